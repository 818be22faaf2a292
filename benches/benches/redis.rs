#![allow(clippy::print_stdout)]
//! lockkit against one real Redis server, in one process and one run, so that
//! the ratios between the measurements are meaningful on a noisy machine.
//!
//! * `redis_cycle/ping`: one `PING` round trip on a redis-rs `ConnectionManager`.
//! * `redis_cycle/raw_floor` (a): `SET key token NX PX 30000` plus an `EVALSHA`
//!   compare-and-delete, hand-written on that connection: the physical floor.
//! * `redis_cycle/lockkit_cycle_no_renew` (b) and `lockkit_cycle_renew` (c):
//!   `acquire` + `release` of an uncontended lock, watchdog renewal off / on.
//! * `redis_cycle/diag_backend_cycle` (diagnostic): the backend's own acquire and
//!   release scripts called directly, without the `LeaseLock` engine, to split
//!   (b) − (a) into script cost and engine cost.
//! * `redis_handoff/handoff` (d): from the holder's `release()` call to the
//!   moment a waiter on another client, already inside `acquire`, gets the lock.
//! * contention (e): 16 tasks on one key sharing one client, then 16 tasks on
//!   16 clients; critical sections per second, how often the releasing task
//!   took the lock straight back, and the handoff wait distribution.
//! * An interleaved cross-check of the uncontended cycles (informational), and
//!   a PING after the same idle pause as each handoff.
//!
//! Run with `cargo bench -p lockkit-benches --bench redis`; the summary is
//! printed at the end and written to `target/lockkit-bench/redis-summary.md`.
//! `LOCKKIT_BENCH_QUICK=1` shrinks everything to a smoke test, as does
//! criterion's `-- --test` (which runs each benchmark once and writes no
//! estimates, so the ratio table is left out).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use criterion::Criterion;
use lockkit_benches::{
    CycleFixture, CycleKind, Estimates, HandoffDiag, HandoffProbe, Handoffs, Interleaved, Limit,
    RawLock, RunMode, bench_then_pair, fmt_duration, lockkit_cycle, percentile, ping, save_summary,
    verdict,
};
use lockkit_core::backend::{Attempt, Intent, LeaseBackend, OwnerToken};
use lockkit_core::{DistributedLock, LockKind, LockOptions};
use lockkit_redis::RedisLock;
use lockkit_testkit::RedisServer;
use lockkit_testkit::TestServer;
use redis::aio::ConnectionManager;
use tokio::runtime::Runtime;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

const CYCLE_GROUP: &str = "redis_cycle";
const HANDOFF_GROUP: &str = "redis_handoff";
const TTL: Duration = Duration::from_secs(30);
const RAW_KEY: &str = "bench:raw_floor";

/// Critical sections of each contention run.
fn critical_sections(mode: RunMode) -> usize {
    match mode {
        RunMode::Bench => 2000,
        _ => 200,
    }
}

fn main() {
    let mode = RunMode::from_env();
    let runtime = lockkit_benches::runtime();
    // Estimates older than this belong to an earlier run.
    let run_started = SystemTime::now();
    let server = runtime.block_on(RedisServer::start());
    let url = server.url();

    let fixture = runtime.block_on(Fixture::new(&url));

    let Some((handoff, paired)) = bench_then_pair(&runtime, CYCLE_GROUP, &fixture, mode, |c| {
        bench_handoff(c, &runtime, &url, &fixture, mode)
    }) else {
        return;
    };

    let total = critical_sections(mode);
    let cap = Duration::from_secs(60);
    let shared = runtime.block_on(contention(&url, Clients::Shared, 16, total, cap));
    println!("contention, 16 tasks on one client: {}", shared.describe());
    let separate = runtime.block_on(contention(&url, Clients::PerTask, 16, total, cap));
    println!(
        "contention, 16 tasks on 16 clients: {}",
        separate.describe()
    );

    let summary = summary(mode, run_started, &paired, &handoff, &shared, &separate);
    save_summary(mode, "redis", &summary);
    drop(server);
}

