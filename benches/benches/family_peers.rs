#![allow(clippy::print_stdout)]
//! lockkit's reader-writer locks and semaphores against the peers users
//! compare them with, on the same servers in the same run, and readers
//! scaling on one name.
//!
//! * `peers_redis/*`: lockkit's shared, exclusive and permit cycles on one
//!   Redis server, interleaved with the `distributed-lock` 0.2 crate's
//!   `RedisDistributedReaderWriterLock` (read, write) and
//!   `RedisDistributedSemaphore` on the same server.
//! * `peers_postgres/*`: lockkit's `advisory` mode (shared, exclusive)
//!   against `distributed-lock`'s `PostgresDistributedReaderWriterLock`
//!   (advisory locks too). `distributed-lock` has no Postgres semaphore.
//! * `peers_mysql/*`: lockkit's MariaDB `named` mode (`GET_LOCK`) against
//!   `distributed-lock`'s `MySqlDistributedLock` (`GET_LOCK` too), the
//!   exclusive lock (neither has a named-lock reader side or semaphore).
//! * `peers_zk/*`: lockkit's permit against Curator's
//!   `InterProcessSemaphoreV2` (Debian's Curator 5.4 in a JVM beside the
//!   bench, each cycle timed inside the JVM) on the same ZooKeeper.
//! * Readers scaling: 16 tasks taking the read side of one name, each
//!   holding it for 5 ms, against one task doing the same: critical sections
//!   per second, on Redis and on Postgres `advisory` (target: at least 8 ×).
//! * 16-way contention on one exclusive lock, each task on a connection of
//!   its own: lockkit's clients, then `distributed-lock`'s
//!   `RedisDistributedLock`, `PostgresDistributedLock` and
//!   `MySqlDistributedLock` on the same servers: critical sections per second, how often the lock went
//!   straight back to the task that released it, the handoff waits and the
//!   time queued in `acquire`.
//!
//! * Fair Redis locks (`fair=true`): the uncontended exclusive cycle of a
//!   fair client against a plain one's (target: at most 1.10 ×), and the
//!   16-way contention run again with fair clients: no critical section
//!   straight back to the task that just released while others wait, and a
//!   queued waiter's p99 at most 2 × (16 × one plain cycle).
//!
//! Every cycle is `acquire` + `release` of an uncontended name, auto-renew
//! off on both sides; the ratios come from interleaved rounds. Run with
//! `cargo bench -p lockkit-benches --bench family_peers`; the summary is
//! printed and written to `target/lockkit-bench/family-peers-summary.md`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use distributed_lock::{
    DistributedLock as _, DistributedReaderWriterLock, DistributedSemaphore, LockHandle,
    LockProvider, PostgresLockProvider, ReaderWriterLockProvider, RedisLockProvider,
    SemaphoreProvider,
};
use distributed_lock_mysql::MySqlLockProvider;
use lockkit_benches::{
    Contender, Contention, CycleFixture, CycleKind, Deployment, Interleaved, Limit, RunMode,
    Servers, bench_then_pair, connect, contention, fmt_duration, fmt_opt_ns, lockkit_cycle,
    save_summary,
};
use lockkit_core::{DistributedLock, LockOptions};
use lockkit_testkit::{CuratorPeer, TestServer};
use tokio::sync::Mutex;

const TTL: Duration = Duration::from_secs(30);
const PERMITS: u32 = 4;
/// How long a reader holds the lock in the scaling runs.
const SECTION: Duration = Duration::from_millis(5);
/// Tasks of the contention runs.
const CONTENDERS: usize = 16;
/// `distributed-lock`'s MySQL `acquire` without a timeout sends
/// `GET_LOCK(name, -1.0)`, which MariaDB answers with NULL (an error to it),
/// so its MySQL locks are given a wait; its other locks wait without one.
const MYSQL_WAIT: Option<Duration> = Some(Duration::from_secs(30));

fn lockkit_opts(kind: &str) -> LockOptions {
    let opts = LockOptions::new().ttl(TTL).auto_renew(false);
    match kind {
        "shared" => opts.shared(),
        "permit" => opts.semaphore(PERMITS),
        _ => opts,
    }
}

