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

use criterion::{Criterion, SamplingMode};
use lockkit_benches::{
    CycleFixture, CycleKind, Estimates, Interleaved, Limit, RawLock, RunMode, bench_cycles,
    fmt_duration, lockkit_cycle, percentile, ping, save_summary, verdict,
};
use lockkit_core::{Attempt, DistributedLock, LeaseBackend, LockOptions, OwnerToken};
use lockkit_redis::RedisLock;
use lockkit_testkit::RedisServer;
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

    let mut criterion = Criterion::default().configure_from_args();
    bench_cycles(&mut criterion, &runtime, CYCLE_GROUP, &fixture, mode);
    let handoff = bench_handoff(&mut criterion, &runtime, &url, &fixture, mode);
    criterion.final_summary();

    if mode == RunMode::List {
        return;
    }

    let (rounds, per_round) = mode.interleaved_plan();
    let paired = runtime.block_on(Interleaved::measure(&fixture, rounds, per_round));

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
                let keys = backend.key(name).expect("a valid name");
                let granted = backend
                    .try_lock(&keys, &owner, TTL)
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

/// Waits until the waiter is parked inside `acquire`: its first attempt and the
/// attempt right after subscribing (two `EVALSHA`s) have reached the server.
/// Polling the server keeps the machine as warm as criterion's PING loop is,
/// where sleeping a fixed time would measure a wake-up from idle instead.
async fn until_parked(conn: &ConnectionManager, calls_before: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while evalsha_calls(conn).await < calls_before + 2 {
        assert!(Instant::now() < deadline, "the waiter never parked");
    }
}

/// One measured handoff from `holder` to a waiter on `waiter`.
async fn handoff_once(
    holder: &Arc<RedisLock>,
    waiter: &Arc<RedisLock>,
    opts: &LockOptions,
    admin: &ConnectionManager,
    diag: &Mutex<HandoffDiag>,
) -> Duration {
    let held = holder
        .acquire(HANDOFF_NAME, opts)
        .await
        .expect("A acquires");
    let calls_before = evalsha_calls(admin).await;
    let (tx, rx) = oneshot::channel();
    let task = tokio::spawn({
        let (waiter, opts) = (waiter.clone(), opts.clone());
        async move {
            let guard = waiter
                .acquire(HANDOFF_NAME, &opts)
                .await
                .expect("B acquires");
            let _ = tx.send(Instant::now());
            guard.release().await.expect("B releases");
        }
    });
    until_parked(admin, calls_before).await;
    assert!(
        !task.is_finished(),
        "the waiter got the lock while A held it"
    );
    // A PING of the same moment, as the yardstick of this handoff.
    let ping_started = Instant::now();
    ping(admin).await;
    let ping = ping_started.elapsed();
    let start = Instant::now();
    held.release().await.expect("A releases");
    let released = Instant::now();
    let acquired = rx.await.expect("the waiter reports its acquisition");
    task.await.expect("the waiter task");
    let handoff = acquired.saturating_duration_since(start);
    diag.lock().unwrap_or_else(|p| p.into_inner()).record(
        released - start,
        acquired < released,
        handoff,
        ping,
    );
    handoff
}

/// (d): release by client A to acquisition by a waiting client B.
fn bench_handoff(
    c: &mut Criterion,
    runtime: &Runtime,
    url: &str,
    fixture: &Fixture,
    mode: RunMode,
) -> HandoffDiag {
    let holder = Arc::new(
        runtime
            .block_on(lockkit_redis::connect(url))
            .expect("connect A"),
    );
    let waiter = Arc::new(
        runtime
            .block_on(lockkit_redis::connect(url))
            .expect("connect B"),
    );
    let opts = LockOptions::new().ttl(TTL);
    // Outside the measurement: B's first wait opens its subscriber connection.
    runtime.block_on(async {
        let scratch = Mutex::new(HandoffDiag::default());
        for _ in 0..2 {
            handoff_once(&holder, &waiter, &opts, &fixture.conn, &scratch).await;
        }
    });

    let mut group = c.benchmark_group(HANDOFF_GROUP);
    // Criterion plans the iteration counts from the wall time of its warm-up
    // (each handoff also costs the setup and the polling until the waiter is
    // parked), while the samples it analyses are the measured handoff
    // durations. So these budgets are wall time.
    group.sampling_mode(SamplingMode::Flat);
    match mode {
        RunMode::Quick => group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(50))
            .measurement_time(Duration::from_millis(300)),
        _ => group
            .sample_size(25)
            .warm_up_time(Duration::from_millis(200))
            .measurement_time(Duration::from_secs(2)),
    };
    let diag = Mutex::new(HandoffDiag::default());
    group.bench_function("handoff", |b| {
        b.to_async(runtime).iter_custom(|iters| {
            let (holder, waiter, opts, admin, diag) =
                (&holder, &waiter, &opts, &fixture.conn, &diag);
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += handoff_once(holder, waiter, opts, admin, diag).await;
                }
                total
            }
        });
    });
    group.finish();
    let mut diag = diag.into_inner().unwrap_or_else(|p| p.into_inner());
    diag.release_calls.sort();
    if let Some(line) = diag.describe() {
        println!("handoff: {line}");
    }
    diag
}

