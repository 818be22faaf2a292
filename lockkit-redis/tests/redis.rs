//! Redis-specific behaviour against real redis-server processes: key layout,
//! reconnects, timeouts, authentication, TLS, notification-driven waits, fencing
//! persistence and interop with redis-py.

use std::time::Duration;

use lockkit_core::{DistributedLock, LockError, LockOptions};
use lockkit_redis::{RedisLock, RedisLockBuilder};
use lockkit_testkit::{ClosedPort, FaultControl, TestServer, eventually, waiter};
use lockkit_testkit::{
    PythonPeer, RedisServer, TestCerts, assert_mutual_exclusion_with, free_port,
};
use tokio::time::Instant;

mod common;

use common::{connect, cycle, opts};

/// How long a call that must fail at its timeout may take before it counts
/// as hung: far past the timeouts these tests set (which is what fails the
/// call; the server stays silent throughout), so that a loaded machine's
/// slowness does not fail them.
const NO_HANG: Duration = Duration::from_secs(10);

/// The lock key holds the owner token under the prefix; the fence counter and
/// the URL's database are where the docs say.
#[tokio::test]
async fn key_layout_and_database() {
    let server = RedisServer::start().await;
    let locks = connect(&format!("{}/2?prefix=app%3A", server.url())).await;
    let guard = locks.acquire("job/1", &opts()).await.unwrap();
    let token = guard.fencing_token().unwrap().get();
    let value = server.command(&["SELECT", "2"]).await.unwrap();
    assert_eq!(value, "OK");
    // `command` opens a fresh connection per call, so select inside one script.
    let owner = server
        .command(&[
            "EVAL",
            "redis.call('SELECT', 2) return redis.call('GET', KEYS[1])",
            "1",
            "app:job/1",
        ])
        .await
        .unwrap();
    assert_eq!(owner.len(), 36, "owner token is a UUID, got {owner:?}");
    let fence = server
        .command(&[
            "EVAL",
            "redis.call('SELECT', 2) return redis.call('GET', KEYS[1])",
            "1",
            "{app:job/1}:fence",
        ])
        .await
        .unwrap();
    assert_eq!(fence, token.to_string());
    assert_eq!(
        server.command(&["EXISTS", "app:job/1"]).await.unwrap(),
        "0",
        "db 0 untouched"
    );
    guard.release().await.unwrap();
}

/// With an empty prefix, a name shaped like another lock's fence counter is refused.
#[tokio::test]
async fn empty_prefix_refuses_fence_lookalikes() {
    let server = RedisServer::start().await;
    let locks = connect(&format!("{}?prefix=", server.url())).await;
    let err = locks.try_acquire("{job}:fence", &opts()).await.unwrap_err();
    assert!(matches!(err, LockError::InvalidName { .. }), "{err}");
    let guard = locks
        .try_acquire("job", &opts())
        .await
        .unwrap()
        .expect("plain key");
    assert_eq!(server.command(&["EXISTS", "job"]).await.unwrap(), "1");
    guard.release().await.unwrap();
}

