//! SQLite: lease rows in a database file shared by the processes of one host.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::backend::Attempt;
use lockkit_core::{Capabilities, FencingToken, Result};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{AssertSqlSafe, ConnectOptions, Sqlite, SqliteConnection};

use crate::lease::{Answer, LeaseDialect, LiveRow};
use crate::settings::{POLLED_LEASE_CAPABILITIES, Settings};
use crate::statement::{millis, q};

/// Milliseconds since the Unix epoch by SQLite's clock, stable within one
/// statement.
const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// The statements of one lock table, built once from the validated table name.
#[derive(Debug)]
pub(crate) struct SqliteSql {
    acquire: Arc<str>,
    remaining: Arc<str>,
    status: Arc<str>,
    hand_over: Arc<str>,
    extend: Arc<str>,
    release: Arc<str>,
    share: Arc<str>,
    share_remaining: Arc<str>,
    extend_share: Arc<str>,
    leave: Arc<str>,
    leave_last: Arc<str>,
    mark_waiting: Arc<str>,
    unmark_waiting: Arc<str>,
    migrate: String,
}

/// The prefix of a reader group's owner (see the `lease` module).
const GROUP: &str = "(char(1) || 'r')";

/// The reader count in a group's `owner`.
const COUNT: &str = "CAST(substr(owner, instr(owner, ':') + 1) AS INTEGER)";

/// Whether the row is a reader group that started at or before `?2`.
const IN_GROUP: &str = "substr(owner, 1, 2) = (char(1) || 'r') \
    AND CAST(substr(owner, 3, instr(owner, ':') - 3) AS INTEGER) <= ?2";

