//! A waiting acquire whose connection to etcd drops while its lease lives
//! on: it reconnects, watches again and gets the lock in its turn (a lost
//! connection is not a lost place in the queue).

use std::time::Duration;

use lockkit_core::{DistributedLock, LockOptions};
use lockkit_testkit::{EtcdServer, TcpProxy, TestServer};
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
