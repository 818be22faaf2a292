//! The fenced write: why a lock alone is not enough, and how the store's
//! fence makes a stale holder harmless.
//!
//! Holder A takes the lock, then stalls (a GC pause, a stopped VM) past its
//! lease. B takes the lock and writes. When A wakes up it still believes it
//! holds the lock and writes too: with a plain `UPDATE` it would overwrite
//! B's newer data. Here every write runs in a transaction that first calls
//! `lockkit_fence(resource, token)` (through `lockkit::fence::postgres`):
//! the database refuses A's smaller token, and A's transaction rolls back.
//!
//! ```sh
//! cargo run --example fenced_write --features postgres -- postgres://user:pass@127.0.0.1/db
//! ```

#![allow(clippy::print_stdout)] // an example talks to its user

use std::time::Duration;

use lockkit::fence::{self, FenceError};
use lockkit::{FencingToken, LockOptions};
use sqlx::PgPool;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const RESOURCE: &str = "inventory/sku-42";

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    // Locks as lease rows in the same database (any fencing backend works).
    let locks = lockkit::connect(&url).await?;
    let db = PgPool::connect(&url).await?;
    // The fence table and function (what `lockkit fence install` does).
    fence::postgres::install(&db).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS lockkit_example_inventory \
         (sku text PRIMARY KEY, quantity int NOT NULL)",
    )
    .execute(&db)
    .await?;
    sqlx::query(
        "INSERT INTO lockkit_example_inventory VALUES ('sku-42', 100) \
         ON CONFLICT (sku) DO UPDATE SET quantity = 100",
    )
    .execute(&db)
    .await?;

    // A holds a short lease and will not renew it: it is about to stall.
    let short = LockOptions::new()
        .ttl(Duration::from_millis(500))
        .auto_renew(false);
    let a = locks.acquire(RESOURCE, &short).await?;
    let a_token = a.fencing_token().expect("a fencing backend");
    println!("A holds the lock with token {a_token}, then stalls");
    tokio::time::sleep(Duration::from_millis(800)).await;

    // Meanwhile the lease ran out and B took over.
    let b = locks.acquire(RESOURCE, &LockOptions::new()).await?;
    let b_token = b.fencing_token().expect("a fencing backend");
    println!("B holds the lock with token {b_token}");
    println!("B's write accepted: {}", write(&db, 90, b_token).await?);
    b.release().await?;

    // A wakes up and writes as if it still held the lock.
    println!(
        "A's stale write accepted: {}",
        write(&db, 99, a_token).await?
    );
    println!("A's guard says lost: {}", a.is_lost());
    let quantity: i32 =
        sqlx::query_scalar("SELECT quantity FROM lockkit_example_inventory WHERE sku = 'sku-42'")
            .fetch_one(&db)
            .await?;
    println!("quantity is {quantity} (B's write survived)");
    Ok(())
}

/// The fenced write: the fence and the update in one transaction. `false`
/// when the fence refused `token` (a newer holder wrote); the transaction
/// is then rolled back when dropped.
async fn write(db: &PgPool, quantity: i32, token: FencingToken) -> Result<bool, BoxError> {
    let mut tx = db.begin().await?;
    match fence::postgres::admit(&mut tx, RESOURCE, token).await {
        Ok(()) => {}
        Err(FenceError::Stale { greatest, .. }) => {
            println!("  the fence refused token {token}: {greatest} was admitted before");
            return Ok(false);
        }
        Err(error) => return Err(error.into()),
    }
    sqlx::query("UPDATE lockkit_example_inventory SET quantity = $1 WHERE sku = 'sku-42'")
        .bind(quantity)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(true)
}
