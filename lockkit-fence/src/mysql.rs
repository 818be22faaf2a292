//! MySQL and MariaDB: the `lockkit_fences` table and the `lockkit_fence`
//! function.
//!
//! [`install`] creates both (what `lockkit fence install` does); any client
//! then fences a write by calling the function in the write's transaction:
//!
//! ```sql
//! START TRANSACTION;
//! SELECT lockkit_fence('reports/daily', 42);  -- an error on a stale token
//! UPDATE reports SET body = '...' WHERE day = '2026-11-29';
//! COMMIT;
//! ```
//!
//! The error ends a `mariadb`/`mysql` script, which then closes its session
//! and so rolls the transaction back; a program rolls back itself when the
//! call fails (InnoDB undoes only the failed statement by itself). The
//! function keeps the resource's row locked until the transaction ends, so
//! fenced writes to one resource commit in token order.
//!
//! The fence can also ride in the write's own statement, which saves the
//! round trip of a separate `SELECT`; the statement then fails (writing
//! nothing) on a stale token, and [`refusal`] turns that failure into
//! [`FenceError::Stale`]. An `UPDATE` that finds its row by key carries it
//! in its `WHERE`, the cheapest form: MariaDB calls the function for each
//! row the key finds (a call after the first admits the same token again),
//! and not at all when the key finds none, in which case nothing is
//! written either. Any other write carries it in a derived table, which
//! runs it once whatever the statement reads (at a cost: the server
//! materialises the table):
//!
//! ```sql
//! UPDATE reports SET body = ? WHERE day = ? AND lockkit_fence(?, ?) IS NOT NULL;
//! UPDATE reports JOIN (SELECT lockkit_fence(?, ?) AS admitted) AS fence
//!     SET body = ? WHERE day = ?;
//! ```
//!
//! Not in the `WHERE` of a statement that scans: MariaDB would call the
//! function for every row it reads.
//!
//! A server that writes a binary log accepts the function only from a user
//! with SUPER or with `log_bin_trust_function_creators = 1`.

use lockkit_core::FencingToken;
use sqlx::mysql::{MySqlConnection, MySqlPool};
use sqlx::{Connection, Executor};

use crate::error::{FenceError, Result};
use crate::resource::{check_resource, sql_token};
use crate::sql::Dialect;

const STORE: &str = "mysql";

const DIALECT: Dialect = Dialect {
    store: STORE,
    module: "mysql",
    stale: |e| e.message().starts_with(STALE_MESSAGE),
    missing: |e| e.message().contains("lockkit_fence does not exist"),
};

/// The start of the function's message for a stale token (SQLSTATE 45000).
pub const STALE_MESSAGE: &str = "lockkit_fence: stale token";

/// What [`install`] runs, in order (also printed by
/// `lockkit fence install --print`, there with `DELIMITER` lines for the
/// command-line client). Idempotent.
pub const INSTALL: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS lockkit_fences (
    resource VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    token BIGINT NOT NULL,
    admitted_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE = InnoDB",
    "DROP FUNCTION IF EXISTS lockkit_fence",
    "CREATE FUNCTION lockkit_fence(
    fence_resource VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    fence_token BIGINT
) RETURNS BIGINT NOT DETERMINISTIC MODIFIES SQL DATA
BEGIN
    DECLARE greatest_token BIGINT DEFAULT NULL;
    DECLARE refusal VARCHAR(512);
    -- The common case first: the resource has a row and the token is at
    -- least its greatest. The update reads the latest version (whatever the
    -- transaction's snapshot) and locks the row. Bad input matches no row
    -- (no row has an empty name or a negative token), nor does a stale
    -- token, nor the same token within the same microsecond on a
    -- connection that counts changed rows: the full check below follows.
    UPDATE lockkit_fences SET token = fence_token, admitted_at = CURRENT_TIMESTAMP(6)
        WHERE resource = fence_resource AND token <= fence_token;
    IF ROW_COUNT() > 0 THEN
        RETURN fence_token;
    END IF;
    IF fence_resource IS NULL OR CHAR_LENGTH(fence_resource) = 0 OR LENGTH(fence_resource) > 255 THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'lockkit_fence: the resource must be 1 to 255 bytes';
    END IF;
    IF fence_token IS NULL OR fence_token < 0 THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'lockkit_fence: the token must be a number from 0';
    END IF;
    -- A new resource, or a refusal to explain: the upsert admits a token
    -- at least the greatest, changes nothing for a smaller one, and locks
    -- the row either way; the locking read (the latest version) then sees
    -- the greatest token, which a stale one is below.
    INSERT INTO lockkit_fences (resource, token) VALUES (fence_resource, fence_token)
        ON DUPLICATE KEY UPDATE
            admitted_at = IF(token <= VALUES(token), CURRENT_TIMESTAMP(6), admitted_at),
            token = IF(token <= VALUES(token), VALUES(token), token);
    SELECT token INTO greatest_token FROM lockkit_fences WHERE resource = fence_resource FOR UPDATE;
    IF fence_token < greatest_token THEN
        SET refusal = CONCAT('lockkit_fence: stale token ', fence_token, ' for resource \"',
            fence_resource, '\": greatest admitted ', greatest_token);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = refusal;
    END IF;
    RETURN fence_token;
END",
];

