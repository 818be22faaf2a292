//! The conformance suite against a real 3-master Redis Cluster started by the
//! testkit (`redis+cluster://`).

use std::sync::Arc;
use std::time::Duration;

use lockkit_conformance::{Disposable, Harness};
use lockkit_core::DistributedLock;
use lockkit_testkit::{DisposableServer, RedisCluster};

const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

fn client_url(cluster: &RedisCluster) -> String {
    format!(
        "{}?connect_timeout=500ms&command_timeout=500ms",
        cluster.url()
    )
}

struct ClusterHarness {
    cluster: RedisCluster,
}

impl ClusterHarness {
    async fn start() -> Self {
        ClusterHarness {
            cluster: RedisCluster::start(3).await,
        }
    }
}

#[async_trait::async_trait]
impl Harness for ClusterHarness {
    async fn client(&self) -> Arc<dyn DistributedLock> {
        Arc::new(
            lockkit_redis::connect(&client_url(&self.cluster))
                .await
                .expect("connect"),
        )
    }

    async fn revoke(&self, name: &str) {
        let key = format!("{}{name}", lockkit_redis::DEFAULT_PREFIX);
        let deleted = self.cluster.command(&["DEL", &key]).await.expect("DEL");
        assert_eq!(deleted, "1", "no lease on {name:?} to revoke");
    }

    async fn disposable(&self) -> Box<dyn Disposable> {
        // One master is enough to kill.
        let cluster = RedisCluster::start(1).await;
        let url = client_url(&cluster);
        Box::new(DisposableServer::new(cluster, url, lockkit_redis::DRIVER))
    }

    fn connect_timeout(&self) -> Duration {
        CONNECT_TIMEOUT
    }

    async fn stored_entries(&self, prefix: &str) -> usize {
        let mut count = 0;
        for node in self.cluster.nodes() {
            count += node
                .count_keys(&format!("*{prefix}*"))
                .await
                .expect("count keys");
        }
        count
    }
}

lockkit_conformance::conformance_suite!(ClusterHarness::start().await);
