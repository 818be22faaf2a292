//! PostgreSQL advisory locks: the server queues the waiters, the lock lives
//! as long as its dedicated connection, and tokens come from a sequence.
//! `?mode=lease` (rows with a TTL) and `?mode=row` (`SELECT … FOR UPDATE`)
//! work the same way.
//!
//! ```sh
//! cargo run --example postgres --features postgres -- postgres://user:pass@127.0.0.1/db
//! ```

#![allow(clippy::print_stdout)] // an example talks to its user

use std::time::Duration;

use lockkit::sql::{Mode, SqlLockBuilder};
use lockkit::{DistributedLock, LockError, LockOptions};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let connect = || async {
        SqlLockBuilder::from_url(&url)?
            .mode(Mode::Advisory)
            // How often a held lock's connection is checked; a dead one
            // fires the guard's lost signal.
            .liveness_interval(Duration::from_millis(500))
            .connect()
            .await
    };
    let (a, b) = (connect().await?, connect().await?);
    println!(
        "advisory key of \"migrate\": {}",
        lockkit::sql::advisory_key("migrate")
    );

    let guard = a.acquire("migrate", &LockOptions::new()).await?;
    println!(
        "a holds migrate, fencing token {}",
        guard.fencing_token().expect("a sequence fences")
    );
    // b waits on the server (pg_advisory_lock with a lock_timeout), not by polling.
    let waiting = tokio::spawn(async move {
        let opts = LockOptions::new().wait_for(Duration::from_secs(10));
        let guard = b.acquire("migrate", &opts).await?;
        println!(
            "b got migrate, fencing token {}",
            guard.fencing_token().expect("fenced")
        );
        guard.release().await
    });
    while a.status("migrate").await?.waiters != Some(1) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("status: {}", a.status("migrate").await?);
    guard.release().await?;
    waiting.await.expect("b panicked")?;
    Ok(())
}
