//! Connections that break: a waiting acquire whose connection to etcd
//! drops while its lease lives on reconnects, watches again and gets the
//! lock in its turn (a lost connection is not a lost place in the queue);
//! a member of the cluster down does not fail the requests that the
//! client's balancer sends its way.

use std::time::Duration;

use lockkit_core::{DistributedLock, LockOptions};
use lockkit_testkit::{EtcdCluster, EtcdServer, FaultControl, TcpProxy, TestServer};
use tokio::time::Instant;

fn opts() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(6))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_survives_its_connections_being_reset() {
    let server = EtcdServer::start().await;
    let upstream = format!("127.0.0.1:{}", server.port()).parse().unwrap();
    let proxy = TcpProxy::start(upstream).await.expect("a proxy");
    let holder = lockkit_etcd::connect(&format!("{}/locks", server.url()))
        .await
        .expect("connect");
    let waiter = lockkit_etcd::connect(&format!(
        "etcd://127.0.0.1:{}/locks?connect_timeout=1s&command_timeout=1s",
        proxy.port()
    ))
    .await
    .expect("connect through the proxy");

    let guard = holder.acquire("reset", &opts()).await.unwrap();
    let token = guard.fencing_token().unwrap();
    let waiting = tokio::spawn(async move {
        let acquired = waiter
            .acquire("reset", &opts().wait_for(Duration::from_secs(20)))
            .await;
        acquired.map(|g| (g.fencing_token(), Instant::now(), g))
    });
    // Queued behind the holder, watching: then its connections die, and
    // new ones are refused for a second (a server restarting, a network
    // blip), which is shorter than its lease.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        holder.status("reset").await.unwrap().waiters,
        Some(1),
        "the waiter is queued"
    );
    proxy.refuse(true);
    proxy.reset_connections();
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.refuse(false);
    tokio::time::sleep(Duration::from_millis(500)).await;
    if waiting.is_finished() {
        let outcome = waiting.await.unwrap().map(|(token, _, _)| token);
        panic!("the waiter gave up: {outcome:?}");
    }

    let released = Instant::now();
    guard.release().await.unwrap();
    let (next, got_at, guard) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter is done within 10 s")
        .unwrap()
        .expect("the waiter gets the lock after the holder's release");
    assert!(next.unwrap() > token, "{next:?} after {token}");
    assert!(
        got_at.duration_since(released) < Duration::from_secs(3),
        "the waiter was told of the release late: {:?}",
        got_at.duration_since(released)
    );
    guard.release().await.unwrap();
}

/// `rounds` cycles of `client` on names of their own, each a
/// `try_acquire` and a `release`: the failures, described.
async fn failed_cycles(client: &dyn DistributedLock, rounds: usize, tag: &str) -> Vec<String> {
    let mut failed = Vec::new();
    for round in 0..rounds {
        let name = format!("member-down-{tag}-{round}");
        match client.try_acquire(&name, &opts()).await {
            Ok(Some(guard)) => {
                if let Err(error) = guard.release().await {
                    failed.push(format!("release {name}: {error}"));
                }
            }
            Ok(None) => failed.push(format!("{name} is busy")),
            Err(error) => failed.push(format!("acquire {name}: {error}")),
        }
    }
    failed
}

/// One member of three is killed, and later restarted. `etcd-client`
/// balances requests over every member and reconnects lazily, so some go
/// to the dead member's connection and cannot be sent: lockkit sends
/// those again, and not one cycle or wait fails, while the member is down
/// or after it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_go_on_while_a_member_is_down() {
    let cluster = EtcdCluster::start(3).await;
    let client = lockkit_etcd::connect(&format!("{}/locks?command_timeout=3s", cluster.url()))
        .await
        .expect("connect");
    let failed = failed_cycles(&client, 10, "before").await;
    assert!(failed.is_empty(), "with every member up: {failed:?}");

    let leader = cluster.leader().await.expect("the cluster has a leader");
    let follower = &cluster.servers()[(leader + 1) % 3];
    follower.kill();
    let failed = failed_cycles(&client, 40, "down").await;
    assert!(failed.is_empty(), "with a follower down: {failed:?}");
    // A client that connects now, and waits (its watch of deletions opens
    // now too), is served as well.
    let waiter = lockkit_etcd::connect(&format!("{}/locks?command_timeout=3s", cluster.url()))
        .await
        .expect("connect with a follower down");
    for round in 0..5 {
        let name = format!("member-down-wait-{round}");
        let held = client.acquire(&name, &opts()).await.unwrap();
        let wait = opts().wait_for(Duration::from_secs(10));
        let waiting = waiter.acquire(&name, &wait);
        let release = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            held.release().await
        };
        let (waited, released) = tokio::join!(waiting, release);
        released.unwrap_or_else(|e| panic!("round {round}: the holder's release: {e}"));
        let guard = waited.unwrap_or_else(|e| panic!("round {round}: the waiter: {e}"));
        guard.release().await.unwrap();
    }

    follower.restart().await;
    let failed = failed_cycles(&client, 20, "back").await;
    assert!(failed.is_empty(), "once it is back: {failed:?}");
}
