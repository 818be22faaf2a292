//! A ZooKeeper ensemble whose members live in network namespaces of the
//! test's own making: a member cut off from the others by the [`Fabric`]
//! loses its place in the quorum, while the test still reaches it.

use std::sync::Arc;
use std::time::Duration;

use lockkit_testkit::{Fabric, FaultControl, TestServer, ZkServer, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cut_off_from_the_others_leaves_the_quorum_and_rejoins() {
    let fabric = Arc::new(Fabric::create(3).expect("network namespaces (run as root)"));
    let ensemble = ZkServer::builder()
        .try_start_ensemble_in(fabric.clone())
        .await
        .expect("an ensemble in the fabric");
    for (i, server) in ensemble.servers().iter().enumerate() {
        assert_eq!(server.addr().ip(), fabric.ip(i));
    }
    let leader = ensemble.leader().await.expect("a leader");
    fabric.isolate(leader, true).unwrap();
    // The test still reaches the cut-off member, which no longer serves; the
    // other two elect a leader between them.
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let parted = eventually(Duration::from_secs(30), || async {
        let modes = ensemble.modes().await;
        let isolated = ensemble.servers()[leader].four_letter("srvr").await;
        let not_serving = isolated.is_ok_and(|answer| answer.contains("not currently serving"));
        not_serving
            && others
                .iter()
                .any(|&i| modes[i].as_deref() == Some("leader"))
    })
    .await;
    assert!(parted, "modes after the cut: {:?}", ensemble.modes().await);
    fabric.isolate(leader, false).unwrap();
    let rejoined = eventually(Duration::from_secs(30), || async {
        ensemble.modes().await[leader].as_deref() == Some("follower")
    })
    .await;
    assert!(
        rejoined,
        "modes after the heal: {:?}",
        ensemble.modes().await
    );
    assert!(ensemble.servers()[leader].pid().is_some());
}