/// After a restart (which also empties the script cache) the client reconnects
/// and reloads its scripts by itself.
#[tokio::test]
async fn reconnects_after_server_restart() {
    let server = RedisServer::start().await;
    let locks = connect(&format!("{}?command_timeout=500ms", server.url())).await;
    cycle(&locks, "before").await;
    server.restart().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let guard = loop {
        match locks.try_acquire("after", &opts()).await {
            Ok(Some(guard)) => break guard,
            Ok(None) => panic!("nobody holds `after`"),
            Err(LockError::Unavailable { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("no reconnect: {e}"),
        }
    };
    guard.release().await.unwrap();
}

/// A paused (SIGSTOP) server makes calls fail with `Unavailable` within the
/// command timeout instead of hanging; after it resumes, calls work again.
#[tokio::test]
async fn paused_server_gives_unavailable_within_command_timeout() {
    let server = RedisServer::start().await;
    let locks = connect(&format!("{}?command_timeout=300ms", server.url())).await;
    server.pause();
    let start = Instant::now();
    let err = locks.try_acquire("paused", &opts()).await.unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    assert!(start.elapsed() < NO_HANG, "{:?}", start.elapsed());
    server.resume();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match locks.try_acquire("paused", &opts()).await {
            Ok(Some(guard)) => {
                guard.release().await.unwrap();
                break;
            }
            Ok(None) => {} // the interrupted attempt's lease, released in the background
            Err(e) if Instant::now() >= deadline => panic!("not back after resume: {e}"),
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Once a client's direct connection is open, single commands take it (see
/// docs/design/redis-cycle.md): it authenticates and selects the
/// URL's database as the multiplexed one does. An acquire cut off by its
/// timeout leaves its reply owed on that connection, and what follows (the
/// release of the interrupted acquire) goes after it, as on one
/// connection: once the server answers again the name is free, long
/// before the lease's 30 s, and the same two connections serve on.
#[tokio::test]
async fn single_commands_take_a_direct_connection() {
    let server = RedisServer::builder().password("direct-pw").start().await;
    let locks = connect(&format!("{}/3?command_timeout=300ms", server.url())).await;
    let opts = opts().auto_renew(false);
    let cycle = |name: &'static str| {
        let locks = &locks;
        let opts = &opts;
        async move {
            match locks.try_acquire(name, opts).await? {
                Some(guard) => guard.release().await.map(|()| true),
                None => Ok(false),
            }
        }
    };
    // The clients in database 3, by id: lockkit's (the tests' own
    // `command` connection is in database 0).
    let clients = || async {
        let list = server.command(&["CLIENT", "LIST"]).await.unwrap();
        let mut ids: Vec<String> = list
            .lines()
            .filter(|line| line.split(' ').any(|field| field == "db=3"))
            .filter_map(|line| line.split(' ').next())
            .map(str::to_owned)
            .collect();
        ids.sort();
        ids
    };
    // The multiplexed connection and, opened beside it, the direct one.
    let deadline = Instant::now() + Duration::from_secs(10);
    let before = loop {
        assert!(cycle("direct").await.unwrap());
        let ids = clients().await;
        if ids.len() == 2 {
            break ids;
        }
        assert!(Instant::now() < deadline, "clients in db 3: {ids:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let paused = Instant::now();
    server.command(&["CLIENT", "PAUSE", "800"]).await.unwrap();
    let err = cycle("cut-off").await.unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    tokio::time::sleep_until(paused + Duration::from_millis(900)).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    while !cycle("cut-off").await.unwrap() {
        assert!(
            Instant::now() < deadline,
            "the interrupted acquire's lease is still there"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..20 {
        assert!(cycle("direct").await.unwrap());
    }
    assert_eq!(clients().await, before, "the same two connections");
}

/// `direct=false` keeps every command on the multiplexed connection: the
/// cycles after which a default client has opened its direct connection
/// beside it (and more) leave a `direct=false` client with one.
#[tokio::test]
async fn direct_false_keeps_one_command_connection() {
    let server = RedisServer::start().await;
    let clients_in = |db: &'static str| {
        let server = &server;
        async move {
            let list = server.command(&["CLIENT", "LIST"]).await.unwrap();
            list.lines()
                .filter(|line| line.split(' ').any(|field| field == db))
                .count()
        }
    };
    async fn cycle(locks: &RedisLock) {
        let opts = opts().auto_renew(false);
        let guard = locks.try_acquire("direct-or-not", &opts).await.unwrap();
        guard.expect("free").release().await.unwrap();
    }
    let default = connect(&format!("{}/5", server.url())).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut cycles = 0;
    while clients_in("db=5").await < 2 {
        assert!(Instant::now() < deadline, "no direct connection opened");
        cycle(&default).await;
        cycles += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let multiplexed_only = connect(&format!("{}/6?direct=false", server.url())).await;
    for _ in 0..cycles + 50 {
        cycle(&multiplexed_only).await;
    }
    assert_eq!(
        clients_in("db=6").await,
        1,
        "direct=false opened a second connection"
    );
}

/// Connecting to a server that accepts TCP but never answers fails within the
/// connect timeout.
#[tokio::test]
async fn unresponsive_server_fails_within_connect_timeout() {
    let server = RedisServer::start().await;
    server.pause();
    let start = Instant::now();
    let err = lockkit_redis::connect(&format!("{}?connect_timeout=400ms", server.url()))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    assert!(start.elapsed() < NO_HANG, "{:?}", start.elapsed());
    server.resume();
}

/// Nothing listens: `Unavailable`, quickly.
#[tokio::test]
async fn closed_port_is_unavailable() {
    let closed = ClosedPort::reserve();
    let port = closed.port();
    let start = Instant::now();
    let err = lockkit_redis::connect(&format!("redis://127.0.0.1:{port}?connect_timeout=1s"))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
    assert!(start.elapsed() < NO_HANG);
}

/// Wrong or missing passwords give a typed error that names the problem and
/// never shows the password; the right one works, and `Debug` hides it.
#[tokio::test]
async fn authentication_errors_are_typed_and_secret_free() {
    let server = RedisServer::builder()
        .password("correct-horse")
        .start()
        .await;
    let port = server.port();
    for url in [
        format!("redis://:battery-staple@127.0.0.1:{port}"),
        format!("redis://default:battery-staple@127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}"),
    ] {
        let err = lockkit_redis::connect(&url).await.unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(matches!(err, LockError::Backend { .. }), "{url}: {shown}");
        assert!(shown.contains("authentication"), "{shown}");
        assert!(!shown.contains("battery-staple"), "{shown}");
    }
    let locks = connect(&server.url()).await;
    let shown = format!("{locks:?}");
    assert!(!shown.contains("correct-horse"), "{shown}");
    locks
        .acquire("authed", &opts())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// The fencing counter lives while the name is held: readers that join
/// while one holds draw one token after another, and with AOF persistence
/// the counter survives a restart. Once the last holding is released the
/// counter goes, and a new one (as after a restart without persistence)
/// starts at the server's clock in microseconds: still above every earlier
/// token.
#[tokio::test]
async fn fencing_counter_and_persistence() {
    const COUNTER: &str = "{lockkit:fenced}:fence";
    for aof in [true, false] {
        let server = RedisServer::builder().appendonly(aof).start().await;
        let locks = connect(&server.url()).await;
        let mut tokens = Vec::new();
        for _ in 0..5 {
            let guard = locks.acquire("fenced", &opts()).await.unwrap();
            tokens.push(guard.fencing_token().unwrap().get());
            guard.release().await.unwrap();
            tokio::time::sleep(Duration::from_millis(3)).await;
            assert_eq!(
                server.command(&["EXISTS", COUNTER]).await.unwrap(),
                "0",
                "a released name keeps no counter"
            );
        }
        assert!(tokens.is_sorted_by(|a, b| a < b), "{tokens:?}");
        // A new counter starts at the server's clock (µs since 2020 at least).
        assert!(tokens[0] > 1_577_836_800_000_000, "{tokens:?}");

        let reader = opts().shared();
        let first = locks.acquire("fenced", &reader).await.unwrap();
        let base = first.fencing_token().unwrap().get();
        assert!(base > tokens[4], "{base} after {tokens:?}");
        for i in 1..=3 {
            let joined = locks.acquire("fenced", &reader).await.unwrap();
            assert_eq!(
                joined.fencing_token().unwrap().get(),
                base + i,
                "by one while held"
            );
            joined.release().await.unwrap();
        }
        server.restart().await;
        let locks = connect(&server.url()).await;
        let next = locks.acquire("fenced", &reader).await.unwrap();
        let token = next.fencing_token().unwrap().get();
        if aof {
            assert_eq!(token, base + 4, "AOF keeps the counter");
        } else {
            assert!(
                token > base + 3,
                "a lost counter restarts above: {token} after {base}+3"
            );
        }
        next.release().await.unwrap();
        drop(first);
    }
}

/// A writer's token is the server's clock, unless the counter is not below
/// it (a clock that went back): then it is one above the counter.
#[tokio::test]
async fn a_writer_draws_above_a_counter_ahead_of_the_clock() {
    const COUNTER: &str = "{lockkit:ahead}:fence";
    let server = RedisServer::start().await;
    let locks = connect(&server.url()).await;
    let guard = locks.acquire("ahead", &opts()).await.unwrap();
    let now = guard.fencing_token().unwrap().get();
    guard.release().await.unwrap();
    // An hour ahead of the clock.
    let ahead = now + 3_600_000_000;
    server
        .command(&["SET", COUNTER, &ahead.to_string()])
        .await
        .unwrap();
    let guard = locks.acquire("ahead", &opts()).await.unwrap();
    assert_eq!(guard.fencing_token().unwrap().get(), ahead + 1);
    assert_eq!(
        server.command(&["GET", COUNTER]).await.unwrap(),
        (ahead + 1).to_string(),
        "the counter holds the writer's token"
    );
    guard.release().await.unwrap();
}

/// A fair lock's queue: a waiter that vanished without leaving it (a
/// process that died) holds up the line for its place's time at most
/// (`QUEUE_PLACE`), and `try_acquire` does not jump the line meanwhile; the
/// queue's keys are gone once it is empty.
#[tokio::test]
async fn a_vanished_waiter_holds_up_a_fair_lock_for_its_place_at_most() {
    let server = RedisServer::start().await;
    let locks = connect(&format!("{}?fair=true", server.url())).await;
    assert!(locks.capabilities().fifo);
    let (queue, deadlines) = (
        "{lockkit:ghost-line}:queue",
        "{lockkit:ghost-line}:queue-deadlines",
    );
    // A waiter of another client that queued and then died: its place runs
    // out QUEUE_PLACE after its last attempt, as lockkit would have set it.
    let place = lockkit_redis::QUEUE_PLACE.as_millis().to_string();
    let queued = server
        .command(&[
            "EVAL",
            "local t = redis.call('TIME') \
             local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
             redis.call('ZADD', KEYS[1], 1, 'ghost') \
             redis.call('ZADD', KEYS[2], now + tonumber(ARGV[1]), 'ghost') \
             return 1",
            "2",
            queue,
            deadlines,
            &place,
        ])
        .await
        .unwrap();
    assert_eq!(queued, "1");
    let started = Instant::now();
    assert!(
        locks
            .try_acquire("ghost-line", &opts())
            .await
            .unwrap()
            .is_none(),
        "try_acquire jumped the queue"
    );
    let guard = locks
        .acquire("ghost-line", &opts().wait_for(Duration::from_secs(10)))
        .await
        .expect("the line moves once the ghost's place runs out");
    let waited = started.elapsed();
    assert!(
        waited >= lockkit_redis::QUEUE_PLACE - Duration::from_millis(200)
            && waited < lockkit_redis::QUEUE_PLACE + Duration::from_millis(1500),
        "waited {waited:?} behind a vanished waiter"
    );
    guard.release().await.unwrap();
    for key in [queue, deadlines] {
        let exists = server.command(&["EXISTS", key]).await.unwrap();
        assert_eq!(exists, "0", "{key} outlived its queue");
    }
}

/// A waiter whose subscriber connection is killed (as a server restart or a
/// proxy would) still hears the holder's release: the subscription is made
/// again, and the wait goes on, well before its 10 s backoff.
#[tokio::test]
async fn waiter_is_woken_after_its_subscriber_connection_is_killed() {
    let server = RedisServer::start().await;
    let (holder, waiter) = (connect(&server.url()).await, connect(&server.url()).await);
    let held = holder.acquire("resubscribed", &opts()).await.unwrap();
    let task = waiter::spawn_patient_acquire(waiter, "resubscribed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = server
        .command(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .await
        .unwrap();
    assert_eq!(killed, "1", "one subscriber connection");
    // Time for the waiter's client to notice and subscribe again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let channel = "{lockkit:resubscribed}:released";
    assert_eq!(
        server
            .command(&["PUBSUB", "NUMSUB", channel])
            .await
            .unwrap(),
        format!("{channel} 1"),
        "subscribed again"
    );
    let (guard, handoff) = waiter::hand_over(held, task).await;
    assert!(
        handoff < Duration::from_secs(2),
        "handoff took {handoff:?} after the subscriber's connection was killed"
    );
    guard.release().await.unwrap();
}

/// A holder that crashed never publishes a release: the waiter wakes when the
/// holder's PTTL runs out, even with a long backoff.
#[tokio::test]
async fn waiter_wakes_at_holder_expiry() {
    let server = RedisServer::start().await;
    let (holder, waiter) = (connect(&server.url()).await, connect(&server.url()).await);
    let ttl = Duration::from_millis(700);
    let granted = Instant::now();
    let crashed = holder
        .acquire("expiring", &LockOptions::new().ttl(ttl).auto_renew(false))
        .await
        .unwrap();
    std::mem::forget(crashed);
    let slow = LockOptions::new()
        .wait_for(Duration::from_secs(20))
        .backoff(lockkit_core::Backoff::new(
            Duration::from_secs(10),
            Duration::from_secs(10),
        ));
    let guard = waiter.acquire("expiring", &slow).await.unwrap();
    let after = granted.elapsed();
    assert!(after >= ttl - Duration::from_millis(50), "{after:?}");
    assert!(after < ttl + Duration::from_millis(500), "{after:?}");
    guard.release().await.unwrap();
}

/// Subscriptions of names nobody waits for any more are dropped after the linger time.
#[tokio::test]
async fn idle_subscriptions_are_dropped() {
    let server = RedisServer::start().await;
    let holder = connect(&server.url()).await;
    let waiter = std::sync::Arc::new(
        RedisLockBuilder::from_url(&server.url())
            .unwrap()
            .subscription_linger(Duration::from_millis(500))
            .connect()
            .await
            .unwrap(),
    );
    let mut held = Vec::new();
    for i in 0..5 {
        held.push(holder.acquire(&format!("sub-{i}"), &opts()).await.unwrap());
    }
    let waits: Vec<_> = (0..5)
        .map(|i| {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                waiter
                    .acquire(
                        &format!("sub-{i}"),
                        &opts().wait_for(Duration::from_millis(150)),
                    )
                    .await
            })
        })
        .collect();
    for wait in waits {
        assert!(matches!(
            wait.await.unwrap(),
            Err(LockError::Timeout { .. })
        ));
    }
    for guard in held {
        guard.release().await.unwrap();
    }
    let channels = server.command(&["PUBSUB", "CHANNELS"]).await.unwrap();
    // Two a name: its releases, and the waiter's turn in its line.
    assert_eq!(channels.split_whitespace().count(), 10, "{channels}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let channels = server.command(&["PUBSUB", "CHANNELS"]).await.unwrap();
    assert!(channels.trim().is_empty(), "still subscribed: {channels}");
}

/// `rediss://` with a private CA given by `ca_file`; a client that does not trust
/// the CA is refused, and certificate checks cannot be turned off (redis-rs's
/// `#insecure` is refused before any connection).
#[tokio::test]
async fn tls_with_private_ca() {
    let certs = TestCerts::generate().expect("openssl makes a test CA");
    let tls_port = free_port();
    let path = |f: &str| certs.path(f).to_str().unwrap().to_owned();
    let server = RedisServer::builder()
        .arg("--tls-port")
        .arg(&tls_port.to_string())
        .arg("--tls-cert-file")
        .arg(&path("server.crt"))
        .arg("--tls-key-file")
        .arg(&path("server.key"))
        .arg("--tls-ca-cert-file")
        .arg(&path("ca.crt"))
        .arg("--tls-auth-clients")
        .arg("no")
        .start()
        .await;
    let url = format!("rediss://127.0.0.1:{tls_port}?ca_file={}", path("ca.crt"));
    let locks = connect(&url).await;
    let guard = locks.acquire("over-tls", &opts()).await.unwrap();
    assert_eq!(
        server
            .command(&["EXISTS", "lockkit:over-tls"])
            .await
            .unwrap(),
        "1"
    );
    guard.release().await.unwrap();

    let err = lockkit_redis::connect(&format!("rediss://127.0.0.1:{tls_port}?connect_timeout=1s"))
        .await
        .expect_err("the private CA is not in the system roots");
    assert!(
        matches!(
            err,
            LockError::Unavailable { .. } | LockError::Backend { .. }
        ),
        "{err}"
    );

    let err = lockkit_redis::connect(&format!("rediss://127.0.0.1:{tls_port}#insecure"))
        .await
        .expect_err("no fragment turns certificate checks off");
    assert!(matches!(err, LockError::InvalidUrl { .. }), "{err}");
}

/// redis-py's `Lock` on the plain key `argv[2]`.
const REDIS_PY_LOCK: &str = r#"
import sys, redis
r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]))
lock = r.lock(sys.argv[2], timeout=30)
"#;

/// With an empty prefix, lockkit and redis-py's `Lock` on the same name exclude
/// each other, and neither releases the other's lease.
#[tokio::test]
async fn interop_with_redis_py() {
    let server = RedisServer::start().await;
    let locks = connect(&format!("{}?prefix=", server.url())).await;
    let port = server.port().to_string();
    let mut py = PythonPeer::start_lock_peer("redis", REDIS_PY_LOCK, &[&port, "shared-job"]).await;
    assert_mutual_exclusion_with(&mut py, &locks, "shared-job").await;
}

/// The waiting line: a release reserves the lock key for the first client
/// in the line (`\x1e` and its waiter id, for the releasing client's
/// `turn`) instead of freeing it. A client in line that vanished (here a
/// waiter id put there by hand, as a crashed client leaves it) is taken out
/// when its turn comes, and the reservation it never uses only delays the
/// next waiter, who then gets the lock; meanwhile `status` tells the lock
/// free, and nobody else takes it. (A turn of 5 s, so that the checks
/// after the release see the reservation however slow this machine is.)
#[tokio::test]
async fn a_vanished_waiter_costs_one_reservation() {
    const TURN: Duration = Duration::from_secs(5);
    let server = RedisServer::start().await;
    let holder = RedisLockBuilder::from_url(&server.url())
        .unwrap()
        .turn(TURN)
        .connect()
        .await
        .unwrap();
    let other = connect(&server.url()).await;
    let guard = holder.acquire("lined", &opts()).await.unwrap();
    let line = "{lockkit:lined}:line";
    let added = server
        .command(&["ZADD", line, "1", "vanished"])
        .await
        .unwrap();
    assert_eq!(added, "1");
    guard.release().await.unwrap();
    let value = server.command(&["GET", "lockkit:lined"]).await.unwrap();
    assert_eq!(
        value, "\u{1e}vanished",
        "the lock key holds the reservation"
    );
    let pttl: i64 = number(&server, &["PTTL", "lockkit:lined"]).await;
    assert!((1..=TURN.as_millis() as i64).contains(&pttl), "{pttl}");
    let left = server.command(&["ZCARD", line]).await.unwrap();
    assert_eq!(left, "0", "the head left the line when its turn came");
    let status = holder.status("lined").await.unwrap();
    assert!(!status.held, "a reservation is no holding: {status:?}");
    assert!(
        other.try_acquire("lined", &opts()).await.unwrap().is_none(),
        "nobody but the reserved waiter takes a reserved lock"
    );
    // The reservation runs out by itself; a waiting client then gets it.
    let guard = other
        .acquire("lined", &opts().wait_for(Duration::from_secs(30)))
        .await
        .unwrap();
    let stored = server.command(&["GET", "lockkit:lined"]).await.unwrap();
    assert!(!stored.starts_with('\u{1e}'), "{stored:?}");
    guard.release().await.unwrap();
    assert_eq!(
        server
            .command(&["EXISTS", "lockkit:lined", line])
            .await
            .unwrap(),
        "0",
        "a released name with nobody in line leaves no key"
    );
}

/// A release grants the first client in line the lease it recorded with
/// its place (`{<key>}:turns`), while that record is fresh: the key holds
/// the client's owner token for its TTL, with a fencing token above the
/// releaser's, and the client's channel says so; its record becomes
/// `g<owner>`, the mark of a lease its turn granted. A record gone stale (a
/// client that stopped asking, as a crashed one does) goes, and gets a
/// reservation instead, which costs the line one turn, not a lease. Records put there
/// by hand, as a client of another process leaves them; the freshness is
/// the server's clock against a bound far in the past or the future.
#[tokio::test]
async fn a_release_grants_the_head_its_lease_while_its_record_is_fresh() {
    let server = RedisServer::start().await;
    let holder = connect(&server.url()).await;
    let (line, turns) = ("{lockkit:granted}:line", "{lockkit:granted}:turns");
    for (fresh, granted) in [("99999999999999999", true), ("1", false)] {
        let guard = holder.acquire("granted", &opts()).await.unwrap();
        let releasers = guard.fencing_token().expect("a token").get();
        server.command(&["ZADD", line, "1", "gone"]).await.unwrap();
        let record = format!("{fresh}|7|30000|1|gone-owner");
        server
            .command(&["HSET", turns, "gone", &record])
            .await
            .unwrap();
        guard.release().await.unwrap();
        let value = server.command(&["GET", "lockkit:granted"]).await.unwrap();
        let pttl: u64 = number(&server, &["PTTL", "lockkit:granted"]).await;
        let left = server.command(&["HGET", turns, "gone"]).await.unwrap();
        if granted {
            assert_eq!(left, "ggone-owner", "the head's record marks its grant");
            assert_eq!(value, "gone-owner", "the head's lease");
            assert!(pttl > 5_000 && pttl <= 30_000, "{pttl}");
            let fence: u64 = number(&server, &["GET", "{lockkit:granted}:fence"]).await;
            assert!(fence > releasers, "token {fence} after {releasers}");
        } else {
            assert_eq!(left, "(nil)", "the head's stale record went with its turn");
            assert_eq!(value, "\u{1e}gone", "a stale record gets a reservation");
            assert!(pttl <= lockkit_redis::TURN.as_millis() as u64, "{pttl}");
        }
        server
            .command(&["DEL", "lockkit:granted", "{lockkit:granted}:fence"])
            .await
            .unwrap();
    }
}

/// Redlock rolls back an attempt that won no quorum on the instances that
/// granted it (`Release::Back`), and that rollback can reach an instance
/// after a release there granted the same waiter its turn, which the
/// waiter has been told of and counts: the rollback leaves such a lease
/// alone (the waiter's record says `g<owner>`, which a release by another
/// acquisition of the same client does not take). A lease the attempt itself
/// was granted is rolled back (and the lock reserved for the head of the
/// line, the client itself, back in line at its place).
#[tokio::test]
async fn a_rollback_leaves_a_lease_the_turn_granted() {
    use lockkit_core::LockKind;
    use lockkit_core::backend::Attempt;
    use lockkit_redis::{RedisConfig, RedisInstance, RedisKey, Release, Waiting, turn_stamp};

    let server = RedisServer::start().await;
    let config = RedisConfig::from_url(&server.url()).unwrap();
    let instance = RedisInstance::connect(config).await.unwrap();
    let key = RedisKey::new("lockkit:", "rolled", LockKind::Exclusive, false).unwrap();
    let ttl = Duration::from_secs(10);
    let place = 1_000_000;
    let waiting = || Waiting::TurnSince {
        place,
        stamp: turn_stamp(),
    };
    server
        .command(&["SET", "lockkit:rolled", "other", "PX", "30000"])
        .await
        .unwrap();
    let refused = instance
        .try_hold(&key, "mine", ttl, false, waiting())
        .await
        .unwrap();
    assert!(matches!(refused, Attempt::Busy { .. }), "{refused:?}");
    // The holder's release grants the client in line its turn.
    let released = instance
        .release_holding(&key, "other", false, Release::Grant)
        .await
        .unwrap();
    assert!(released);
    let held = || server.command(&["GET", "lockkit:rolled"]);
    assert_eq!(held().await.unwrap(), "mine", "the turn's lease");
    // A release by another acquisition of the same client, which holds
    // nothing (a kept place given up in the background), leaves the mark.
    let stale = instance
        .release_holding(&key, "older", false, Release::Grant)
        .await
        .unwrap();
    assert!(!stale, "not the older acquisition's");
    let rolled_back = instance
        .release_holding(&key, "mine", false, Release::Back(place))
        .await
        .unwrap();
    assert!(!rolled_back, "a rollback of the turn's lease");
    assert_eq!(held().await.unwrap(), "mine", "the turn's lease stays");
    // The holding ends with its release, and a lease an attempt was
    // granted goes with the attempt's rollback.
    assert!(
        instance
            .release_holding(&key, "mine", false, Release::Grant)
            .await
            .unwrap()
    );
    let granted = instance
        .try_hold(&key, "next", ttl, false, waiting())
        .await
        .unwrap();
    assert!(matches!(granted, Attempt::Acquired(_)), "{granted:?}");
    let rolled_back = instance
        .release_holding(&key, "next", false, Release::Back(place))
        .await
        .unwrap();
    assert!(rolled_back, "the attempt's own grant is rolled back");
    // Back in line at its place, the client is the head: the lock is
    // reserved for it, as a release reserves it.
    let after = held().await.unwrap();
    assert!(after.starts_with('\u{1e}'), "{after:?}");
}

/// A client whose turn channel is subscribed (it waited for the lock
/// before) and whose release hands the lock to a client in line keeps its
/// own place in the same step: it is at the end of the line with a kept
/// record (`k…`) at once, and asking again it waits for that turn and gets
/// the lock after the client it handed it to, with a higher token. A kept
/// place that its client does not take over is given up: the name is left
/// with no key.
#[tokio::test]
async fn a_release_keeps_the_place_of_a_client_that_waited() {
    let server = RedisServer::start().await;
    let a = std::sync::Arc::new(connect(&server.url()).await);
    let b = std::sync::Arc::new(connect(&server.url()).await);
    let (line, turns) = ("{lockkit:kept}:line", "{lockkit:kept}:turns");
    // An acquire of the name that waits, in a task of its own.
    let waits = |locks: &std::sync::Arc<RedisLock>| {
        let (locks, o) = (locks.clone(), opts().wait_for(Duration::from_secs(30)));
        tokio::spawn(async move { locks.acquire("kept", &o).await })
    };
    let in_line = |n: &'static str| {
        let server = &server;
        async move {
            eventually(Duration::from_secs(10), || async {
                server.command(&["ZCARD", line]).await.unwrap() == n
            })
            .await
        }
    };
    // `a` waits once, so that its turn channel is subscribed.
    let first = b.acquire("kept", &opts()).await.unwrap();
    let a_waits = waits(&a);
    assert!(in_line("1").await, "a never took its place in line");
    first.release().await.unwrap();
    let held = a_waits.await.unwrap().unwrap();
    let b_waits = waits(&b);
    assert!(in_line("1").await, "b never took its place in line");
    held.release().await.unwrap();
    let b_guard = b_waits.await.unwrap().unwrap();
    assert_eq!(server.command(&["ZCARD", line]).await.unwrap(), "1");
    let record = server.command(&["HVALS", turns]).await.unwrap();
    assert!(record.starts_with('k'), "a kept record: {record:?}");
    let again = waits(&a);
    let b_token = b_guard.fencing_token().expect("a token").get();
    b_guard.release().await.unwrap();
    let a_guard = again.await.unwrap().unwrap();
    let a_token = a_guard.fencing_token().expect("a token").get();
    assert!(a_token > b_token, "token {a_token} after {b_token}");
    a_guard.release().await.unwrap();
    // `b` kept its place too, and does not ask again: its turn (now) is
    // given up by its client, and the name is left with no key.
    let cleared = eventually(Duration::from_secs(10), || async {
        server
            .command(&["EXISTS", "lockkit:kept", line, turns])
            .await
            .unwrap()
            == "0"
    })
    .await;
    assert!(cleared, "a kept place nobody took over was never given up");
}

/// The turn of a kept place (a record marked `k`) goes to the next in line
/// when nobody listens on its turn channel (its client went away): fresh,
/// the next waiter's recorded lease is granted instead; stale, the next
/// waiter gets the reservation. A place without the mark keeps its turn
/// whoever listens, as before. Records put there by hand.
#[tokio::test]
async fn a_kept_place_nobody_listens_for_is_passed_over() {
    let server = RedisServer::start().await;
    let holder = connect(&server.url()).await;
    let (line, turns) = ("{lockkit:passed}:line", "{lockkit:passed}:turns");
    let future = "99999999999999999";
    for (gone, next, expected) in [
        (
            format!("k{future}|7|30000|1|gone-owner"),
            format!("{future}|8|30000|1|next-owner"),
            "next-owner",
        ),
        (
            "k1|7|30000|1|gone-owner".to_owned(),
            "1|8|30000|1|next-owner".to_owned(),
            "\u{1e}next",
        ),
        (
            format!("{future}|7|30000|1|gone-owner"),
            format!("{future}|8|30000|1|next-owner"),
            "gone-owner",
        ),
    ] {
        let guard = holder.acquire("passed", &opts()).await.unwrap();
        server
            .command(&["ZADD", line, "1", "gone", "2", "next"])
            .await
            .unwrap();
        server
            .command(&["HSET", turns, "gone", &gone, "next", &next])
            .await
            .unwrap();
        guard.release().await.unwrap();
        let value = server.command(&["GET", "lockkit:passed"]).await.unwrap();
        assert_eq!(value, expected, "records {gone:?}, {next:?}");
        server
            .command(&[
                "DEL",
                "lockkit:passed",
                "{lockkit:passed}:fence",
                line,
                turns,
            ])
            .await
            .unwrap();
    }
}

/// The server's answer to `command`, a number.
async fn number<T: std::str::FromStr<Err: std::fmt::Debug>>(
    server: &RedisServer,
    command: &[&str],
) -> T {
    let answer = server.command(command).await.unwrap();
    answer
        .parse()
        .unwrap_or_else(|e| panic!("{command:?}: {answer:?} ({e:?})"))
}

/// A turn outside 1 ms ..= 1 min is refused before anything is sent.
#[tokio::test]
async fn a_turn_out_of_range_is_refused() {
    for turn in [Duration::ZERO, Duration::from_secs(61)] {
        let refused = RedisLockBuilder::from_url(&format!("redis://127.0.0.1:{}", free_port()))
            .unwrap()
            .turn(turn)
            .connect()
            .await
            .unwrap_err();
        assert!(
            matches!(refused, LockError::InvalidOptions { .. }),
            "{refused}"
        );
        assert!(refused.to_string().contains("turn"), "{refused}");
    }
}
