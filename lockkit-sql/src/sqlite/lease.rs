//! `lease` mode on SQLite.

use std::sync::Arc;
use std::time::Duration;

use futures_util::TryFutureExt as _;
use lockkit_core::backend::Attempt;
use lockkit_core::{Capabilities, FencingToken};
use sqlx::sqlite::SqliteQueryResult;
use sqlx::{Sqlite, SqliteConnection};

use super::statements::SqliteSql;
use crate::lease::{LeaseDialect, LiveRow};
use crate::settings::POLLED_LEASE_CAPABILITIES;
use crate::statement::{
    Answer, Value::Int, Value::MaybeText, Value::Text, bound, bound_rows, bound_scalar, millis,
    remaining_ms,
};

/// Whether a conditional statement changed its row.
fn changed(done: SqliteQueryResult) -> bool {
    done.rows_affected() == 1
}

/// `lease` mode on SQLite.
#[derive(Debug)]
pub(super) struct SqliteLease {
    pub(super) sql: Arc<SqliteSql>,
}

impl SqliteLease {
    /// A grant's upsert (`RETURNING fence`), and when it did not grant,
    /// the remaining lease of what stands in its way, asked next on the
    /// same connection.
    async fn grant(
        &self,
        conn: &mut SqliteConnection,
        upsert: (&Arc<str>, &[crate::statement::Value<'_>]),
        remaining: (&Arc<str>, &[crate::statement::Value<'_>]),
    ) -> sqlx::Result<Attempt<Option<FencingToken>>> {
        let fence: Option<i64> = bound_scalar(upsert.0, upsert.1)
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(fence) = fence {
            return Ok(Attempt::Acquired(Some(FencingToken::new(fence as u64))));
        }
        let left: Option<i64> = bound_scalar(remaining.0, remaining.1)
            .fetch_optional(conn)
            .await?
            .flatten();
        Ok(Attempt::Busy {
            retry_after: left.map(remaining_ms),
        })
    }
}

impl LeaseDialect for SqliteLease {
    type Db = Sqlite;
    const CAPABILITIES: Capabilities = POLLED_LEASE_CAPABILITIES;

    fn acquire<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        name: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Attempt<Option<FencingToken>>> {
        Box::pin(async move {
            let upsert = [Text(name), Text(owner), millis(ttl)];
            let remaining = [Text(name)];
            self.grant(
                conn,
                (&self.sql.acquire, &upsert),
                (&self.sql.remaining, &remaining),
            )
            .await
        })
    }

    fn extend<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        name: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, bool> {
        let values = [Text(name), Text(owner), millis(ttl)];
        Box::pin(
            bound(&self.sql.extend, &values)
                .execute(conn)
                .map_ok(changed),
        )
    }

    fn release<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        name: &'c str,
        owner: &'c str,
    ) -> Answer<'c, bool> {
        let values = [Text(name), Text(owner)];
        Box::pin(
            bound(&self.sql.release, &values)
                .execute(conn)
                .map_ok(changed),
        )
    }

    fn hand_over<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
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
        conn: &'c mut SqliteConnection,
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
        conn: &'c mut SqliteConnection,
        name: &'c str,
        waiting: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Attempt<Option<FencingToken>>> {
        Box::pin(async move {
            let upsert = [Text(name), millis(ttl), Text(waiting)];
            let remaining = [Text(name), Text(waiting)];
            self.grant(
                conn,
                (&self.sql.share, &upsert),
                (&self.sql.share_remaining, &remaining),
            )
            .await
        })
    }

    fn extend_share<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        name: &'c str,
        token: i64,
        ttl: Duration,
    ) -> Answer<'c, bool> {
        let values = [Text(name), Int(token), millis(ttl)];
        let query = bound(&self.sql.extend_share, &values);
        Box::pin(query.execute(conn).map_ok(changed))
    }

    /// The last reader deletes the row; the others count it down.
    fn leave<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        name: &'c str,
        token: i64,
    ) -> Answer<'c, bool> {
        let values = [Text(name), Int(token)];
        Box::pin(async move {
            if changed(
                bound(&self.sql.leave_last, &values)
                    .execute(&mut *conn)
                    .await?,
            ) {
                return Ok(true);
            }
            bound(&self.sql.leave, &values)
                .execute(conn)
                .await
                .map(changed)
        })
    }

    fn mark_waiting<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        waiting: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, ()> {
        let values = [Text(waiting), Text(owner), millis(ttl)];
        let query = bound(&self.sql.mark_waiting, &values);
        Box::pin(query.execute(conn).map_ok(drop))
    }

    fn unmark_waiting<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        _name: &'c str,
        waiting: &'c str,
        owner: Option<&'c str>,
    ) -> Answer<'c, ()> {
        let values = [Text(waiting), MaybeText(owner)];
        let query = bound(&self.sql.unmark_waiting, &values);
        Box::pin(query.execute(conn).map_ok(drop))
    }
}
