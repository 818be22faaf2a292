//! Many tasks contending for one lock, watched by a probe that notices
//! overlapping critical sections and lost updates.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use lockkit_core::{DistributedLock, LockOptions};
use tokio::task::JoinHandle;

/// A shared resource for mutual-exclusion tests: it counts how often two
/// critical sections were inside at once, and keeps a counter whose
/// read-modify-write loses updates when they interleave.
#[derive(Clone, Debug, Default)]
pub struct Probe {
    inside: Arc<AtomicU32>,
    overlaps: Arc<AtomicU32>,
    counter: Arc<AtomicU64>,
}

impl Probe {
    /// One critical section: enter, read the counter, yield, write it back + 1, leave.
    pub async fn critical_section(&self) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let seen = self.counter.load(Ordering::SeqCst);
        tokio::task::yield_now().await;
        self.counter.store(seen + 1, Ordering::SeqCst);
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    /// How many critical sections completed (if none overlapped).
    pub fn completed(&self) -> u64 {
        self.counter.load(Ordering::SeqCst)
    }

    /// How many critical sections started while another was inside.
    pub fn overlaps(&self) -> u32 {
        self.overlaps.load(Ordering::SeqCst)
    }
}

/// Spawns `tasks_per_client` tasks on every client; each runs `rounds`
/// critical sections of `probe` under the lock `name`, acquired with `opts`.
/// A failed acquire or release panics the task (and so fails its join).
pub fn spawn_contenders(
    clients: &[Arc<dyn DistributedLock>],
    tasks_per_client: usize,
    rounds: u64,
    name: &str,
    opts: &LockOptions,
    probe: &Probe,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for client in clients {
        for _ in 0..tasks_per_client {
            let (client, name, opts, probe) =
                (client.clone(), name.to_owned(), opts.clone(), probe.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..rounds {
                    let guard = client
                        .acquire(&name, &opts)
                        .await
                        .unwrap_or_else(|e| panic!("acquire under contention: {e}"));
                    probe.critical_section().await;
                    guard
                        .release()
                        .await
                        .unwrap_or_else(|e| panic!("release under contention: {e}"));
                }
            }));
        }
    }
    tasks
}
