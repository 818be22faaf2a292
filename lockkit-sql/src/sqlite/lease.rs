//! `lease` mode on SQLite: a grant's upsert answers the new fence
//! (`RETURNING`), and when it did not grant, a second statement on the same
//! connection reads how long what stands in the way still runs.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use lockkit_core::backend::{Attempt, ReleaseWatch};
use lockkit_core::{Capabilities, FencingToken};
use sqlx::Sqlite;

use super::bells::Bells;
use super::statements::SqliteSql;
use crate::lease::{Ask, Conn, Grant, Granted, LeaseDialect, LeaseStatements};
use crate::settings::{SQLITE_LEASE_CAPABILITIES, Settings};
use crate::statement::{Answer, Bind as _, remaining_ms, trusted};

/// `lease` mode on SQLite, its waiters woken by the release bells.
#[derive(Debug)]
pub(super) struct SqliteLease {
    pub(super) sql: Arc<SqliteSql>,
    pub(super) bells: Bells,
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

    fn released(&self, name: &str) {
        self.bells.ring(name);
    }

    fn watch<'a>(&'a self, _: &'a Settings, name: &'a str) -> BoxFuture<'a, ReleaseWatch> {
        Box::pin(std::future::ready(self.bells.watch(name)))
    }
}
