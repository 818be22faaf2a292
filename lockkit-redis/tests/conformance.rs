//! The conformance suite against a real redis-server started by the testkit.

use std::sync::Arc;
use std::time::Duration;

use lockkit_conformance::{Disposable, Harness};
use lockkit_core::DistributedLock;
use lockkit_testkit::TestServer;
use lockkit_testkit::{DisposableServer, RedisServer};

const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

fn client_url(server: &RedisServer) -> String {
    format!(
        "{}?connect_timeout=500ms&command_timeout=500ms",
        server.url()
    )
}

struct RedisHarness {
    server: RedisServer,
}

impl RedisHarness {
    async fn start() -> Self {
        RedisHarness {
            server: RedisServer::start().await,
        }
    }
}

#[async_trait::async_trait]
impl Harness for RedisHarness {
    async fn client(&self) -> Arc<dyn DistributedLock> {
        Arc::new(
            lockkit_redis::connect(&client_url(&self.server))
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
        let server = RedisServer::start().await;
        let url = client_url(&server);
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

lockkit_conformance::conformance_suite!(RedisHarness::start().await);
