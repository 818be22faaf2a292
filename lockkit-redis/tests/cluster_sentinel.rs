//! Redis Cluster, Redis Sentinel and the replica `WAIT` against real
//! redis-server processes: keys across every slot, notifications across
//! nodes, failovers under a live client (Sentinel's, and a cluster's with
//! replicas), replication cut, and bad or unreachable URLs.

use std::net::SocketAddr;
use std::time::Duration;

use lockkit_core::{DistributedLock, LockError, LockGuard, LockOptions};
use lockkit_redis::{DEFAULT_PREFIX, RedisLock, RedisLockBuilder};
use lockkit_testkit::{ClosedPort, RedisCluster, RedisSentinels, RedisServer, eventually};
use lockkit_testkit::{FaultControl, TestServer, info_field, waiter};
use tokio::time::Instant;

const CLIENT_PARAMS: &str = "connect_timeout=500ms&command_timeout=500ms";

mod common;

use common::{connect, cycle, opts, take, try_cycle};

/// How long a call that must fail at its timeout may take before it counts
/// as hung: far past the timeouts these tests set (which is what fails the
/// call; the server stays silent throughout), so that a loaded machine's
/// slowness does not fail them.
const NO_HANG: Duration = Duration::from_secs(10);

fn key(name: &str) -> String {
    format!("{DEFAULT_PREFIX}{name}")
}

/// Holds `name` on `holder`, lets `waiter` wait with a 10 s backoff, releases
/// and returns how long the waiter took to get the lock.
async fn handoff(holder: &RedisLock, waiter: RedisLock, name: &str) -> Duration {
    let held = holder.acquire(name, &opts()).await.unwrap();
    let owned = name.to_owned();
    let task = tokio::spawn(async move {
        let guard = waiter.acquire(&owned, &waiter::patient()).await;
        (guard, Instant::now())
    });
    // Time for the waiter to try, subscribe and try again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (guard, acquired) = task.await.unwrap();
    guard.expect("the waiter acquires").release().await.unwrap();
    acquired - released
}

/// Waits for the sentinels to promote the replica of the (killed) master at
/// `old`.
async fn wait_for_promotion(deployment: &RedisSentinels, old: SocketAddr) {
    assert!(
        deployment
            .wait_for_failover(old, Duration::from_secs(30))
            .await,
        "no failover within 30 s"
    );
}

