#![allow(clippy::print_stdout)]
//! lockkit-etcd against one real etcd server, in one process and one run,
//! on a current-thread and on a multi-thread tokio runtime, so that the
//! ratios between the measurements are meaningful on a noisy machine.
//!
//! * `etcd_<flavour>/raw_floor` (a): the physical floor of a lock cycle,
//!   hand-written with the `etcd-client` crate on a connection of its own:
//!   the requests lockkit's cycle sends, in its order (a keep-alive of the
//!   lease the previous cycle released, granted on the first; the create
//!   transaction, which also reads the lock's oldest key; the
//!   compare-and-delete transaction, after which the lease is kept for the
//!   next cycle). See `lockkit_benches::RawEtcd`.
//! * `etcd_<flavour>/raw_put`: one put, i.e. one etcd write: the yardstick
//!   of the handoffs.
//! * `etcd_<flavour>/lockkit_etcd_cycle` (b) and `lockkit_etcd_cycle_renew`
//!   (c): `acquire` + `release` of an uncontended lock, watchdog renewal off
//!   / on.
//! * `etcd_handoff_<flavour>/handoff` (d): from the holder's `release()` call
//!   to the moment a waiter on another client, already inside `acquire` with
//!   its key queued behind the holder's, gets the lock. Each handoff is
//!   paired with a put timed just before it.
//! * contention (e): 16 tasks sharing one client loop `acquire` → `release`
//!   on one key (the client's local queue keeps one key of its own on the
//!   server); (e′) the same with 16 clients, each task its own. The handoff
//!   wait is from one holder's release returning to the next holder's
//!   acquire returning.
//!
//! The targets are judged on paired measurements: (b)/(a) ≤ 1.15 over the
//! interleaved rounds run after the criterion groups, and the p99 of (e′)'s
//! handoff waits ≤ 3 × one write (the median put of the interleaved rounds
//! of the same runtime). After every batch of cycles (outside the timing)
//! the cycle's lock directory is checked to hold no key any more.
//!
//! Run with `cargo bench -p lockkit-benches --bench etcd`; the summary is
//! printed at the end and written to `target/lockkit-bench/etcd-summary.md`.
//! `LOCKKIT_BENCH_QUICK=1` shrinks everything to a smoke test, as does
//! criterion's `-- --test`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use lockkit_benches::{
    Contention, CycleFixture, CycleKind, HandoffDiag, HandoffProbe, Handoffs, Interleaved, Limit,
    RawEtcd, RunMode, bench_then_pair, contention, flavours, fmt_duration, lockkit_cycle,
    save_summary,
};
use lockkit_core::{DistributedLock, LockOptions};
use lockkit_testkit::{EtcdServer, TestServer};
use tokio::runtime::Runtime;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);
/// lockkit's prefix: lock `name` lives under `/bench/<name>/`.
const PREFIX: &str = "/bench";
/// The raw floor's lock directory.
const RAW_DIR: &str = "/bench-raw/floor/";
/// The key the raw puts write.
const PUT_KEY: &str = "/bench-raw/put";
/// The least time a handoff's waiter is given to set its watch.
const PARK: Duration = Duration::from_millis(20);
/// Tasks (each on a client of its own) of the contention run.
const CONTENDERS: usize = 16;
/// The contention target: the handoff wait's p99 at most this many writes.
const HANDOFF_WRITES: f64 = 3.0;

/// Critical sections of each contention run.
fn critical_sections(mode: RunMode) -> usize {
    match mode {
        RunMode::Bench => 2000,
        RunMode::Quick => 400,
        _ => 100,
    }
}

/// One uncontended cycle of each kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cycle {
    Raw,
    RawPut,
    NoRenew,
    Renew,
}

impl CycleKind for Cycle {
    const ALL: &'static [Cycle] = &[Cycle::Raw, Cycle::RawPut, Cycle::NoRenew, Cycle::Renew];

    fn bench(self) -> &'static str {
        match self {
            Cycle::Raw => "raw_floor",
            Cycle::RawPut => "raw_put",
            Cycle::NoRenew => "lockkit_etcd_cycle",
            Cycle::Renew => "lockkit_etcd_cycle_renew",
        }
    }
}

/// The lock names of one runtime flavour's benchmarks.
struct Names {
    no_renew: String,
    renew: String,
    handoff: &'static str,
    shared: &'static str,
    contention: &'static str,
}

