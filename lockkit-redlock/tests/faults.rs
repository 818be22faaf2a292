//! Redlock under node failures, against real redis-server processes: killed,
//! paused and restarted instances, and leases that expired on a majority.

#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{DistributedLock, LockError, LockOptions, LostReason};
use lockkit_redlock::RedlockLock;
use lockkit_testkit::{FaultControl, TestServer};
use lockkit_testkit::{Probe, RedisServer, TcpProxy, spawn_contenders};
use tokio::time::Instant;

async fn servers(n: usize) -> Vec<RedisServer> {
    let mut servers = Vec::with_capacity(n);
    for _ in 0..n {
        servers.push(RedisServer::start().await);
    }
    servers
}

/// The per-instance timeout of these tests. They check the quorum mechanics
/// with an explicit value: a loaded CI machine running a debug build can miss
/// the default of 50 ms, and Redlock then rightly answers `Unavailable`.
const INSTANCE_TIMEOUT: Duration = Duration::from_millis(250);

/// What a decision may take beyond the per-instance timeout before it
/// counts as hung: a frozen or dead instance never answers, so a call that
/// waited for it would not return at all. Far more than the timeout, so
/// that a loaded machine's slowness does not fail the tests; how fast a
/// decision is with instances down is the benchmarks' part.
const MARGIN: Duration = Duration::from_secs(10);

fn url(servers: &[RedisServer]) -> String {
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    format!(
        "redlock://{}?connect_timeout=500ms&instance_timeout={}ms",
        hosts.join(","),
        INSTANCE_TIMEOUT.as_millis()
    )
}

async fn connect(servers: &[RedisServer]) -> RedlockLock {
    lockkit_redlock::connect(&url(servers))
        .await
        .expect("connect")
}

fn opts() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(10))
}

/// How many instances hold `name` right now.
async fn holders(servers: &[RedisServer], name: &str) -> usize {
    let key = format!("lockkit:{name}");
    let mut n = 0;
    for server in servers {
        if matches!(server.command(&["EXISTS", &key]).await.as_deref(), Ok("1")) {
            n += 1;
        }
    }
    n
}

/// With 2 of 5 instances dead, acquire, extend and release still work; the
/// lock is held on all 3 live ones.
#[tokio::test]
async fn minority_down_still_works() {
    let servers = servers(5).await;
    let locks = connect(&servers).await;
    servers[0].kill();
    servers[1].kill();
    let guard = locks
        .acquire("minority", &opts())
        .await
        .expect("acquire with 3 of 5");
    assert_eq!(holders(&servers[2..], "minority").await, 3);
    guard
        .extend(Duration::from_secs(20))
        .await
        .expect("extend with 3 of 5");
    let other = connect(&servers[..]).await;
    assert!(
        other
            .try_acquire("minority", &opts())
            .await
            .unwrap()
            .is_none()
    );
    guard.release().await.expect("release with 3 of 5");
    assert_eq!(holders(&servers[2..], "minority").await, 0);
}

/// With 3 of 5 dead, acquire fails with `Unavailable` — not `Timeout`, not a
/// hang — within the per-instance timeout plus a small margin, and says how
/// many instances answered.
#[tokio::test]
async fn majority_down_is_unavailable_quickly() {
    let servers = servers(5).await;
    let locks = connect(&servers).await;
    for server in &servers[..3] {
        server.kill();
    }
    let start = Instant::now();
    let err = locks
        .acquire("majority", &opts().wait_for(Duration::from_secs(10)))
        .await
        .unwrap_err();
    let took = start.elapsed();
    match &err {
        LockError::Unavailable { message, .. } => {
            assert!(message.contains("2 of 5"), "{message}");
            assert!(message.contains("quorum is 3"), "{message}");
        }
        other => panic!("expected Unavailable, got {other}"),
    }
    assert!(took < INSTANCE_TIMEOUT + MARGIN, "took {took:?}");

    // Connecting while a majority is down fails the same way.
    let err = lockkit_redlock::connect(&url(&servers)).await.unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
}