/// The Redis comparison's kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RedisKind {
    Shared,
    DlRead,
    Exclusive,
    FairExclusive,
    DlWrite,
    Permit,
    DlSemaphore,
}

impl CycleKind for RedisKind {
    const ALL: &'static [RedisKind] = &[
        RedisKind::Shared,
        RedisKind::DlRead,
        RedisKind::Exclusive,
        RedisKind::FairExclusive,
        RedisKind::DlWrite,
        RedisKind::Permit,
        RedisKind::DlSemaphore,
    ];

    fn bench(self) -> &'static str {
        match self {
            RedisKind::Shared => "lockkit_shared",
            RedisKind::DlRead => "distributed_lock_read",
            RedisKind::Exclusive => "lockkit_exclusive",
            RedisKind::FairExclusive => "lockkit_exclusive_fair",
            RedisKind::DlWrite => "distributed_lock_write",
            RedisKind::Permit => "lockkit_permit",
            RedisKind::DlSemaphore => "distributed_lock_semaphore",
        }
    }
}

struct RedisPeers {
    lock: Arc<dyn DistributedLock>,
    /// A client with `fair=true`.
    fair: Arc<dyn DistributedLock>,
    rw: distributed_lock::RedisDistributedReaderWriterLock,
    semaphore: distributed_lock::RedisDistributedSemaphore,
}

impl CycleFixture for RedisPeers {
    type Kind = RedisKind;

    async fn run(&self, kind: RedisKind) {
        let lock = self.lock.as_ref();
        match kind {
            RedisKind::Shared => lockkit_cycle(lock, "peers-shared", &lockkit_opts("shared")).await,
            RedisKind::Exclusive => {
                lockkit_cycle(lock, "peers-exclusive", &lockkit_opts("exclusive")).await
            }
            RedisKind::FairExclusive => {
                let fair = self.fair.as_ref();
                lockkit_cycle(fair, "peers-exclusive-fair", &lockkit_opts("exclusive")).await
            }
            RedisKind::Permit => lockkit_cycle(lock, "peers-permit", &lockkit_opts("permit")).await,
            RedisKind::DlRead => {
                let handle = self.rw.acquire_read(None).await.expect("dl read");
                handle.release().await.expect("dl read release");
            }
            RedisKind::DlWrite => {
                let handle = self.rw.acquire_write(None).await.expect("dl write");
                handle.release().await.expect("dl write release");
            }
            RedisKind::DlSemaphore => {
                let handle = self.semaphore.acquire(None).await.expect("dl semaphore");
                handle.release().await.expect("dl semaphore release");
            }
        }
    }
}

/// The Postgres comparison's kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PgKind {
    Shared,
    DlRead,
    Exclusive,
    DlWrite,
}

impl CycleKind for PgKind {
    const ALL: &'static [PgKind] = &[
        PgKind::Shared,
        PgKind::DlRead,
        PgKind::Exclusive,
        PgKind::DlWrite,
    ];

    fn bench(self) -> &'static str {
        match self {
            PgKind::Shared => "lockkit_shared",
            PgKind::DlRead => "distributed_lock_read",
            PgKind::Exclusive => "lockkit_exclusive",
            PgKind::DlWrite => "distributed_lock_write",
        }
    }
}

struct PgPeers {
    lock: Arc<dyn DistributedLock>,
    rw: distributed_lock::PostgresDistributedReaderWriterLock,
}

impl CycleFixture for PgPeers {
    type Kind = PgKind;

    async fn run(&self, kind: PgKind) {
        let lock = self.lock.as_ref();
        match kind {
            PgKind::Shared => lockkit_cycle(lock, "peers-shared", &lockkit_opts("shared")).await,
            PgKind::Exclusive => {
                lockkit_cycle(lock, "peers-exclusive", &lockkit_opts("exclusive")).await
            }
            PgKind::DlRead => {
                let handle = self.rw.acquire_read(None).await.expect("dl read");
                handle.release().await.expect("dl read release");
            }
            PgKind::DlWrite => {
                let handle = self.rw.acquire_write(None).await.expect("dl write");
                handle.release().await.expect("dl write release");
            }
        }
    }
}

