//! Interop with Apache Curator itself (Debian's `libcurator-recipes-java`,
//! driven through lockkit-testkit's `CuratorPeer`): Curator's
//! `InterProcessSemaphoreV2` and lockkit's semaphores share one semaphore.

use std::time::Duration;

use lockkit_core::{DistributedLock, LockOptions};
use lockkit_testkit::{CuratorPeer, TestServer, ZkServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_is_shared_with_curator_interprocess_semaphore_v2() {
    let server = ZkServer::start().await;
    let url = format!("{}?session_timeout=5s", server.url_at("locks"));
    let locks = lockkit_zk::connect(&url).await.expect("connect");
    let path = format!("/locks/{}/transcoders", lockkit_zk::SEMAPHORES);
    let mut curator = CuratorPeer::semaphore(&server, &path, 2).await;
    let permit = LockOptions::new().ttl(Duration::from_secs(30)).semaphore(2);

    // lockkit holds both permits: Curator gets none.
    let one = locks.acquire("transcoders", &permit).await.unwrap();
    let two = locks.acquire("transcoders", &permit).await.unwrap();
    assert_eq!(curator.ask("try").await, "busy");
    two.release().await.unwrap();

    // Curator takes the returned permit: lockkit gets no third.
    assert_eq!(curator.ask("try").await, "acquired");
    let status = locks.status_of("transcoders", permit.kind()).await.unwrap();
    assert_eq!(status.holders, Some(2), "{status:?}");
    assert!(
        locks
            .try_acquire("transcoders", &permit)
            .await
            .unwrap()
            .is_none(),
        "a third holder beside lockkit's and Curator's"
    );

    // A waiting lockkit acquire gets Curator's lease once it is returned.
    let waiting = {
        let locks = lockkit_zk::connect(&url).await.expect("connect");
        let permit = permit.clone().wait_for(Duration::from_secs(10));
        tokio::spawn(async move { locks.acquire("transcoders", &permit).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "lockkit did not wait for Curator");
    assert_eq!(curator.ask("return").await, "returned");
    let after = waiting.await.unwrap().expect("Curator's returned lease");
    assert_eq!(curator.ask("try").await, "busy");
    after.release().await.unwrap();
    one.release().await.unwrap();
    assert_eq!(curator.ask("try").await, "acquired");
    assert_eq!(curator.ask("return").await, "returned");
}
