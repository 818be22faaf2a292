//! The fenced write: why a lock alone is not enough, and how fencing tokens
//! make a stale holder harmless.
//!
//! Holder A takes the lock, then stalls (a GC pause, a stopped VM) past its
//! lease. B takes the lock and writes. When A wakes up it still believes it
//! holds the lock and writes too: with a plain `UPDATE` it would overwrite
//! B's newer data. The resource therefore keeps the highest token it has
//! accepted and refuses a write with a lower one:
//!
//! ```sql
//! UPDATE inventory SET quantity = $1, fence = $2 WHERE sku = $3 AND fence < $2
//! ```
//!
//! ```sh
//! cargo run --example fenced_write --features postgres -- postgres://user:pass@127.0.0.1/db
//! ```

#![allow(clippy::print_stdout)] // an example talks to its user

use std::time::Duration;

use lockkit::{FencingToken, LockOptions};
use sqlx::PgPool;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    // Locks as lease rows in the same database (any fencing backend works).
    let locks = lockkit::connect(&url).await?;
    let db = PgPool::connect(&url).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS lockkit_example_inventory \
         (sku text PRIMARY KEY, quantity int NOT NULL, fence bigint NOT NULL)",
    )
    .execute(&db)
    .await?;
    sqlx::query(
        "INSERT INTO lockkit_example_inventory VALUES ('sku-42', 100, 0) \
         ON CONFLICT (sku) DO UPDATE SET quantity = 100, fence = 0",
    )
    .execute(&db)
    .await?;

    // A holds a short lease and will not renew it: it is about to stall.
    let short = LockOptions::new()
        .ttl(Duration::from_millis(500))
        .auto_renew(false);
    let a = locks.acquire("inventory/sku-42", &short).await?;
    let a_token = a.fencing_token().expect("a fencing backend");
    println!("A holds the lock with token {a_token}, then stalls");
    tokio::time::sleep(Duration::from_millis(800)).await;

    // Meanwhile the lease ran out and B took over.
    let b = locks
        .acquire("inventory/sku-42", &LockOptions::new())
        .await?;
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

/// The fenced write: applied only if `token` is newer than every token the
/// row has seen.
async fn write(db: &PgPool, quantity: i32, token: FencingToken) -> Result<bool, BoxError> {
    let done = sqlx::query(
        "UPDATE lockkit_example_inventory SET quantity = $1, fence = $2 \
         WHERE sku = 'sku-42' AND fence < $2",
    )
    .bind(quantity)
    .bind(i64::try_from(token.get())?)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}