impl Names {
    fn of(flavour: &str) -> Names {
        let name = |what: &str| format!("bench-etcd-{flavour}-{what}");
        Names {
            no_renew: name("cycle"),
            renew: name("cycle-renew"),
            // Two short strings per flavour for the life of the bench.
            handoff: name("handoff").leak(),
            shared: name("contention-shared").leak(),
            contention: name("contention").leak(),
        }
    }
}

/// The clients of the uncontended cycles, made on one runtime.
struct Fixture {
    raw: RawEtcd,
    locks: Arc<dyn DistributedLock>,
    names: Names,
}

/// lockkit's URL of `server`, under [`PREFIX`].
fn lock_url(server: &EtcdServer) -> String {
    format!("{}{PREFIX}", server.url())
}

fn lock_dir(name: &str) -> String {
    format!("{PREFIX}/{}/", lockkit_etcd::encode_name(name))
}

impl Fixture {
    async fn new(server: &EtcdServer, flavour: &str) -> Fixture {
        let raw = RawEtcd::connect(&server.endpoint()).await;
        let locks: Arc<dyn DistributedLock> = Arc::new(
            lockkit_etcd::connect(&lock_url(server))
                .await
                .expect("lockkit-etcd connects"),
        );
        let fixture = Fixture {
            raw,
            locks,
            names: Names::of(flavour),
        };
        // Outside every measurement: the first requests open the streams.
        for &kind in Cycle::ALL {
            for _ in 0..3 {
                fixture.run(kind).await;
            }
            fixture.after_batch(kind).await;
        }
        fixture
    }

    /// The directory whose keys a cycle of `kind` creates.
    fn dir(&self, kind: Cycle) -> Option<String> {
        match kind {
            Cycle::Raw => Some(RAW_DIR.to_owned()),
            Cycle::RawPut => None,
            Cycle::NoRenew => Some(lock_dir(&self.names.no_renew)),
            Cycle::Renew => Some(lock_dir(&self.names.renew)),
        }
    }
}

impl CycleFixture for Fixture {
    type Kind = Cycle;

    async fn run(&self, kind: Cycle) {
        self.run_timed(kind).await;
    }

    async fn run_timed(&self, kind: Cycle) -> Duration {
        let started = Instant::now();
        match kind {
            Cycle::Raw => self.raw.cycle(RAW_DIR).await,
            Cycle::RawPut => return self.raw.put(PUT_KEY).await,
            Cycle::NoRenew => {
                let opts = LockOptions::new().ttl(TTL).auto_renew(false);
                lockkit_cycle(self.locks.as_ref(), &self.names.no_renew, &opts).await;
            }
            Cycle::Renew => {
                let opts = LockOptions::new().ttl(TTL);
                lockkit_cycle(self.locks.as_ref(), &self.names.renew, &opts).await;
            }
        }
        started.elapsed()
    }

    /// Checks that the cycles left no key behind.
    async fn after_batch(&self, kind: Cycle) {
        if let Some(dir) = self.dir(kind) {
            let left = self.raw.count(&dir).await;
            assert_eq!(left, 0, "{}: keys left behind under {dir}", kind.bench());
        }
    }
}

/// The handoff's view of the server: a raw client that counts the lock's
/// keys (the waiter's key queued behind the holder's) and times a put.
struct EtcdProbe {
    raw: RawEtcd,
    dir: String,
}

impl HandoffProbe for EtcdProbe {
    type Mark = Instant;

    async fn mark(&self) -> Instant {
        Instant::now()
    }

    /// Waits until the waiter's key is queued behind the holder's (two keys
    /// in the directory) and it has had [`PARK`] to set its watch.
    async fn until_parked(&self, started: Instant) {
        let deadline = started + Duration::from_secs(10);
        while self.raw.count(&self.dir).await < 2 || started.elapsed() < PARK {
            assert!(Instant::now() < deadline, "the waiter never queued");
        }
    }

    async fn yardstick(&self) -> Duration {
        self.raw.put(PUT_KEY).await
    }
}

/// (d): release by client A to acquisition by a waiting client B.
fn bench_handoff(
    c: &mut criterion::Criterion,
    runtime: &Runtime,
    server: &EtcdServer,
    fixture: &Fixture,
    flavour: &str,
    mode: RunMode,
) -> HandoffDiag {
    let probe = EtcdProbe {
        raw: fixture.raw.clone(),
        dir: lock_dir(fixture.names.handoff),
    };
    let url = lock_url(server);
    Handoffs::connect(
        runtime,
        || lockkit_etcd::connect(&url),
        fixture.names.handoff,
        LockOptions::new().ttl(TTL),
        probe,
    )
    .bench(c, runtime, &format!("etcd_handoff_{flavour}"), mode)
}

