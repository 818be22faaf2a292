//! `lease` mode on SQLite: a grant's upsert answers the new fence
//! (`RETURNING`), and when it did not grant, a second statement on the same
//! connection reads how long what stands in the way still runs.
//!
//! A client whose waiters wait for a name has a place in the name's line
//! (see [`Line`]) while they wait. A release that finds another client in
//! line reserves the row for the client at the head of the line for a
//! moment rather than delete it, and rings that client's own bell (see
//! `bells`): it alone wakes, and the releasing process, awake already,
//! cannot take the lock straight back.

use std::sync::Arc;

use futures_util::TryFutureExt as _;
use futures_util::future::BoxFuture;
use lockkit_core::backend::{Attempt, ReleaseWatch};
use lockkit_core::{Capabilities, FencingToken};
use sqlx::Sqlite;

use super::bells::Bells;
use super::statements::SqliteSql;
use crate::lease::{
    Args, Ask, Conn, Grant, Granted, LeaseDialect, LeaseStatements, Line, RESERVED_FOR, Turns,
};
use crate::settings::{SQLITE_LEASE_CAPABILITIES, Settings};
use crate::statement::{Answer, Bind as _, remaining_ms, trusted};

/// `lease` mode on SQLite, its waiters woken by the release bells.
#[derive(Debug)]
pub(super) struct SqliteLease {
    pub(super) sql: Arc<SqliteSql>,
    pub(super) bells: Bells,
    /// The client's places in lines; none for an in-memory database (one
    /// client alone uses it).
    pub(super) line: Option<Line<Sqlite>>,
}

impl LeaseDialect for SqliteLease {
    type Db = Sqlite;
    const CAPABILITIES: Capabilities = SQLITE_LEASE_CAPABILITIES;
    /// Every waiting process tries on each release (the bells wake them
    /// all), and SQLite has one write lock per database.
    const READ_FIRST: bool = true;

    fn statements(&self) -> &LeaseStatements {
        &self.sql.lease
    }

    fn grant<'c>(&'c self, conn: &'c mut Conn<Self>, ask: Ask<'c>) -> Answer<'c, Granted> {
        let lease = &self.sql.lease;
        let (upsert, remaining) = match ask.grant {
            Grant::Acquire => (&lease.acquire, &self.sql.remaining),
            Grant::Share => (&lease.share, &self.sql.share_remaining),
        };
        Box::pin(async move {
            let values = lease.values::<Self>(upsert, ask.args);
            let fence: Option<i64> = sqlx::query_scalar(trusted(&upsert.text))
                .bind_all(&values)
                .fetch_optional(&mut *conn)
                .await?;
            if let Some(fence) = fence {
                return Ok(Attempt::Acquired(Some(FencingToken::new(fence as u64))));
            }
            let values = lease.values::<Self>(remaining, ask.args);
            let left: Option<i64> = sqlx::query_scalar(trusted(&remaining.text))
                .bind_all(&values)
                .fetch_optional(conn)
                .await?
                .flatten();
            Ok(Attempt::Busy {
                retry_after: left.map(remaining_ms),
            })
        })
    }

    /// With no other client in the name's line, the row goes and the
    /// name's bell rings (one statement). Otherwise the row is reserved
    /// for the client at the head of the line and that client's place
    /// ends (a second statement), and its own bell rings: it alone wakes,
    /// however many wait.
    fn release<'c>(&'c self, conn: &'c mut Conn<Self>, args: Args<'c>) -> Answer<'c, u64> {
        Box::pin(async move {
            let lease = &self.sql.lease;
            let changed = self.run(&mut *conn, &lease.release[0], args).await?;
            if changed >= 1 {
                self.released(args.name);
                return Ok(changed);
            }
            let reserve = &self.sql.reserve;
            let values = lease.values::<Self>(reserve, args);
            let owners: Vec<String> = sqlx::query_scalar(trusted(&reserve.text))
                .bind_all(&values)
                .fetch_all(&mut *conn)
                .await?;
            if let Some(head) = owners
                .iter()
                .find_map(|owner| owner.strip_prefix(RESERVED_FOR))
            {
                self.bells.ring_client(head);
                return Ok(1);
            }
            // The line emptied meanwhile.
            let changed = self.run(conn, &self.sql.release_alone, args).await?;
            if changed >= 1 {
                self.released(args.name);
            }
            Ok(changed)
        })
    }

    fn released(&self, name: &str) {
        self.bells.ring(name);
    }

    /// The bell of the name's bucket, and a place in the name's line while
    /// the watch lives. In line, the client is woken when its turn comes
    /// (its own bell rings): its waiters sleep until then, or until what
    /// stands in the way runs out, rather than ask again on the backoff.
    fn watch<'a>(&'a self, _: &'a Settings, name: &'a str) -> BoxFuture<'a, ReleaseWatch> {
        Box::pin(async move {
            let bell = self.bells.watch(name);
            match &self.line {
                Some(line) if bell.is_active() => match line.join(name).await {
                    (place, true) => ReleaseWatch::merge([bell, place]).telling_turns(),
                    (place, false) => ReleaseWatch::merge([bell, place]),
                },
                _ => bell,
            }
        })
    }

    /// The live places in the name's line.
    fn waiting<'a>(&'a self, _: &'a Settings, name: &'a str) -> Answer<'a, Option<usize>> {
        let Some(line) = &self.line else {
            return Box::pin(std::future::ready(Ok(None)));
        };
        let count = sqlx::query_scalar::<_, i64>(trusted(&self.sql.in_line))
            .bind(name)
            .fetch_one(&line.places().pool);
        Box::pin(count.map_ok(|n| Some(usize::try_from(n).unwrap_or(0))))
    }

    fn turns(&self) -> Option<&Turns> {
        self.line.as_ref().map(Line::turns)
    }
}