/// Creates the table and the function, idempotently; concurrent installs
/// wait for each other.
pub async fn install(pool: &MySqlPool) -> Result<()> {
    let mut conn = pool.acquire().await.map_err(failed)?;
    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK('lockkit_fence install', 30)")
        .fetch_one(&mut *conn)
        .await
        .map_err(failed)?;
    if got != Some(1) {
        return Err(FenceError::store(
            STORE,
            "another `lockkit fence install` held its lock for 30 s",
            None,
        ));
    }
    let mut outcome = Ok(());
    for statement in INSTALL {
        if let Err(error) = conn.execute(*statement).await {
            outcome = Err(install_failed(error));
            break;
        }
    }
    let _ = conn
        .execute("DO RELEASE_LOCK('lockkit_fence install')")
        .await;
    if outcome.is_ok() {
        tracing::debug!("lockkit_fence installed on mysql");
    }
    outcome
}

/// Admits `token` for `resource` on `conn`, normally inside the transaction
/// that makes the write (pass `&mut tx`): `Ok` records it, and the resource
/// stays locked until that transaction ends; [`FenceError::Stale`] means a
/// newer holder wrote: roll the transaction back.
///
/// ```no_run
/// # async fn f(pool: sqlx::MySqlPool, token: lockkit_core::FencingToken) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// lockkit_fence::mysql::admit(&mut tx, "reports/daily", token).await?;
/// sqlx::query("UPDATE reports SET body = ? WHERE day = ?")
///     .bind("...").bind("2026-11-29").execute(&mut *tx).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn admit(conn: &mut MySqlConnection, resource: &str, token: FencingToken) -> Result<()> {
    check_resource(resource)?;
    let value = sql_token(token, STORE)?;
    let answer = sqlx::query("SELECT lockkit_fence(?, ?)")
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
pub fn refusal(error: sqlx::Error, resource: &str, token: FencingToken) -> FenceError {
    DIALECT.refusal(error, resource, token)
}

/// Admits `token` for `resource` in a transaction of its own (what
/// `lockkit fence check` does): records it, or refuses it as stale.
pub async fn check(pool: &MySqlPool, resource: &str, token: FencingToken) -> Result<()> {
    let mut conn = pool.acquire().await.map_err(failed)?;
    let mut tx = conn.begin().await.map_err(failed)?;
    admit(&mut tx, resource, token).await?;
    tx.commit().await.map_err(failed)
}

fn install_failed(error: sqlx::Error) -> FenceError {
    let binlog = matches!(&error, sqlx::Error::Database(e) if e.message().contains("log_bin_trust_function_creators"));
    if binlog {
        return FenceError::store(
            STORE,
            "the server writes a binary log: install as a user with SUPER, or set \
             log_bin_trust_function_creators = 1",
            Some(Box::new(error) as _),
        );
    }
    failed(error)
}

fn failed(error: sqlx::Error) -> FenceError {
    DIALECT.failed(error)
}
