//! `lease` mode on PostgreSQL, woken by `LISTEN/NOTIFY`: a grant answers
//! one row, the new fence or the remaining lease of what stands in the way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::TryFutureExt as _;
use futures_util::future::BoxFuture;
use lockkit_core::backend::{Attempt, ReleaseWatch};
use lockkit_core::{Capabilities, FencingToken};
use sqlx::Postgres;

use super::bell;
use super::notify::PgNotifications;
use super::statements::PgSql;
use crate::lease::{Args, Ask, Conn, Granted, LeaseDialect, LeaseSql, LeaseStatements, Turns};
use crate::settings::{PG_LEASE_CAPABILITIES, Settings};
use crate::statement::{Answer, Bind as _, remaining_ms, trusted};

/// `lease` mode on Postgres.
#[derive(Debug)]
pub(super) struct PgLease {
    pub(super) sql: Arc<PgSql>,
    pub(super) notifications: PgNotifications,
    /// Names whose release found clients in line lately (see
    /// [`LinesSeen`]).
    pub(super) lines: LinesSeen,
}

/// How many of a name's releases after one that found clients in its line
/// go straight to the statement that serves the line.
const LINED_RELEASES: u8 = 8;

/// How many names [`LinesSeen`] remembers; past it, it starts afresh.
const LINES_SEEN_MAX: usize = 256;

/// The names whose release lately found clients in line, so that the next
/// releases of those names run the statement that serves the line (and
/// frees the row when the line has emptied) at once, rather than first the
/// one that only frees a row nobody waits for: a contended handoff costs
/// the releaser one statement, not two. Each release that serves a
/// client in line renews the hint, which runs out after
/// [`LINED_RELEASES`] releases that found the line empty; the next release
/// then tries the first statement again. A name released without
/// contention costs one statement as before.
#[derive(Debug, Default)]
pub(super) struct LinesSeen {
    names: Mutex<HashMap<String, u8>>,
}

impl LinesSeen {
    /// Whether a release of `name` found clients in line lately; counts
    /// this release against the hint.
    fn take(&self, name: &str) -> bool {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        let Some(left) = names.get_mut(name) else {
            return false;
        };
        *left -= 1;
        if *left == 0 {
            names.remove(name);
        }
        true
    }

    /// A release of `name` found clients in its line.
    fn saw(&self, name: &str) {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        if names.len() >= LINES_SEEN_MAX && !names.contains_key(name) {
            names.clear();
        }
        names.insert(name.to_owned(), LINED_RELEASES);
    }
}

/// A grant's answer: the new fence, or the remaining milliseconds of what
/// stands in the way.
fn granted((fence, remaining): (Option<i64>, Option<i64>)) -> Granted {
    match fence {
        Some(fence) => Attempt::Acquired(Some(FencingToken::new(fence as u64))),
        None => Attempt::Busy {
            retry_after: remaining.map(remaining_ms),
        },
    }
}

impl PgLease {
    /// The release statement that serves the line (`served`): the rows
    /// changed. When it reserved the row for the client first in line, that
    /// client is woken (see [`bell::wake`]) once the reservation has
    /// committed, and the name's next releases go straight to this
    /// statement (see [`LinesSeen`]).
    async fn serve_line(
        &self,
        conn: &mut Conn<Self>,
        served: &LeaseSql,
        args: Args<'_>,
    ) -> sqlx::Result<u64> {
        let values = self.sql.lease.values::<Self>(served, args);
        let rows: Vec<Option<String>> = sqlx::query_scalar(trusted(&served.text))
            .bind_all(&values)
            .fetch_all(&mut *conn)
            .await?;
        for client in rows.iter().flatten() {
            self.lines.saw(args.name);
            if let Err(error) = bell::wake(conn, &self.sql, client, args.name).await {
                // The client asks again as it renews its place.
                tracing::debug!(%error, "could not wake the client first in line");
            }
        }
        Ok(rows.len() as u64)
    }
}

impl LeaseDialect for PgLease {
    type Db = Postgres;
    const CAPABILITIES: Capabilities = PG_LEASE_CAPABILITIES;

    fn statements(&self) -> &LeaseStatements {
        &self.sql.lease
    }

    /// The release's statements (see `statements::PgSql`), in order until
    /// one changes a row: the first frees a row nobody
    /// waits for; the last serves the line, and frees the row if the line
    /// is empty. A release of a name whose line was seen lately runs the
    /// last alone (see [`LinesSeen`]).
    fn release<'c>(&'c self, conn: &'c mut Conn<Self>, args: Args<'c>) -> Answer<'c, u64> {
        Box::pin(async move {
            let statements = &self.sql.lease;
            let Some((served, first)) = statements.release.split_last() else {
                return Ok(0);
            };
            if !self.lines.take(args.name) {
                for release in first {
                    let changed = self.run(&mut *conn, release, args).await?;
                    if changed >= 1 {
                        return Ok(changed);
                    }
                }
            }
            self.serve_line(conn, served, args).await
        })
    }

    fn grant<'c>(&'c self, conn: &'c mut Conn<Self>, ask: Ask<'c>) -> Answer<'c, Granted> {
        let sql = self.sql.lease.grant(ask.grant);
        let values = self.sql.lease.values::<Self>(sql, ask.args);
        Box::pin(
            sqlx::query_as(trusted(&sql.text))
                .bind_all(&values)
                .fetch_one(conn)
                .map_ok(granted),
        )
    }

    fn watch<'a>(&'a self, settings: &'a Settings, name: &'a str) -> BoxFuture<'a, ReleaseWatch> {
        Box::pin(self.notifications.watch(settings, name))
    }

    fn waiting<'a>(&'a self, _: &'a Settings, name: &'a str) -> Answer<'a, Option<usize>> {
        Box::pin(self.notifications.in_line(name).map_ok(Some))
    }

    fn turns(&self) -> Option<&Turns> {
        Some(self.notifications.turns())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_seen_hints_the_next_releases_until_the_hint_runs_out() {
        let lines = LinesSeen::default();
        assert!(!lines.take("a"), "no line seen yet");
        lines.saw("a");
        for _ in 0..LINED_RELEASES {
            assert!(lines.take("a"));
        }
        assert!(!lines.take("a"), "the hint ran out");
        assert!(!lines.take("b"), "a hint is the name's own");
    }

    #[test]
    fn lines_seen_stay_bounded() {
        let lines = LinesSeen::default();
        for i in 0..3 * LINES_SEEN_MAX {
            lines.saw(&format!("name-{i}"));
        }
        let kept = lines.names.lock().unwrap().len();
        assert!((1..=LINES_SEEN_MAX).contains(&kept), "{kept}");
        assert!(lines.take(&format!("name-{}", 3 * LINES_SEEN_MAX - 1)));
    }
}
