//! The Redis Cluster and Redis Sentinel harnesses against real redis-server
//! processes.

use std::time::Duration;

use lockkit_testkit::{FaultControl, TestServer};
use lockkit_testkit::{RedisCluster, RedisSentinels, eventually};
use tokio::time::Instant;

fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_serves_every_slot_and_notices_a_dead_master() {
    let started = Instant::now();
    let cluster = RedisCluster::start(3).await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(cluster.nodes().len(), 3);
    let ports = cluster.ports();
    assert_eq!(
        cluster.url(),
        format!(
            "redis+cluster://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
            ports[0], ports[1], ports[2]
        )
    );
    for node in cluster.nodes() {
        let info = node.command(&["CLUSTER", "INFO"]).await.unwrap();
        assert_eq!(field(&info, "cluster_state"), Some("ok"), "{info}");
        assert_eq!(field(&info, "cluster_slots_assigned"), Some("16384"));
        assert_eq!(field(&info, "cluster_known_nodes"), Some("3"));
    }
    // Keys land on every node; `command` finds the owner of each.
    for i in 0..30 {
        let key = format!("key-{i}");
        assert_eq!(cluster.command(&["SET", &key, "v"]).await.unwrap(), "OK");
        assert_eq!(cluster.command(&["GET", &key]).await.unwrap(), "v");
    }
    for node in cluster.nodes() {
        let size: u32 = node.command(&["DBSIZE"]).await.unwrap().parse().unwrap();
        assert!(size > 0, "node {} holds no key", node.port());
    }

    // One master down: the others declare the cluster failed (every slot
    // must be served), and it recovers when the node is back.
    cluster.nodes()[2].kill();
    let other = &cluster.nodes()[0];
    assert!(
        eventually(Duration::from_secs(10), || async {
            other
                .command(&["CLUSTER", "INFO"])
                .await
                .is_ok_and(|info| field(&info, "cluster_state") == Some("fail"))
        })
        .await,
        "the cluster did not notice the dead master"
    );
    cluster.nodes()[2].restart().await;
    assert!(
        cluster.wait_until_ok(Duration::from_secs(20)).await,
        "the cluster did not recover"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_replicate_through_the_proxy_and_fail_over() {
    let started = Instant::now();
    let deployment = RedisSentinels::start().await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let master = deployment.master();
    let replica = deployment.replica();
    assert_eq!(deployment.sentinel_ports().len(), 3);
    let hosts: Vec<String> = deployment
        .sentinel_ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    assert_eq!(
        deployment.url(),
        format!(
            "redis+sentinel://{}/{}",
            hosts.join(","),
            deployment.master_name()
        )
    );
    assert_eq!(deployment.current_master_addr().await, Some(master.addr()));
    assert_eq!(
        deployment
            .replication_proxy()
            .expect("a replication proxy")
            .upstream(),
        master.addr(),
        "the replica replicates through the proxy"
    );

    // Replication works… (`command` opens a connection per call, so `WAIT`
    // would not see the `SET`: poll the replica instead.)
    let replica_has = |value: &'static str| async move {
        replica
            .command(&["GET", "k"])
            .await
            .is_ok_and(|v| v == value)
    };
    master.command(&["SET", "k", "1"]).await.unwrap();
    assert!(eventually(Duration::from_secs(5), || replica_has("1")).await);
    // …until the proxy cuts it…
    deployment
        .replication_proxy()
        .expect("a replication proxy")
        .blackhole(true);
    master.command(&["SET", "k", "2"]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(replica.command(&["GET", "k"]).await.unwrap(), "1");
    // …and it catches up once healed.
    deployment
        .replication_proxy()
        .expect("a replication proxy")
        .blackhole(false);
    assert!(eventually(Duration::from_secs(5), || replica_has("2")).await);

    // The master dies: the sentinels promote the replica.
    let old = master.addr();
    master.kill();
    assert!(
        deployment
            .wait_for_failover(old, Duration::from_secs(30))
            .await,
        "no failover within 30 s"
    );
    assert_eq!(deployment.current_master_addr().await, Some(replica.addr()));
    let role = replica.command(&["ROLE"]).await.unwrap();
    assert!(role.starts_with("master"), "{role}");
    assert_eq!(deployment.master_command(&["GET", "k"]).await.unwrap(), "2");
}
