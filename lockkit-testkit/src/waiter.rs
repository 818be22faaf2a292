//! A waiter that polls only every 10 s, for tests that show a release
//! reaches a waiting client by a notification (a poll would come too late).

use std::time::Duration;

use lockkit_core::{Backoff, DistributedLock, LockGuard, LockOptions, Result};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A 30 s lease, waited for up to 20 s, tried again only every 10 s unless
/// a notification comes first.
pub fn patient() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_for(Duration::from_secs(20))
        .backoff(Backoff::new(
            Duration::from_secs(10),
            Duration::from_secs(10),
        ))
}

/// `lock.acquire(name, &patient())` in a task of its own: the answer, and
/// when it came.
pub fn spawn_patient_acquire(
    lock: impl DistributedLock + 'static,
    name: &str,
) -> JoinHandle<(Result<LockGuard>, Instant)> {
    let name = name.to_owned();
    tokio::spawn(async move {
        let guard = lock.acquire(&name, &patient()).await;
        (guard, Instant::now())
    })
}

/// Releases `held` and waits for the waiting `task`: its guard, and how long
/// after the release it returned. Panics if the waiter failed.
pub async fn hand_over(
    held: LockGuard,
    task: JoinHandle<(Result<LockGuard>, Instant)>,
) -> (LockGuard, Duration) {
    let released = Instant::now();
    held.release().await.expect("the holder releases");
    let (guard, acquired) = task.await.expect("the waiting task");
    let guard = guard.unwrap_or_else(|e| panic!("the waiter's acquire: {e}"));
    (guard, acquired.saturating_duration_since(released))
}
