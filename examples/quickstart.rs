//! The quickstart: two workers share one counter under a lock.
//!
//! ```sh
//! cargo run --example quickstart                       # in-process backend
//! cargo run --example quickstart -- redis://127.0.0.1   # a real Redis server
//! ```

#![allow(clippy::print_stdout)] // an example talks to its user

use std::sync::Arc;
use std::time::Duration;

use lockkit::{LockError, LockOptions};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".to_owned());
    let locks = lockkit::connect(&url).await?;
    println!("connected to {}", lockkit::redact_url(&url));
    println!("capabilities: {:?}", locks.capabilities());

    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_for(Duration::from_secs(5));
    let counter = Arc::new(tokio::sync::Mutex::new(0u64));
    let mut workers = Vec::new();
    for worker in 0..2 {
        let (locks, opts, counter) = (locks.clone(), opts.clone(), counter.clone());
        workers.push(tokio::spawn(async move {
            for _ in 0..3 {
                let guard = locks.acquire("quickstart/counter", &opts).await?;
                let mut value = counter.lock().await;
                *value += 1;
                println!(
                    "worker {worker} holds the lock (fencing token {}), counter = {value}",
                    guard
                        .fencing_token()
                        .map_or("none".to_owned(), |t| t.to_string())
                );
                drop(value);
                guard.release().await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    for worker in workers {
        worker.await.expect("worker panicked")?;
    }
    println!("done: counter = {}", counter.lock().await);
    Ok(())
}
