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

    /// The nodes of the lock and semaphore directories whose names start
    /// with `prefix`, with their children. A released lock's directory is a
    /// container node, which the server removes once it is empty (every
    /// second in the testkit's servers; a semaphore's directory only once
    /// its `locks` and `leases` containers are gone, a check later): waits
    /// up to 15 s for that, as a server loaded by the other tests deletes
    /// thousands of containers slowly (a run with 5 s failed once, after
    /// 9 s, most likely on this). While it waits it lists only the two
    /// parents: the nodes below the directories are counted once few
    /// directories are left (or the wait is over), since listing each of
    /// thousands of them every 250 ms loads the server the other tests share.
    async fn stored_entries(&self, prefix: &str) -> usize {
        let admin = zookeeper_client::Client::connect(&self.server.connect_string())
            .await
            .expect("admin session");
        let encoded = lockkit_zk::encode_name(prefix);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let dirs = directories(&admin, &encoded).await;
            let over = tokio::time::Instant::now() > deadline;
            if dirs.len() <= lockkit_conformance::MAX_LEFT || over {
                let mut count = dirs.len();
                for dir in &dirs {
                    count += nodes_below(&admin, dir).await;
                }
                if count <= lockkit_conformance::MAX_LEFT || over {
                    return count;
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// The paths of the lock and semaphore directories whose (encoded) names
/// start with `encoded`.
async fn directories(admin: &zookeeper_client::Client, encoded: &str) -> Vec<String> {
    let mut dirs = Vec::new();
    for parent in [
        "/locks".to_owned(),
        format!("/locks/{}", lockkit_zk::SEMAPHORES),
    ] {
        let children = match admin.list_children(&parent).await {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(e) => panic!("list {parent}: {e}"),
        };
        dirs.extend(
            children
                .iter()
                .filter(|c| c.starts_with(encoded))
                .map(|child| format!("{parent}/{child}")),
        );
    }
    dirs
}

/// How many nodes there are below `path` (0 if it is gone).
async fn nodes_below(admin: &zookeeper_client::Client, path: &str) -> usize {
    let mut count = 0;
    let mut pending = vec![path.to_owned()];
    while let Some(dir) = pending.pop() {
        let children = match admin.list_children(&dir).await {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => continue,
            Err(e) => panic!("list {dir}: {e}"),
        };
        count += children.len();
        pending.extend(children.iter().map(|child| format!("{dir}/{child}")));
    }
    count
}

lockkit_conformance::conformance_suite!(ZkHarness {
    server: ZkServer::start().await
});
