//! Release notifications on PostgreSQL: one `LISTEN` connection per client,
//! and a line of the waiting clients per name, so that a release goes to
//! the client that has waited longest and wakes that one alone.
//!
//! `NOTIFY` reaches every client that listens on the channel. If each woke
//! its waiters of the released name, every release would send each waiting
//! client to ask again, and all but one would be refused: the statements
//! per release would grow with the number of clients that wait. And the
//! client that released, asking again at once, would mostly win. So a
//! client whose waiter starts to wait for a name takes a place at the back
//! of the name's line (a row beside the lock's, see `statements::FIRST`),
//! or keeps the one it has, and leaves the line when the last of its
//! waiters stops. A release that finds clients in line does not delete the
//! lock's row: it reserves it for the client at the head of the line, for
//! [`RESERVED_MS`](super::statements::RESERVED_MS), ends that client's
//! place, and wakes that client alone: by its bell (see [`bell`]), or, where
//! the bell is away, on its own channel (`lockkit-<client>`; each client
//! listens on it and on the table's). Only
//! that client is granted a reserved row; should it not ask in time (its
//! process died), anyone may take the row once the reservation runs out. A
//! release with nobody in line deletes the row and notifies the table's
//! channel, which wakes every client's waiters of the name, as do the other
//! statements that free a name (a reader group's last leave, a withdrawn
//! waiting record). (Every listening session's server process reads each
//! notification, of whichever channel: that work grows with the clients
//! that listen, which is why a handoff rings a bell instead.)
//!
//! Waiters in line sleep until their client is woken, or until what stands
//! in the way runs out; and, every third of a place's lease (`PLACE_TTL`,
//! 10 s, see `lease::line`), when the client renews its places (taking them
//! again where they went), they ask once. A client that stopped without
//! leaving the line (its process died) keeps its place until it runs out,
//! within `PLACE_TTL`; it is swept when a client next takes a place in that
//! line, and a reservation for it holds the name up for at most
//! `RESERVED_MS`. A client notified on its own channel for a name none of
//! its waiters waits for any longer (the last one stopped after the release
//! found the client in line) passes the turn on at once (see [`Turns`]). A
//! client whose place could not be taken backs off and asks again (never
//! past the holder's expiry).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockkit_core::backend::ReleaseWatch;
use sqlx::Postgres;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::bell;
use super::statements::PgSql;
use crate::lease::{Line, Places, Turns};
use crate::settings::Settings;
use crate::statement::trusted;

/// One `LISTEN` connection per client, started on first use, that wakes the
/// waiters of a name when a release reserves it for this client (or wakes
/// everyone); and this client's places in the lines of names (see
/// [`Line`]). The `LISTEN` connection comes from a pool of its own, so that
/// it never takes a connection from the statements.
#[derive(Debug)]
pub(super) struct PgNotifications {
    options: PgConnectOptions,
    sql: Arc<PgSql>,
    line: Line<Postgres>,
    /// `true` once `LISTEN` is in place; the listener and the bell.
    state: Mutex<Option<(watch::Receiver<bool>, [AbortHandle; 2])>>,
}

impl PgNotifications {
    pub(super) fn new(
        options: PgConnectOptions,
        pool: PgPool,
        sql: Arc<PgSql>,
        settings: &Settings,
    ) -> Self {
        let places = Places {
            pool,
            sql: sql.places.clone(),
            client: sql.lease.client.clone(),
            settings: settings.clone(),
        };
        PgNotifications {
            options,
            sql,
            // Waiters in line sleep until woken: a renewal wakes them too.
            line: Line::new(places, true),
            state: Mutex::new(None),
        }
    }

    /// A watch on `name`; inactive (the waiter falls back to backoff and the
    /// holder's expiry) when `LISTEN` cannot be set up in time.
    pub(super) async fn watch(&self, settings: &Settings, name: &str) -> ReleaseWatch {
        let mut listening = self.start(settings);
        let joined = async {
            let listening = listening.wait_for(|on| *on).await.is_ok();
            // A place kept, or taken at the back of the line: a grant
            // ended any place this client had.
            let (watch, joined) = self.line.join(name).await;
            (listening, watch, joined)
        };
        match tokio::time::timeout(settings.command_timeout, joined).await {
            // A release wakes the client when its turn has come (the row
            // reserved for it): the waiters sleep until then, or until
            // what stands in the way runs out, rather than ask again on
            // the backoff.
            Ok((true, watch, true)) => watch.telling_turns(),
            Ok((true, watch, false)) => watch,
            _ => {
                tracing::warn!(postgres.address = %settings.address, "LISTEN is not set up; waiting by polling");
                ReleaseWatch::none()
            }
        }
    }

    /// The client's turns (see [`Turns`]).
    pub(super) fn turns(&self) -> &Turns {
        self.line.turns()
    }

    /// How many clients wait in the line of `name`.
    pub(super) async fn in_line(&self, name: &str) -> sqlx::Result<usize> {
        let count: i64 = sqlx::query_scalar(trusted(&self.sql.in_line))
            .bind(name)
            .fetch_one(&self.line.places().pool)
            .await?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    /// The listener, started on first use; whether `LISTEN` is in place.
    fn start(&self, settings: &Settings) -> watch::Receiver<bool> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (listening, _) = state.get_or_insert_with(|| {
            let (tx, rx) = watch::channel(false);
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(settings.connect_timeout)
                .connect_lazy_with(self.options.clone());
            let own = bell::own_channel(&self.sql.lease.client);
            let channels = [self.sql.channel().to_owned(), own];
            let listener = tokio::spawn(listen(pool, channels, self.line.turns().clone(), tx));
            let bell = tokio::spawn(bell::ring_loop(
                self.options.clone(),
                self.sql.clone(),
                self.line.in_line().clone(),
                self.line.turns().clone(),
                settings.clone(),
            ));
            (rx, [listener.abort_handle(), bell.abort_handle()])
        });
        listening.clone()
    }
}

impl Drop for PgNotifications {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some((_, tasks)) = state.take() {
            for task in tasks {
                task.abort();
            }
        }
    }
}

/// The listener task: `LISTEN` on the table's channel and on this client's
/// (`channels`, in that order), then wake the waiters of each
/// notification's name; on the client's own channel, the name was
/// reserved for it, and should none of its waiters want it any longer the
/// turn is passed on (see [`Turns`]). After a lost connection every waiter
/// is woken, as notifications may have been missed; sqlx reconnects and
/// listens again.
async fn listen(pool: PgPool, channels: [String; 2], turns: Turns, listening: watch::Sender<bool>) {
    let hub = turns.hub();
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::debug!(%error, "cannot open the LISTEN connection; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(error) = listener
            .listen_all(channels.iter().map(String::as_str))
            .await
        {
            tracing::debug!(%error, "LISTEN failed; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        listening.send_replace(true);
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) if notification.channel() == channels[1] => {
                    turns.came(notification.payload());
                }
                Ok(Some(notification)) => {
                    hub.notify(notification.payload());
                }
                Ok(None) => {
                    // The connection was lost; the next call reconnects.
                    hub.notify_all();
                }
                Err(error) => {
                    tracing::debug!(%error, "the LISTEN connection failed; reconnecting");
                    hub.notify_all();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            }
        }
    }
}
