//! The conformance suite against a real redis-server started by the testkit:
//! `plain` locks, `fair` ones (`fair=true`: waiters served in order), and
//! `barging` ones (`barging=true`: waiters ask on the backoff, in no line).

use std::sync::Arc;
use std::time::Duration;

use lockkit_conformance::{Disposable, Harness};
use lockkit_core::DistributedLock;
use lockkit_testkit::TestServer;
use lockkit_testkit::{DisposableServer, RedisServer};

const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// `mode`: the lock's URL parameter (`fair=…` or `barging=…`).
fn client_url(server: &RedisServer, mode: &str) -> String {
    format!(
        "{}?connect_timeout=500ms&command_timeout=500ms&{mode}",
        server.url()
    )
}

struct RedisHarness {
    server: RedisServer,
    mode: &'static str,
}

impl RedisHarness {
    async fn start(mode: &'static str) -> Self {
        RedisHarness {
            server: RedisServer::start().await,
            mode,
        }
    }
}

#[async_trait::async_trait]
impl Harness for RedisHarness {
    async fn client(&self) -> Arc<dyn DistributedLock> {
        Arc::new(
            lockkit_redis::connect(&client_url(&self.server, self.mode))
                .await
                .expect("connect"),
        )
    }

    async fn revoke(&self, name: &str) {
        let key = format!("{}{name}", lockkit_redis::DEFAULT_PREFIX);
        let deleted = self.server.command(&["DEL", &key]).await.expect("DEL");
        assert_eq!(deleted, "1", "no lease on {name:?} to revoke");
    }

    async fn disposable(&self) -> Box<dyn Disposable> {
        let server = RedisServer::builder().shiftable_clock(true).start().await;
        let url = client_url(&server, self.mode);
        Box::new(DisposableServer::new(server, url, lockkit_redis::DRIVER))
    }

    fn connect_timeout(&self) -> Duration {
        CONNECT_TIMEOUT
    }

    async fn stored_entries(&self, prefix: &str) -> usize {
        self.server
            .count_keys(&format!("*{prefix}*"))
            .await
            .expect("count keys")
    }
}

mod plain {
    lockkit_conformance::conformance_suite!(super::RedisHarness::start("fair=false").await);
}

mod fair {
    lockkit_conformance::conformance_suite!(super::RedisHarness::start("fair=true").await);
}

mod barging {
    lockkit_conformance::conformance_suite!(super::RedisHarness::start("barging=true").await);
}
