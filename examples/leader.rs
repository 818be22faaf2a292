//! One replica leads, the others stand by: three candidates campaign for
//! one election, each leads for a while, then resigns; the next one takes
//! over in a later term. An observer prints every hand-over.
//!
//! Here the candidates are tasks with their own clients; in production they
//! are processes on different machines with the same URL. Any backend
//! works: every built-in one records holder identities, which `leader()`
//! reads back.
//!
//! ```sh
//! cargo run --example leader                            # in-process memory://
//! cargo run --example leader -- redis://127.0.0.1:6379  # real candidates share a server
//! ```

#![allow(clippy::print_stdout)] // an example talks to its user

use std::sync::Arc;
use std::time::Duration;

use lockkit::{DistributedLock, Election, LockOptions};

const TERMS_EACH: u32 = 2;

#[tokio::main]
async fn main() -> lockkit::Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".to_owned());
    let name = "example/scheduler";
    let observer = Election::new(lockkit::connect(&url).await?, name, "observer");
    let mut leader = observer.observe(Duration::from_millis(50));
    let watch = tokio::spawn(async move {
        while leader.changed().await.is_ok() {
            match leader.borrow_and_update().as_deref() {
                Some(who) => println!("observer: {who} leads"),
                None => println!("observer: nobody leads"),
            }
        }
    });

    let mut candidates = Vec::new();
    for id in ["replica-a", "replica-b", "replica-c"] {
        let locks: Arc<dyn DistributedLock> = lockkit::connect(&url).await?;
        let election = Election::new(locks, name, id);
        candidates.push(tokio::spawn(async move {
            let opts = LockOptions::new().ttl(Duration::from_secs(5));
            for _ in 0..TERMS_EACH {
                let leadership = election.campaign(&opts).await?;
                let term = leadership.term().map_or("-".to_owned(), |t| t.to_string());
                println!("{id}: leading in term {term}");
                // The leader's work; it would stop at once if
                // `leadership.lost()` fired.
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(300)) => {}
                    reason = leadership.lost() => println!("{id}: lost the lead ({reason})"),
                }
                leadership.resign().await?;
                // Give the others a turn before campaigning again.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok::<_, lockkit::LockError>(())
        }));
    }
    for candidate in candidates {
        candidate.await.expect("a candidate")?;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    watch.abort();
    Ok(())
}
