//! ZooKeeper: ephemeral sequential nodes, each waiter watching only its
//! predecessor, so waiters are served in the order they asked (FIFO) and a
//! release wakes exactly one of them.
//!
//! ```sh
//! cargo run --example zookeeper --features zk -- zk://127.0.0.1:2181/lockkit-example
//! ```

#![allow(clippy::print_stdout)] // an example talks to its user

use std::sync::Arc;
use std::time::Duration;

use lockkit::zk::ZkLockBuilder;
use lockkit::{DistributedLock, LockError, LockOptions};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "zk://127.0.0.1:2181/lockkit-example".to_owned());
    let connect = || async {
        ZkLockBuilder::from_url(&url)?
            // The server frees a crashed holder's lock this long after its
            // session went silent.
            .session_timeout(Duration::from_secs(6))
            .connect()
            .await
    };
    let holder = connect().await?;
    let opts = LockOptions::new().wait_for(Duration::from_secs(30));
    let guard = holder.acquire("deploy", &opts).await?;
    println!(
        "holder has deploy, fencing token (czxid) {}",
        guard.fencing_token().expect("ZooKeeper fences")
    );

    // Three waiters on their own sessions, queued in order 1, 2, 3.
    let mut waiters = Vec::new();
    for n in 1..=3 {
        let client = Arc::new(connect().await?);
        let opts = opts.clone();
        waiters.push(tokio::spawn(async move {
            let guard = client.acquire("deploy", &opts).await?;
            println!("waiter {n} got deploy");
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.release().await
        }));
        // Let each waiter queue before the next one asks.
        while holder.status("deploy").await?.waiters != Some(n) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    println!("status: {}", holder.status("deploy").await?);
    guard.release().await?;
    for waiter in waiters {
        waiter.await.expect("waiter panicked")?;
    }
    println!("all served in order");
    Ok(())
}
