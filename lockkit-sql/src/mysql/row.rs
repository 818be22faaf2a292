//! `row` mode's statements on MySQL and MariaDB.
//!
//! A lock's attempt sends the row's insert (where it is missing), `BEGIN`
//! and the locking `SELECT` in one message: an uncontended cycle takes
//! three round trips with the release's two, where one statement at a time
//! takes five. Statements sent several at once bind nothing (the text
//! protocol): the name goes in as a hexadecimal literal (see
//! [`hex_literal`]).

use std::sync::Arc;

use lockkit_core::Capabilities;
use lockkit_core::backend::Intent;
use sqlx::{AssertSqlSafe, MySqlConnection};

use super::batch::batch;
use super::session::{MyConn, MySqlSession};
use crate::error::{is_deadlock, is_lock_busy};
use crate::names::hex_literal;
use crate::session::{LockingSql, RowLocking, ServerWait};
use crate::settings::MYSQL_ROW_CAPABILITIES;
use crate::statement::{Answer, Bind as _, Value, Value::Bytes, trusted};

/// Each `?` of `sql` replaced by `literal` (every statement of `row` mode
/// binds the row's name alone, once or more).
fn with_name(sql: &str, literal: &str) -> String {
    sql.replace('?', literal)
}

/// `n` comma-separated placeholders.
fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

impl RowLocking for MySqlSession {
    type Db = sqlx::MySql;
    const CAPABILITIES: Capabilities = MYSQL_ROW_CAPABILITIES;

    fn connection(conn: &mut MyConn) -> &mut MySqlConnection {
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

    /// One round trip: the row made if it is missing, `BEGIN` and the
    /// locking `SELECT`. An upsert's duplicate check would wait for a
    /// holder's row lock: an attempt that waits inserts from a plain read
    /// that finds no row (on the lock's connection, which reads committed
    /// rows and takes no gap locks), and so does a try on MySQL; a try on
    /// MariaDB sends an upsert that gives up at once (a row held is a row
    /// that exists); see `MySql::make_row`. An insert that found the row
    /// held (or deadlocked) stops the message before `BEGIN`: a second one
    /// sends `BEGIN` and the `SELECT`, which waits for the holder.
    fn begin_and_select<'c>(
        &'c self,
        conn: &'c mut MyConn,
        name: &'c str,
        intent: Intent,
        shared: bool,
    ) -> Answer<'c, Option<i64>> {
        let form = self.locking().form(shared, intent);
        Box::pin(self.make_begin_and_select(conn, name, self.sql.make_row(intent), form))
    }

    /// One round trip, as [`begin_and_select`](RowLocking::begin_and_select):
    /// the slot's row made if it is missing, `BEGIN` and the slot's locking
    /// `SELECT … SKIP LOCKED`; after an upsert that found the row held (or
    /// deadlocked), a second message with `BEGIN` and the `SELECT`.
    fn begin_and_select_slot<'c>(
        &'c self,
        conn: &'c mut MyConn,
        slot: &'c [String],
    ) -> Answer<'c, Option<i64>> {
        let make = self.sql.make_row(Intent::Try);
        Box::pin(self.make_begin_and_select(conn, &slot[0], make, &self.sql.row_free_one))
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

    /// With a sequence the `SELECT` drew the token (without tokens, it
    /// answered 1). With the counter it is drawn now, on the pool, so the
    /// counter's row lock is not held for the whole holding and a rollback
    /// cannot undo it.
    fn granted<'c>(&'c self, _conn: &'c mut MyConn, token: i64) -> Answer<'c, i64> {
        Box::pin(async move {
            if !self.sql.draws_after_grant() {
                return Ok(token);
            }
            let mut conn = self.pool.acquire().await?;
            self.next_fence(&mut conn).await.map(|n| n as i64)
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

impl MySqlSession {
    /// `name`'s row made if it is missing, `BEGIN` and `select` (a locking
    /// `SELECT` of that row, `?` its name), in one message: the first
    /// column of its row. `make` (see `MySql::make_row`) that found the row
    /// held (or deadlocked) stops the message before `BEGIN`: a second one
    /// sends `BEGIN` and the `SELECT`.
    async fn make_begin_and_select(
        &self,
        conn: &mut MyConn,
        name: &str,
        make: &str,
        select: &str,
    ) -> sqlx::Result<Option<i64>> {
        let literal = hex_literal(name);
        let select = with_name(select, &literal);
        let make = with_name(make, &literal);
        let first = batch(&mut conn.conn, format!("{make}; BEGIN; {select}")).await;
        match &first.error {
            // The insert's: no transaction began.
            Some(error) if first.done == 0 && (is_lock_busy(error) || is_deadlock(error)) => {
                batch(&mut conn.conn, format!("BEGIN; {select}"))
                    .await
                    .answer()
            }
            _ => first.answer(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mysql::statements::{FenceSource, MySql};

    /// The statements sent in one message: each `?` is the row's name,
    /// and none sits inside a quoted string.
    #[test]
    fn every_placeholder_of_a_batched_statement_is_the_name() {
        let forms = [FenceSource::Sequence, FenceSource::Counter]
            .into_iter()
            .flat_map(|source| [(source, true), (source, false)]);
        for (source, tokens) in forms {
            let sql = MySql::new("lockkit_locks", source, tokens);
            let mut texts = Vec::new();
            for intent in [Intent::Wait, Intent::Try] {
                texts.push(sql.make_row(intent).to_string());
                for shared in [false, true] {
                    texts.push(sql.row.form(shared, intent).to_string());
                }
            }
            for text in texts {
                let outside_quotes: String = text.split('\'').step_by(2).collect();
                assert_eq!(
                    outside_quotes.matches('?').count(),
                    text.matches('?').count(),
                    "{text}"
                );
                let named = with_name(&text, &hex_literal("jobs"));
                assert!(!named.contains('?'), "{named}");
                assert!(named.contains("X'6a6f6273'"), "{named}");
            }
        }
    }
}
