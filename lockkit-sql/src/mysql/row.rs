//! `row` mode's statements on MySQL and MariaDB.

use std::sync::Arc;

use lockkit_core::Capabilities;
use sqlx::AssertSqlSafe;

use super::session::{MyConn, MySqlSession};
use super::statements::FenceSource;
use crate::error::is_lock_busy;
use crate::session::{LockingSql, RowLocking, ServerWait};
use crate::settings::MYSQL_ROW_CAPABILITIES;
use crate::statement::{Answer, Bind as _, Value, Value::Bytes, trusted};

/// `n` comma-separated placeholders.
fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

impl RowLocking for MySqlSession {
    type Db = sqlx::MySql;
    const CAPABILITIES: Capabilities = MYSQL_ROW_CAPABILITIES;

    fn connection(conn: &mut MyConn) -> &mut sqlx::MySqlConnection {
        &mut conn.conn
    }

    fn set_wait<'c>(&'c self, conn: &'c mut MyConn, wait: ServerWait) -> Answer<'c, ()> {
        Box::pin(self.set_lock_wait(conn, wait))
    }

    fn locking(&self) -> &LockingSql {
        &self.sql.row
    }

    fn delete_sql(&self) -> &Arc<str> {
        &self.sql.row_delete
    }

    /// Names are `VARBINARY`.
    fn row_values(name: &str) -> Vec<Value<'_>> {
        vec![Bytes(name.as_bytes())]
    }

    /// An upsert's duplicate check would wait for a holder's row lock: on
    /// MariaDB it gives up at once (a row held is a row that exists), on
    /// MySQL the insert comes from a `SELECT` that finds no row, a plain
    /// read on the lock's connection (which reads committed rows and takes
    /// no gap locks). See `MySql::make_row`.
    fn make_missing_row<'c>(&'c self, conn: &'c mut MyConn, name: &'c str) -> Answer<'c, ()> {
        let make = &self.sql.make_row;
        let names = vec![Bytes(name.as_bytes()); make.binds];
        Box::pin(async move {
            match sqlx::query(trusted(&make.text))
                .bind_all(&names)
                .execute(&mut conn.conn)
                .await
            {
                Err(error) if is_lock_busy(&error) => Ok(()),
                made => made.map(drop),
            }
        })
    }

    /// The `IN` list has one placeholder per slot (at most
    /// [`MAX_SLOT_PERMITS`](crate::MAX_SLOT_PERMITS)).
    fn select_free<'c>(
        &'c self,
        conn: &'c mut MyConn,
        names: &'c [String],
    ) -> Answer<'c, Option<(String, i64)>> {
        Box::pin(async move {
            let sql = (self.sql.row_free_slot).replace("{slots}", &placeholders(names.len()));
            let mut query = sqlx::query_as::<_, (Vec<u8>, i64)>(AssertSqlSafe(sql));
            for name in names {
                query = query.bind(name.as_bytes());
            }
            let row = query.fetch_optional(&mut conn.conn).await?;
            row.map(|(name, token)| {
                String::from_utf8(name)
                    .map(|name| (name, token))
                    .map_err(|error| sqlx::Error::Decode(Box::new(error)))
            })
            .transpose()
        })
    }

    /// Only the rows missing from a plain read: InnoDB's duplicate check of
    /// an `INSERT` waits for the row lock of a held slot.
    fn ensure_rows<'c>(&'c self, names: &'c [String]) -> Answer<'c, ()> {
        Box::pin(async move {
            let sql = (self.sql.rows_present).replace("{slots}", &placeholders(names.len()));
            let mut present = sqlx::query_scalar::<_, Vec<u8>>(AssertSqlSafe(sql));
            for name in names {
                present = present.bind(name.as_bytes());
            }
            let present = present.fetch_all(&self.pool).await?;
            let missing: Vec<&String> = names
                .iter()
                .filter(|name| !present.iter().any(|p| p == name.as_bytes()))
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            let rows = vec!["(?, NULL, 0, '1000-01-01 00:00:00')"; missing.len()].join(", ");
            let sql = self.sql.ensure_rows.replace("{rows}", &rows);
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for name in missing {
                query = query.bind(name.as_bytes());
            }
            query.execute(&self.pool).await.map(drop)
        })
    }

    /// With a sequence the `SELECT` drew the token. With the counter it is
    /// drawn now, on the pool, so the counter's row lock is not held for
    /// the whole holding and a rollback cannot undo it.
    fn granted<'c>(&'c self, _conn: &'c mut MyConn, token: i64) -> Answer<'c, i64> {
        Box::pin(async move {
            match self.sql.fence_source {
                FenceSource::Sequence => Ok(token),
                FenceSource::Counter => {
                    let mut conn = self.pool.acquire().await?;
                    self.next_fence(&mut conn).await.map(|n| n as i64)
                }
            }
        })
    }

    /// Whether the row exists and cannot be locked (`FOR UPDATE SKIP
    /// LOCKED`, MySQL 8 / MariaDB 10.6), in a transaction rolled back at
    /// once; the server does not tell the waiters.
    fn row_state<'c>(&'c self, name: &'c str) -> Answer<'c, (bool, Option<usize>)> {
        let name = Self::row_values(name);
        Box::pin(async move {
            let mut tx = self.pool.begin().await?;
            let free: Option<i32> = sqlx::query_scalar(trusted(&self.sql.row_free))
                .bind_all(&name)
                .fetch_optional(&mut *tx)
                .await?;
            let held = match free {
                Some(_) => false,
                None => sqlx::query_scalar::<_, i32>(trusted(&self.sql.row_exists))
                    .bind_all(&name)
                    .fetch_optional(&mut *tx)
                    .await?
                    .is_some(),
            };
            tx.rollback().await?;
            Ok((held, None))
        })
    }
}
