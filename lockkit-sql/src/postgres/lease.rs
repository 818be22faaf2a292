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
use crate::lease::{LeaseDialect, LiveRow};
use crate::settings::{NOTIFIED_LEASE_CAPABILITIES, Settings};
use crate::statement::{
    Answer, Value::Int, Value::MaybeText, Value::Text, bound, bound_rows, bound_scalar, millis,
    remaining_ms,
};

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

    fn extend<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, bool> {
        let query = bound(&self.sql.extend, &[Text(name), Text(owner), millis(ttl)]);
        Box::pin(query.execute(conn).map_ok(|done| done.rows_affected() == 1))
    }

    fn release<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
        owner: &'c str,
    ) -> Answer<'c, bool> {
        let values = [Text(name), Text(owner), Text(&self.sql.channel)];
        let query = bound(&self.sql.release, &values);
        Box::pin(query.fetch_all(conn).map_ok(|rows| rows.len() == 1))
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

    fn status<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
    ) -> Answer<'c, Option<LiveRow>> {
        let query = bound_rows::<_, (i64, i64, Option<String>)>(&self.sql.status, &[Text(name)]);
        Box::pin(
            query
                .fetch_optional(conn)
                .map_ok(|row| row.map(LiveRow::from)),
        )
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

    fn extend_share<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
        token: i64,
        ttl: Duration,
    ) -> Answer<'c, bool> {
        let query = bound(
            &self.sql.extend_share,
            &[Text(name), Int(token), millis(ttl)],
        );
        Box::pin(query.execute(conn).map_ok(|done| done.rows_affected() == 1))
    }

    fn leave<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
        token: i64,
    ) -> Answer<'c, bool> {
        let values = [Text(name), Int(token), Text(&self.sql.channel)];
        let query = bound(&self.sql.leave, &values);
        Box::pin(query.fetch_all(conn).map_ok(|rows| rows.len() == 1))
    }

    fn mark_waiting<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        waiting: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, ()> {
        let values = [Text(waiting), Text(owner), millis(ttl)];
        Box::pin(
            bound(&self.sql.mark_waiting, &values)
                .execute(conn)
                .map_ok(drop),
        )
    }

    fn unmark_waiting<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
        waiting: &'c str,
        owner: Option<&'c str>,
    ) -> Answer<'c, ()> {
        let values = [
            Text(waiting),
            MaybeText(owner),
            Text(&self.sql.channel),
            Text(name),
        ];
        let query = bound(&self.sql.unmark_waiting, &values);
        Box::pin(query.fetch_all(conn).map_ok(drop))
    }

    fn watch<'a>(&'a self, settings: &'a Settings, name: &'a str) -> BoxFuture<'a, ReleaseWatch> {
        Box::pin(self.notifications.watch(self.sql.channel(), settings, name))
    }
}