/// The MySQL (MariaDB) comparison's kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MySqlKind {
    Exclusive,
    DlExclusive,
}

impl CycleKind for MySqlKind {
    const ALL: &'static [MySqlKind] = &[MySqlKind::Exclusive, MySqlKind::DlExclusive];

    fn bench(self) -> &'static str {
        match self {
            MySqlKind::Exclusive => "lockkit_exclusive",
            MySqlKind::DlExclusive => "distributed_lock_exclusive",
        }
    }
}

struct MySqlPeers {
    lock: Arc<dyn DistributedLock>,
    dl: <MySqlLockProvider as LockProvider>::Lock,
}

impl CycleFixture for MySqlPeers {
    type Kind = MySqlKind;

    async fn run(&self, kind: MySqlKind) {
        match kind {
            MySqlKind::Exclusive => {
                lockkit_cycle(
                    self.lock.as_ref(),
                    "peers-exclusive",
                    &lockkit_opts("exclusive"),
                )
                .await
            }
            MySqlKind::DlExclusive => {
                let handle = self.dl.acquire(MYSQL_WAIT).await.expect("dl mysql lock");
                handle.release().await.expect("dl mysql release");
            }
        }
    }
}

/// The ZooKeeper comparison's kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ZkKind {
    Permit,
    Curator,
}

impl CycleKind for ZkKind {
    const ALL: &'static [ZkKind] = &[ZkKind::Permit, ZkKind::Curator];

    fn bench(self) -> &'static str {
        match self {
            ZkKind::Permit => "lockkit_permit",
            ZkKind::Curator => "curator_semaphore_v2",
        }
    }
}

struct ZkPeers {
    lock: Arc<dyn DistributedLock>,
    curator: Mutex<CuratorPeer>,
}

impl CycleFixture for ZkPeers {
    type Kind = ZkKind;

    async fn run(&self, kind: ZkKind) {
        self.run_timed(kind).await;
    }

    /// Curator's cycle is timed inside its JVM: the pipe to it is not counted.
    async fn run_timed(&self, kind: ZkKind) -> Duration {
        match kind {
            ZkKind::Permit => {
                let started = Instant::now();
                lockkit_cycle(self.lock.as_ref(), "peers", &lockkit_opts("permit")).await;
                started.elapsed()
            }
            ZkKind::Curator => self.curator.lock().await.cycle().await,
        }
    }
}

