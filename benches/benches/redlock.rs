#![allow(clippy::print_stdout)]
//! lockkit-redlock against five real Redis servers, in one process and one
//! run, so that the ratios between the measurements are meaningful on a noisy
//! machine.
//!
//! * `redlock_cycle/ping`: one `PING` round trip to one of the instances.
//! * `redlock_cycle/raw_parallel_floor` (a): the physical floor of a Redlock
//!   cycle, hand-written on one redis-rs `ConnectionManager` per instance:
//!   `SET key token NX PX 30000` on all five at once, then the
//!   compare-and-delete script by `EVALSHA` on all five at once.
//! * `redlock_cycle/lockkit_redlock_cycle` (b) and `lockkit_redlock_cycle_renew`
//!   (c): `acquire` + `release` of an uncontended lock, watchdog renewal off / on.
//! * `redlock_cycle/rslock_cycle` (d): the `rslock` crate's `lock` + `unlock` on
//!   the same five instances, with one attempt per `lock` call (its default
//!   retries a failed attempt after a random sleep, which would hide a failure
//!   in a slow cycle; uncontended, every attempt must succeed).
//!
//! The targets are judged on interleaved rounds run after the criterion group:
//! (b)/(a) ≤ 1.15 and (b)/(d) < 1. After every batch of cycles (outside the
//! timing) every instance is checked to hold none of the cycle's keys; a key
//! left behind is deleted and counted in the summary, as are the results of a
//! last, per-cycle leak check (every cycle followed by that check), so that a
//! release that never reached an instance cannot pass unnoticed.
//!
//! Run with `cargo bench -p lockkit-benches --bench redlock`; the summary is
//! printed at the end and written to `target/lockkit-bench/redlock-summary.md`.
//! `LOCKKIT_BENCH_QUICK=1` shrinks everything to a smoke test, as does
//! criterion's `-- --test` (which runs each benchmark once and writes no
//! estimates, so the criterion table is left out).

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use futures_util::future::join_all;
use lockkit_benches::{
    CycleFixture, CycleKind, Estimates, Interleaved, Limit, RawLock, RunMode, bench_then_pair,
    lockkit_cycle, ping, save_summary,
};
use lockkit_core::LockOptions;
use lockkit_redis::Keys;
use lockkit_redlock::RedlockLock;
use lockkit_testkit::RedisServer;
use lockkit_testkit::TestServer;
use redis::aio::ConnectionManager;
use tokio::time::Instant;

const GROUP: &str = "redlock_cycle";
const INSTANCES: usize = 5;
const TTL: Duration = Duration::from_secs(30);

const RAW_KEY: &str = "bench:raw_parallel_floor";
const NO_RENEW_NAME: &str = "bench-redlock-no-renew";
const RENEW_NAME: &str = "bench-redlock-renew";
const RSLOCK_RESOURCE: &str = "bench:rslock";

fn main() {
    let mode = RunMode::from_env();
    let runtime = lockkit_benches::runtime();
    // Estimates older than this belong to an earlier run.
    let run_started = SystemTime::now();
    let servers: Vec<RedisServer> =
        runtime.block_on(join_all((0..INSTANCES).map(|_| RedisServer::start())));
    let fixture = runtime.block_on(Fixture::new(&servers));

    let Some(((), paired)) = bench_then_pair(&runtime, GROUP, &fixture, mode, |_| ()) else {
        return;
    };
    let leak_cycles = match mode {
        RunMode::Bench => 500,
        RunMode::Quick => 100,
        _ => 20,
    };
    let leaks = runtime.block_on(leak_check(&fixture, leak_cycles));
    let leftovers = Leftovers {
        batches: fixture.batches(),
        cycles: leak_cycles,
        leaks,
    };
    save_summary(
        mode,
        "redlock",
        &summary(mode, run_started, &paired, &leftovers),
    );
    drop(fixture);
    drop(servers);
}

/// One uncontended cycle of each kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cycle {
    Ping,
    Raw,
    NoRenew,
    Renew,
    Rslock,
}

impl CycleKind for Cycle {
    const ALL: &'static [Cycle] = &[
        Cycle::Ping,
        Cycle::Raw,
        Cycle::NoRenew,
        Cycle::Renew,
        Cycle::Rslock,
    ];

    fn bench(self) -> &'static str {
        match self {
            Cycle::Ping => "ping",
            Cycle::Raw => "raw_parallel_floor",
            Cycle::NoRenew => "lockkit_redlock_cycle",
            Cycle::Renew => "lockkit_redlock_cycle_renew",
            Cycle::Rslock => "rslock_cycle",
        }
    }
}

/// A check after a batch of cycles: the kind, and (instance, PTTL in ms)
/// wherever its key was still found.
type Batch = (Cycle, Vec<(usize, i64)>);

