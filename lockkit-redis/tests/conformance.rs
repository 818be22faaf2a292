//! The conformance suite against a real redis-server started by the testkit.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{DistributedLock, Result};
use lockkit_testkit::RedisServer;
use lockkit_testkit::conformance::{Disposable, Harness};

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
        Box::new(DisposableRedis {
            server: RedisServer::start().await,
        })
    }

    fn connect_timeout(&self) -> Duration {
        CONNECT_TIMEOUT
    }
}

struct DisposableRedis {
    server: RedisServer,
}

#[async_trait::async_trait]
impl Disposable for DisposableRedis {
    async fn connect(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(
            lockkit_redis::connect(&client_url(&self.server)).await?,
        ))
    }

    async fn kill(&mut self) {
        self.server.kill();
    }

    async fn pause(&mut self) {
        self.server.pause();
    }

    async fn resume(&mut self) {
        self.server.resume();
    }
}

lockkit_testkit::conformance_suite!(RedisHarness::start().await);