fn main() {
    let mode = RunMode::from_env();
    let runtime = lockkit_benches::runtime();
    let deployments = [
        Deployment::Redis,
        Deployment::PgAdvisory,
        Deployment::MariaDbNamed,
        Deployment::Zk,
    ];
    let servers = runtime.block_on(Servers::start(&deployments));
    let redis_url = servers.redis()[0].url();
    let pg_url = servers.pg().url();
    let my_url = servers.my().url();

    let redis = runtime.block_on(async {
        let provider = RedisLockProvider::builder()
            .url(redis_url.clone())
            .build()
            .await
            .expect("distributed-lock connects to Redis");
        RedisPeers {
            lock: client(&servers, Deployment::Redis).await,
            fair: fair_client(&servers).await,
            rw: provider.create_reader_writer_lock("dl-peers-rw"),
            semaphore: provider.create_semaphore("dl-peers-semaphore", PERMITS),
        }
    });
    let pg = runtime.block_on(async {
        let provider = PostgresLockProvider::builder()
            .connection_string(pg_url.clone())
            .build()
            .await
            .expect("distributed-lock connects to Postgres");
        PgPeers {
            lock: client(&servers, Deployment::PgAdvisory).await,
            rw: provider.create_reader_writer_lock("dl-peers-rw"),
        }
    });
    let my = runtime.block_on(async {
        let provider = MySqlLockProvider::builder()
            .connection_string(my_url.clone())
            .build()
            .await
            .expect("distributed-lock connects to MariaDB");
        MySqlPeers {
            lock: client(&servers, Deployment::MariaDbNamed).await,
            dl: provider.create_lock("dl-peers-exclusive"),
        }
    });
    let zk = runtime.block_on(async {
        let path = format!("/lockkit/{}/peers", lockkit_zk::SEMAPHORES);
        ZkPeers {
            lock: client(&servers, Deployment::Zk).await,
            curator: Mutex::new(CuratorPeer::semaphore(servers.zk(), &path, PERMITS).await),
        }
    });
    // Both sides warmed up (connections, scripts, nodes) outside the timing.
    runtime.block_on(async {
        for _ in 0..5 {
            for &kind in RedisKind::ALL {
                redis.run(kind).await;
            }
            for &kind in PgKind::ALL {
                pg.run(kind).await;
            }
            for &kind in MySqlKind::ALL {
                my.run(kind).await;
            }
            for &kind in ZkKind::ALL {
                zk.run(kind).await;
            }
        }
    });
    let Some(((), redis_rounds)) = bench_then_pair(&runtime, "peers_redis", &redis, mode, |_| ())
    else {
        return;
    };
    let Some(((), pg_rounds)) = bench_then_pair(&runtime, "peers_postgres", &pg, mode, |_| ())
    else {
        return;
    };
    let Some(((), my_rounds)) = bench_then_pair(&runtime, "peers_mysql", &my, mode, |_| ()) else {
        return;
    };
    let Some(((), zk_rounds)) = bench_then_pair(&runtime, "peers_zk", &zk, mode, |_| ()) else {
        return;
    };
    let scaling: Vec<(Deployment, Scaling)> = [Deployment::Redis, Deployment::PgAdvisory]
        .into_iter()
        .map(|d| (d, runtime.block_on(readers_scaling(&servers, d, mode))))
        .collect();
    let fair_contended = runtime.block_on(fair_contention(&servers, mode));
    let contended: Vec<(Deployment, Contention, Contention)> = [
        Deployment::Redis,
        Deployment::PgAdvisory,
        Deployment::MariaDbNamed,
    ]
    .into_iter()
    .map(|d| {
        let (ours, theirs) = runtime.block_on(contended(&servers, d, mode));
        (d, ours, theirs)
    })
    .collect();
    let summary = summary(
        mode,
        &redis_rounds,
        &pg_rounds,
        &my_rounds,
        &zk_rounds,
        &scaling,
        &contended,
    ) + &fair_summary(&redis_rounds, &contended, &fair_contended);
    save_summary(mode, "family-peers", &summary);
    drop((redis, pg, my, zk));
    drop(servers);
}

/// A Redis client with `fair=true`.
async fn fair_client(servers: &Servers) -> Arc<dyn DistributedLock> {
    let addrs: Vec<String> = servers
        .addrs(Deployment::Redis)
        .iter()
        .map(ToString::to_string)
        .collect();
    let url = servers.url_with(Deployment::Redis, &addrs, &[("fair", "true".to_owned())]);
    lockkit::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("a fair Redis client connects: {e}"))
}

async fn client(servers: &Servers, deployment: Deployment) -> Arc<dyn DistributedLock> {
    connect(servers, deployment)
        .await
        .unwrap_or_else(|e| panic!("{deployment} connects: {e}"))
}

/// `distributed-lock`'s exclusive lock of one name as a contender, and the
/// timeout its `acquire` is given.
struct Peer<L>(L, Option<Duration>);

impl<L> Contender for Peer<L>
where
    L: distributed_lock::DistributedLock + 'static,
    L::Handle: 'static,
{
    type Held = L::Handle;

    async fn take(&self, _name: &'static str) -> Result<L::Handle, String> {
        self.0.acquire(self.1).await.map_err(|e| e.to_string())
    }

    async fn give_back(&self, held: L::Handle) -> Result<(), String> {
        held.release().await.map_err(|e| e.to_string())
    }
}

