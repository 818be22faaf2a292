//! `lease` mode on PostgreSQL, woken by `LISTEN/NOTIFY`: a grant answers
//! one row, the new fence or the remaining lease of what stands in the way.

use std::sync::Arc;

use futures_util::TryFutureExt as _;
use futures_util::future::BoxFuture;
use lockkit_core::backend::{Attempt, ReleaseWatch};
use lockkit_core::{Capabilities, FencingToken};
use sqlx::Postgres;

use super::notify::PgNotifications;
use super::statements::PgSql;
use crate::lease::{Ask, Conn, Granted, LeaseDialect, LeaseStatements, Turns};
use crate::settings::{PG_LEASE_CAPABILITIES, Settings};
use crate::statement::{Answer, Bind as _, remaining_ms, trusted};

/// `lease` mode on Postgres.
#[derive(Debug)]
pub(super) struct PgLease {
    pub(super) sql: Arc<PgSql>,
    pub(super) notifications: PgNotifications,
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

impl LeaseDialect for PgLease {
    type Db = Postgres;
    const CAPABILITIES: Capabilities = PG_LEASE_CAPABILITIES;

    fn statements(&self) -> &LeaseStatements {
        &self.sql.lease
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