/// With 2 of 5 instances frozen (SIGSTOP), acquiring goes on: it needs a
/// quorum of answers, not all of them, and each request is bounded by the
/// per-instance timeout.
#[tokio::test]
async fn paused_minority_keeps_latency_bounded() {
    let servers = servers(5).await;
    let locks = connect(&servers).await;
    servers[3].pause();
    servers[4].pause();
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let start = Instant::now();
        let guard = locks.acquire("paused", &opts()).await.expect("acquire");
        let took = start.elapsed();
        slowest = slowest.max(took);
        assert!(
            took < INSTANCE_TIMEOUT + MARGIN,
            "acquire {i} took {took:?}"
        );
        let start = Instant::now();
        guard.release().await.expect("release");
        assert!(
            start.elapsed() < INSTANCE_TIMEOUT + MARGIN,
            "release {i} took {:?}",
            start.elapsed()
        );
    }
    servers[3].resume();
    servers[4].resume();
    println!("slowest acquire with 2 of 5 paused: {slowest:?}");
}

/// A holder whose lease expired on a majority is told `Lost`: by `extend`,
/// and by the watchdog through the lost signal.
#[tokio::test]
async fn lease_expired_on_majority_is_lost() {
    let servers = servers(5).await;
    let locks = connect(&servers).await;

    let guard = locks
        .acquire("expired-extend", &opts().auto_renew(false))
        .await
        .unwrap();
    for server in &servers[..3] {
        server
            .command(&["PEXPIRE", "lockkit:expired-extend", "1"])
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let err = guard.extend(Duration::from_secs(10)).await.unwrap_err();
    assert!(
        matches!(
            err,
            LockError::Lost {
                reason: LostReason::Revoked,
                ..
            }
        ),
        "{err}"
    );

    let guard = locks
        .acquire(
            "expired-watchdog",
            &LockOptions::new().ttl(Duration::from_millis(600)),
        )
        .await
        .unwrap();
    for server in &servers[2..] {
        server
            .command(&["PEXPIRE", "lockkit:expired-watchdog", "1"])
            .await
            .unwrap();
    }
    let reason = tokio::time::timeout(Duration::from_secs(20), guard.lost())
        .await
        .expect("the watchdog notices at its next renewal");
    assert_eq!(reason, LostReason::Revoked);
}

/// An instance that restarts without persistence forgets the key, but while a
/// majority still holds it nobody else can take the lock.
#[tokio::test]
async fn restarted_instances_do_not_break_exclusion_while_a_majority_holds() {
    let servers = servers(5).await;
    let (a, b) = (connect(&servers).await, connect(&servers).await);
    let guard = a.acquire("restart", &opts()).await.unwrap();
    servers[0].restart().await;
    servers[1].restart().await;
    assert_eq!(holders(&servers, "restart").await, 3);
    assert!(
        b.try_acquire("restart", &opts()).await.unwrap().is_none(),
        "3 of 5 still hold it"
    );
    // B's partial grant on the two restarted instances was rolled back.
    assert_eq!(holders(&servers, "restart").await, 3);
    guard
        .extend(Duration::from_secs(20))
        .await
        .expect("a quorum still holds it");
    guard.release().await.expect("release");
    let guard = b
        .acquire("restart", &opts().wait_for(Duration::from_secs(5)))
        .await
        .unwrap();
    guard.release().await.unwrap();
}

/// 32 tasks × 50 critical sections on 4 clients, one of 5 instances frozen
/// part of the way through: never two inside at once, no lost update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_with_an_instance_paused_mid_run() {
    const CLIENTS: usize = 4;
    const TASKS_PER_CLIENT: usize = 8;
    const ROUNDS: u64 = 50;
    let servers = servers(5).await;
    let mut clients: Vec<Arc<dyn DistributedLock>> = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(Arc::new(connect(&servers).await));
    }
    let probe = Probe::default();
    let o = opts().wait_for(Duration::from_secs(60));
    let tasks = spawn_contenders(&clients, TASKS_PER_CLIENT, ROUNDS, "contended", &o, &probe);
    // Freeze one instance once the run is under way, thaw it near the end.
    while probe.completed() < 200 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    servers[2].pause();
    let paused_at = probe.completed();
    while probe.completed() < 1400 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    servers[2].resume();
    for task in tasks {
        task.await.expect("worker");
    }
    assert_eq!(probe.overlaps(), 0, "critical sections overlapped");
    assert_eq!(
        probe.completed(),
        (CLIENTS * TASKS_PER_CLIENT) as u64 * ROUNDS,
        "updates were lost"
    );
    assert!(paused_at < 1400, "the pause happened mid-run");
}