/// [`CONTENDERS`] tasks loop acquire → release on one name, each on a
/// connection of its own: lockkit's clients of `deployment`, then
/// `distributed-lock`'s locks on the same server. Bounded in count and time.
async fn contended(
    servers: &Servers,
    deployment: Deployment,
    mode: RunMode,
) -> (Contention, Contention) {
    let (total, cap) = match mode {
        RunMode::Bench => (2000, Duration::from_secs(60)),
        _ => (100, Duration::from_secs(20)),
    };
    let name: &'static str = format!("bench-contended-{}", deployment.label()).leak();
    let mut clients = Vec::new();
    for _ in 0..CONTENDERS {
        clients.push(client(servers, deployment).await);
    }
    let ours = contention(clients, name, total, cap).await;
    println!("{deployment}, lockkit: {}", ours.describe());
    let theirs = match deployment {
        Deployment::Redis => {
            let url = servers.redis()[0].url();
            peer_contention(name, total, cap, None, || {
                RedisLockProvider::builder().url(url.clone()).build()
            })
            .await
        }
        Deployment::MariaDbNamed => {
            let url = servers.my().url();
            peer_contention(name, total, cap, MYSQL_WAIT, || {
                MySqlLockProvider::builder()
                    .connection_string(url.clone())
                    .build()
            })
            .await
        }
        _ => {
            let url = servers.pg().url();
            peer_contention(name, total, cap, None, || {
                PostgresLockProvider::builder()
                    .connection_string(url.clone())
                    .build()
            })
            .await
        }
    };
    println!("{deployment}, distributed-lock: {}", theirs.describe());
    (ours, theirs)
}

/// [`CONTENDERS`] tasks, each on a fair Redis client of its own, loop
/// acquire → release on one name, as in [`contended`].
async fn fair_contention(servers: &Servers, mode: RunMode) -> Contention {
    let (total, cap) = match mode {
        RunMode::Bench => (2000, Duration::from_secs(60)),
        _ => (100, Duration::from_secs(20)),
    };
    let mut clients = Vec::new();
    for _ in 0..CONTENDERS {
        clients.push(fair_client(servers).await);
    }
    let run = contention(clients, "bench-contended-fair", total, cap).await;
    println!("redis, lockkit fair: {}", run.describe());
    run
}

/// [`CONTENDERS`] of `distributed-lock`'s locks of `name`, each from a
/// provider (a connection) of its own made by `connect`, in a contention run.
async fn peer_contention<P, F, E>(
    name: &'static str,
    total: usize,
    cap: Duration,
    wait: Option<Duration>,
    connect: impl Fn() -> F,
) -> Contention
where
    P: LockProvider,
    P::Lock: 'static,
    F: Future<Output = Result<P, E>>,
    E: std::fmt::Display,
{
    let mut locks = Vec::new();
    for _ in 0..CONTENDERS {
        let provider = connect()
            .await
            .unwrap_or_else(|e| panic!("distributed-lock connects: {e}"));
        locks.push(Peer(provider.create_lock(name), wait));
    }
    contention(locks, name, total, cap).await
}

/// Critical sections per second of one reader and of 16 readers on one name.
struct Scaling {
    one: f64,
    sixteen: f64,
}

