//! The conformance suite against a real Redis Sentinel deployment (a master,
//! a replica, three sentinels) started by the testkit (`redis+sentinel://`).

use std::sync::Arc;
use std::time::Duration;

use lockkit_conformance::{Disposable, Harness};
use lockkit_core::DistributedLock;
use lockkit_testkit::{DisposableServer, RedisSentinels};

const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

fn client_url(deployment: &RedisSentinels) -> String {
    format!(
        "{}?connect_timeout=500ms&command_timeout=500ms",
        deployment.url()
    )
}

struct SentinelHarness {
    deployment: RedisSentinels,
}

impl SentinelHarness {
    async fn start() -> Self {
        SentinelHarness {
            deployment: RedisSentinels::start().await,
        }
    }
}

#[async_trait::async_trait]
impl Harness for SentinelHarness {
    async fn client(&self) -> Arc<dyn DistributedLock> {
        Arc::new(
            lockkit_redis::connect(&client_url(&self.deployment))
                .await
                .expect("connect"),
        )
    }

    async fn revoke(&self, name: &str) {
        let key = format!("{}{name}", lockkit_redis::DEFAULT_PREFIX);
        let deleted = self
            .deployment
            .master_command(&["DEL", &key])
            .await
            .expect("DEL");
        assert_eq!(deleted, "1", "no lease on {name:?} to revoke");
    }

    async fn disposable(&self) -> Box<dyn Disposable> {
        // The whole deployment dies or freezes at once (the sentinels too,
        // so that no failover interferes).
        let deployment = RedisSentinels::start().await;
        let url = client_url(&deployment);
        Box::new(DisposableServer::new(
            deployment,
            url,
            lockkit_redis::DRIVER,
        ))
    }

    fn connect_timeout(&self) -> Duration {
        CONNECT_TIMEOUT
    }

    async fn stored_entries(&self, prefix: &str) -> usize {
        self.deployment
            .master()
            .count_keys(&format!("*{prefix}*"))
            .await
            .expect("count keys")
    }
}

lockkit_conformance::conformance_suite!(SentinelHarness::start().await);
