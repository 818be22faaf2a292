//! Redlock over independent Redis masters: a lease is granted by a majority
//! within its validity (ttl − elapsed − drift), so it survives a minority of
//! servers down. It has no safe fencing token.
//!
//! ```sh
//! cargo run --example redlock --features redlock -- redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003
//! ```

#![allow(clippy::print_stdout)] // an example talks to its user

use std::time::Duration;

use lockkit::redlock::RedlockLockBuilder;
use lockkit::{DistributedLock, LockError, LockOptions};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003".to_owned());
    let locks = RedlockLockBuilder::from_url(&url)?
        // Each instance gets this long to answer; far below the TTL.
        .instance_timeout(Duration::from_millis(50))
        .connect()
        .await?;
    let caps = locks.capabilities();
    println!(
        "survives a minority down: {}, fencing: {}",
        caps.survives_minority_failure, caps.fencing
    );

    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let guard = locks.acquire("billing/run", &opts).await?;
    let valid_for = guard
        .valid_until()
        .map(|until| until.saturating_duration_since(tokio::time::Instant::now()));
    println!("holding billing/run on a quorum, valid for about {valid_for:?}");
    println!("status: {}", locks.status("billing/run").await?);
    guard.release().await?;
    println!("released on every instance");
    Ok(())
}