/// `try_acquire` of a lock nobody holds, retried while the client cannot
/// reach the (new) master yet, for up to 15 s.
async fn acquire_once_reachable(lock: &RedisLock, name: &str, opts: &LockOptions) -> LockGuard {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match lock.try_acquire(name, opts).await {
            Ok(Some(guard)) => return guard,
            Ok(None) => panic!("{name:?} is held, but nobody should hold it"),
            Err(LockError::Unavailable { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no acquire of {name:?}: {e}"),
        }
    }
}

/// A renewal that no replica acknowledged fails with `Unavailable`, and the
/// guard's validity does not move.
async fn renewal_is_not_acknowledged(guard: &LockGuard) {
    let valid_until = guard.valid_until();
    match guard.extend(Duration::from_secs(60)).await {
        Err(LockError::Unavailable { message, .. }) => assert!(
            message.contains("renewal written but only 0 of 1 replicas acknowledged"),
            "{message}"
        ),
        other => panic!("a renewal no replica acknowledged: {other:?}"),
    }
    assert_eq!(guard.valid_until(), valid_until, "validity moved");
}

/// A holder whose lock vanished in a failover learns it when it reaches the
/// new master (its first calls may still meet the old master's dead
/// connection: `Unavailable`), and cannot free the next holder's lock.
async fn learns_of_its_loss(held: LockGuard) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let extended = loop {
        match held.extend(Duration::from_secs(30)).await {
            Err(LockError::Unavailable { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => break other,
        }
    };
    assert!(
        matches!(extended, Err(LockError::Lost { .. })),
        "{extended:?}"
    );
    assert!(held.is_lost());
    assert!(matches!(held.release().await, Err(LockError::Lost { .. })));
}

// ---------------------------------------------------------------------------
// Redis Cluster
// ---------------------------------------------------------------------------

/// Locks on many names (braces included) land on every master, and are all
/// released again. The acquire script gets the fence counter's key too, so a
/// key in another slot would fail with CROSSSLOT; without `wait_replicas`
/// no token is drawn in cluster mode (a promoted replica could repeat one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_locks_names_across_all_slots() {
    let cluster = RedisCluster::start(3).await;
    let url = format!("{}?{CLIENT_PARAMS}", cluster.url());
    let (a, b) = (connect(&url).await, connect(&url).await);
    let odd = ["{", "}", "{}", "{x}", "a}b", "}{y}", "{tag}:fence", "ü{名}"];
    let names: Vec<String> = (0..600)
        .map(|i| format!("spread-{i}{}", odd[i % odd.len()]))
        .collect();
    let mut guards = Vec::new();
    for name in &names {
        let guard = a
            .try_acquire(name, &opts().auto_renew(false))
            .await
            .unwrap_or_else(|e| panic!("{name:?}: {e}"))
            .unwrap_or_else(|| panic!("{name:?} collides"));
        assert_eq!(guard.fencing_token(), None, "no fencing without WAIT");
        guards.push(guard);
    }
    // Every master holds some of them: a lock key each.
    let mut total = 0;
    for node in cluster.nodes() {
        let size: usize = node.command(&["DBSIZE"]).await.unwrap().parse().unwrap();
        assert!(size > 0, "node {} holds no lock", node.port());
        total += size;
    }
    assert_eq!(total, names.len());
    for name in names.iter().step_by(37) {
        assert!(b.try_acquire(name, &opts()).await.unwrap().is_none());
        let status = b.status(name).await.unwrap();
        assert!(status.held, "{name:?}");
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
    // Nothing stays.
    let mut total = 0;
    for node in cluster.nodes() {
        let size: usize = node.command(&["DBSIZE"]).await.unwrap().parse().unwrap();
        total += size;
    }
    assert_eq!(total, 0);
    assert_eq!(
        cluster.command(&["EXISTS", &key(&names[1])]).await.unwrap(),
        "0"
    );
}

/// A release published on one master wakes a waiter whose subscriber is
/// connected to another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_release_on_another_node_wakes_the_waiter() {
    let cluster = RedisCluster::start(3).await;
    let url = format!("{}?{CLIENT_PARAMS}", cluster.url());
    // A name whose slot the first node (the subscriber's seed) does not serve.
    let name = name_in_slots(&cluster, "elsewhere", |slot| slot >= 16384 / 3).await;
    let (holder, waiter) = (connect(&url).await, connect(&url).await);
    assert!(
        holder.backend().instance().publishes_sharded(),
        "Redis 7 has SPUBLISH"
    );
    let took = handoff(&holder, waiter, &name).await;
    // The waiter's own retry comes 10 s after its last try: sooner, it was woken.
    assert!(took < Duration::from_secs(5), "handoff took {took:?}");
}

/// The bus messages of pub/sub that the nodes of `cluster` have received,
/// broadcast (`PUBLISH`) and sharded (`SPUBLISH`), summed over the nodes.
async fn bus_messages(cluster: &RedisCluster) -> (u64, u64) {
    let mut sums = (0, 0);
    for node in cluster.nodes() {
        let info = node.command(&["CLUSTER", "INFO"]).await.unwrap();
        let field = |name: &str| -> u64 {
            info_field(&info, name).map_or(0, |v| v.trim().parse().unwrap())
        };
        sums.0 += field("cluster_stats_messages_publish_received");
        sums.1 += field("cluster_stats_messages_publishshard_received");
    }
    sums
}

/// With sharded pub/sub (the default where the servers have it) a release
/// reaches only the shard of the lock key's slot: the other masters get no
/// message over the cluster bus. With `sharded_pubsub=false` every release
/// is a `PUBLISH` that each other master receives. Waiters are woken either
/// way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_releases_reach_only_their_shard() {
    const HANDOFFS: u64 = 5;
    let cluster = RedisCluster::start(3).await;
    for sharded in [true, false] {
        let url = format!("{}?{CLIENT_PARAMS}&sharded_pubsub={sharded}", cluster.url());
        let holder = connect(&url).await;
        assert_eq!(holder.backend().instance().publishes_sharded(), sharded);
        let name = format!("announced-{sharded}");
        let before = bus_messages(&cluster).await;
        for _ in 0..HANDOFFS {
            let took = handoff(&holder, connect(&url).await, &name).await;
            assert!(took < Duration::from_secs(5), "handoff took {took:?}");
        }
        if sharded {
            let after = bus_messages(&cluster).await;
            let (global, shard) = (after.0 - before.0, after.1 - before.1);
            assert_eq!(
                (global, shard),
                (0, 0),
                "a shard without replicas sends nothing"
            );
        } else {
            // Each release (the waiter's too) is broadcast to both other
            // masters; the bus may carry the last ones a little later.
            let deadline = Instant::now() + NO_HANG;
            loop {
                let after = bus_messages(&cluster).await;
                let (global, shard) = (after.0 - before.0, after.1 - before.1);
                assert_eq!(shard, 0);
                if global >= 2 * 2 * HANDOFFS {
                    break;
                }
                assert!(Instant::now() < deadline, "{global} broadcast messages");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The first name `<prefix>-<i>` whose lock key the cluster puts in a
/// slot that `wanted` takes, as the server computes it (`CLUSTER KEYSLOT`).
async fn name_in_slots(
    cluster: &RedisCluster,
    prefix: &str,
    wanted: impl Fn(u16) -> bool,
) -> String {
    let mut i = 0;
    loop {
        let name = format!("{prefix}-{i}");
        let slot = cluster.command(&["CLUSTER", "KEYSLOT", &key(&name)]).await;
        if wanted(slot.unwrap().parse().expect("a slot number")) {
            return name;
        }
        i += 1;
    }
}

/// A dead master makes its locks unavailable (typed, within the timeouts);
/// the same client works again once the node is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_node_failure_is_unavailable_then_recovers() {
    let cluster = RedisCluster::start(3).await;
    let locks = connect(&format!("{}?{CLIENT_PARAMS}", cluster.url())).await;
    // A name on the last node (slots 10923..=16383).
    let name = name_in_slots(&cluster, "on-last", |slot| slot > 2 * 16384 / 3 + 1).await;
    try_cycle(&locks, &name).await;
    cluster.nodes()[2].kill();
    let started = Instant::now();
    let err = locks.try_acquire(&name, &opts()).await.unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    assert!(started.elapsed() < NO_HANG, "{:?}", started.elapsed());
    cluster.nodes()[2].restart().await;
    assert!(cluster.wait_until_ok(Duration::from_secs(20)).await);
    assert!(
        eventually(Duration::from_secs(15), || async {
            match locks.try_acquire(&name, &opts()).await {
                Ok(Some(guard)) => guard.release().await.is_ok(),
                _ => false,
            }
        })
        .await,
        "the client did not recover after the node came back"
    );
}

/// Waits (30 s at most) until `node` has `role`; a replica also its link up.
async fn wait_for_role(node: &RedisServer, role: &str) {
    assert!(
        node.wait_for_role(role, Duration::from_secs(30)).await,
        "{} did not become a {role} within 30 s",
        node.addr()
    );
}

/// Redis Cluster with a replica per master, as the Sentinel test below: the
/// replica of the lock's master is frozen and the master drops its link, so
/// a grant cannot reach it; the master is killed, the cluster's other
/// masters promote the replica, and a second client is granted the same
/// lock while the first still holds a guard that looks valid. With
/// `wait_replicas=1` (the `WAIT` goes to the lock's master) the grant is
/// refused while its replica cannot acknowledge it, and so is a renewal:
/// the guard's validity does not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_before_replication_grants_the_lock_twice_unless_waiting() {
    let cluster = RedisCluster::try_start_with_replicas(3).await.unwrap();
    let url = format!("{}?{CLIENT_PARAMS}", cluster.url());
    let (first, second) = (connect(&url).await, connect(&url).await);
    let waiting = connect(&format!("{url}&wait_replicas=1&wait_timeout=300ms")).await;
    let name = "cluster-granted-twice";
    let unrenewed = opts().auto_renew(false);
    let master = cluster.master_of(&key(name)).await.expect("a master");
    let replica = cluster.replica_of(master).await.expect("a replica");

    // Another name on the same master, for the renewal (its release during
    // the cut does not reach the replica either).
    let mut other = String::new();
    for i in 0.. {
        other = format!("cluster-renewed-{i}");
        let on = cluster.master_of(&key(&other)).await.expect("a master");
        if on.port() == master.port() {
            break;
        }
    }

    // Replicated: acknowledged grants and renewals.
    let renewed = waiting.acquire(&other, &unrenewed).await.unwrap();
    assert!(waiting.capabilities().fencing && !first.capabilities().fencing);
    assert_eq!(
        replica.command(&["READONLY"]).await.unwrap(),
        "OK",
        "the replica serves reads"
    );
    renewed.extend(Duration::from_secs(30)).await.unwrap();

    // Cut: nothing written from now on reaches the replica.
    replica.pause();
    let killed = master
        .command(&["CLIENT", "KILL", "TYPE", "replica"])
        .await
        .unwrap();
    assert_eq!(killed, "1", "the master dropped its replica's link");
    renewal_is_not_acknowledged(&renewed).await;
    renewed.release().await.unwrap();
    refused_unseen(waiting.try_acquire(name, &unrenewed).await);
    assert_eq!(
        master.command(&["EXISTS", &key(name)]).await.unwrap(),
        "0",
        "a refused grant leaves no key"
    );
    let held = take(&first, name, &unrenewed).await;

    master.kill();
    replica.resume();
    wait_for_role(replica, "master").await;
    // The promoted replica never had the first grant.
    let taken = acquire_once_reachable(&second, name, &unrenewed).await;
    assert!(!held.is_lost());
    assert!(held.valid_until().expect("a lease") > Instant::now());
    learns_of_its_loss(held).await;
    taken.release().await.unwrap();

    // The old master rejoins as the new master's replica: acknowledged
    // grants work again.
    master.try_restart().await.unwrap();
    wait_for_role(master, "slave").await;
    assert!(
        eventually(Duration::from_secs(15), || async {
            match waiting.try_acquire(name, &unrenewed).await {
                Ok(Some(guard)) => guard.release().await.is_ok(),
                _ => false,
            }
        })
        .await,
        "acquires with WAIT did not work again once the old master replicated"
    );
}

// ---------------------------------------------------------------------------
// Redis Sentinel
// ---------------------------------------------------------------------------

/// The master dies, the sentinels promote the replica, and the same client
/// acquires on the new master (its failures meanwhile are typed), and its
/// waiters are woken by releases on the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_keeps_the_client_working() {
    let deployment = RedisSentinels::start().await;
    let url = format!("{}?{CLIENT_PARAMS}", deployment.url());
    let (locks, waiter) = (connect(&url).await, connect(&url).await);
    cycle(&locks, "before").await;

    let old = deployment.master().addr();
    deployment.master().kill();
    wait_for_promotion(&deployment, old).await;
    let guard = acquire_once_reachable(&locks, "after", &opts()).await;
    let replica = deployment.replica();
    assert_eq!(
        replica.command(&["EXISTS", &key("after")]).await.unwrap(),
        "1",
        "the lock is on the promoted replica"
    );
    // No token without WAIT: a promoted replica may repeat the last one.
    assert_eq!(guard.fencing_token(), None);
    guard.release().await.unwrap();

    // Release notifications follow the master too.
    let took = handoff(&locks, waiter, "notified-after-failover").await;
    assert!(took < Duration::from_millis(1000), "handoff took {took:?}");
}

/// The failover story, reproduced step by step: replication is cut, a lock
/// is granted on the master, the master dies before the key reaches the
/// replica, the sentinels promote the replica, and a second client is
/// granted the same lock while the first still holds a guard that looks
/// valid. Only when the first talks to the server again does it learn that
/// its lease is gone. With `wait_replicas=1` the first grant is refused
/// while the replica cannot acknowledge it, so no such lock can exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_before_replication_grants_the_lock_twice_unless_waiting() {
    let deployment = RedisSentinels::start().await;
    let url = format!("{}?{CLIENT_PARAMS}", deployment.url());
    let (first, second) = (connect(&url).await, connect(&url).await);
    let waiting = connect(&format!("{url}&wait_replicas=1&wait_timeout=300ms")).await;
    let name = "granted-twice";
    // No watchdog: the first holder's guard must not find out by itself
    // before the second grant.
    let unrenewed = opts().auto_renew(false);

    deployment
        .replication_proxy()
        .expect("a replication proxy")
        .blackhole(true);
    refused_unseen(waiting.try_acquire(name, &unrenewed).await);
    let held = take(&first, name, &unrenewed).await;
    assert_eq!(
        deployment
            .replica()
            .command(&["EXISTS", &key(name)])
            .await
            .unwrap(),
        "0",
        "the grant has not reached the replica"
    );

    let old = deployment.master().addr();
    deployment.master().kill();
    // Drop what the blackhole held, so the replica never gets the grant.
    deployment
        .replication_proxy()
        .expect("a replication proxy")
        .reset_connections();
    deployment
        .replication_proxy()
        .expect("a replication proxy")
        .blackhole(false);
    wait_for_promotion(&deployment, old).await;
    // The promoted replica never had the first grant.
    let taken = acquire_once_reachable(&second, name, &unrenewed).await;
    // Two holders at once: the first guard still looks valid.
    assert!(!held.is_lost());
    assert!(held.valid_until().expect("a lease") > Instant::now());

    learns_of_its_loss(held).await;
    assert_eq!(
        second
            .try_acquire(name, &unrenewed)
            .await
            .unwrap()
            .map(|_| ()),
        None,
        "the second holder still holds"
    );
    taken.release().await.unwrap();
}