/// Side observations of the handoff benchmark, to tell where its time goes.
#[derive(Debug, Default)]
struct HandoffDiag {
    /// How long the holder's `release()` call took; sorted once complete.
    release_calls: Vec<Duration>,
    /// Handoffs where the waiter had the lock before the holder's `release()`
    /// call returned.
    waiter_first: usize,
    /// Every measured handoff, and the PING timed just before it.
    pairs: Vec<(Duration, Duration)>,
}

impl HandoffDiag {
    fn record(
        &mut self,
        release_call: Duration,
        waiter_first: bool,
        handoff: Duration,
        ping: Duration,
    ) {
        self.release_calls.push(release_call);
        self.waiter_first += usize::from(waiter_first);
        self.pairs.push((handoff, ping));
    }

    /// Medians of the handoffs and of the PINGs timed just before them.
    fn paired_medians(&self) -> Option<(Duration, Duration)> {
        let mut handoffs: Vec<Duration> = self.pairs.iter().map(|p| p.0).collect();
        let mut pings: Vec<Duration> = self.pairs.iter().map(|p| p.1).collect();
        handoffs.sort();
        pings.sort();
        Some((percentile(&handoffs, 50.0)?, percentile(&pings, 50.0)?))
    }

    fn describe(&self) -> Option<String> {
        let p50 = percentile(&self.release_calls, 50.0)?;
        Some(format!(
            "{} handoffs measured; the holder's release() call took {} (p50); the waiter had the lock before that call returned in {} of them",
            self.release_calls.len(),
            fmt_duration(p50),
            self.waiter_first
        ))
    }
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
    let target = |ratio: Option<f64>, limit: f64| Limit::AtMost(limit).judge(ratio);

    let mut out = String::new();
    let _ = writeln!(
        out,
        "## lockkit on one Redis server ({} run, {} interleaved rounds, {} critical sections per contention run)\n",
        mode.label(),
        paired.rounds(),
        critical_sections(mode)
    );
    let _ = writeln!(
        out,
        "Targets, from paired measurements: each ratio compares cycles run in the same round (or a handoff with a PING timed just before it), so that the shared machine's slow and fast phases cancel out.\n"
    );
    let _ = writeln!(out, "| measurement | median | ratio | target |");
    let _ = writeln!(out, "| --- | --- | --- | --- |");
    let row = |out: &mut String, label: &str, kind: Cycle, limit: Option<f64>| {
        let _ = writeln!(
            out,
            "{}",
            paired.row(label, kind, Cycle::Raw, limit.map(Limit::AtMost))
        );
    };
    row(
        &mut out,
        "(a) raw SET NX PX + EVALSHA cycle",
        Cycle::Raw,
        None,
    );
    row(
        &mut out,
        "(b) lockkit acquire+release, auto_renew off",
        Cycle::NoRenew,
        Some(1.10),
    );
    row(
        &mut out,
        "(c) lockkit acquire+release, auto_renew on",
        Cycle::Renew,
        Some(1.15),
    );
    row(
        &mut out,
        "(diag) backend scripts alone, no LeaseLock engine",
        Cycle::Backend,
        None,
    );
    row(&mut out, "PING round trip", Cycle::Ping, None);
    let (handoff_ratio, handoff_target) = match handoff_diag.paired_medians() {
        Some((handoff, ping)) => {
            let (r, t) = target(Some(handoff.as_secs_f64() / ping.as_secs_f64()), 3.0);
            (format!("{} (PING {})", r, fmt_duration(ping)), t)
        }
        None => target(None, 3.0),
    };
    let _ = writeln!(
        out,
        "| (d) handoff release→waiter acquired, ratio to PING | {} | {handoff_ratio} | {handoff_target} |",
        handoff_diag
            .paired_medians()
            .map_or_else(|| "n/a".to_owned(), |(h, _)| fmt_duration(h))
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
