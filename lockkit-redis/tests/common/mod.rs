//! What the Redis test files share: their locks' options, a client of a
//! URL, and holdings that must succeed.
#![allow(dead_code, reason = "each test file uses some of these")]

use std::time::Duration;

use lockkit_core::{DistributedLock, LockGuard, LockOptions};
use lockkit_redis::RedisLock;

/// A 30 s lease: longer than any test's holding.
pub(crate) fn opts() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(30))
}

/// A client of `url`; a test fails at once when it cannot connect.
pub(crate) async fn connect(url: &str) -> RedisLock {
    lockkit_redis::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

/// One try on the free `name`: granted, or the test fails.
pub(crate) async fn take(locks: &RedisLock, name: &str, opts: &LockOptions) -> LockGuard {
    locks
        .try_acquire(name, opts)
        .await
        .unwrap()
        .expect("the lock is free")
}

/// One acquire and release of `name` that must both succeed.
pub(crate) async fn cycle(locks: &RedisLock, name: &str) {
    let guard = locks.acquire(name, &opts()).await.unwrap();
    guard.release().await.unwrap();
}

/// One try and release of the free `name` that must both succeed.
pub(crate) async fn try_cycle(locks: &RedisLock, name: &str) {
    take(locks, name, &opts()).await.release().await.unwrap();
}
