//! SQLite: the `lockkit_fences` table and the rule, through the Rust API
//! (SQLite has no stored functions).
//!
//! SQLite lets one writer at a time into a database, so fenced writes to a
//! resource are serialised by the write transaction itself; begin it with
//! `BEGIN IMMEDIATE` (sqlx: `pool.begin_with("BEGIN IMMEDIATE")`) so that it
//! waits for the write lock up front instead of failing on upgrade.

use lockkit_core::FencingToken;
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use sqlx::{Connection, Executor};

use crate::error::{FenceError, Result};
use crate::resource::{check_resource, sql_token};

const STORE: &str = "sqlite";

/// What [`install`] runs. Idempotent.
pub const INSTALL: &[&str] = &["CREATE TABLE IF NOT EXISTS lockkit_fences (
    resource TEXT PRIMARY KEY NOT NULL,
    token INTEGER NOT NULL,
    admitted_at INTEGER NOT NULL
)"];

/// Creates the table, idempotently.
pub async fn install(pool: &SqlitePool) -> Result<()> {
    for statement in INSTALL {
        pool.execute(*statement).await.map_err(failed)?;
    }
    Ok(())
}

/// Admits `token` for `resource` on `conn`, normally inside the transaction
/// that makes the write (pass `&mut tx`): `Ok` records it;
/// [`FenceError::Stale`] means a newer holder wrote (nothing was changed;
/// roll the transaction back).
///
/// ```no_run
/// # async fn f(pool: sqlx::SqlitePool, token: lockkit_core::FencingToken) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
/// lockkit_fence::sqlite::admit(&mut tx, "reports/daily", token).await?;
/// sqlx::query("UPDATE reports SET body = ? WHERE day = ?")
///     .bind("...").bind("2026-11-29").execute(&mut *tx).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn admit(conn: &mut SqliteConnection, resource: &str, token: FencingToken) -> Result<()> {
    check_resource(resource)?;
    let value = sql_token(token, STORE)?;
    let admitted: Option<i64> = sqlx::query_scalar(
        "INSERT INTO lockkit_fences (resource, token, admitted_at) \
         VALUES (?1, ?2, CAST(unixepoch('subsec') * 1000 AS INTEGER)) \
         ON CONFLICT (resource) DO UPDATE SET token = excluded.token, admitted_at = excluded.admitted_at \
         WHERE lockkit_fences.token <= excluded.token \
         RETURNING token",
    )
    .bind(resource)
    .bind(value)
    .fetch_optional(&mut *conn)
    .await
    .map_err(failed)?;
    if admitted.is_some() {
        return Ok(());
    }
    let greatest: i64 = sqlx::query_scalar("SELECT token FROM lockkit_fences WHERE resource = ?1")
        .bind(resource)
        .fetch_one(&mut *conn)
        .await
        .map_err(failed)?;
    Err(FenceError::stale(
        resource,
        token,
        u64::try_from(greatest).unwrap_or(0),
    ))
}

/// Admits `token` for `resource` in a transaction of its own (what
/// `lockkit fence check` does): records it, or refuses it as stale.
pub async fn check(pool: &SqlitePool, resource: &str, token: FencingToken) -> Result<()> {
    let mut conn = pool.acquire().await.map_err(failed)?;
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(failed)?;
    admit(&mut tx, resource, token).await?;
    tx.commit().await.map_err(failed)
}

fn failed(error: sqlx::Error) -> FenceError {
    let message = match &error {
        sqlx::Error::Database(e) if e.message().contains("no such table: lockkit_fences") => {
            "the lockkit_fences table is missing: run `lockkit fence install --url URL` \
             (or lockkit_fence::sqlite::install)"
                .to_owned()
        }
        other => other.to_string(),
    };
    FenceError::store(STORE, message, Some(Box::new(error) as _))
}