/// `wait_replicas=1`: with replication working the acquire and a renewal
/// succeed; cut by the proxy, an acquire fails with `Unavailable` and leaves
/// the lock free, and a renewal fails with `Unavailable` (the guard's
/// validity does not move).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_replicas_fails_cleanly_without_replication() {
    let deployment = RedisSentinels::start().await;
    let url = format!(
        "{}?{CLIENT_PARAMS}&wait_replicas=1&wait_timeout=300ms",
        deployment.url()
    );
    let waiting = connect(&url).await;
    let plain = connect(&format!("{}?{CLIENT_PARAMS}", deployment.url())).await;
    assert_eq!(
        waiting.backend().instance().wait_for_replicas(),
        Some((1, Duration::from_millis(300)))
    );

    let guard = waiting.acquire("replicated", &opts()).await.unwrap();
    // Acknowledged grants fence again; without WAIT, Sentinel mode does not.
    assert!(waiting.capabilities().fencing && !plain.capabilities().fencing);
    assert!(guard.fencing_token().is_some());
    assert_eq!(
        deployment
            .replica()
            .command(&["EXISTS", &key("replicated")])
            .await
            .unwrap(),
        "1",
        "acknowledged means the replica has it"
    );
    guard.extend(Duration::from_secs(30)).await.unwrap();
    guard.release().await.unwrap();
    let renewed = waiting
        .acquire("renewed", &opts().auto_renew(false))
        .await
        .unwrap();

    deployment
        .replication_proxy()
        .expect("a replication proxy")
        .blackhole(true);
    renewal_is_not_acknowledged(&renewed).await;
    let started = Instant::now();
    let err = waiting
        .try_acquire("cut-off", &opts())
        .await
        .expect_err("no replica can acknowledge");
    let took = started.elapsed();
    match &err {
        LockError::Unavailable { message, .. } => {
            assert!(
                message.contains("only 0 of 1 replicas acknowledged"),
                "{message}"
            );
        }
        other => panic!("{other}"),
    }
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "{took:?}"
    );
    // No leaked lease: the lock is free at once.
    assert_eq!(
        deployment
            .master()
            .command(&["EXISTS", &key("cut-off")])
            .await
            .unwrap(),
        "0"
    );
    plain
        .try_acquire("cut-off", &opts())
        .await
        .unwrap()
        .expect("the lock is free")
        .release()
        .await
        .unwrap();
    // A waiting acquire gives the same error, not a timeout.
    let err = waiting
        .acquire("cut-off", &opts().wait_for(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");

    deployment
        .replication_proxy()
        .expect("a replication proxy")
        .blackhole(false);
    assert!(
        eventually(Duration::from_secs(10), || async {
            match waiting.try_acquire("cut-off", &opts()).await {
                Ok(Some(guard)) => guard.release().await.is_ok(),
                _ => false,
            }
        })
        .await,
        "acquires with WAIT did not work again once replication was back"
    );
    renewed
        .extend(Duration::from_secs(30))
        .await
        .expect("renewals are acknowledged again");
    renewed.release().await.unwrap();
}

/// A lone server has no replica: with `wait_for_replicas` every grant is
/// rolled back; with 0 replicas the option is off.
#[tokio::test]
async fn wait_for_replicas_on_a_lone_server() {
    let server = RedisServer::start().await;
    let waiting = RedisLockBuilder::from_url(&server.url())
        .unwrap()
        .wait_for_replicas(1, Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let err = waiting.try_acquire("alone", &opts()).await.unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    assert_eq!(
        server.command(&["EXISTS", &key("alone")]).await.unwrap(),
        "0"
    );
    let off = RedisLockBuilder::from_url(&server.url())
        .unwrap()
        .wait_for_replicas(0, Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    try_cycle(&off, "alone").await;
    // The script cache is flushed: WAIT's pipeline loads the script again.
    server.command(&["SCRIPT", "FLUSH"]).await.unwrap();
    let err = waiting.try_acquire("alone", &opts()).await.unwrap_err();
    assert!(
        matches!(&err, LockError::Unavailable { message, .. } if message.contains("only 0 of 1")),
        "{err}"
    );
}

// ---------------------------------------------------------------------------
// Bad and unreachable URLs
// ---------------------------------------------------------------------------

#[tokio::test]
async fn bad_cluster_and_sentinel_urls_are_invalid_and_secret_free() {
    for url in [
        "redis+sentinel://:topsecret@127.0.0.1:1",
        "redis+sentinel://:topsecret@127.0.0.1:1/",
        "redis+sentinel://:topsecret@/master",
        "redis+sentinel://:topsecret@127.0.0.1:0/master",
        "redis+sentinel://127.0.0.1:1/master?sentinel_password=topsecret&bogus=1",
        "redis+sentinel://127.0.0.1:1/master?sentinel_password=topsecret&ca_file=/x",
        "redis+cluster://:topsecret@",
        "redis+cluster://:topsecret@127.0.0.1:0",
        "redis+cluster://:topsecret@127.0.0.1:1,,127.0.0.1:2",
        "redis+cluster://:topsecret@127.0.0.1:1/3",
        "redis+cluster://:topsecret@127.0.0.1:1?sentinel_password=topsecret",
    ] {
        let err = lockkit_redis::connect(url).await.unwrap_err();
        assert!(matches!(err, LockError::InvalidUrl { .. }), "{url}: {err}");
        let text = format!("{err} {err:?}");
        assert!(!text.contains("topsecret"), "{text}");
    }
}

#[tokio::test]
async fn unreachable_cluster_and_sentinels_are_unavailable() {
    let closed = [ClosedPort::reserve(), ClosedPort::reserve()];
    let (p1, p2) = (closed[0].port(), closed[1].port());
    for url in [
        format!("redis+cluster://:topsecret@127.0.0.1:{p1},127.0.0.1:{p2}?connect_timeout=500ms"),
        format!(
            "redis+sentinel://:topsecret@127.0.0.1:{p1},127.0.0.1:{p2}/m?connect_timeout=500ms&sentinel_password=topsecret"
        ),
    ] {
        let started = Instant::now();
        let err = lockkit_redis::connect(&url).await.unwrap_err();
        assert!(matches!(err, LockError::Unavailable { .. }), "{url}: {err}");
        assert!(started.elapsed() < NO_HANG, "{:?}", started.elapsed());
        let text = format!("{err} {err:?}");
        assert!(!text.contains("topsecret"), "{text}");
    }
}

/// Sentinels that do not know the master name: `Unavailable`, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_master_name_is_unavailable() {
    let deployment = RedisSentinels::start().await;
    let url = deployment
        .url()
        .replace(&format!("/{}", deployment.master_name()), "/no-such-master");
    let err = lockkit_redis::connect(&format!("{url}?{CLIENT_PARAMS}"))
        .await
        .unwrap_err();
    match &err {
        LockError::Unavailable { message, .. } => {
            assert!(message.contains("does not know it"), "{message}")
        }
        other => panic!("{other}"),
    }
}

/// With `WAIT`, a grant the replica cannot see is refused as unavailable.
fn refused_unseen(refused: lockkit_core::Result<Option<LockGuard>>) {
    assert!(
        matches!(refused, Err(LockError::Unavailable { .. })),
        "with WAIT a grant the replica cannot see is refused: {refused:?}"
    );
}