/// The connections of the uncontended cycles, shared by the criterion group
/// and the interleaved cross-check.
struct Fixture {
    conn: ConnectionManager,
    raw: RawLock,
    locks: Arc<RedisLock>,
}

/// One uncontended cycle of each kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cycle {
    Ping,
    Raw,
    Backend,
    NoRenew,
    Renew,
}

impl CycleKind for Cycle {
    const ALL: &'static [Cycle] = &[
        Cycle::Ping,
        Cycle::Raw,
        Cycle::Backend,
        Cycle::NoRenew,
        Cycle::Renew,
    ];

    /// The criterion benchmark id within [`CYCLE_GROUP`].
    fn bench(self) -> &'static str {
        match self {
            Cycle::Ping => "ping",
            Cycle::Raw => "raw_floor",
            Cycle::Backend => "diag_backend_cycle",
            Cycle::NoRenew => "lockkit_cycle_no_renew",
            Cycle::Renew => "lockkit_cycle_renew",
        }
    }
}

impl Fixture {
    async fn new(url: &str) -> Fixture {
        let raw = RawLock::default();
        let conn = raw.connect(url).await;
        let locks = Arc::new(lockkit_redis::connect(url).await.expect("connect"));
        Fixture { conn, raw, locks }
    }

    /// (a): `SET key token NX PX 30000`, then the compare-and-delete by EVALSHA.
    async fn raw_cycle(&self) {
        let token = self.raw.token();
        assert!(
            RawLock::set_nx_px(&self.conn, RAW_KEY, &token, TTL).await,
            "raw_floor: the key was not free"
        );
        let deleted = self
            .raw
            .compare_and_delete(&self.conn, RAW_KEY, &token)
            .await;
        assert_eq!(deleted, 1, "raw_floor: compare-and-delete missed");
    }
}

impl CycleFixture for Fixture {
    type Kind = Cycle;

    async fn run(&self, kind: Cycle) {
        match kind {
            Cycle::Ping => ping(&self.conn).await,
            Cycle::Raw => self.raw_cycle().await,
            Cycle::Backend => {
                // The backend's two scripts without the LeaseLock engine (no
                // local queue, no guard, no watchdog task, no tracing spans).
                let name = "bench-diag-backend";
                let backend = self.locks.backend();
                let owner = OwnerToken::new();
                let keys = backend
                    .key(name, LockKind::Exclusive)
                    .expect("a valid name");
                let granted = backend
                    .try_lock(&keys, &owner, TTL, Intent::Try)
                    .await
                    .expect("try_lock");
                assert!(
                    matches!(granted, Attempt::Acquired(_)),
                    "backend cycle: busy"
                );
                assert!(backend.release(&keys, &owner).await.expect("release"));
            }
            Cycle::NoRenew | Cycle::Renew => {
                let (name, opts) = if kind == Cycle::Renew {
                    ("bench-cycle-renew", LockOptions::new().ttl(TTL))
                } else {
                    (
                        "bench-cycle-no-renew",
                        LockOptions::new().ttl(TTL).auto_renew(false),
                    )
                };
                lockkit_cycle(&self.locks, name, &opts).await;
            }
        }
    }
}

/// Lock name of the handoff benchmark.
const HANDOFF_NAME: &str = "bench-handoff";

