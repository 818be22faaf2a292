//! The conformance suite against a real ZooKeeper server started by the testkit.

use std::sync::Arc;
use std::time::Duration;

use lockkit_conformance::{Disposable, Harness};
use lockkit_core::{DistributedLock, Result};
use lockkit_testkit::TestServer;
use lockkit_testkit::{DisposableServer, ZkServer};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

fn url(server: &ZkServer) -> String {
    format!(
        "{}?session_timeout=2s&connect_timeout=1s&command_timeout=1s",
        server.url_at("locks")
    )
}

async fn connect(server: &ZkServer) -> Result<Arc<dyn DistributedLock>> {
    Ok(Arc::new(lockkit_zk::connect(&url(server)).await?))
}

struct ZkHarness {
    server: ZkServer,
}

#[async_trait::async_trait]
impl Harness for ZkHarness {
    async fn client(&self) -> Arc<dyn DistributedLock> {
        connect(&self.server).await.expect("connect")
    }

    /// Deletes the lock's nodes with a client of its own, as an operator would.
    async fn revoke(&self, name: &str) {
        let admin = zookeeper_client::Client::connect(&self.server.connect_string())
            .await
            .expect("admin session");
        let dir = format!("/locks/{}", lockkit_zk::encode_name(name));
        let children = admin
            .list_children(&dir)
            .await
            .expect("list the lock's nodes");
        // The holder's node: the lowest sequence (the last 10 digits), as
        // the other backends delete the lease and leave the waiters be.
        let head = children
            .iter()
            .min_by_key(|child| child[child.len().saturating_sub(10)..].to_owned())
            .unwrap_or_else(|| panic!("no node of {name:?} to revoke"));
        admin
            .delete(&format!("{dir}/{head}"), None)
            .await
            .expect("delete the holder's node");
    }

    async fn disposable(&self) -> Box<dyn Disposable> {
        let server = ZkServer::start().await;
        let url = url(&server);
        Box::new(DisposableServer::new(server, url, lockkit_zk::DRIVER))
    }

    fn connect_timeout(&self) -> Duration {
        CONNECT_TIMEOUT
    }
}

lockkit_conformance::conformance_suite!(ZkHarness {
    server: ZkServer::start().await
});