impl SqliteSql {
    /// `table` must have passed [`validate_table`](crate::validate_table).
    ///
    /// Released rows are deleted. Tokens come from the table's high-water
    /// mark, `<table>_fence`, which triggers raise to every token stored:
    /// the next token is one above it, so a name's row made afresh still
    /// counts on from every earlier token. (SQLite runs one write at a
    /// time, and a statement's read and write are one step.)
    pub(crate) fn new(table: &str) -> Self {
        let fence = format!("{table}_fence");
        let next = format!("(SELECT n + 1 FROM {fence} WHERE id = 1)");
        SqliteSql {
            acquire: format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) VALUES (?1, ?2, {next}, {NOW_MS} + ?3) \
                 ON CONFLICT (name) DO UPDATE \
                     SET owner = excluded.owner, fence = excluded.fence, expires_at = excluded.expires_at \
                     WHERE expires_at <= {NOW_MS} \
                 RETURNING fence"
            )
            .into(),
            remaining: format!("SELECT MAX(0, expires_at - {NOW_MS}) FROM {table} WHERE name = ?1")
                .into(),
            hand_over: format!(
                "UPDATE {table} SET owner = ?3, fence = {next}, expires_at = {NOW_MS} + ?4 \
                 WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS} \
                 RETURNING fence"
            )
            .into(),
            status: format!(
                "SELECT fence, expires_at - {NOW_MS}, owner FROM {table} WHERE name = ?1 AND expires_at > {NOW_MS}"
            )
            .into(),
            // Readers: see the `lease` module. `?3`: the waiting record's row.
            share: format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) \
                 SELECT ?1, {GROUP} || t.f || ':1', t.f, {NOW_MS} + ?2 FROM (SELECT {next} AS f) AS t \
                 WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE name = ?3 AND expires_at > {NOW_MS}) \
                 ON CONFLICT (name) DO UPDATE \
                     SET owner = CASE WHEN expires_at <= {NOW_MS} THEN excluded.owner \
                             ELSE substr(owner, 1, instr(owner, ':')) || ({COUNT} + 1) END, \
                         fence = excluded.fence, \
                         expires_at = MAX(expires_at, excluded.expires_at) \
                     WHERE expires_at <= {NOW_MS} OR substr(owner, 1, 2) = {GROUP} \
                 RETURNING fence"
            )
            .into(),
            share_remaining: format!(
                "SELECT MAX(0, MAX(expires_at) - {NOW_MS}) FROM {table} WHERE name IN (?1, ?2)"
            )
            .into(),
            extend_share: format!(
                "UPDATE {table} SET expires_at = MAX(expires_at, {NOW_MS} + ?3) \
                 WHERE name = ?1 AND expires_at > {NOW_MS} AND {IN_GROUP}"
            )
            .into(),
            leave_last: format!(
                "DELETE FROM {table} WHERE name = ?1 AND expires_at > {NOW_MS} AND {IN_GROUP} AND {COUNT} = 1"
            )
            .into(),
            leave: format!(
                "UPDATE {table} \
                 SET owner = CASE WHEN {COUNT} > 1 THEN substr(owner, 1, instr(owner, ':')) || ({COUNT} - 1) END, \
                     expires_at = CASE WHEN {COUNT} > 1 THEN expires_at ELSE {NOW_MS} END \
                 WHERE name = ?1 AND expires_at > {NOW_MS} AND {IN_GROUP}"
            )
            .into(),
            mark_waiting: format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) VALUES (?1, ?2, 0, {NOW_MS} + ?3) \
                 ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at"
            )
            .into(),
            unmark_waiting: format!("DELETE FROM {table} WHERE name = ?1 AND owner = COALESCE(?2, owner)").into(),
            extend: format!(
                "UPDATE {table} SET expires_at = {NOW_MS} + ?3 \
                 WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS}"
            )
            .into(),
            release: format!(
                "DELETE FROM {table} WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS}"
            )
            .into(),
            // The high-water mark starts at the highest token stored (a
            // table of an earlier version keeps a token per row).
            migrate: format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                    name TEXT NOT NULL PRIMARY KEY, \
                    owner TEXT, \
                    fence INTEGER NOT NULL, \
                    expires_at INTEGER NOT NULL); \
                 CREATE TABLE IF NOT EXISTS {fence} (\
                    id INTEGER NOT NULL PRIMARY KEY CHECK (id = 1), \
                    n INTEGER NOT NULL); \
                 INSERT OR IGNORE INTO {fence} (id, n) SELECT 1, COALESCE(MAX(fence), 0) FROM {table}; \
                 CREATE TRIGGER IF NOT EXISTS {table}_fence_insert AFTER INSERT ON {table} \
                 BEGIN UPDATE {fence} SET n = MAX(n, NEW.fence) WHERE id = 1; END; \
                 CREATE TRIGGER IF NOT EXISTS {table}_fence_update AFTER UPDATE OF fence ON {table} \
                 BEGIN UPDATE {fence} SET n = MAX(n, NEW.fence) WHERE id = 1; END;"
            ),
        }
    }
}

/// Creates the lock table if it is missing, on a connection of its own.
pub(crate) async fn migrate(
    options: &SqliteConnectOptions,
    sql: &SqliteSql,
    settings: &Settings,
) -> Result<()> {
    let mut conn = settings
        .connecting("open the database", options.connect())
        .await?;
    settings
        .migrating(sqlx::raw_sql(AssertSqlSafe(sql.migrate.as_str())).execute(&mut conn))
        .await
        .map(|_| ())
}

/// `lease` mode on SQLite.
#[derive(Debug)]
pub(crate) struct SqliteLease {
    pub(crate) sql: Arc<SqliteSql>,
}

impl LeaseDialect for SqliteLease {
    type Db = Sqlite;
    const CAPABILITIES: Capabilities = POLLED_LEASE_CAPABILITIES;

