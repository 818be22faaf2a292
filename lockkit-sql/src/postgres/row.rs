//! `row` mode's statements on PostgreSQL: the name's gate, then its row.

use std::sync::Arc;

use futures_util::TryFutureExt as _;
use lockkit_core::Capabilities;
use lockkit_core::backend::Intent;
use sqlx::Postgres;

use super::session::{PgConn, PgSession};
use super::statements::gate_halves;
use crate::error::is_deadlock;
use crate::session::{LockingSql, RowLocking, ServerWait};
use crate::settings::PG_ROW_CAPABILITIES;
use crate::statement::{Answer, Bind as _, Runs as _, Value, Value::Int, Value::Text, trusted};

impl RowLocking for PgSession {
    type Db = Postgres;
    const CAPABILITIES: Capabilities = PG_ROW_CAPABILITIES;

    fn connection(conn: &mut PgConn) -> &mut sqlx::PgConnection {
        &mut conn.conn
    }

    fn set_wait<'c>(&'c self, conn: &'c mut PgConn, wait: ServerWait) -> Answer<'c, ()> {
        Box::pin(self.set_lock_timeout(conn, wait))
    }

    fn locking(&self) -> &LockingSql {
        &self.sql.row
    }

    fn delete_sql(&self) -> &Arc<str> {
        &self.sql.row_release
    }

    /// The name, and its gate's two halves (see the statements; the status
    /// statement binds them too).
    fn row_values(name: &str) -> Vec<Value<'_>> {
        let (high, low) = gate_halves(name);
        vec![Text(name), Int(high.into()), Int(low.into())]
    }

    /// One statement after the other, as a hand-written cycle sends them;
    /// the upsert's `ON CONFLICT DO NOTHING` never waits for a holder's row
    /// lock. A deadlock of the upsert is left to the locking `SELECT`, which
    /// finds the row missing and makes it again.
    fn begin_and_select<'c>(
        &'c self,
        conn: &'c mut PgConn,
        name: &'c str,
        intent: Intent,
        shared: bool,
    ) -> Answer<'c, Option<i64>> {
        Box::pin(async move {
            let made = sqlx::query(trusted(&self.sql.make_row))
                .bind_all(&[Text(name)])
                .execute(&mut conn.conn)
                .await;
            match made {
                Err(error) if !is_deadlock(&error) => return Err(error),
                _ => {}
            }
            sqlx::raw_sql("BEGIN").execute(&mut conn.conn).await?;
            let sql = self.locking().form(shared, intent);
            Postgres::number(&mut conn.conn, (sql, &Self::row_values(name))).await
        })
    }

    fn select_free<'c>(
        &'c self,
        conn: &'c mut PgConn,
        names: &'c [String],
    ) -> Answer<'c, Option<(String, i64)>> {
        let query = sqlx::query_as(trusted(&self.sql.row_free_slot)).bind(names);
        Box::pin(query.fetch_optional(&mut conn.conn))
    }

    /// Two round trips: `BEGIN`, then [`select_free`](RowLocking::select_free)
    /// of the one slot (its row is not made first: Postgres has no upsert
    /// that gives up at once on a held row without a statement of its own).
    fn begin_and_select_slot<'c>(
        &'c self,
        conn: &'c mut PgConn,
        slot: &'c [String],
    ) -> Answer<'c, Option<i64>> {
        Box::pin(async move {
            sqlx::raw_sql("BEGIN").execute(&mut conn.conn).await?;
            Ok(self.select_free(conn, slot).await?.map(|(_, token)| token))
        })
    }

    fn ensure_rows<'c>(&'c self, names: &'c [String]) -> Answer<'c, ()> {
        let query = sqlx::query(trusted(&self.sql.ensure_rows)).bind(names);
        Box::pin(query.execute(&self.pool).map_ok(drop))
    }

    /// And the waiters queued for its gate.
    fn row_state<'c>(&'c self, name: &'c str) -> Answer<'c, (bool, Option<usize>)> {
        let values = Self::row_values(name);
        let query =
            sqlx::query_as::<_, (bool, i64)>(trusted(&self.sql.row_status)).bind_all(&values);
        Box::pin(
            query
                .fetch_one(&self.pool)
                .map_ok(|(held, waiting)| (held, Some(waiting.max(0) as usize))),
        )
    }
}
