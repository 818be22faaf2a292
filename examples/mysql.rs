//! MySQL/MariaDB named locks (`GET_LOCK`): a short lower-case name is used
//! verbatim, so other programs' `GET_LOCK('nightly-export', …)` is the same
//! lock; other names map to `LK#` + base32 of their SHA-256.
//!
//! ```sh
//! cargo run --example mysql --features mysql -- mysql://root@127.0.0.1:3306/app
//! ```

#![allow(clippy::print_stdout)] // an example talks to its user

use std::time::Duration;

use lockkit::sql::{Mode, SqlLockBuilder, named_lock_name};
use lockkit::{DistributedLock, LockError, LockOptions};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "mysql://root@127.0.0.1:3306/test".to_owned());
    let locks = SqlLockBuilder::from_url(&url)?
        .mode(Mode::Named)
        .connect()
        .await?;
    for name in ["nightly-export", "Nightly-Export"] {
        println!("GET_LOCK name of {name:?}: {}", named_lock_name(name));
    }
    let opts = LockOptions::new().wait_for(Duration::from_secs(5));
    let guard = locks.acquire("nightly-export", &opts).await?;
    println!(
        "holding nightly-export, fencing token {}",
        guard.fencing_token().expect("named locks fence")
    );
    println!("status: {}", locks.status("nightly-export").await?);
    guard.release().await?;
    println!(
        "status after release: {}",
        locks.status("nightly-export").await?
    );
    Ok(())
}
