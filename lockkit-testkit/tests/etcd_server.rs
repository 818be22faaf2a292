//! Tests of the `EtcdServer` harness against the real `etcd` and `etcdctl`.

mod common;

use std::time::Duration;

use common::assert_drop_frees;
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
        value_of(&server, "k").await,
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
    assert_drop_frees::<EtcdServer>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_survives_a_killed_member_which_rejoins() {
    let cluster = lockkit_testkit::EtcdCluster::start(3).await;
    assert_eq!(cluster.servers().len(), 3);
    assert_eq!(cluster.url(), format!("etcd://{}", cluster.endpoints()));
    let (first, second) = (&cluster.servers()[0], &cluster.servers()[1]);
    first.etcdctl(&["put", "k", "v1"]).await.unwrap();
    first.kill();
    // A write proposed while the survivors elect a new leader (if the killed
    // member led) is dropped, and the client waits out its timeout: retry.
    let written = lockkit_testkit::eventually(Duration::from_secs(15), || async {
        second
            .etcdctl(&["put", "k", "v2", "--command-timeout=1s"])
            .await
            .is_ok()
    })
    .await;
    assert!(written, "the two survivors did not take a write");
    first.restart().await;
    assert_eq!(
        value_of(first, "k").await,
        "v2",
        "the restarted member caught up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_names_its_leader_and_a_new_one_after_a_kill() {
    let cluster = lockkit_testkit::EtcdCluster::start(3).await;
    let leader = lockkit_testkit::eventually(Duration::from_secs(10), || async {
        cluster.leader().await.is_some()
    })
    .await;
    assert!(leader, "no member says it leads");
    let old = cluster.leader().await.expect("a leader");
    cluster.servers()[old].kill();
    let elected = lockkit_testkit::eventually(Duration::from_secs(15), || async {
        cluster.leader().await.is_some_and(|new| new != old)
    })
    .await;
    assert!(elected, "the survivors elected no leader of their own");
}

/// The value of `key` on `server`, read with `etcdctl`.
async fn value_of(server: &EtcdServer, key: &str) -> String {
    let value = server.etcdctl(&["get", key, "--print-value-only"]).await;
    value.unwrap().trim().to_owned()
}
