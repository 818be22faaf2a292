//! Interop with Apache Curator itself (Debian's `libcurator-recipes-java`,
//! driven through lockkit-testkit's `CuratorPeer`): Curator's
//! `InterProcessSemaphoreV2` and lockkit's semaphores share one semaphore,
//! and Curator's `LeaderSelector` and lockkit's elections one election.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{DistributedLock, Election, LockOptions};
use lockkit_testkit::{CuratorPeer, TestServer, ZkServer};
use tokio::time::Instant;

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

/// lockkit and Curator contend for one permit at the same time: lockkit's
/// first attempt sends its mutex and lease nodes before it knows whether the
/// mutex is free, and withdraws both when it is not. Every acquire of both
/// must end with the permit: a lease counted at the wrong moment would leave
/// a Curator client waiting for a change of `leases/` that never comes
/// (Curator's cycle answers "busy" after 10 s), and two holders at once
/// would show in lockkit's count of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockkit_and_curator_contend_for_one_permit() {
    let server = ZkServer::start().await;
    let url = format!("{}?session_timeout=5s", server.url_at("locks"));
    let path = format!("/locks/{}/encoder", lockkit_zk::SEMAPHORES);
    let mut curator = CuratorPeer::semaphore(&server, &path, 1).await;
    let permit = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .semaphore(1)
        .wait_for(Duration::from_secs(30));
    let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..3 {
        let locks = lockkit_zk::connect(&url).await.expect("connect");
        let (permit, inside) = (permit.clone(), inside.clone());
        clients.spawn(async move {
            for _ in 0..15 {
                let guard = locks.acquire("encoder", &permit).await?;
                let before = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                assert_eq!(before, 0, "two lockkit holders of one permit");
                guard.release().await?;
            }
            Ok::<_, lockkit_core::LockError>(())
        });
    }
    for cycle in 0..10 {
        let answer = curator.ask("cycle").await;
        assert!(
            answer.parse::<u64>().is_ok(),
            "Curator's cycle {cycle} answered {answer:?} while lockkit contended"
        );
    }
    while let Some(joined) = clients.join_next().await {
        joined.expect("a lockkit client").expect("lockkit's cycles");
    }
    let status = lockkit_zk::connect(&url)
        .await
        .expect("connect")
        .status_of("encoder", permit.kind())
        .await
        .expect("status");
    assert!(!status.held, "a lease left behind: {status:?}");
}

/// Asks `command` until the answer satisfies `done` (within 15 s).
async fn until_answer(
    peer: &mut CuratorPeer,
    command: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let answer = peer.ask(command).await;
        if done(&answer) {
            return answer;
        }
        assert!(Instant::now() < deadline, "{command}: still {answer:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Curator's `LeaderSelector` and lockkit's `Election` on one path: Curator's
/// `getLeader()` and `getParticipants()` show lockkit's identity while it
/// leads, lockkit's `leader()` shows Curator's participant id while Curator
/// leads, and leadership passes between them both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_are_shared_with_curator_leader_selector() {
    let server = ZkServer::start().await;
    let url = format!("{}?session_timeout=5s", server.url_at("locks"));
    let locks: Arc<dyn DistributedLock> =
        Arc::new(lockkit_zk::connect(&url).await.expect("connect"));
    let path = format!("/locks/{}", lockkit_zk::encode_name("scheduler"));
    let mut curator = CuratorPeer::leader_selector(&server, &path, "curator-1").await;
    let election = Election::new(locks, "scheduler", "lockkit-1");

    // lockkit leads; Curator campaigns behind it and sees it lead.
    let leadership = election
        .campaign(&LockOptions::new().no_wait())
        .await
        .expect("lockkit leads");
    assert_eq!(curator.ask("run").await, "campaigning");
    let participants =
        until_answer(&mut curator, "participants", |a| a.contains("curator-1")).await;
    assert_eq!(participants, "lockkit-1,curator-1");
    assert_eq!(curator.ask("leader").await, "lockkit-1");
    assert_eq!(curator.ask("leading").await, "no");

    // lockkit resigns: Curator leads, and lockkit sees it.
    leadership.resign().await.expect("resign");
    until_answer(&mut curator, "leading", |a| a == "yes").await;
    assert_eq!(
        election.leader().await.expect("leader()").as_deref(),
        Some("curator-1")
    );

    // lockkit campaigns behind Curator, and leads once Curator resigns.
    let waiting = {
        let election = election.clone();
        tokio::spawn(async move {
            election
                .campaign(&LockOptions::new().wait_for(Duration::from_secs(20)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "lockkit led while Curator did");
    assert_eq!(curator.ask("resign").await, "resigned");
    let leadership = waiting.await.unwrap().expect("lockkit leads again");
    assert_eq!(curator.ask("leader").await, "lockkit-1");
    leadership.resign().await.expect("resign");
}
