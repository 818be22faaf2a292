//! SQLite: lease rows in a database file shared by the processes of one host.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{Attempt, FencingToken, Result};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{AssertSqlSafe, ConnectOptions, Sqlite};

use crate::config::Settings;
use crate::pool::{KeptPool, kept, undo_release};
use crate::statement::{millis, q};

/// Milliseconds since the Unix epoch by SQLite's clock, stable within one
/// statement.
const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// The statements of one lock table, built once from the validated table name.
#[derive(Debug)]
pub(crate) struct SqliteSql {
    acquire: Arc<str>,
    remaining: Arc<str>,
    extend: Arc<str>,
    release: Arc<str>,
    migrate: String,
}

impl SqliteSql {
    /// `table` must have passed [`validate_table`](crate::validate_table).
    pub(crate) fn new(table: &str) -> Self {
        SqliteSql {
            acquire: format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) VALUES (?1, ?2, 1, {NOW_MS} + ?3) \
                 ON CONFLICT (name) DO UPDATE \
                     SET owner = excluded.owner, fence = fence + 1, expires_at = excluded.expires_at \
                     WHERE expires_at <= {NOW_MS} \
                 RETURNING fence"
            )
            .into(),
            remaining: format!("SELECT MAX(0, expires_at - {NOW_MS}) FROM {table} WHERE name = ?1")
                .into(),
            extend: format!(
                "UPDATE {table} SET expires_at = {NOW_MS} + ?3 \
                 WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS}"
            )
            .into(),
            release: format!(
                "UPDATE {table} SET owner = NULL, expires_at = {NOW_MS} \
                 WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS}"
            )
            .into(),
            migrate: format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                    name TEXT NOT NULL PRIMARY KEY, \
                    owner TEXT, \
                    fence INTEGER NOT NULL, \
                    expires_at INTEGER NOT NULL)"
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
        .bounded(
            "create the lock table",
            sqlx::query(AssertSqlSafe(sql.migrate.as_str())).execute(&mut conn),
        )
        .await
        .map(|_| ())
}

pub(crate) async fn try_lock(
    pool: &KeptPool<Sqlite>,
    sql: &Arc<SqliteSql>,
    settings: &Settings,
    name: &str,
    owner: &str,
    ttl: Duration,
) -> Result<Attempt<Option<FencingToken>>> {
    let undo = undo_release!(settings, sql, name, owner, release_on);
    let fence: Option<i64> = kept!(pool, settings, "acquire", undo = undo, |conn| {
        sqlx::query_scalar(q(&sql.acquire))
            .bind(name)
            .bind(owner)
            .bind(millis(ttl))
            .fetch_optional(conn)
    })?;
    if let Some(fence) = fence {
        return Ok(Attempt::Acquired(Some(FencingToken::new(fence as u64))));
    }
    let remaining: Option<i64> = kept!(pool, settings, "read the holder's lease", |conn| {
        sqlx::query_scalar(q(&sql.remaining))
            .bind(name)
            .fetch_optional(conn)
    })?;
    Ok(Attempt::Busy {
        retry_after: remaining.map(|ms| Duration::from_millis(ms.max(0) as u64)),
    })
}

pub(crate) async fn extend(
    pool: &KeptPool<Sqlite>,
    sql: &SqliteSql,
    settings: &Settings,
    name: &str,
    owner: &str,
    ttl: Duration,
) -> Result<bool> {
    let done = kept!(pool, settings, "extend", |conn| {
        sqlx::query(q(&sql.extend))
            .bind(name)
            .bind(owner)
            .bind(millis(ttl))
            .execute(conn)
    })?;
    Ok(done.rows_affected() == 1)
}

pub(crate) async fn release(
    pool: &KeptPool<Sqlite>,
    sql: &SqliteSql,
    settings: &Settings,
    name: &str,
    owner: &str,
) -> Result<bool> {
    kept!(pool, settings, "release", |conn| release_on(
        conn, sql, name, owner
    ))
}

/// The release statement on one connection: `Ok(false)` when the lease was
/// not `owner`'s (any more).
async fn release_on(
    conn: &mut sqlx::SqliteConnection,
    sql: &SqliteSql,
    name: &str,
    owner: &str,
) -> sqlx::Result<bool> {
    let done = sqlx::query(q(&sql.release))
        .bind(name)
        .bind(owner)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}
