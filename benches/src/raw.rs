//! The hand-written Redis commands a lock cycle is compared with, and the
//! lockkit cycle itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use lockkit_core::{DistributedLock, LockOptions};
use redis::aio::ConnectionManager;

/// Compare-and-delete, as the raw floor's release.
pub const RAW_RELEASE: &str =
    "if redis.call('GET',KEYS[1])==ARGV[1] then return redis.call('DEL',KEYS[1]) else return 0 end";

/// The raw floor's lock: `SET key token NX PX ttl`, released by the
/// [`RAW_RELEASE`] script sent with `EVALSHA`.
#[derive(Debug)]
pub struct RawLock {
    script: redis::Script,
    counter: AtomicUsize,
}

impl Default for RawLock {
    fn default() -> Self {
        RawLock {
            script: redis::Script::new(RAW_RELEASE),
            counter: AtomicUsize::new(0),
        }
    }
}

impl RawLock {
    /// A redis-rs `ConnectionManager` to `url`, with the release script
    /// loaded there (so that the measured `EVALSHA`s never miss).
    pub async fn connect(&self, url: &str) -> ConnectionManager {
        let client = redis::Client::open(url).expect("a redis URL");
        let mut conn = ConnectionManager::new(client)
            .await
            .expect("a redis connection");
        self.script
            .prepare_invoke()
            .load_async(&mut conn)
            .await
            .expect("SCRIPT LOAD");
        conn
    }

    /// A fresh owner token.
    pub fn token(&self) -> String {
        format!("raw-{:016x}", self.counter.fetch_add(1, Ordering::Relaxed))
    }

    /// `SET key token NX PX ttl`; whether it was set.
    pub async fn set_nx_px(
        conn: &ConnectionManager,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> bool {
        let mut conn = conn.clone();
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query_async(&mut conn)
            .await
            .expect("SET NX PX");
        set.is_some()
    }

    /// The compare-and-delete by `EVALSHA`; 1 when it deleted the key.
    pub async fn compare_and_delete(
        &self,
        conn: &ConnectionManager,
        key: &str,
        token: &str,
    ) -> i64 {
        let mut conn = conn.clone();
        self.script
            .key(key)
            .arg(token)
            .invoke_async(&mut conn)
            .await
            .expect("EVALSHA")
    }
}

impl RawLock {
    /// The Redlock floor: `SET key token NX PX ttl` on every instance at
    /// once, then the compare-and-delete by `EVALSHA` on every instance at
    /// once (panics unless the key was free and deleted everywhere).
    pub async fn parallel_cycle(&self, conns: &[ConnectionManager], key: &str, ttl: Duration) {
        let token = self.token();
        let set = join_all(
            conns
                .iter()
                .map(|conn| RawLock::set_nx_px(conn, key, &token, ttl)),
        )
        .await;
        assert!(
            set.iter().all(|set| *set),
            "raw parallel cycle: {key:?} was not free everywhere: {set:?}"
        );
        let deleted = join_all(
            conns
                .iter()
                .map(|conn| self.compare_and_delete(conn, key, &token)),
        )
        .await;
        assert!(
            deleted.iter().all(|d| *d == 1),
            "raw parallel cycle: compare-and-delete of {key:?} missed: {deleted:?}"
        );
    }
}

/// One `PING` round trip.
pub async fn ping(conn: &ConnectionManager) {
    redis::cmd("PING")
        .query_async::<String>(&mut conn.clone())
        .await
        .expect("PING");
}

/// One lockkit cycle: `acquire` + `release` of `name` (panics if either fails).
pub async fn lockkit_cycle(
    locks: &(impl DistributedLock + ?Sized),
    name: &str,
    opts: &LockOptions,
) {
    let guard = locks.acquire(name, opts).await.expect("acquire");
    guard.release().await.expect("release");
}
