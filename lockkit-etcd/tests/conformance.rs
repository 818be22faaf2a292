//! The conformance suite against real etcd: a single server, and a
//! three-member cluster (every client given all three endpoints); a
//! deployment per test (one starts in about a second). Revocation deletes
//! the holder's key with `etcdctl`, as an operator would.

use std::sync::Arc;
use std::time::Duration;

use lockkit_conformance::{Disposable, Harness};
use lockkit_core::DistributedLock;
use lockkit_testkit::{DisposableServer, EtcdCluster, EtcdServer, TestServer};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A single server or a cluster.
enum Deployment {
    One(Box<EtcdServer>),
    Cluster(EtcdCluster),
}

impl Deployment {
    async fn start(members: usize) -> Deployment {
        match members {
            1 => Deployment::One(Box::new(EtcdServer::start().await)),
            n => Deployment::Cluster(EtcdCluster::start(n).await),
        }
    }

    fn url(&self) -> String {
        let url = match self {
            Deployment::One(server) => server.url(),
            Deployment::Cluster(cluster) => cluster.url(),
        };
        format!(
            "{url}/locks?connect_timeout={}ms&command_timeout=2s",
            CONNECT_TIMEOUT.as_millis()
        )
    }

    /// A member to run `etcdctl` against.
    fn member(&self) -> &EtcdServer {
        match self {
            Deployment::One(server) => server,
            Deployment::Cluster(cluster) => &cluster.servers()[0],
        }
    }

    fn disposable(self) -> Box<dyn Disposable> {
        let url = self.url();
        match self {
            Deployment::One(server) => {
                Box::new(DisposableServer::new(*server, url, lockkit_etcd::DRIVER))
            }
            Deployment::Cluster(cluster) => {
                Box::new(DisposableServer::new(cluster, url, lockkit_etcd::DRIVER))
            }
        }
    }
}

struct EtcdHarness {
    members: usize,
    deployment: Deployment,
}

impl EtcdHarness {
    async fn start(members: usize) -> EtcdHarness {
        EtcdHarness {
            members,
            deployment: Deployment::start(members).await,
        }
    }
}

#[async_trait::async_trait]
impl Harness for EtcdHarness {
    async fn client(&self) -> Arc<dyn DistributedLock> {
        Arc::new(
            lockkit_etcd::connect(&self.deployment.url())
                .await
                .expect("connect"),
        )
    }

    /// Deletes the holder's key (the oldest of the lock's directory) with
    /// `etcdctl`, as an operator would; the waiters' keys stay.
    async fn revoke(&self, name: &str) {
        let dir = format!("/locks/{}/", lockkit_etcd::encode_name(name));
        let member = self.deployment.member();
        let keys = member
            .etcdctl(&[
                "get",
                &dir,
                "--prefix",
                "--keys-only",
                "--sort-by=CREATE",
                "--order=ASCEND",
                "--limit=1",
            ])
            .await
            .expect("list the lock's keys");
        let head = keys
            .lines()
            .find(|line| !line.is_empty())
            .unwrap_or_else(|| panic!("no key of {name:?} to revoke"))
            .to_owned();
        let deleted = member
            .etcdctl(&["del", &head])
            .await
            .expect("delete the holder's key");
        assert_eq!(deleted.trim(), "1", "{head}");
    }

    async fn disposable(&self) -> Box<dyn Disposable> {
        Deployment::start(self.members).await.disposable()
    }

    fn connect_timeout(&self) -> Duration {
        CONNECT_TIMEOUT
    }

    /// Keys anywhere under the prefix whose path holds the encoded
    /// `prefix` (the locks' directories and the semaphores').
    async fn stored_entries(&self, prefix: &str) -> usize {
        let encoded = lockkit_etcd::encode_name(prefix);
        self.deployment
            .member()
            .etcdctl(&["get", "/locks/", "--prefix", "--keys-only"])
            .await
            .expect("list the keys")
            .lines()
            .filter(|key| key.contains(&encoded))
            .count()
    }
}

mod single {
    use super::*;
    lockkit_conformance::conformance_suite!(EtcdHarness::start(1).await);
}

mod cluster {
    use super::*;
    lockkit_conformance::conformance_suite!(EtcdHarness::start(3).await);
}
