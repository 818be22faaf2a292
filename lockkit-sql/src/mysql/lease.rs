//! `lease` mode on MySQL and MariaDB: the answer of an upsert comes back in
//! `LAST_INSERT_ID`, as MySQL has no `RETURNING`.

use std::sync::Arc;
use std::time::Duration;

use futures_util::TryFutureExt as _;
use lockkit_core::backend::Attempt;
use lockkit_core::{Capabilities, FencingToken};
use sqlx::MySqlConnection;

use super::statements::{BUSY_FLAG, MySql};
use crate::lease::{LeaseDialect, LeaseStatements};
use crate::settings::POLLED_LEASE_CAPABILITIES;
use crate::statement::{Answer, Value, Value::Bytes, Value::Text, bound, micros, trusted};

/// What a lease upsert answered in `LAST_INSERT_ID`: the new fence, or
/// [`BUSY_FLAG`] plus the remaining wait in µs.
fn upsert_answer(answer: u64) -> sqlx::Result<Attempt<Option<FencingToken>>> {
    if answer >= BUSY_FLAG {
        Ok(Attempt::Busy {
            retry_after: Some(Duration::from_micros(answer - BUSY_FLAG)),
        })
    } else if answer > 0 {
        Ok(Attempt::Acquired(Some(FencingToken::new(answer))))
    } else {
        Err(sqlx::Error::Protocol(
            "the server returned no LAST_INSERT_ID for the lease upsert".into(),
        ))
    }
}

/// `lease` mode on MySQL/MariaDB.
#[derive(Debug)]
pub(super) struct MyLease {
    pub(super) sql: Arc<MySql>,
}

impl LeaseDialect for MyLease {
    type Db = sqlx::MySql;
    const CAPABILITIES: Capabilities = POLLED_LEASE_CAPABILITIES;

    fn statements(&self) -> &LeaseStatements {
        &self.sql.lease
    }

    fn name_value(name: &str) -> Value<'_> {
        Bytes(name.as_bytes())
    }

    fn ttl_value(ttl: Duration) -> Value<'static> {
        micros(ttl)
    }

    /// Prepares the upsert, at no cost once the connection has it cached:
    /// sqlx-mysql does not keep track of a prepare it gave up.
    fn ready_acquire<'c>(&'c self, conn: &'c mut MySqlConnection) -> Answer<'c, ()> {
        let sql = sqlx::SqlSafeStr::into_sql_str(trusted(&self.sql.acquire));
        Box::pin(sqlx::Executor::prepare(conn, sql).map_ok(drop))
    }

    fn acquire<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        name: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Attempt<Option<FencingToken>>> {
        let name = name.as_bytes();
        let values = [Bytes(name), Text(owner), Bytes(name), micros(ttl)];
        let query = bound(&self.sql.acquire, &values);
        Box::pin(
            query
                .execute(conn)
                .and_then(|done| async move { upsert_answer(done.last_insert_id()) }),
        )
    }

    fn hand_over<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        name: &'c str,
        from: &'c str,
        to: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Option<i64>> {
        let values = [Text(to), micros(ttl), Bytes(name.as_bytes()), Text(from)];
        let query = bound(&self.sql.hand_over, &values);
        // 1 matched row when it was `from`'s; the new fence in LAST_INSERT_ID.
        Box::pin(
            query
                .execute(conn)
                .map_ok(|done| (done.rows_affected() == 1).then(|| done.last_insert_id() as i64)),
        )
    }

    fn share<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        name: &'c str,
        waiting: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Attempt<Option<FencingToken>>> {
        let (name, waiting) = (name.as_bytes(), waiting.as_bytes());
        let values = [
            Bytes(name),
            Bytes(name),
            micros(ttl),
            Bytes(waiting),
            Bytes(waiting),
            Bytes(waiting),
        ];
        let query = bound(&self.sql.share, &values);
        Box::pin(query.execute(conn).and_then(|done| async move {
            if done.rows_affected() == 0 {
                // A writer waits (see the statement).
                return Ok(Attempt::Busy { retry_after: None });
            }
            upsert_answer(done.last_insert_id())
        }))
    }
}