/// What one runtime flavour measured.
struct Run {
    flavour: &'static str,
    paired: Interleaved<Cycle>,
    handoff: HandoffDiag,
    shared: Contention,
    contention: Contention,
}

fn main() {
    let mode = RunMode::from_env();
    let runtimes = flavours();
    let server = runtimes[1].1.block_on(EtcdServer::start());
    let mut runs = Vec::new();
    for (flavour, runtime) in &runtimes {
        let fixture = runtime.block_on(Fixture::new(&server, flavour));
        let group = format!("etcd_{flavour}");
        let Some((handoff, paired)) = bench_then_pair(runtime, &group, &fixture, mode, |c| {
            bench_handoff(c, runtime, &server, &fixture, flavour, mode)
        }) else {
            return;
        };
        let url = lock_url(&server);
        let one: Arc<dyn DistributedLock> = Arc::new(
            runtime
                .block_on(lockkit_etcd::connect(&url))
                .expect("connect"),
        );
        let shared = runtime.block_on(contention(
            vec![one; CONTENDERS],
            fixture.names.shared,
            critical_sections(mode),
            Duration::from_secs(60),
        ));
        println!(
            "contention ({flavour}, {CONTENDERS} tasks on one client): {}",
            shared.describe()
        );
        let clients = runtime.block_on(async {
            let mut clients: Vec<Arc<dyn DistributedLock>> = Vec::new();
            for _ in 0..CONTENDERS {
                clients.push(Arc::new(
                    lockkit_etcd::connect(&url).await.expect("connect"),
                ));
            }
            clients
        });
        let contended = runtime.block_on(contention(
            clients,
            fixture.names.contention,
            critical_sections(mode),
            Duration::from_secs(60),
        ));
        println!(
            "contention ({flavour}, {CONTENDERS} clients): {}",
            contended.describe()
        );
        runs.push(Run {
            flavour,
            paired,
            handoff,
            shared,
            contention: contended,
        });
    }
    save_summary(mode, "etcd", &summary(mode, &runs));
    drop(server);
}

fn summary(mode: RunMode, runs: &[Run]) -> String {
    let mut out = String::new();
    for run in runs {
        let raw = Cycle::Raw;
        let what = format!("lockkit-etcd on one etcd server, {} runtime", run.flavour);
        out.push_str(&run.paired.summary(
            mode,
            &what,
            &format!(", {} critical sections in the contention run", critical_sections(mode)),
            "Targets, from paired measurements: each cycle ratio is the median over rounds of the ratio of two cycles run in the same round; the single handoff is compared with a put timed just before it; the 16-way handoff's p99 with the median put of the same rounds.",
            &[
                (
                    "(a) raw floor: keep-alive of the kept lease + create txn + delete txn",
                    raw,
                    raw,
                    None,
                ),
                ("one write (put); ratio to (a)", Cycle::RawPut, raw, None),
                (
                    "(b) lockkit-etcd acquire+release, auto_renew off; ratio (b)/(a)",
                    Cycle::NoRenew,
                    raw,
                    Some(Limit::AtMost(1.15)),
                ),
                (
                    "(c) lockkit-etcd acquire+release, auto_renew on; ratio (c)/(a)",
                    Cycle::Renew,
                    raw,
                    None,
                ),
            ],
        ));
        let _ = writeln!(
            out,
            "{}",
            run.handoff.row(
                "(d) handoff release→waiter acquired, ratio to the put timed just before each",
                "put",
                None,
            )
        );
        let write = run
            .paired
            .median(Cycle::RawPut)
            .map(|ns| Duration::from_nanos(ns as u64));
        let limit = write.map(|w| w.mul_f64(HANDOFF_WRITES));
        let label = format!("(e) {CONTENDERS} tasks on one client");
        let _ = writeln!(out, "{}", run.shared.row(&label, None));
        let label = format!(
            "(e′) {CONTENDERS} tasks on {CONTENDERS} clients, target p99 ≤ {HANDOFF_WRITES} × one write ({})",
            write.map_or_else(|| "n/a".to_owned(), fmt_duration)
        );
        let _ = writeln!(out, "{}", run.contention.row(&label, limit));
        let _ = writeln!(out);
        if let Some(line) = run.handoff.describe() {
            let _ = writeln!(out, "(d) detail: {line}.\n");
        }
        for (label, c) in [("(e)", &run.shared), ("(e′)", &run.contention)] {
            let _ = writeln!(out, "{label} detail: {}.\n", c.describe());
            if let Some(note) = c.overlap_note() {
                let _ = writeln!(out, "{label} note: {note}\n");
            }
        }
    }
    out
}