/// `tasks` tasks, each on a client of its own, taking the read side of one
/// name and holding it for [`SECTION`], for `length`: critical sections per
/// second. Bounded in time and count.
async fn readers(servers: &Servers, deployment: Deployment, tasks: usize, length: Duration) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let name = format!("bench-readers-{}", deployment.label());
    let mut clients = Vec::new();
    for _ in 0..tasks {
        clients.push(client(servers, deployment).await);
    }
    let started = Instant::now();
    let stop = started + length;
    let opts = lockkit_opts("shared").wait_for(Duration::from_secs(10));
    let handles: Vec<_> = clients
        .into_iter()
        .map(|lock| {
            let (done, name, opts) = (done.clone(), name.clone(), opts.clone());
            tokio::spawn(async move {
                for _ in 0..100_000 {
                    if Instant::now() >= stop {
                        break;
                    }
                    let guard = lock.acquire(&name, &opts).await.expect("a reader");
                    tokio::time::sleep(SECTION).await;
                    guard.release().await.expect("a reader's release");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.expect("a reader task");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

async fn readers_scaling(servers: &Servers, deployment: Deployment, mode: RunMode) -> Scaling {
    let length = match mode {
        RunMode::Bench => Duration::from_secs(5),
        _ => Duration::from_millis(500),
    };
    Scaling {
        one: readers(servers, deployment, 1, length).await,
        sixteen: readers(servers, deployment, 16, length).await,
    }
}

fn summary(
    mode: RunMode,
    redis: &Interleaved<RedisKind>,
    pg: &Interleaved<PgKind>,
    my: &Interleaved<MySqlKind>,
    zk: &Interleaved<ZkKind>,
    scaling: &[(Deployment, Scaling)],
    contended: &[(Deployment, Contention, Contention)],
) -> String {
    let mut out = format!(
        "## lockkit's readers, writers and semaphores against their peers ({} run)\n\n\
         Uncontended `acquire` + `release`, auto-renew off on both sides, on the same server in the same run; \
         each ratio is the median over {} interleaved rounds of lockkit's round mean ÷ the peer's in the same round (below 1: lockkit is faster). \
         Peers: the `distributed-lock` 0.2 crate (Redis, Postgres advisory locks, MySQL `GET_LOCK` on MariaDB) and Curator 5.4's `InterProcessSemaphoreV2` (ZooKeeper; its cycles timed inside its JVM).\n\n\
         | server | primitive | lockkit | peer | lockkit ÷ peer |\n| --- | --- | --- | --- | --- |\n",
        mode.label(),
        redis.rounds(),
    );
    let mut row =
        |server: &str, what: &str, ours: Option<f64>, theirs: Option<f64>, ratio: Option<f64>| {
            let ratio = ratio.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}"));
            let _ = writeln!(
                out,
                "| {server} | {what} | {} | {} | {ratio} |",
                fmt_opt_ns(ours),
                fmt_opt_ns(theirs)
            );
        };
    for (what, ours, theirs) in [
        ("read lock (shared)", RedisKind::Shared, RedisKind::DlRead),
        (
            "write lock (exclusive)",
            RedisKind::Exclusive,
            RedisKind::DlWrite,
        ),
        (
            "semaphore permit",
            RedisKind::Permit,
            RedisKind::DlSemaphore,
        ),
    ] {
        row(
            "Redis",
            what,
            redis.median(ours),
            redis.median(theirs),
            redis.paired_ratio(ours, theirs),
        );
    }
    for (what, ours, theirs) in [
        ("read lock (shared)", PgKind::Shared, PgKind::DlRead),
        ("write lock (exclusive)", PgKind::Exclusive, PgKind::DlWrite),
    ] {
        row(
            "Postgres advisory",
            what,
            pg.median(ours),
            pg.median(theirs),
            pg.paired_ratio(ours, theirs),
        );
    }
    row(
        "MariaDB named (`GET_LOCK`)",
        "exclusive lock",
        my.median(MySqlKind::Exclusive),
        my.median(MySqlKind::DlExclusive),
        my.paired_ratio(MySqlKind::Exclusive, MySqlKind::DlExclusive),
    );
    row(
        "ZooKeeper",
        "semaphore permit (vs Curator)",
        zk.median(ZkKind::Permit),
        zk.median(ZkKind::Curator),
        zk.paired_ratio(ZkKind::Permit, ZkKind::Curator),
    );
    let _ = write!(
        out,
        "\n16 readers on one name, each holding it {SECTION:?} per critical section, against one reader (critical sections per second; each reader on a client of its own).\n\n\
         | server | 1 reader | 16 readers | × one reader | target |\n| --- | --- | --- | --- | --- |\n"
    );
    let limit = Limit::AtLeast(8.0);
    for (deployment, s) in scaling {
        let (ratio, target) = limit.judge(Some(s.sixteen / s.one));
        let _ = writeln!(
            out,
            "| {} | {:.0}/s | {:.0}/s | {ratio} | {target} |",
            deployment.label(),
            s.one,
            s.sixteen
        );
    }
    let _ = write!(
        out,
        "\n{CONTENDERS} tasks on one exclusive lock, each on a connection of its own, looping acquire → release (no work inside), on the same server one library after the other. \
         Straight back: consecutive critical sections by the same task. Handoff wait: from a holder's release returning to the next holder's acquire returning. Queued: time in `acquire` (of the attempt that succeeded). \
         Failed attempts are retried at once and counted: `distributed-lock` 0.2's Redis `acquire` on a single server makes one attempt and fails with `Timeout` when the lock is held, whatever its timeout, so its callers loop.\n\n\
         | server | client | critical sections/s | straight back | handoff wait p50 / p99 / max | queued p50 / p99 | failed attempts |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n"
    );
    let at = |d: Option<Duration>| d.map_or_else(|| "n/a".to_owned(), fmt_duration);
    for (deployment, ours, theirs) in contended {
        for (client, run) in [("lockkit", ours), ("distributed-lock 0.2", theirs)] {
            let _ = writeln!(
                out,
                "| {} | {client} | {:.0}{} | {:.1} % | {} / {} / {} | {} / {} | {} |",
                deployment.label(),
                run.per_second(),
                if run.capped() {
                    " (stopped by the cap)"
                } else {
                    ""
                },
                100.0 * run.straight_back_rate(),
                at(run.wait(50.0)),
                at(run.wait(99.0)),
                at(run.wait(100.0)),
                at(run.queued(50.0)),
                at(run.queued(99.0)),
                run.errors(),
            );
        }
    }
    out
}

/// The fair Redis lock's section of the summary: its uncontended cost, and
/// the 16-way run against the plain one's.
fn fair_summary(
    redis: &Interleaved<RedisKind>,
    contended: &[(Deployment, Contention, Contention)],
    fair: &Contention,
) -> String {
    let mut out = String::new();
    let at = |d: Option<Duration>| d.map_or_else(|| "n/a".to_owned(), fmt_duration);
    let plain = redis.median(RedisKind::Exclusive);
    let (cost, cost_target) = Limit::AtMost(1.10)
        .judge(redis.paired_ratio(RedisKind::FairExclusive, RedisKind::Exclusive));
    let _ = write!(
        out,
        "\nFair Redis locks (`fair=true`, waiters served in order across clients). Uncontended: the exclusive cycle of a fair client over a plain one's, paired in the rounds above. \
         Contended: the {CONTENDERS}-task run above with fair clients; a grant straight back to the task that just released is one while {} others waited; the bound on a queued waiter's p99 is 2 × ({CONTENDERS} × the plain cycle).\n\n\
         | measure | fair | plain | ratio or bound | target |\n| --- | --- | --- | --- | --- |\n",
        CONTENDERS - 1
    );
    let _ = writeln!(
        out,
        "| uncontended cycle | {} | {} | {cost} | {cost_target} |",
        fmt_opt_ns(redis.median(RedisKind::FairExclusive)),
        fmt_opt_ns(plain),
    );
    let plain_run = contended
        .iter()
        .find(|(d, _, _)| *d == Deployment::Redis)
        .map(|(_, ours, _)| ours);
    let straight = |run: &Contention| format!("{:.1} %", 100.0 * run.straight_back_rate());
    let _ = writeln!(
        out,
        "| grants straight back, 16 tasks | {} | {} | — | 0: {} |",
        straight(fair),
        plain_run.map_or_else(|| "n/a".to_owned(), straight),
        lockkit_benches::verdict(fair.straight_back_rate() == 0.0),
    );
    let bound = plain.map(|ns| Duration::from_nanos((2.0 * CONTENDERS as f64 * ns) as u64));
    let p99 = fair.queued(99.0);
    let met = matches!((p99, bound), (Some(p), Some(b)) if p <= b);
    let _ = writeln!(
        out,
        "| queued p99, 16 tasks | {} | {} | ≤ {} | {} |",
        at(p99),
        at(plain_run.and_then(|r| r.queued(99.0))),
        at(bound),
        lockkit_benches::verdict(met),
    );
    let _ = writeln!(
        out,
        "| critical sections/s, 16 tasks | {:.0} | {} | — | — |",
        fair.per_second(),
        plain_run.map_or_else(|| "n/a".to_owned(), |r| format!("{:.0}", r.per_second())),
    );
    out
}