    /// The upsert, and when it did not take the lease, the holder's
    /// remaining lease in a second statement on the same connection.
    fn acquire<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        name: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Attempt<Option<FencingToken>>> {
        Box::pin(async move {
            let fence: Option<i64> = sqlx::query_scalar(q(&self.sql.acquire))
                .bind(name)
                .bind(owner)
                .bind(millis(ttl))
                .fetch_optional(&mut *conn)
                .await?;
            if let Some(fence) = fence {
                return Ok(Attempt::Acquired(Some(FencingToken::new(fence as u64))));
            }
            let remaining: Option<i64> = sqlx::query_scalar(q(&self.sql.remaining))
                .bind(name)
                .fetch_optional(conn)
                .await?;
            Ok(Attempt::Busy {
                retry_after: remaining.map(|ms| Duration::from_millis(ms.max(0) as u64)),
            })
        })
    }

    fn extend<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        name: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, bool> {
        Box::pin(async move {
            let done = sqlx::query(q(&self.sql.extend))
                .bind(name)
                .bind(owner)
                .bind(millis(ttl))
                .execute(conn)
                .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn release<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        name: &'c str,
        owner: &'c str,
    ) -> Answer<'c, bool> {
        Box::pin(async move {
            let done = sqlx::query(q(&self.sql.release))
                .bind(name)
                .bind(owner)
                .execute(conn)
                .await?;
            Ok(done.rows_affected() == 1)
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
        Box::pin(
            sqlx::query_scalar(q(&self.sql.hand_over))
                .bind(name)
                .bind(from)
                .bind(to)
                .bind(millis(ttl))
                .fetch_optional(conn),
        )
    }

    fn status<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        name: &'c str,
    ) -> Answer<'c, Option<LiveRow>> {
        Box::pin(
            sqlx::query_as(q(&self.sql.status))
                .bind(name)
                .fetch_optional(conn),
        )
    }

    /// The upsert, and when it did not join, the longer of the row's and
    /// the waiting record's remaining lease in a second statement.
    fn share<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        name: &'c str,
        waiting: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Attempt<Option<FencingToken>>> {
        Box::pin(async move {
            let fence: Option<i64> = sqlx::query_scalar(q(&self.sql.share))
                .bind(name)
                .bind(millis(ttl))
                .bind(waiting)
                .fetch_optional(&mut *conn)
                .await?;
            if let Some(fence) = fence {
                return Ok(Attempt::Acquired(Some(FencingToken::new(fence as u64))));
            }
            let remaining: Option<i64> = sqlx::query_scalar(q(&self.sql.share_remaining))
                .bind(name)
                .bind(waiting)
                .fetch_one(conn)
                .await?;
            Ok(Attempt::Busy {
                retry_after: remaining.map(|ms| Duration::from_millis(ms.max(0) as u64)),
            })
        })
    }

    fn extend_share<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        name: &'c str,
        token: i64,
        ttl: Duration,
    ) -> Answer<'c, bool> {
        Box::pin(async move {
            let done = sqlx::query(q(&self.sql.extend_share))
                .bind(name)
                .bind(token)
                .bind(millis(ttl))
                .execute(conn)
                .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn leave<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        name: &'c str,
        token: i64,
    ) -> Answer<'c, bool> {
        Box::pin(async move {
            // The last reader deletes the row; the others count it down.
            let done = sqlx::query(q(&self.sql.leave_last))
                .bind(name)
                .bind(token)
                .execute(&mut *conn)
                .await?;
            if done.rows_affected() == 1 {
                return Ok(true);
            }
            let done = sqlx::query(q(&self.sql.leave))
                .bind(name)
                .bind(token)
                .execute(conn)
                .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn mark_waiting<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        waiting: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, ()> {
        Box::pin(async move {
            sqlx::query(q(&self.sql.mark_waiting))
                .bind(waiting)
                .bind(owner)
                .bind(millis(ttl))
                .execute(conn)
                .await
                .map(drop)
        })
    }

    fn unmark_waiting<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        _name: &'c str,
        waiting: &'c str,
        owner: Option<&'c str>,
    ) -> Answer<'c, ()> {
        Box::pin(async move {
            sqlx::query(q(&self.sql.unmark_waiting))
                .bind(waiting)
                .bind(owner)
                .execute(conn)
                .await
                .map(drop)
        })
    }
}
