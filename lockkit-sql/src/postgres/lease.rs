//! `lease` mode on PostgreSQL, woken by `LISTEN/NOTIFY`.

use std::sync::Arc;
use std::time::Duration;

use futures_util::TryFutureExt as _;
use futures_util::future::BoxFuture;
use lockkit_core::backend::{Attempt, ReleaseWatch};
use lockkit_core::{Capabilities, FencingToken};
use sqlx::{PgConnection, Postgres};

use super::notify::PgNotifications;
use super::statements::PgSql;
use crate::lease::{LeaseDialect, LeaseStatements};
use crate::settings::{NOTIFIED_LEASE_CAPABILITIES, Settings};
use crate::statement::{Answer, Value::Text, bound_rows, bound_scalar, millis, remaining_ms};

/// `lease` mode on Postgres.
#[derive(Debug)]
pub(super) struct PgLease {
    pub(super) sql: Arc<PgSql>,
    pub(super) notifications: PgNotifications,
}

/// A grant's answer: the new fence, or the holder's remaining milliseconds.
fn granted((fence, remaining): (Option<i64>, Option<i64>)) -> Attempt<Option<FencingToken>> {
    match fence {
        Some(fence) => Attempt::Acquired(Some(FencingToken::new(fence as u64))),
        None => Attempt::Busy {
            retry_after: remaining.map(remaining_ms),
        },
    }
}

impl LeaseDialect for PgLease {
    type Db = Postgres;
    const CAPABILITIES: Capabilities = NOTIFIED_LEASE_CAPABILITIES;

    fn statements(&self) -> &LeaseStatements {
        &self.sql.lease
    }

    fn acquire<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Attempt<Option<FencingToken>>> {
        let query = bound_rows(&self.sql.acquire, &[Text(name), Text(owner), millis(ttl)]);
        Box::pin(query.fetch_one(conn).map_ok(granted))
    }

    fn hand_over<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
        from: &'c str,
        to: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Option<i64>> {
        let values = [Text(name), Text(from), Text(to), millis(ttl)];
        Box::pin(bound_scalar(&self.sql.hand_over, &values).fetch_optional(conn))
    }

    fn share<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
        waiting: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Attempt<Option<FencingToken>>> {
        let query = bound_rows(&self.sql.share, &[Text(name), millis(ttl), Text(waiting)]);
        Box::pin(query.fetch_one(conn).map_ok(granted))
    }

    fn watch<'a>(&'a self, settings: &'a Settings, name: &'a str) -> BoxFuture<'a, ReleaseWatch> {
        Box::pin(self.notifications.watch(self.sql.channel(), settings, name))
    }
}
