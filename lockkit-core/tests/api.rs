//! Compile-time and behavioural checks of the public API's promises.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{
    Capabilities, DistributedLock, FencingToken, LockError, LockGuard, LockOptions, LostReason,
    MemoryLock, MemoryStore, ReleaseOnCrash,
};

fn send_sync_static<T: Send + Sync + 'static>() {}
fn send_future<F: Future + Send>(f: F) -> F {
    f
}

#[test]
fn thread_safety_promises() {
    send_sync_static::<LockGuard>();
    send_sync_static::<LockError>();
    send_sync_static::<Arc<dyn DistributedLock>>();
    send_sync_static::<LostReason>();
    send_sync_static::<Capabilities>();
    send_sync_static::<ReleaseOnCrash>();
    send_sync_static::<FencingToken>();
}

#[tokio::test]
async fn every_method_future_is_send() {
    let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::with_store(MemoryStore::new()));
    let opts = LockOptions::new();
    let guard = send_future(locks.acquire("send", &opts)).await.unwrap();
    assert!(
        send_future(locks.try_acquire("send", &opts))
            .await
            .unwrap()
            .is_none()
    );
    send_future(guard.extend(Duration::from_secs(5)))
        .await
        .unwrap();
    // `lost()` is Send + 'static: it can be spawned.
    let lost = tokio::spawn(guard.lost());
    send_future(guard.release()).await.unwrap();
    lost.abort();
}

/// A short outage (shorter than the lease) costs renewals, not the lease:
/// the watchdog retries often enough to catch the end of it.
#[tokio::test]
async fn renewal_retries_through_a_short_outage() {
    let store = MemoryStore::new();
    let a = MemoryLock::with_store(store.clone());
    let b = MemoryLock::with_store(store.clone());
    let ttl = Duration::from_millis(1500);
    let guard = a
        .acquire("outage", &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    store.outage(true);
    tokio::time::sleep(ttl / 3 + Duration::from_millis(300)).await; // a renewal falls into it
    store.outage(false);
    tokio::time::sleep(ttl).await; // past the validity the lost renewal would have given
    assert!(!guard.is_lost());
    assert!(
        b.try_acquire("outage", &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    guard.release().await.unwrap();
}

/// Renewal retries are paced by the lease, not by a fixed backoff: with a
/// 600 ms lease they come at most 60 ms apart, so every one of ten guards
/// renews within 100 ms of an outage's end (with retries up to a second apart,
/// most would miss the rest of their validity).
#[tokio::test(start_paused = true)]
async fn renewal_retries_are_paced_by_the_lease() {
    let store = MemoryStore::new();
    let a = MemoryLock::with_store(store.clone());
    let ttl = Duration::from_millis(600);
    let mut guards = Vec::new();
    for i in 0..10 {
        guards.push(
            a.acquire(&format!("pace-{i}"), &LockOptions::new().ttl(ttl))
                .await
                .unwrap(),
        );
    }
    store.outage(true);
    // The renewals due at 200 ms fail and are retried until the outage ends.
    tokio::time::sleep(Duration::from_millis(450)).await;
    store.outage(false);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    assert_eq!(lost, 0, "{lost} of 10 guards missed the end of the outage");
    tokio::time::sleep(ttl).await;
    assert!(guards.iter().all(|g| !g.is_lost()));
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// Dropping a guard outside any runtime does not panic; the lease then ends
/// with its TTL instead of at once.
#[test]
fn guard_dropped_outside_a_runtime_ends_with_its_ttl() {
    let store = MemoryStore::new();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ttl = Duration::from_millis(300);
    let guard = runtime
        .block_on(
            MemoryLock::with_store(store.clone())
                .acquire("outside", &LockOptions::new().ttl(ttl).auto_renew(false)),
        )
        .unwrap();
    drop(runtime);
    drop(guard);
    assert!(
        store.holder("outside").is_some(),
        "no runtime, so no release"
    );
    std::thread::sleep(ttl + Duration::from_millis(50));
    assert!(store.holder("outside").is_none(), "the TTL ends it");
}
