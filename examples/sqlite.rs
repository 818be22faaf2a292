//! The embedded default: lease rows in a SQLite file, no server needed.
//! Every process of the host that opens the same file shares the locks.
//!
//! ```sh
//! cargo run --example sqlite                        # ./lockkit-example.db
//! cargo run --example sqlite -- sqlite:///tmp/x.db  # any path
//! ```

#![allow(clippy::print_stdout)] // an example talks to its user

use std::time::Duration;

use lockkit::sql::SqlLockBuilder;
use lockkit::{DistributedLock, LockError, LockOptions};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sqlite://lockkit-example.db".to_owned());
    // `lockkit::connect(&url)` does the same; the builder reaches the options
    // a URL cannot express as well (table name, timeouts, pool size).
    let locks = SqlLockBuilder::from_url(&url)?
        .table("lockkit_locks")
        .command_timeout(Duration::from_secs(2))
        .connect()
        .await?;
    let opts = LockOptions::new().ttl(Duration::from_secs(10));

    let guard = locks.acquire("invoices/close-month", &opts).await?;
    println!(
        "holding {:?}, fencing token {}",
        guard.name(),
        guard.fencing_token().expect("SQL leases fence")
    );
    println!("status: {}", locks.status("invoices/close-month").await?);

    // A second client (another process would do the same) cannot take it.
    let other = lockkit::connect(&url).await?;
    let busy = other
        .try_acquire("invoices/close-month", &opts.clone().no_wait())
        .await?;
    println!("second client got it: {}", busy.is_some());

    guard.release().await?;
    println!(
        "released; status: {}",
        locks.status("invoices/close-month").await?
    );
    Ok(())
}