/// The clients of the cycles, shared by the criterion group and the
/// interleaved rounds.
struct Fixture {
    /// One redis-rs connection per instance: the raw floor, PING, checks.
    conns: Vec<ConnectionManager>,
    raw: RawLock,
    locks: RedlockLock,
    rslock: rslock::LockManager,
    /// Every check after a batch: the kind, and (instance, PTTL in ms) where
    /// the key was still found (empty when nowhere).
    batches: Mutex<Vec<Batch>>,
}

impl Fixture {
    async fn new(servers: &[RedisServer]) -> Fixture {
        let raw = RawLock::default();
        let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
        let conns = join_all(urls.iter().map(|url| raw.connect(url))).await;
        let addresses: Vec<String> = servers.iter().map(|s| s.addr().to_string()).collect();
        let locks = lockkit_redlock::connect(&format!("redlock://{}", addresses.join(",")))
            .await
            .expect("lockkit-redlock connects");
        let mut rslock = rslock::LockManager::new(urls);
        // `set_retry(n, _)` allows n attempts in all: one attempt, so that a
        // failed one is an error instead of a hidden retry after up to 200 ms.
        rslock.set_retry(1, Duration::from_millis(200));
        let fixture = Fixture {
            conns,
            raw,
            locks,
            rslock,
            batches: Mutex::new(Vec::new()),
        };
        // Outside every measurement: rslock connects lazily on its first lock
        // and loads its unlock script on its first EVALSHA miss.
        for &kind in Cycle::ALL {
            for _ in 0..3 {
                fixture.run(kind).await;
            }
            fixture.sweep(kind, Duration::from_millis(500)).await;
        }
        fixture
    }

    /// (a): `SET key token NX PX 30000` on every instance at once, then the
    /// compare-and-delete by `EVALSHA` on every instance at once.
    async fn raw_parallel_cycle(&self) {
        self.raw.parallel_cycle(&self.conns, RAW_KEY, TTL).await;
    }

    /// The Redis key a cycle of `kind` takes on every instance.
    fn key(&self, kind: Cycle) -> Option<String> {
        let name = match kind {
            Cycle::Ping => return None,
            Cycle::Raw => return Some(RAW_KEY.to_owned()),
            Cycle::Rslock => return Some(RSLOCK_RESOURCE.to_owned()),
            Cycle::NoRenew => NO_RENEW_NAME,
            Cycle::Renew => RENEW_NAME,
        };
        let prefix = self.locks.backend().prefix();
        Some(Keys::new(prefix, name).expect("a valid name").lock)
    }

    /// Waits up to `grace` until no instance holds the key of `kind` (lockkit
    /// returns from `release` once a quorum has answered, so its last deletes
    /// may still be on their way), then deletes it where it is left, so that
    /// the next cycles start clean. Returns where it was left: (instance, PTTL
    /// in ms).
    async fn sweep(&self, kind: Cycle, grace: Duration) -> Vec<(usize, i64)> {
        let Some(key) = self.key(kind) else {
            return Vec::new();
        };
        let deadline = Instant::now() + grace;
        let mut holders = self.holders(&key).await;
        while !holders.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
            holders = self.holders(&key).await;
        }
        for &(index, _) in &holders {
            redis::cmd("DEL")
                .arg(&key)
                .query_async::<i64>(&mut self.conns[index].clone())
                .await
                .expect("DEL");
        }
        holders
    }

    /// The instances that hold `key`: (index, PTTL in ms).
    async fn holders(&self, key: &str) -> Vec<(usize, i64)> {
        let pttls = join_all(self.conns.iter().map(|conn| async move {
            redis::cmd("PTTL")
                .arg(key)
                .query_async::<i64>(&mut conn.clone())
                .await
                .expect("PTTL")
        }))
        .await;
        // PTTL is -2 where the key does not exist.
        pttls
            .into_iter()
            .enumerate()
            .filter(|(_, pttl)| *pttl != -2)
            .collect()
    }
}

