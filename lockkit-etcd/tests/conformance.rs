//! The conformance suite against a real etcd server: a server per test (it
//! starts in about a second), revocation by deleting the holder's key with
//! `etcdctl`, as an operator would.

use std::sync::Arc;
use std::time::Duration;

use lockkit_conformance::{Disposable, Harness};
use lockkit_core::DistributedLock;
use lockkit_testkit::{DisposableServer, EtcdServer, TestServer};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

fn url(server: &EtcdServer) -> String {
    format!(
        "{}/locks?connect_timeout={}ms&command_timeout=2s",
        server.url(),
        CONNECT_TIMEOUT.as_millis()
    )
}

struct EtcdHarness {
    server: EtcdServer,
}

#[async_trait::async_trait]
impl Harness for EtcdHarness {
    async fn client(&self) -> Arc<dyn DistributedLock> {
        Arc::new(
            lockkit_etcd::connect(&url(&self.server))
                .await
                .expect("connect"),
        )
    }

    /// Deletes the holder's key (the oldest of the lock's directory) with
    /// `etcdctl`, as an operator would; the waiters' keys stay.
    async fn revoke(&self, name: &str) {
        let dir = format!("locks/{}/", lockkit_etcd::encode_name(name));
        let keys = self
            .server
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
        let deleted = self
            .server
            .etcdctl(&["del", &head])
            .await
            .expect("delete the holder's key");
        assert_eq!(deleted.trim(), "1", "{head}");
    }

    async fn disposable(&self) -> Box<dyn Disposable> {
        let server = EtcdServer::start().await;
        let url = url(&server);
        Box::new(DisposableServer::new(server, url, lockkit_etcd::DRIVER))
    }

    fn connect_timeout(&self) -> Duration {
        CONNECT_TIMEOUT
    }
}

lockkit_conformance::conformance_suite!(EtcdHarness {
    server: EtcdServer::start().await
});
