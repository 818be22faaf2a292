//! Release bells of `lease` mode on PostgreSQL: a release that serves a
//! client's place in line wakes that client alone, by ending a statement of
//! one session of the client's own, rather than with a `NOTIFY`.
//!
//! Every `NOTIFY` is read by the server process of every session that
//! listens in the database, on whatever channel: the server's work per
//! handoff would grow with the clients that wait. So while a client is in a
//! line, a session of its own (its *bell*, whose `application_name` is
//! `lockkit-bell-<client>`) runs one statement after another that first
//! looks for the names reserved for the client among those it is in line
//! for, answers them at once if there are any, and otherwise sleeps a
//! while ([`NAP`]). A release that reserves a name for the client (see
//! `statements`) answers the client; the releaser then signals that
//! client's bell sessions (`pg_cancel_backend`, once the reservation has
//! committed), which ends the sleep. The client's waiters then ask at once
//! (those of its first few names, see [`WAKE_AT_ONCE`]), and the bell's
//! next statement finds any other reservation: its waiters then take the
//! lock, or with none the turn is passed on (see [`Turns`]).
//!
//! No ring is lost: a ring that comes while a statement runs ends it, and
//! one that comes between two statements is dropped by the server (a
//! session reading its next command ignores a cancel), but then the next
//! statement starts after the reservation committed, and finds it. Where a
//! client's bell is away (not started yet, reconnecting, or an earlier
//! version of lockkit), the releaser notifies the client on its own
//! channel instead, as before. A bell of another role cannot be signalled
//! without `pg_signal_backend`: the ring fails, and the client is notified
//! then too.
//!
//! A client's bell runs its statements only while the client is in a line
//! (or left one lately, see [`InLine`]); its session is opened when the
//! client first waits, and closed once it has waited for nothing for
//! [`IDLE`].

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions as _, Connection as _};

use super::statements::PgSql;
use crate::error::is_interrupted;
use crate::lease::{InLine, Turns};
use crate::settings::Settings;
use crate::statement::trusted;

/// How long one statement of a bell sleeps when it finds nothing: how long
/// the bell's session lingers after its client went, and how often a
/// waiting client's bell asks the server when nothing rings.
const NAP: Duration = Duration::from_secs(1);

/// How long a bell's session stays open once its client waits for no name
/// any more: a client that waits again soon finds it ready.
const IDLE: Duration = Duration::from_secs(10);

/// How many names one statement of a bell asks about at most; the waiters
/// of the names past it are woken as the client renews its places.
const NAMES_MAX: usize = 1024;

/// How many names' waiters a ring wakes at once, without asking the server
/// which of the client's names was reserved (see [`wake_at_once`]).
const WAKE_AT_ONCE: usize = 4;

/// The `application_name` of the bell sessions of `client`.
pub(super) fn bell_name(client: &str) -> String {
    format!("lockkit-bell-{client}")
}

/// The channel on which `client` alone is notified where its bell is away
/// (the client listens on it, see `notify`).
pub(super) fn own_channel(client: &str) -> String {
    format!("lockkit-{client}")
}

/// The bell task of client `sql.lease.client`: while `in_line` counts a
/// name, one statement after another on a session of its own (see the
/// module's documentation), and the turns it finds go to `turns`. A lost
/// session is opened again after a pause; meanwhile releasers notify the
/// client on its own channel.
pub(super) async fn ring_loop(
    options: PgConnectOptions,
    sql: Arc<PgSql>,
    in_line: Arc<InLine>,
    turns: Turns,
    settings: Settings,
) {
    let client = &sql.lease.client;
    let options = options.application_name(&bell_name(client));
    loop {
        in_line.until_any().await;
        let conn = tokio::time::timeout(settings.connect_timeout, options.connect()).await;
        let mut conn = match conn {
            Ok(Ok(conn)) => conn,
            Ok(Err(error)) => {
                tracing::debug!(%error, "cannot open the bell's session; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(_) => {
                tracing::debug!("the bell's session did not open in time; retrying");
                continue;
            }
        };
        let failed = ring(&mut conn, &sql, &in_line, &turns, &settings).await;
        let _ = tokio::time::timeout(settings.command_timeout, conn.close()).await;
        if let Some(error) = failed {
            tracing::debug!(%error, "the bell's session failed; opening another");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// The bell's statements on `conn`, until one fails other than by a ring
/// (the error), or until the client has waited for no name for [`IDLE`]
/// (`None`).
async fn ring(
    conn: &mut PgConnection,
    sql: &PgSql,
    in_line: &InLine,
    turns: &Turns,
    settings: &Settings,
) -> Option<sqlx::Error> {
    let client = sql.lease.client.as_str();
    // The names found last time, asked about again only after a ring or a
    // whole nap: their waiters are about to take them.
    let mut told: Vec<String> = Vec::new();
    loop {
        if tokio::time::timeout(IDLE, in_line.until_any())
            .await
            .is_err()
        {
            return None;
        }
        let mut names = in_line.counted();
        names.retain(|name| !told.contains(name));
        names.truncate(NAMES_MAX);
        let asked = sqlx::query_scalar::<_, Option<String>>(trusted(&sql.bell))
            .bind(&names)
            .bind(client)
            .bind(NAP.as_secs_f64())
            .fetch_all(&mut *conn);
        match tokio::time::timeout(NAP + settings.command_timeout, asked).await {
            Ok(Ok(rows)) => {
                told = rows.into_iter().flatten().collect();
                for name in &told {
                    turns.came(name);
                }
            }
            Ok(Err(error)) if is_interrupted(&error) => {
                told = wake_at_once(in_line, turns);
            }
            Ok(Err(error)) => return Some(error),
            Err(_) => {
                let late = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the bell's statement outlived its nap and the command timeout",
                );
                return Some(sqlx::Error::Io(late));
            }
        }
    }
}

/// After a ring: the waiters of the client's names, when they are few
/// ([`WAKE_AT_ONCE`]), are woken at once, without a statement to ask which
/// name was reserved (their attempts find out); those names are returned,
/// for the next statement to leave out. The next statement finds any other
/// reservation (a name whose last waiter stopped, whose turn is then
/// passed on).
fn wake_at_once(in_line: &InLine, turns: &Turns) -> Vec<String> {
    let hub = turns.hub();
    let mut waited = in_line.counted();
    waited.retain(|name| hub.watched(name));
    if waited.len() > WAKE_AT_ONCE {
        return Vec::new();
    }
    for name in &waited {
        hub.notify(name);
    }
    waited
}

/// Wakes `client`, for whom a release just reserved `name`, on `conn`:
/// its bell, or its own channel when the bell is away; and when the bell
/// cannot be signalled (another role), its channel all the same.
pub(super) async fn wake(
    conn: &mut PgConnection,
    sql: &PgSql,
    client: &str,
    name: &str,
) -> sqlx::Result<()> {
    let channel = own_channel(client);
    let rung = sqlx::query(trusted(&sql.ring))
        .bind(bell_name(client))
        .bind(&channel)
        .bind(name)
        .execute(&mut *conn)
        .await;
    if let Err(error) = rung {
        tracing::debug!(%error, "cannot ring the bell of the client first in line; notifying it");
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(&channel)
            .bind(name)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}
