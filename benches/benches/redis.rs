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
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use criterion::Criterion;
use lockkit_benches::{
    Contention, CycleFixture, CycleKind, Estimates, HandoffDiag, HandoffProbe, Handoffs,
    Interleaved, Limit, RawLock, RunMode, bench_then_pair, contention, lockkit_cycle, ping,
    save_summary,
};
use lockkit_core::backend::{Attempt, Intent, LeaseBackend, OwnerToken};
use lockkit_core::{DistributedLock, LockKind, LockOptions};
use lockkit_redis::RedisLock;
use lockkit_testkit::TestServer;
use lockkit_testkit::{RedisServer, command_stat};
use redis::aio::ConnectionManager;
use tokio::runtime::Runtime;
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
    let url_ref = url.as_str();
    let connect = move || async move {
        let lock: Arc<dyn DistributedLock> =
            Arc::new(lockkit_redis::connect(url_ref).await.expect("connect"));
        lock
    };
    let one = runtime.block_on(connect());
    let shared = runtime.block_on(contention(
        vec![one; 16],
        "bench-contention-shared",
        total,
        cap,
    ));
    println!("contention, 16 tasks on one client: {}", shared.describe());
    let clients = runtime.block_on(futures_util::future::join_all((0..16).map(|_| connect())));
    let separate = runtime.block_on(contention(clients, "bench-contention-per-task", total, cap));
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
/// Its waiting line on the server (the default prefix `lockkit:`).
const HANDOFF_LINE: &str = "{lockkit:bench-handoff}:line";

/// How many `EVALSHA` calls the server has served so far (`INFO commandstats`).
async fn evalsha_calls(conn: &ConnectionManager) -> u64 {
    let mut conn = conn.clone();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO commandstats");
    command_stat(&info, "evalsha", "calls").unwrap_or(0)
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

    /// Waits until the waiter's attempt has reached the server and left
    /// its place in the name's line. (Its release watch is live before
    /// that attempt: the waiter's client subscribed in the warm-up
    /// handoffs, and its subscription lingers between them.)
    async fn until_parked(&self, calls_before: u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut conn = self.admin.clone();
        loop {
            let in_line: u64 = redis::cmd("ZCARD")
                .arg(HANDOFF_LINE)
                .query_async(&mut conn)
                .await
                .expect("ZCARD of the line");
            if in_line >= 1 && evalsha_calls(&self.admin).await > calls_before {
                return;
            }
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
        shared.row("(e) 16 tasks one client", Some(Duration::from_millis(2)))
    );
    let _ = writeln!(out, "{}", separate.row("(e') 16 tasks 16 clients", None));
    let _ = writeln!(out);
    if let Some(line) = handoff_diag.describe() {
        let _ = writeln!(out, "(d) detail: {line}.\n");
    }
    for (clients, c) in [("one client", shared), ("16 clients", separate)] {
        if let Some(note) = c.overlap_note() {
            let _ = writeln!(out, "Note ({clients}): {note}\n");
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