/// How many `EVALSHA` calls the server has served so far (`INFO commandstats`).
async fn evalsha_calls(conn: &ConnectionManager) -> u64 {
    let mut conn = conn.clone();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO commandstats");
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The handoff's view of the Redis server, on the admin connection.
struct RedisProbe {
    admin: ConnectionManager,
}

impl HandoffProbe for RedisProbe {
    /// `EVALSHA` calls served before the waiter starts.
    type Mark = u64;

    async fn mark(&self) -> u64 {
        evalsha_calls(&self.admin).await
    }

    /// Waits until the waiter's first attempt and the attempt right after
    /// subscribing (two `EVALSHA`s) have reached the server.
    async fn until_parked(&self, calls_before: u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while evalsha_calls(&self.admin).await < calls_before + 2 {
            assert!(Instant::now() < deadline, "the waiter never parked");
        }
    }

    /// A PING of the same moment.
    async fn yardstick(&self) -> Duration {
        let started = Instant::now();
        ping(&self.admin).await;
        started.elapsed()
    }
}

/// (d): release by client A to acquisition by a waiting client B.
fn bench_handoff(
    c: &mut Criterion,
    runtime: &Runtime,
    url: &str,
    fixture: &Fixture,
    mode: RunMode,
) -> HandoffDiag {
    let probe = RedisProbe {
        admin: fixture.conn.clone(),
    };
    let opts = LockOptions::new().ttl(TTL);
    Handoffs::connect(
        runtime,
        || lockkit_redis::connect(url),
        HANDOFF_NAME,
        opts,
        probe,
    )
    .bench(c, runtime, HANDOFF_GROUP, mode)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Clients {
    /// All tasks share one `RedisLock`.
    Shared,
    /// Every task connects its own `RedisLock`.
    PerTask,
}

/// The outcome of one contention run.
#[derive(Debug)]
struct Contention {
    clients: Clients,
    tasks: usize,
    critical_sections: usize,
    elapsed: Duration,
    capped: bool,
    errors: usize,
    /// Consecutive critical sections held by the same task.
    straight_back: usize,
    /// Pairs of consecutive critical sections.
    pairs: usize,
    /// Handoffs where the next holder's acquire returned before the previous
    /// holder's release call did (the release reply was still in flight).
    overlapping: usize,
    /// From the previous holder's release returning to the next holder's
    /// acquire returning, for every change of holder; sorted.
    handoff_waits: Vec<Duration>,
    /// From calling `acquire` to its return (time queued behind other tasks),
    /// for every critical section; sorted.
    acquire_waits: Vec<Duration>,
}

impl Contention {
    fn per_second(&self) -> f64 {
        self.critical_sections as f64 / self.elapsed.as_secs_f64()
    }

    fn straight_back_rate(&self) -> f64 {
        if self.pairs == 0 {
            0.0
        } else {
            self.straight_back as f64 / self.pairs as f64
        }
    }

    fn wait(&self, p: f64) -> Option<Duration> {
        percentile(&self.handoff_waits, p)
    }

    /// One line for the log.
    fn describe(&self) -> String {
        format!(
            "{} critical sections in {} ({:.0}/s){}, {} errors, {} of {} consecutive pairs by the same task, {} handoffs (p50 {}, p90 {}, p99 {}, max {}), {} overlapping",
            self.critical_sections,
            fmt_duration(self.elapsed),
            self.per_second(),
            if self.capped { " (capped)" } else { "" },
            self.errors,
            self.straight_back,
            self.pairs,
            self.handoff_waits.len(),
            self.wait(50.0)
                .map_or_else(|| "n/a".to_owned(), fmt_duration),
            self.wait(90.0)
                .map_or_else(|| "n/a".to_owned(), fmt_duration),
            self.wait(99.0)
                .map_or_else(|| "n/a".to_owned(), fmt_duration),
            self.handoff_waits
                .last()
                .copied()
                .map_or_else(|| "n/a".to_owned(), fmt_duration),
            self.overlapping,
        )
    }
}

/// (e): `tasks` tasks loop acquire → record → release on one key until `total`
/// critical sections are done (or `cap` has passed).
/// One critical section of a contention run: the task, when its acquire
/// returned, when its release returned, and how long its acquire call took.
type Section = (usize, Instant, Instant, Duration);

async fn contention(
    url: &str,
    clients: Clients,
    tasks: usize,
    total: usize,
    cap: Duration,
) -> Contention {
    let name = match clients {
        Clients::Shared => "bench-contention-shared",
        Clients::PerTask => "bench-contention-per-task",
    };
    let mut locks: Vec<Arc<RedisLock>> = Vec::with_capacity(tasks);
    match clients {
        Clients::Shared => {
            let one = Arc::new(lockkit_redis::connect(url).await.expect("connect"));
            locks.resize(tasks, one);
        }
        Clients::PerTask => {
            for _ in 0..tasks {
                locks.push(Arc::new(
                    lockkit_redis::connect(url).await.expect("connect"),
                ));
            }
        }
    }

    let opts = LockOptions::new().ttl(TTL);
    let records: Arc<Mutex<Vec<Section>>> = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let taken = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let (done_tx, done_rx) = oneshot::channel::<()>();
    let done_tx = Arc::new(Mutex::new(Some(done_tx)));

    let started = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for (task_id, locks) in locks.into_iter().enumerate() {
        let (opts, records, taken, errors, done_tx) = (
            opts.clone(),
            records.clone(),
            taken.clone(),
            errors.clone(),
            done_tx.clone(),
        );
        let mut stop = stop_rx.clone();
        handles.push(tokio::spawn(async move {
            loop {
                let called_at = Instant::now();
                let guard = tokio::select! {
                    biased;
                    _ = stop.wait_for(|stop| *stop) => return,
                    result = locks.acquire(name, &opts) => match result {
                        Ok(guard) => guard,
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    },
                };
                let acquired_at = Instant::now();
                let index = taken.fetch_add(1, Ordering::SeqCst);
                if index >= total {
                    let _ = guard.release().await;
                    return;
                }
                if guard.release().await.is_err() {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                let released_at = Instant::now();
                let finished = {
                    let mut records = records.lock().unwrap_or_else(|p| p.into_inner());
                    records.push((task_id, acquired_at, released_at, acquired_at - called_at));
                    records.len() == total
                };
                if finished && let Some(done) = done_tx.lock().unwrap().take() {
                    let _ = done.send(());
                }
            }
        }));
    }

    let capped = tokio::time::timeout(cap, done_rx).await.is_err();
    let elapsed = started.elapsed();
    let _ = stop_tx.send(true);
    for handle in handles {
        if tokio::time::timeout(Duration::from_secs(5), handle)
            .await
            .is_err()
        {
            println!("contention: a task did not stop within 5 s");
        }
    }

    let mut records = std::mem::take(&mut *records.lock().unwrap());
    records.sort_by_key(|&(_, acquired, _, _)| acquired);
    let mut acquire_waits: Vec<Duration> = records.iter().map(|r| r.3).collect();
    acquire_waits.sort();
    let mut straight_back = 0;
    let mut overlapping = 0;
    let mut handoff_waits = Vec::new();
    for pair in records.windows(2) {
        let ((prev_task, _, prev_released, _), (task, acquired, _, _)) = (pair[0], pair[1]);
        if task == prev_task {
            straight_back += 1;
        } else {
            if acquired < prev_released {
                overlapping += 1;
            }
            handoff_waits.push(acquired.saturating_duration_since(prev_released));
        }
    }
    handoff_waits.sort();
    Contention {
        clients,
        tasks,
        critical_sections: records.len(),
        elapsed,
        capped,
        errors: errors.load(Ordering::Relaxed),
        straight_back,
        pairs: records.len().saturating_sub(1),
        overlapping,
        handoff_waits,
        acquire_waits,
    }
}

fn contention_row(label: &str, c: &Contention, target: Option<Duration>) -> String {
    let waits = match (c.wait(50.0), c.wait(99.0), c.handoff_waits.last()) {
        (Some(p50), Some(p99), Some(max)) => format!(
            "{} / {} / {}",
            fmt_duration(p50),
            fmt_duration(p99),
            fmt_duration(*max)
        ),
        _ => "no handoffs".to_owned(),
    };
    let mut notes = Vec::new();
    if c.capped {
        notes.push(format!(
            "stopped by the cap after {}",
            fmt_duration(c.elapsed)
        ));
    }
    if c.errors > 0 {
        notes.push(format!("{} errors", c.errors));
    }
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join(", "))
    };
    let target = match target {
        Some(limit) => match c.wait(99.0) {
            Some(p99) => format!(
                "p99 ≤ {}: {}",
                fmt_duration(limit),
                verdict(p99 <= limit && !c.capped)
            ),
            None => format!("p99 ≤ {}: MISS (no handoffs)", fmt_duration(limit)),
        },
        None => "—".to_owned(),
    };
    let queued = match (
        percentile(&c.acquire_waits, 50.0),
        percentile(&c.acquire_waits, 99.0),
    ) {
        (Some(p50), Some(p99)) => format!(
            "; queued in acquire p50/p99 {} / {}",
            fmt_duration(p50),
            fmt_duration(p99)
        ),
        _ => String::new(),
    };
    format!(
        "| {label}: {:.0} cs/s, straight-back {:.1} %{queued}; handoff wait p50/p99/max{notes} | {waits} | | {target} |",
        c.per_second(),
        100.0 * c.straight_back_rate(),
    )
}

fn summary(
    mode: RunMode,
    run_started: SystemTime,
    paired: &Interleaved<Cycle>,
    handoff_diag: &HandoffDiag,
    shared: &Contention,
    separate: &Contention,
) -> String {
    let raw = Cycle::Raw;
    let mut out = paired.summary(
        mode,
        "lockkit on one Redis server",
        &format!(", {} critical sections per contention run", critical_sections(mode)),
        "Targets, from paired measurements: each ratio compares cycles run in the same round (or a handoff with a PING timed just before it), so that the shared machine's slow and fast phases cancel out.",
        &[
            ("(a) raw SET NX PX + EVALSHA cycle", raw, raw, None),
            (
                "(b) lockkit acquire+release, auto_renew off",
                Cycle::NoRenew,
                raw,
                Some(Limit::AtMost(1.10)),
            ),
            (
                "(c) lockkit acquire+release, auto_renew on",
                Cycle::Renew,
                raw,
                Some(Limit::AtMost(1.15)),
            ),
            (
                "(diag) backend scripts alone, no LeaseLock engine",
                Cycle::Backend,
                raw,
                None,
            ),
            ("PING round trip", Cycle::Ping, raw, None),
        ],
    );
    let _ = writeln!(
        out,
        "{}",
        handoff_diag.row(
            "(d) handoff release→waiter acquired, ratio to PING",
            "PING",
            Some(Limit::AtMost(3.0)),
        )
    );
    let _ = writeln!(
        out,
        "{}",
        contention_row(
            "(e) 16 tasks one client",
            shared,
            Some(Duration::from_millis(2))
        )
    );
    let _ = writeln!(
        out,
        "{}",
        contention_row("(e') 16 tasks 16 clients", separate, None)
    );
    let _ = writeln!(out);
    if let Some(line) = handoff_diag.describe() {
        let _ = writeln!(out, "(d) detail: {line}.\n");
    }
    for c in [shared, separate] {
        if c.overlapping > 0 {
            let _ = writeln!(
                out,
                "Note ({:?}, {} tasks): in {} of {} handoffs the next holder's acquire returned before the previous holder's release call did (counted as 0 wait).\n",
                c.clients,
                c.tasks,
                c.overlapping,
                c.handoff_waits.len()
            );
        }
    }

    // Criterion's own medians: each benchmark measured for seconds, one after
    // the other, so drift of the machine between them shows in their ratios.
    Estimates::new(run_started).write_table(
        &mut out,
        CYCLE_GROUP,
        Cycle::Raw,
        &[(HANDOFF_GROUP, "handoff")],
    );
    out
}
