//! `lease` mode on SQLite.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::backend::Attempt;
use lockkit_core::{Capabilities, FencingToken};
use sqlx::{Sqlite, SqliteConnection};

use super::statements::SqliteSql;
use crate::lease::{LeaseDialect, LeaseStatements};
use crate::settings::POLLED_LEASE_CAPABILITIES;
use crate::statement::{Answer, Value, Value::Text, bound_scalar, millis, remaining_ms};

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
        upsert: (&Arc<str>, &[Value<'_>]),
        remaining: (&Arc<str>, &[Value<'_>]),
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

    fn statements(&self) -> &LeaseStatements {
        &self.sql.lease
    }

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
}
