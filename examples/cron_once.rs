//! Run a scheduled job once per slot across replicas.
//!
//! Every replica runs the same schedule. At each slot they all try the
//! slot's own lock (`report/<slot>`) without waiting; the one that gets it
//! runs the job and releases, and `min_hold` keeps the name taken on the
//! server until the slot is over, so a replica whose clock runs late
//! cannot take the slot again after a fast job finished. The others skip
//! the slot.
//!
//! Here three replicas are tasks with their own clients; in production they
//! are processes on different machines with the same URL. Any backend
//! works; the embedded SQLite default needs no server.
//!
//! ```sh
//! cargo run --example cron_once                            # SQLite in a temp dir
//! cargo run --example cron_once -- redis://127.0.0.1:6379  # real replicas share a server
//! ```

#![allow(clippy::print_stdout)] // an example talks to its user

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use lockkit::{DistributedLock, LockError, LockOptions};
use tokio::time::{Instant, sleep_until};

const SLOTS: u64 = 3;
const SLOT: Duration = Duration::from_millis(600);

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let dir = std::env::temp_dir().join(format!("lockkit-cron-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| format!("sqlite://{}", dir.join("cron.db").display()));

    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..SLOTS).map(|_| AtomicU32::new(0)).collect());
    let start = Instant::now();
    let mut replicas = Vec::new();
    for replica in 1..=3 {
        let locks = lockkit::connect(&url).await?;
        let runs = runs.clone();
        replicas.push(tokio::spawn(async move {
            for slot in 0..SLOTS {
                let slot_start = start + SLOT * slot as u32;
                // Replicas' clocks never agree exactly.
                sleep_until(slot_start + Duration::from_millis(fastrand_ms(replica, slot))).await;
                run_slot(locks.as_ref(), replica, slot, &runs).await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    for replica in replicas {
        replica.await.expect("replica panicked")?;
    }
    for (slot, count) in runs.iter().enumerate() {
        println!(
            "slot {slot}: the report ran {} time(s)",
            count.load(Ordering::SeqCst)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// One replica's turn at one slot.
async fn run_slot(
    locks: &dyn DistributedLock,
    replica: u32,
    slot: u64,
    runs: &[AtomicU32],
) -> Result<(), LockError> {
    // Taken for the whole slot, however soon the job ends; nobody waits.
    let opts = LockOptions::new()
        .min_hold(SLOT - Duration::from_millis(50))
        .no_wait();
    let Some(guard) = locks.try_acquire(&format!("report/{slot}"), &opts).await? else {
        println!("slot {slot}: replica {replica} skips, another replica has it");
        return Ok(());
    };
    println!("slot {slot}: replica {replica} runs the report");
    runs[slot as usize].fetch_add(1, Ordering::SeqCst);
    // The job is done; the server keeps the name until the slot is over.
    guard.release().await
}

/// A small, replica-specific clock skew (0–90 ms).
fn fastrand_ms(replica: u32, slot: u64) -> u64 {
    (u64::from(replica) * 37 + slot * 53) % 90
}