impl Fixture {
    fn batches(&self) -> Vec<Batch> {
        self.batches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl CycleFixture for Fixture {
    type Kind = Cycle;

    async fn run(&self, kind: Cycle) {
        match kind {
            Cycle::Ping => ping(&self.conns[0]).await,
            Cycle::Raw => self.raw_parallel_cycle().await,
            Cycle::NoRenew => {
                let opts = LockOptions::new().ttl(TTL).auto_renew(false);
                lockkit_cycle(&self.locks, NO_RENEW_NAME, &opts).await;
            }
            Cycle::Renew => {
                lockkit_cycle(&self.locks, RENEW_NAME, &LockOptions::new().ttl(TTL)).await;
            }
            Cycle::Rslock => {
                let lock = self
                    .rslock
                    .lock(RSLOCK_RESOURCE, TTL)
                    .await
                    .expect("rslock: lock on its first attempt");
                self.rslock.unlock(&lock).await;
            }
        }
    }

    /// Checks that no instance holds the cycle's key any more and records the
    /// outcome; see [`Fixture::sweep`].
    async fn after_batch(&self, kind: Cycle) {
        if self.key(kind).is_none() {
            return;
        }
        let holders = self.sweep(kind, Duration::from_millis(500)).await;
        if !holders.is_empty() {
            println!(
                "{}: the key was left behind after a batch on (instance, PTTL ms) {holders:?}; deleted it",
                kind.bench()
            );
        }
        self.batches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((kind, holders));
    }
}

/// Per-cycle leak check, after the measurements: every cycle of the lock
/// kinds is followed by a [`Fixture::sweep`] with 100 ms of grace. Returns, per
/// kind, how many cycles left the key behind.
async fn leak_check(fixture: &Fixture, cycles: usize) -> Vec<(Cycle, usize)> {
    let mut result = Vec::new();
    for &kind in Cycle::ALL {
        if fixture.key(kind).is_none() {
            continue;
        }
        let mut leaks = 0;
        for _ in 0..cycles {
            fixture.run(kind).await;
            if !fixture
                .sweep(kind, Duration::from_millis(100))
                .await
                .is_empty()
            {
                leaks += 1;
            }
        }
        result.push((kind, leaks));
    }
    result
}

/// What the checks for keys left on the instances found.
#[derive(Debug)]
struct Leftovers {
    /// The checks after every batch (criterion's and each round's).
    batches: Vec<Batch>,
    /// Cycles of each kind in the per-cycle leak check.
    cycles: usize,
    /// Per kind, the cycles of the leak check that left the key behind.
    leaks: Vec<(Cycle, usize)>,
}

impl Leftovers {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "Keys left behind (each check waits for the key to be gone from every instance, then deletes it where it is left):\n"
        );
        let _ = writeln!(
            out,
            "| cycle | batches ending with the key still held (500 ms grace) | cycles leaving it in a one-by-one check of {} (100 ms grace) |",
            self.cycles
        );
        let _ = writeln!(out, "| --- | --- | --- |");
        for &(kind, leaks) in &self.leaks {
            let checks: Vec<&Vec<(usize, i64)>> = self
                .batches
                .iter()
                .filter(|(k, _)| *k == kind)
                .map(|(_, holders)| holders)
                .collect();
            let left: Vec<&&Vec<(usize, i64)>> = checks
                .iter()
                .filter(|holders| !holders.is_empty())
                .collect();
            let example = match left.first() {
                Some(holders) => format!("; e.g. (instance, PTTL ms) {holders:?}"),
                None => String::new(),
            };
            let _ = writeln!(
                out,
                "| {} | {} of {}{example} | {leaks} of {} |",
                kind.bench(),
                left.len(),
                checks.len(),
                self.cycles
            );
        }
        let _ = writeln!(out);
    }
}

fn summary(
    mode: RunMode,
    run_started: SystemTime,
    paired: &Interleaved<Cycle>,
    leftovers: &Leftovers,
) -> String {
    let raw = Cycle::Raw;
    let mut out = paired.summary(
        mode,
        &format!("lockkit-redlock on {INSTANCES} local Redis servers"),
        "",
        "Targets, from paired measurements: each ratio is the median over rounds of the ratio of two cycles run in the same round, so that the shared machine's slow and fast phases cancel out.",
        &[
            (
                "(a) raw parallel floor: SET NX PX on all 5, then EVALSHA compare-and-delete on all 5",
                raw,
                raw,
                None,
            ),
            (
                "(b) lockkit-redlock acquire+release, auto_renew off; ratio (b)/(a)",
                Cycle::NoRenew,
                raw,
                Some(Limit::AtMost(1.15)),
            ),
            (
                "(b) against rslock: ratio (b)/(d)",
                Cycle::NoRenew,
                Cycle::Rslock,
                Some(Limit::Below(1.0)),
            ),
            (
                "(c) lockkit-redlock acquire+release, auto_renew on; ratio (c)/(a)",
                Cycle::Renew,
                raw,
                None,
            ),
            (
                "(d) rslock 0.10 lock+unlock; ratio (d)/(a)",
                Cycle::Rslock,
                raw,
                None,
            ),
            ("PING one instance; ratio to (a)", Cycle::Ping, raw, None),
        ],
    );
    let rounds = paired.rounds();
    let _ = writeln!(
        out,
        "\nRounds in which (b) was faster than (a): {} of {rounds}; than (d): {} of {rounds}. (a) and rslock wait for all {INSTANCES} replies of each step; lockkit-redlock returns from acquire and release once a quorum ({}) has decided.\n",
        paired.rounds_faster(Cycle::NoRenew, Cycle::Raw),
        paired.rounds_faster(Cycle::NoRenew, Cycle::Rslock),
        INSTANCES / 2 + 1,
    );

    leftovers.write(&mut out);

    // Criterion's own medians: each benchmark measured for seconds, one after
    // the other, so drift of the machine between them shows in their ratios.
    Estimates::new(run_started).write_table(&mut out, GROUP, Cycle::Raw, &[]);
    out
}
