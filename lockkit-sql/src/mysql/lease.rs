//! `lease` mode on MySQL and MariaDB: the answer of an upsert comes back in
//! `LAST_INSERT_ID`, as MySQL has no `RETURNING`.

use std::sync::Arc;
use std::time::Duration;

use futures_util::TryFutureExt as _;
use lockkit_core::backend::Attempt;
use lockkit_core::{Capabilities, FencingToken};
use sqlx::MySqlConnection;
use sqlx::mysql::MySqlQueryResult;

use super::statements::{BUSY_FLAG, MySql};
use crate::lease::{LeaseDialect, LiveRow};
use crate::settings::POLLED_LEASE_CAPABILITIES;
use crate::statement::{
    Answer, Value::Bytes, Value::Int, Value::MaybeText, Value::Text, bound, bound_rows, micros,
    trusted,
};

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

/// Whether a conditional statement matched its row (sqlx asks for found
/// rows, so an `UPDATE` that changed nothing still counts).
fn matched(done: MySqlQueryResult) -> bool {
    done.rows_affected() >= 1
}

/// `lease` mode on MySQL/MariaDB.
#[derive(Debug)]
pub(super) struct MyLease {
    pub(super) sql: Arc<MySql>,
}

impl LeaseDialect for MyLease {
    type Db = sqlx::MySql;
    const CAPABILITIES: Capabilities = POLLED_LEASE_CAPABILITIES;

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

    fn extend<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        name: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, bool> {
        let values = [micros(ttl), Bytes(name.as_bytes()), Text(owner)];
        Box::pin(
            bound(&self.sql.extend, &values)
                .execute(conn)
                .map_ok(matched),
        )
    }

    fn release<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        name: &'c str,
        owner: &'c str,
    ) -> Answer<'c, bool> {
        let values = [Bytes(name.as_bytes()), Text(owner)];
        Box::pin(
            bound(&self.sql.release, &values)
                .execute(conn)
                .map_ok(matched),
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

    fn status<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        name: &'c str,
    ) -> Answer<'c, Option<LiveRow>> {
        let values = [Bytes(name.as_bytes())];
        let query = bound_rows::<_, (i64, i64, Option<String>)>(&self.sql.status, &values);
        Box::pin(
            query
                .fetch_optional(conn)
                .map_ok(|row| row.map(LiveRow::from)),
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

    fn extend_share<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        name: &'c str,
        token: i64,
        ttl: Duration,
    ) -> Answer<'c, bool> {
        let values = [micros(ttl), Bytes(name.as_bytes()), Int(token)];
        let query = bound(&self.sql.extend_share, &values);
        Box::pin(query.execute(conn).map_ok(matched))
    }

    fn leave<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        name: &'c str,
        token: i64,
    ) -> Answer<'c, bool> {
        let values = [Bytes(name.as_bytes()), Int(token)];
        Box::pin(async move {
            if let Some(last) = &self.sql.leave_last
                && matched(bound(last, &values).execute(&mut *conn).await?)
            {
                return Ok(true);
            }
            bound(&self.sql.leave, &values)
                .execute(conn)
                .await
                .map(matched)
        })
    }

    fn mark_waiting<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        waiting: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, ()> {
        let values = [Bytes(waiting.as_bytes()), Text(owner), micros(ttl)];
        let query = bound(&self.sql.mark_waiting, &values);
        Box::pin(query.execute(conn).map_ok(drop))
    }

    fn unmark_waiting<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        _name: &'c str,
        waiting: &'c str,
        owner: Option<&'c str>,
    ) -> Answer<'c, ()> {
        let values = [Bytes(waiting.as_bytes()), MaybeText(owner)];
        let query = bound(&self.sql.unmark_waiting, &values);
        Box::pin(query.execute(conn).map_ok(drop))
    }
}
