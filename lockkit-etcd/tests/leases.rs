//! A released holding's lease serves the client's next acquire (see the
//! crate docs): fewer leases on the server, and an expired kept lease is
//! replaced rather than failing the acquire.

use std::time::Duration;

use etcd_client::{Client, GetOptions};
use lockkit_core::{DistributedLock, LockOptions};
use lockkit_testkit::{EtcdServer, TestServer};

/// A server, an etcd-client connection to it and a lockkit client of it.
async fn setup() -> (EtcdServer, Client, lockkit_etcd::EtcdLock) {
    let server = EtcdServer::start().await;
    let client = Client::connect([format!("127.0.0.1:{}", server.port())], None)
        .await
        .expect("an etcd-client connection");
    let locks = lockkit_etcd::connect(&format!("{}/locks", server.url()))
        .await
        .expect("connect");
    (server, client, locks)
}

/// The ids of the leases the server has.
async fn leases(client: &mut Client) -> Vec<i64> {
    let listed = client.leases().await.expect("list the leases");
    listed.leases().iter().map(|l| l.id()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_serves_the_next_acquire() {
    let (_server, mut client, locks) = setup().await;
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let before = leases(&mut client).await.len();
    let mut keys = Vec::new();
    let mut last = None;
    for _ in 0..20 {
        let guard = locks.acquire("kept", &opts).await.unwrap();
        let token = guard.fencing_token().unwrap();
        assert!(last < Some(token), "{last:?} then {token:?}");
        last = Some(token);
        let held = client
            .get(
                "/locks/kept/",
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
            .unwrap();
        keys.extend(held.kvs().iter().map(|kv| kv.key_str().unwrap().to_owned()));
        guard.release().await.unwrap();
    }
    keys.dedup();
    assert_eq!(keys.len(), 1, "one lease, so one key, served all: {keys:?}");
    assert_eq!(leases(&mut client).await.len(), before + 1);
    let left = client
        .get(
            "/locks/kept/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap()
        .count();
    assert_eq!(left, 0, "no key left after the releases");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lease_gone_from_the_server_is_replaced() {
    let (_server, mut client, locks) = setup().await;
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    locks
        .acquire("gone", &opts)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // The kept lease ends behind the client's back (expired, or revoked
    // by an operator).
    let ids = leases(&mut client).await;
    assert!(!ids.is_empty());
    for id in ids {
        client.lease_revoke(id).await.unwrap();
    }
    let again = locks
        .acquire("gone", &opts)
        .await
        .expect("a new lease replaces the one that is gone");
    assert!(!again.is_lost());
    again.release().await.unwrap();
}