/// Every release reaches every instance, after the acquire requests of the
/// same lease: after many quick cycles no instance keeps a key. (Acquire
/// returns at a quorum; a `SET` still in flight that reached its instance after
/// the release's `DEL` would leave a key nobody holds until its TTL.) Four
/// clients cycle four locks at once. A release that is dropped is caught every
/// time; one that overtakes its acquire's `SET` needs a loaded machine to
/// happen at all, and this test caught it only while the rest of the suite
/// ran beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_reach_every_instance() {
    let servers = servers(5).await;
    let mut loops = Vec::new();
    for n in 0..4 {
        let locks = connect(&servers).await;
        loops.push(tokio::spawn(async move {
            let o = LockOptions::new()
                .ttl(Duration::from_secs(30))
                .auto_renew(false)
                .wait_for(Duration::from_secs(5));
            let name = format!("every-instance-{n}");
            for _ in 0..300 {
                let guard = locks.acquire(&name, &o).await.unwrap();
                guard.release().await.unwrap();
            }
        }));
    }
    for cycles in loops {
        cycles.await.unwrap();
    }
    // The requests of the last cycles to the slowest instances finish in the background.
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let mut left = Vec::new();
        for n in 0..4 {
            let name = format!("every-instance-{n}");
            let held = holders(&servers, &name).await;
            if held > 0 {
                left.push((name, held));
            }
        }
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "released locks still held on some instances: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A release is decided by a quorum; its delete to the last instance may
/// still be on the way when the next acquire of the same key (from the same
/// client) asks that instance. That acquire's request goes after the
/// delete, although it cannot share its connection (the delete keeps the
/// direct one busy, so the acquire would take the multiplexed one): here the
/// delete is held 300 ms on the way and the acquire's request is not, and
/// the third instance still ends up holding the new lease instead of
/// refusing it (the old holding there) and then losing the old one.
#[tokio::test]
async fn an_acquire_does_not_overtake_the_release_before_it() {
    let servers = servers(3).await;
    let proxy = TcpProxy::start(servers[2].addr()).await.expect("a proxy");
    let url = format!(
        "redlock://127.0.0.1:{},127.0.0.1:{},{}?connect_timeout=500ms&instance_timeout=1s",
        servers[0].port(),
        servers[1].port(),
        proxy.addr()
    );
    let locks = lockkit_redlock::connect(&url).await.expect("connect");
    let o = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .auto_renew(false);
    for round in 0..3 {
        let name = format!("overtake-{round}");
        let first = locks.try_acquire(&name, &o).await.unwrap().expect("free");
        // The third instance's grant may come after the quorum's.
        held_everywhere(&servers, &name, &format!("round {round}: the first lease")).await;
        proxy.set_delay(Duration::from_millis(300));
        first.release().await.unwrap();
        // The proxy takes its delay when it forwards a chunk: let it take
        // the delete's before the next request goes through undelayed.
        tokio::time::sleep(Duration::from_millis(50)).await;
        proxy.set_delay(Duration::ZERO);
        let second = locks.try_acquire(&name, &o).await.unwrap();
        let second = second.unwrap_or_else(|| panic!("round {round}: the second acquire"));
        held_everywhere(
            &servers,
            &name,
            &format!(
                "round {round}: the third instance lost the new lease to the old one's release"
            ),
        )
        .await;
        second.release().await.unwrap();
    }
}

