//! Tests of the `EtcdServer` harness against the real `etcd` and `etcdctl`.

#[allow(dead_code, reason = "helpers that other servers' tests use")]
mod common;

use std::time::Duration;

use common::{assert_dropped, process_exists};
use lockkit_testkit::{EtcdServer, FaultControl, TestServer};

#[tokio::test]
async fn start_serves_etcdctl_and_keeps_data_across_a_restart() {
    let server = EtcdServer::start().await;
    assert_eq!(server.url(), format!("etcd://127.0.0.1:{}", server.port()));
    server.etcdctl(&["put", "k", "v"]).await.unwrap();
    assert_eq!(
        server
            .etcdctl(&["get", "k", "--print-value-only"])
            .await
            .unwrap()
            .trim(),
        "v"
    );
    let pid = server.pid().unwrap();
    server.kill();
    assert!(server.etcdctl(&["get", "k"]).await.is_err());
    server.restart().await;
    assert_ne!(server.pid(), Some(pid));
    assert_eq!(
        server
            .etcdctl(&["get", "k", "--print-value-only"])
            .await
            .unwrap()
            .trim(),
        "v",
        "the data directory survives"
    );
}

#[tokio::test]
async fn pause_makes_requests_hang_and_resume_recovers() {
    let server = EtcdServer::start().await;
    server.pause();
    let hung = tokio::time::timeout(
        Duration::from_secs(2),
        server.etcdctl(&["get", "k", "--command-timeout=1s"]),
    )
    .await;
    assert!(!matches!(hung, Ok(Ok(_))), "{hung:?}");
    server.resume();
    server.etcdctl(&["put", "k", "v"]).await.unwrap();
}

#[tokio::test]
async fn drop_kills_the_process_and_frees_the_port() {
    let server = EtcdServer::start().await;
    let pid = server.pid().unwrap();
    let addr = server.addr();
    let dir = server.dir().to_path_buf();
    assert!(process_exists(pid));
    drop(server);
    assert_dropped(pid, addr, &dir).await;
}
