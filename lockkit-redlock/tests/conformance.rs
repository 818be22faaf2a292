//! The conformance suite against Redlock over 3 and over 5 real redis-server
//! processes started by the testkit, and over 3 with barging waiters
//! (`barging=true`).

use std::sync::Arc;
use std::time::Duration;

use lockkit_conformance::{Disposable, Harness};
use lockkit_core::{DistributedLock, Result};
use lockkit_testkit::TestServer;
use lockkit_testkit::{DisposableServer, RedisServer};

const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Deletes KEYS[1] if it holds ARGV[1].
const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// The instances, and the lock's URL parameters beyond the timeouts.
struct Servers(Vec<RedisServer>, &'static str);

impl Servers {
    async fn start(n: usize, params: &'static str) -> Self {
        let mut servers = Vec::with_capacity(n);
        for _ in 0..n {
            servers.push(RedisServer::builder().shiftable_clock(true).start().await);
        }
        Servers(servers, params)
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .0
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        // The suite tests semantics, not the default per-instance timeout (the
        // fault tests do): a debug build on a loaded CI machine is a slow
        // network, for which the docs say to raise it.
        format!(
            "redlock://{}?connect_timeout=500ms&command_timeout=500ms&instance_timeout=250ms{}",
            hosts.join(","),
            self.1
        )
    }

    async fn connect(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(lockkit_redlock::connect(&self.url()).await?))
    }
}

struct RedlockHarness {
    servers: Servers,
}

impl RedlockHarness {
    async fn start(n: usize, params: &'static str) -> Self {
        RedlockHarness {
            servers: Servers::start(n, params).await,
        }
    }
}

#[async_trait::async_trait]
impl Harness for RedlockHarness {
    async fn client(&self) -> Arc<dyn DistributedLock> {
        self.servers.connect().await.expect("connect")
    }

    /// Deletes the holder's key where it holds it: the value a quorum of
    /// instances agree on, compared and deleted on each. (A plain `DEL` on
    /// every instance could delete the next holder's key on an instance it
    /// took while this one's deletes were under way.)
    async fn revoke(&self, name: &str) {
        let key = format!("{}{name}", lockkit_redis::DEFAULT_PREFIX);
        let quorum = self.servers.0.len() / 2 + 1;
        let mut values = Vec::new();
        for server in &self.servers.0 {
            values.push(server.command(&["GET", &key]).await.expect("GET"));
        }
        let holder = values
            .iter()
            .find(|value| {
                *value != "(nil)" && values.iter().filter(|other| other == value).count() >= quorum
            })
            .unwrap_or_else(|| panic!("no holder of {name:?} on a quorum: {values:?}"))
            .clone();
        let mut deleted = 0;
        for server in &self.servers.0 {
            let answer = server
                .command(&["EVAL", COMPARE_AND_DELETE, "1", &key, &holder])
                .await
                .expect("compare and delete");
            if answer == "1" {
                deleted += 1;
            }
        }
        assert!(deleted >= quorum, "only {deleted} instances held {name:?}");
    }

    async fn disposable(&self) -> Box<dyn Disposable> {
        let servers = Servers::start(self.servers.0.len(), self.servers.1).await;
        let url = servers.url();
        Box::new(DisposableServer::new(
            servers.0,
            url,
            lockkit_redlock::DRIVER,
        ))
    }

    fn connect_timeout(&self) -> Duration {
        CONNECT_TIMEOUT
    }

    async fn stored_entries(&self, prefix: &str) -> usize {
        let mut count = 0;
        for server in &self.servers.0 {
            count += server
                .count_keys(&format!("*{prefix}*"))
                .await
                .expect("count keys");
        }
        count
    }
}

mod three {
    use super::*;
    lockkit_conformance::conformance_suite!(RedlockHarness::start(3, "").await);
}

mod five {
    use super::*;
    lockkit_conformance::conformance_suite!(RedlockHarness::start(5, "").await);
}

mod three_barging {
    use super::*;
    lockkit_conformance::conformance_suite!(RedlockHarness::start(3, "&barging=true").await);
}
