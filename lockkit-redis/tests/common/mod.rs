//! What the Redis test files share: the options of their locks, and a
//! client of a URL.

use std::time::Duration;

use lockkit_core::LockOptions;
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
