//! PostgreSQL: the `lockkit_fences` table and the `lockkit_fence` function.
//!
//! [`install`] creates both (what `lockkit fence install` does); any client
//! then fences a write by calling the function in the write's transaction:
//!
//! ```sql
//! BEGIN;
//! SELECT lockkit_fence('reports/daily', 42);  -- raises on a stale token
//! UPDATE reports SET body = '...' WHERE day = '2026-11-29';
//! COMMIT;
//! ```
//!
//! The function takes the resource's row lock until the transaction ends, so
//! fenced writes to one resource commit in token order: a token-10
//! transaction that waits behind a committed token-11 one is refused.
//!
//! The fence can also ride in the write's own statement, which saves the
//! round trip of a separate `SELECT`: the function runs once, as a row
//! source, and the statement fails (writing nothing) on a stale token.
//! [`refusal`] turns that failure into [`FenceError::Stale`]:
//!
//! ```sql
//! UPDATE reports SET body = $3 FROM lockkit_fence($1, $2) AS fence WHERE day = $4;
//! INSERT INTO events (body) SELECT $3 FROM lockkit_fence($1, $2) AS fence;
//! ```

use lockkit_core::FencingToken;
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{Connection, Executor};

use crate::error::{FenceError, Result};
use crate::resource::{check_resource, sql_token};
use crate::sql::Dialect;

const STORE: &str = "postgres";

const DIALECT: Dialect = Dialect {
    store: STORE,
    module: "postgres",
    stale: |e| e.code().as_deref() == Some(STALE_SQLSTATE),
    missing: |e| e.code().as_deref() == Some("42883"),
};

/// The SQLSTATE the function raises for a stale token.
pub const STALE_SQLSTATE: &str = "LKF01";

/// What [`install`] runs, in order (also printed by
/// `lockkit fence install --print`). Idempotent.
pub const INSTALL: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS lockkit_fences (
    resource varchar(255) PRIMARY KEY,
    token bigint NOT NULL,
    admitted_at timestamptz NOT NULL DEFAULT now()
)",
    r#"CREATE OR REPLACE FUNCTION lockkit_fence(fence_resource text, fence_token bigint)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $lockkit$
DECLARE
    greatest_token bigint;
BEGIN
    -- The common case first: the resource has a row and the token is at
    -- least its greatest. The update locks the row and, under READ
    -- COMMITTED, judges the latest version of a row another transaction
    -- changed meanwhile. Bad input matches no row (no row has an empty
    -- name or a negative token), nor does a stale token, nor a row
    -- committed after this statement's snapshot: the full check follows.
    UPDATE lockkit_fences SET token = fence_token, admitted_at = now()
        WHERE resource = fence_resource AND token <= fence_token;
    IF FOUND THEN
        RETURN fence_token;
    END IF;
    IF fence_resource IS NULL OR length(fence_resource) = 0 OR octet_length(fence_resource) > 255 THEN
        RAISE EXCEPTION 'lockkit_fence: the resource must be 1 to 255 bytes' USING ERRCODE = '22023';
    END IF;
    IF fence_token IS NULL OR fence_token < 0 THEN
        RAISE EXCEPTION 'lockkit_fence: the token must be a number from 0' USING ERRCODE = '22023';
    END IF;
    INSERT INTO lockkit_fences AS f (resource, token) VALUES (fence_resource, fence_token)
    ON CONFLICT (resource) DO UPDATE SET token = excluded.token, admitted_at = now()
        WHERE f.token <= excluded.token
    RETURNING f.token INTO greatest_token;
    IF NOT FOUND THEN
        SELECT f.token INTO greatest_token FROM lockkit_fences f WHERE f.resource = fence_resource;
        RAISE EXCEPTION 'lockkit_fence: stale token % for resource "%": greatest admitted %',
            fence_token, fence_resource, greatest_token
            USING ERRCODE = 'LKF01', HINT = 'a newer holder of the lock wrote; roll the transaction back';
    END IF;
    RETURN fence_token;
END
$lockkit$"#,
];

/// Creates the table and the function, idempotently; concurrent installs
/// wait for each other.
pub async fn install(pool: &PgPool) -> Result<()> {
    let mut tx = pool.begin().await.map_err(failed)?;
    tx.execute("SELECT pg_advisory_xact_lock(hashtext('lockkit_fence install'))")
        .await
        .map_err(failed)?;
    for statement in INSTALL {
        tx.execute(*statement).await.map_err(failed)?;
    }
    tx.commit().await.map_err(failed)?;
    tracing::debug!("lockkit_fence installed on postgres");
    Ok(())
}

/// Admits `token` for `resource` on `conn`, normally inside the transaction
/// that makes the write (pass `&mut tx`): `Ok` records it, and the resource
/// stays locked until that transaction ends; [`FenceError::Stale`] means a
/// newer holder wrote, and the transaction is aborted (roll it back).
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool, token: lockkit_core::FencingToken) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// lockkit_fence::postgres::admit(&mut tx, "reports/daily", token).await?;
/// sqlx::query("UPDATE reports SET body = $1 WHERE day = $2")
///     .bind("...").bind("2026-11-29").execute(&mut *tx).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn admit(conn: &mut PgConnection, resource: &str, token: FencingToken) -> Result<()> {
    check_resource(resource)?;
    let value = sql_token(token, STORE)?;
    let answer = sqlx::query("SELECT lockkit_fence($1, $2)")
        .bind(resource)
        .bind(value)
        .execute(conn)
        .await;
    answer
        .map(drop)
        .map_err(|error| refusal(error, resource, token))
}

/// What a failed fenced statement means: [`FenceError::Stale`] when
/// `lockkit_fence` refused `token` (the statement wrote nothing; roll the
/// transaction back), a [`FenceError::Store`] naming the fix when the
/// function is missing, and the store's failure otherwise.
///
/// ```no_run
/// # async fn f(tx: &mut sqlx::PgConnection, token: lockkit_core::FencingToken) -> Result<(), lockkit_fence::FenceError> {
/// use lockkit_fence::postgres::refusal;
///
/// sqlx::query("UPDATE reports SET body = $3 FROM lockkit_fence($1, $2) AS fence WHERE day = $4")
///     .bind("reports/daily")
///     .bind(lockkit_fence::bigint(token)?)
///     .bind("...")
///     .bind("2026-11-29")
///     .execute(tx)
///     .await
///     .map_err(|error| refusal(error, "reports/daily", token))?;
/// # Ok(()) }
/// ```
pub fn refusal(error: sqlx::Error, resource: &str, token: FencingToken) -> FenceError {
    DIALECT.refusal(error, resource, token)
}

/// Admits `token` for `resource` in a transaction of its own (what
/// `lockkit fence check` does): records it, or refuses it as stale.
pub async fn check(pool: &PgPool, resource: &str, token: FencingToken) -> Result<()> {
    let mut conn = pool.acquire().await.map_err(failed)?;
    let mut tx = conn.begin().await.map_err(failed)?;
    admit(&mut tx, resource, token).await?;
    tx.commit().await.map_err(failed)
}

fn failed(error: sqlx::Error) -> FenceError {
    DIALECT.failed(error)
}