/// Waits (up to 3 s) until every instance holds `name` for the same holder
/// (its owner token, the value of the lock's key).
async fn held_everywhere(servers: &[RedisServer], name: &str, what: &str) {
    let key = format!("lockkit:{name}");
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let mut tokens = Vec::with_capacity(servers.len());
        for server in servers {
            tokens.push(server.command(&["GET", &key]).await.ok());
        }
        let held = tokens[0].as_deref().is_some_and(|token| token != "(nil)");
        if held && tokens.iter().all(|token| *token == tokens[0]) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {tokens:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A lock held on exactly a quorum (3 of 5), one of those 3 frozen: the
/// answers fit a held lock as well as a free one, so `status` says
/// `Unavailable` (after reading again), never "free"; once the instance
/// answers again it reads "held".
#[tokio::test]
async fn a_silent_holder_instance_does_not_make_a_held_lock_look_free() {
    let servers = servers(5).await;
    let (a, b) = (connect(&servers).await, connect(&servers).await);
    let guard = a.acquire("silent", &opts()).await.unwrap();
    servers[0].restart().await;
    servers[1].restart().await;
    assert_eq!(holders(&servers, "silent").await, 3);
    servers[2].pause();
    let started = Instant::now();
    let status = b.status("silent").await;
    let took = started.elapsed();
    servers[2].resume();
    match status {
        Err(LockError::Unavailable { message, .. }) => {
            assert!(message.contains("may hold one"), "{message}")
        }
        other => panic!("2 holders, 2 free, 1 silent read as {other:?}"),
    }
    assert!(
        took <= 3 * (INSTANCE_TIMEOUT + MARGIN),
        "three reads took {took:?}"
    );
    let status = b.status("silent").await.expect("all five answer");
    assert!(status.held, "{status:?}");
    guard.release().await.unwrap();
    assert!(!b.status("silent").await.unwrap().held);
}

/// Sets `key` on `servers` as a client that died would have left it: held
/// for longer than any test runs.
async fn held_by_a_dead_client(servers: &[RedisServer], key: &str) {
    for server in servers {
        let set = server
            .command(&["SET", key, "a-client-that-died", "PX", "600000"])
            .await;
        assert_eq!(set.as_deref().ok(), Some("OK"), "{set:?}");
    }
}

/// A waiter whose grant won no quorum keeps its place in every instance's
/// waiting line. Two of three instances are held by a client that died
/// (their leases outlive the test): the free instance grants the waiter on
/// every try and the other two refuse it, so every try ends in a rollback.
/// The rollback puts the waiter back in the free instance's line at the
/// place the other two have it, so that the instances' lines stay alike and
/// their releases reserve the lock for the same waiter. (Without that, the
/// free instance's line lost the waiter on every grant, and with many
/// processes the instances reserved the lock for different waiters, none of
/// which won a quorum until the reservations lapsed.) As the waiter is
/// then first in that line, the rollback also reserves the free instance's
/// key for it, as a release would, taking it out of the line again: there
/// the waiter holds its turn rather than a place. Once the dead client's
/// leases go, the waiter gets the lock.
#[tokio::test]
async fn a_rolled_back_grant_keeps_the_waiters_place_in_line() {
    let servers = Arc::new(servers(3).await);
    let locks = connect(&servers).await;
    let (key, line) = ("lockkit:split", "{lockkit:split}:line");
    held_by_a_dead_client(&servers[1..], key).await;
    let waiting = tokio::spawn(async move {
        locks
            .acquire("split", &opts().wait_for(Duration::from_secs(60)))
            .await
    });
    let lines = |servers: Arc<Vec<RedisServer>>| async move {
        let mut lines = Vec::with_capacity(servers.len());
        for server in servers.iter() {
            let places = server
                .command(&["ZRANGE", line, "0", "-1", "WITHSCORES"])
                .await;
            lines.push(places.unwrap_or_else(|e| format!("error: {e}")));
        }
        lines
    };
    let turn = |servers: Arc<Vec<RedisServer>>| async move {
        servers[0]
            .command(&["GET", key])
            .await
            .unwrap_or_else(|e| format!("error: {e}"))
    };
    let alike = lockkit_testkit::eventually(MARGIN, || {
        let (lines, turn) = (lines(servers.clone()), turn(servers.clone()));
        async move {
            let (lines, turn) = (lines.await, turn.await);
            // One waiter (its id, one per connection, and its place), at
            // the same place on both held instances; on the free one at
            // that place too, or holding the turn there (the key reserved
            // for its id on that instance's connection).
            let places: Vec<Option<&str>> = lines
                .iter()
                .map(|line| match line.split(' ').collect::<Vec<_>>()[..] {
                    [_, place] => Some(place),
                    _ => None,
                })
                .collect();
            places[1].is_some()
                && places[1] == places[2]
                && (places[0] == places[1] || turn.starts_with('\u{1e}'))
        }
    })
    .await;
    assert!(
        alike,
        "the waiter's place in the instances' lines: {:?}, the free instance's key: {:?}",
        lines(servers.clone()).await,
        turn(servers.clone()).await
    );
    assert!(!waiting.is_finished(), "granted by one instance of three");
    for server in &servers[1..] {
        server.command(&["DEL", key]).await.expect("DEL");
    }
    let guard = tokio::time::timeout(MARGIN, waiting)
        .await
        .expect("the waiter gets the lock once the dead client's leases go")
        .expect("the waiting task")
        .expect("acquire");
    // A quorum: a try between the two deletions wins with the free
    // instance and the first one cleared.
    let held = holders(&servers, "split").await;
    assert!(held >= 2, "held on {held} instances of 3");
    guard.release().await.expect("release");
}

/// A rolled-back grant reserves the lock for the first waiter in line, as a
/// release would, rather than leaving it free for whichever waiter asks
/// next. Two of three instances are held by a client that died; waiters A
/// and then B, of two clients, are refused there on every try, and the free
/// instance grants whichever asks while it is free. Each grant is rolled
/// back, and the free instance's key ends up reserved for A, the first in
/// line, while B keeps its place in that instance's line.
#[tokio::test]
async fn a_rolled_back_grant_reserves_the_lock_for_the_first_in_line() {
    let servers = Arc::new(servers(3).await);
    let (key, line) = ("lockkit:first", "{lockkit:first}:line");
    held_by_a_dead_client(&servers[1..], key).await;
    let places = |server: usize| {
        let servers = servers.clone();
        async move {
            let places = servers[server]
                .command(&["ZRANGE", line, "0", "-1", "WITHSCORES"])
                .await
                .unwrap_or_default();
            let words: Vec<String> = places.split(' ').map(str::to_owned).collect();
            words
                .chunks(2)
                .filter_map(|pair| pair.get(1).cloned())
                .collect::<Vec<String>>()
        }
    };
    let waiter = |locks: RedlockLock| {
        tokio::spawn(async move {
            locks
                .acquire("first", &opts().wait_for(Duration::from_secs(60)))
                .await
        })
    };
    let a = waiter(connect(&servers).await);
    let a_placed = lockkit_testkit::eventually(MARGIN, || {
        let places = places(1);
        async move { places.await.len() == 1 }
    })
    .await;
    assert!(
        a_placed,
        "A's place on a held instance: {:?}",
        places(1).await
    );
    let b = waiter(connect(&servers).await);
    let reserved = lockkit_testkit::eventually(MARGIN, || {
        let (held, free, servers) = (places(1), places(0), servers.clone());
        async move {
            let held = held.await;
            let free = free.await;
            let turn = servers[0].command(&["GET", key]).await.unwrap_or_default();
            // A first and B second on the held instances; on the free one,
            // the key reserved and B alone in line.
            held.len() == 2 && turn.starts_with('\u{1e}') && free == held[1..]
        }
    })
    .await;
    assert!(
        reserved,
        "held instance's line {:?}, free instance's line {:?} and key {:?}",
        places(1).await,
        places(0).await,
        servers[0].command(&["GET", key]).await
    );
    assert!(
        !a.is_finished() && !b.is_finished(),
        "granted by one instance of three"
    );
    a.abort();
    b.abort();
}

/// A client that waited for the lock before (its turn channels are
/// subscribed) and whose release hands the lock to a client in line keeps
/// its own place on every instance in the same step: one place at the same
/// point in time on each, with a kept record (`k…`). Asking again, it waits
/// for that turn and gets the lock after the client it handed it to. Kept
/// places that their clients do not take over are given up: the name is
/// left with no key on any instance.
#[tokio::test]
async fn a_release_keeps_the_place_on_every_instance() {
    let servers = Arc::new(servers(3).await);
    let a = Arc::new(connect(&servers).await);
    let b = Arc::new(connect(&servers).await);
    let (key, line, turns) = (
        "lockkit:kept",
        "{lockkit:kept}:line",
        "{lockkit:kept}:turns",
    );
    let waits = |locks: &Arc<RedlockLock>| {
        let (locks, o) = (locks.clone(), opts().wait_for(Duration::from_secs(30)));
        tokio::spawn(async move { locks.acquire("kept", &o).await })
    };
    // The places in line on each instance, by their scores.
    let places = |servers: Arc<Vec<RedisServer>>| async move {
        let mut places = Vec::with_capacity(servers.len());
        for server in servers.iter() {
            let line = server
                .command(&["ZRANGE", line, "0", "-1", "WITHSCORES"])
                .await
                .unwrap_or_else(|e| format!("error: {e}"));
            let scores: Vec<String> = line
                .split(' ')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect();
            places.push(scores);
        }
        places
    };
    let one_in_line = || {
        let servers = servers.clone();
        lockkit_testkit::eventually(MARGIN, move || {
            let places = places(servers.clone());
            async move { places.await.iter().all(|scores| scores.len() == 1) }
        })
    };
    // `a` waits once, so that its turn channels are subscribed.
    let first = b.acquire("kept", &opts()).await.unwrap();
    let a_waits = waits(&a);
    assert!(one_in_line().await, "a never took its place in line");
    first.release().await.unwrap();
    let held = a_waits.await.unwrap().unwrap();
    let b_waits = waits(&b);
    assert!(one_in_line().await, "b never took its place in line");
    // A wait goes on once a quorum of instances have its subscriptions; the
    // others follow, and a place is kept only where every instance has
    // them: the lock's channel and the two clients' turn channels.
    let subscribed = lockkit_testkit::eventually(MARGIN, || {
        let servers = servers.clone();
        async move {
            for server in servers.iter() {
                let channels = server.command(&["PUBSUB", "CHANNELS", "*kept*"]).await;
                if channels.map_or(0, |c| c.split(' ').count()) < 3 {
                    return false;
                }
            }
            true
        }
    })
    .await;
    assert!(
        subscribed,
        "the waits' subscriptions never reached every instance"
    );
    held.release().await.unwrap();
    let b_guard = b_waits.await.unwrap().unwrap();
    let kept = places(servers.clone()).await;
    assert!(
        kept.iter()
            .all(|scores| scores.len() == 1 && scores == &kept[0]),
        "a's place, the same on every instance: {kept:?}"
    );
    for server in servers.iter() {
        // Beside the mark of b's lease, which its turn granted (`g…`).
        let records = server.command(&["HVALS", turns]).await.unwrap();
        assert!(
            records.split(' ').any(|record| record.starts_with('k')),
            "a kept record: {records:?}"
        );
    }
    let again = waits(&a);
    b_guard.release().await.unwrap();
    let a_guard = tokio::time::timeout(MARGIN, again)
        .await
        .expect("a's kept turn came")
        .unwrap()
        .unwrap();
    assert!(holders(&servers, "kept").await >= 2, "a holds a quorum");
    a_guard.release().await.unwrap();
    // `b` kept its place too, and does not ask again: its turn (now) is
    // given up by its client, and so is `a`'s, kept by that release.
    let cleared = lockkit_testkit::eventually(MARGIN, || {
        let servers = servers.clone();
        async move {
            for server in servers.iter() {
                if server.command(&["EXISTS", key, line, turns]).await.ok() != Some("0".to_owned())
                {
                    return false;
                }
            }
            true
        }
    })
    .await;
    assert!(cleared, "a kept place nobody took over was never given up");
}
