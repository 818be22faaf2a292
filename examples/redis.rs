//! A single Redis server: `SET NX PX` leases renewed by a watchdog, fencing
//! tokens from the server's clock and a counter, and the lease-lost signal
//! around the guarded work.
//!
//! ```sh
//! cargo run --example redis -- redis://127.0.0.1:6379
//! ```

#![allow(clippy::print_stdout)] // an example talks to its user

use std::time::Duration;

use lockkit::redis::RedisLockBuilder;
use lockkit::{DistributedLock, LockError, LockOptions};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let locks = RedisLockBuilder::from_url(&url)?
        // Keys are `<prefix><name>`; an empty prefix shares locks with
        // redis-py, redsync and node-redlock clients of the same name.
        .prefix("example:")
        .connect_timeout(Duration::from_secs(2))
        .command_timeout(Duration::from_millis(500))
        .connect()
        .await?;

    // A short lease, renewed every ttl/3 while the guard lives.
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(3))
        .wait_for(Duration::from_secs(5));
    let guard = locks.acquire("stock/sku-42", &opts).await?;
    let token = guard.fencing_token().expect("Redis fences");
    println!("holding stock/sku-42 with fencing token {token}");

    // The work outlives several leases; the watchdog keeps the lock, and if
    // it ever cannot, `lost()` stops the work before someone else's starts.
    tokio::select! {
        reason = guard.lost() => println!("lock lost ({reason}); stopping"),
        () = tokio::time::sleep(Duration::from_secs(4)) => println!("work done, lock still held: {}", !guard.is_lost()),
    }
    println!("status: {}", locks.status("stock/sku-42").await?);
    guard.release().await?;
    println!("released");
    Ok(())
}
