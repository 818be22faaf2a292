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

/// A short outage (shorter than the lease) costs renewals, not the lease.
#[tokio::test]
async fn renewal_retries_through_a_short_outage() {
    let store = MemoryStore::new();
    let a = MemoryLock::with_store(store.clone());
    let b = MemoryLock::with_store(store.clone());
    let guard = a
        .acquire(
            "outage",
            &LockOptions::new().ttl(Duration::from_millis(600)),
        )
        .await
        .unwrap();
    store.set_available(false);
    tokio::time::sleep(Duration::from_millis(300)).await; // a renewal was due at 200 ms
    store.set_available(true);
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!guard.is_lost());
    assert!(
        b.try_acquire("outage", &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    guard.release().await.unwrap();
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
