#![allow(clippy::print_stdout)]
//! Every backend on the same work, side by side in one run: one criterion
//! group per scenario, one benchmark per backend configuration (memory,
//! redis, redlock×3, redlock×5, zk, postgres lease/row/advisory, mysql
//! lease/row/named on MariaDB, sqlite lease), the servers started by the
//! testkit outside the timed region.
//!
//! * `cycle/<backend>/renew_off`, `cycle/<backend>/renew_on`: uncontended
//!   `acquire` + `release`, auto-renew off and on.
//! * `try_fail/<backend>`: `try_acquire` of a lock another client holds.
//! * `handoff/<backend>`: from the holder's `release()` call to the moment a
//!   waiter on another client, queued inside `acquire`, has the lock. Before
//!   each handoff the waiter is given at least 20 ms to queue (or, where the
//!   server reports its queue, until it shows there), polled with `status`
//!   calls; one `status` call is timed just before the release as the
//!   handoff's yardstick.
//! * `raw_floor/<backend>`: the same lock cycle written by hand against the
//!   server (the physical floor of that backend on this machine; see
//!   `lockkit_benches::RawFloor`).
//!
//! Then, per backend, interleaved rounds (`lockkit_benches::Interleaved`:
//! every kind in every round, the order turned and reversed every other
//! round) of the raw floor, the cycle with auto-renew off and on, the
//! cycle of a client that draws no fencing token (single Redis only, where
//! the token costs a write of its own), the shared (reader) and permit
//! (semaphore of 4) cycles and the `try_acquire` of a held lock, so that
//! each ratio is paired: the median over rounds of one kind's round mean ÷
//! its base's in the same round.
//!
//! At the end a Markdown table gives each backend's medians and paired
//! ratios (and criterion's handoff with its yardstick); it is printed and
//! written to `target/lockkit-bench/compare-summary.md`, with a chart of
//! the ratios beside it (`compare-ratios.svg` and `.png`).
//! `LOCKKIT_BENCH_BACKENDS=redis,zk` limits the run to some backends;
//! `LOCKKIT_BENCH_QUICK=1` shrinks it.
//!
//! Run with `cargo bench -p lockkit-benches --bench compare`, or
//! `scripts/bench.sh` for this and the load generator's comparisons.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkGroup, Criterion, measurement::WallTime};
use lockkit_benches::{
    CycleFixture, CycleKind, Deployment, HandoffDiag, HandoffProbe, Handoffs, Interleaved,
    PIN_CPUS, RawFloor, RunMode, Servers, configure_fast, connect, fmt_opt_ns, lockkit_cycle,
    pin_from_env, runtime, save_summary, selected, target_dir,
};
use lockkit_core::{Capabilities, DistributedLock, LockGuard, LockOptions};
use tokio::runtime::Runtime;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);
/// The least time a waiter is given to queue before a handoff.
const PARK: Duration = Duration::from_millis(20);

/// The lock names of one backend's benchmarks. Each backend has its own:
/// some share a server (single Redis and the Redlocks share instances, the
/// SQL modes of one database share a table), and a lock one backend holds
/// must not be in another's way.
#[derive(Clone, Copy)]
struct Names {
    cycle: &'static str,
    renew: &'static str,
    /// Held by a second client during `try_fail`.
    held: &'static str,
    handoff: &'static str,
    raw: &'static str,
    shared: &'static str,
    permit: &'static str,
    tokenless: &'static str,
}

impl Names {
    fn of(backend: Deployment) -> Names {
        // A dozen short strings for the life of the bench.
        let name = |what: &str| -> &'static str {
            format!("bench-compare-{}-{what}", backend.label()).leak()
        };
        Names {
            cycle: name("cycle"),
            renew: name("cycle-renew"),
            held: name("held"),
            handoff: name("handoff"),
            raw: name("raw"),
            shared: name("shared"),
            permit: name("permit"),
            tokenless: name("tokenless"),
        }
    }
}

fn main() {
    let pinned = pin_from_env();
    let mode = RunMode::from_env();
    let runtime = runtime();
    let backends = selected();
    let servers = runtime.block_on(Servers::start(&backends));
    let fixtures: Vec<Fixture> = backends
        .iter()
        .map(|&backend| runtime.block_on(Fixture::new(&servers, backend)))
        .collect();

    let mut c = lockkit_benches::criterion();
    bench_group(&mut c, "cycle", mode, &fixtures, |g, f| {
        for (renew, name) in [(false, f.names.cycle), (true, f.names.renew)] {
            let opts = LockOptions::new().ttl(TTL).auto_renew(renew);
            let id = format!("{}/renew_{}", f.backend, if renew { "on" } else { "off" });
            g.bench_function(id, |b| {
                b.to_async(&runtime)
                    .iter(|| lockkit_cycle(f.lock.as_ref(), name, &opts))
            });
        }
    });
    bench_group(&mut c, "try_fail", mode, &fixtures, |g, f| {
        let opts = LockOptions::new().ttl(TTL).no_wait();
        g.bench_function(f.backend.label(), |b| {
            b.to_async(&runtime).iter(|| async {
                let got = f
                    .lock
                    .try_acquire(f.names.held, &opts)
                    .await
                    .expect("try_acquire");
                assert!(got.is_none(), "{}: took a held lock", f.backend);
            })
        });
    });
    bench_group(&mut c, "raw_floor", mode, &fixtures, |g, f| {
        g.bench_function(f.backend.label(), |b| {
            b.to_async(&runtime).iter(|| f.raw.cycle(f.names.raw))
        });
    });
    let handoffs: Vec<HandoffDiag> = fixtures
        .iter()
        .map(|f| bench_handoff(&mut c, &runtime, &servers, f, mode))
        .collect();
    c.final_summary();
    if mode == RunMode::List {
        return;
    }
    let (rounds, per_round) = match mode {
        // Thirteen backends, the slowest at about a millisecond a cycle.
        RunMode::Bench => (15, 50),
        _ => mode.interleaved_plan(),
    };
    let paired: Vec<Interleaved<Cycle>> = fixtures
        .iter()
        .map(|f| runtime.block_on(Interleaved::measure(f, rounds, per_round)))
        .collect();
    save_summary(
        mode,
        "compare",
        &summary(&fixtures, &paired, &handoffs, pinned.as_deref()),
    );
    if mode != RunMode::Test {
        chart(&fixtures, &paired);
    }
    // Clients end before their servers.
    runtime.block_on(async move {
        for f in fixtures {
            f.held.release().await.expect("release the held lock");
        }
    });
    drop(servers);
}

/// One backend's clients: the one measured, a second one holding
/// its `held` lock for `try_fail`, and the raw floor.
struct Fixture {
    backend: Deployment,
    names: Names,
    lock: Arc<dyn DistributedLock>,
    /// The client's capabilities, asked once (not inside the timed cycles).
    can: Capabilities,
    held: LockGuard,
    raw: RawFloor,
    /// Where the fencing token costs a write of its own, a client that
    /// draws none (see [`tokenless`]).
    tokenless: Option<Arc<dyn DistributedLock>>,
}

/// A client of `backend` that draws no fencing token, where the backend
/// draws its token with a write of its own and can leave it out: single
/// Redis (`fencing=false`; the token is a `TIME` and a write of the name's
/// counter in the acquire script, and their clean-up in the release). The
/// SQL modes draw theirs in the locking statement itself, ZooKeeper and
/// etcd read it off what the grant creates, Redlock draws none.
async fn tokenless(servers: &Servers, backend: Deployment) -> Option<Arc<dyn DistributedLock>> {
    if backend != Deployment::Redis {
        return None;
    }
    let hosts: Vec<String> = servers
        .addrs(backend)
        .iter()
        .map(ToString::to_string)
        .collect();
    let url = servers.url_with(backend, &hosts, &[("fencing", "false".to_owned())]);
    let lock = lockkit::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{backend} without tokens connects: {e}"));
    assert!(!lock.capabilities().fencing, "{url} draws no tokens");
    Some(lock)
}

impl Fixture {
    async fn new(servers: &Servers, backend: Deployment) -> Fixture {
        let client = || async {
            connect(servers, backend)
                .await
                .unwrap_or_else(|e| panic!("{backend} connects: {e}"))
        };
        // lockkit's clients first: their `connect` creates the SQL tables
        // the raw floors use.
        let names = Names::of(backend);
        let lock = client().await;
        let holder = client().await;
        let held = holder
            .acquire(names.held, &LockOptions::new().ttl(TTL))
            .await
            .expect("hold the try_fail lock");
        let raw = RawFloor::connect(servers, backend).await;
        let tokenless = tokenless(servers, backend).await;
        // Outside every measurement: first acquires create rows, nodes and
        // connections.
        let fixture = Fixture {
            backend,
            names,
            can: lock.capabilities(),
            lock,
            held,
            raw,
            tokenless,
        };
        for _ in 0..3 {
            for &kind in Cycle::ALL {
                fixture.run(kind).await;
            }
        }
        fixture
    }

    /// Whether the backend has the kind of holding (MySQL named locks have
    /// no shared side, for one): a kind it has not is skipped, and its
    /// cells say so.
    fn has(&self, kind: Cycle) -> bool {
        match kind {
            Cycle::Shared => self.can.shared,
            Cycle::Permit => self.can.semaphore,
            Cycle::Tokenless => self.tokenless.is_some(),
            _ => true,
        }
    }
}

/// The kinds of the interleaved rounds.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cycle {
    /// The raw floor's cycle.
    Raw,
    /// `acquire` + `release`, auto-renew off.
    Exclusive,
    /// The same with auto-renew on.
    Renewed,
    /// `acquire` + `release` of a client that draws no fencing token
    /// (where it has one of its own, see [`tokenless`]), auto-renew off.
    Tokenless,
    /// A shared (reader) holding's cycle.
    Shared,
    /// A permit's cycle, of a semaphore of 4.
    Permit,
    /// `try_acquire` of a lock another client holds.
    TryHeld,
}

impl CycleKind for Cycle {
    const ALL: &'static [Cycle] = &[
        Cycle::Raw,
        Cycle::Exclusive,
        Cycle::Renewed,
        Cycle::Tokenless,
        Cycle::Shared,
        Cycle::Permit,
        Cycle::TryHeld,
    ];

    fn bench(self) -> &'static str {
        match self {
            Cycle::Raw => "raw",
            Cycle::Exclusive => "exclusive",
            Cycle::Renewed => "renewed",
            Cycle::Tokenless => "tokenless",
            Cycle::Shared => "shared",
            Cycle::Permit => "permit",
            Cycle::TryHeld => "try_held",
        }
    }
}

impl CycleFixture for Fixture {
    type Kind = Cycle;

    async fn run(&self, kind: Cycle) {
        if !self.has(kind) {
            return;
        }
        let (lock, names) = (self.lock.as_ref(), &self.names);
        let opts = LockOptions::new().ttl(TTL).auto_renew(false);
        match kind {
            Cycle::Raw => self.raw.cycle(names.raw).await,
            Cycle::Exclusive => lockkit_cycle(lock, names.cycle, &opts).await,
            Cycle::Renewed => lockkit_cycle(lock, names.renew, &opts.auto_renew(true)).await,
            Cycle::Tokenless => {
                if let Some(tokenless) = &self.tokenless {
                    lockkit_cycle(tokenless.as_ref(), names.tokenless, &opts).await
                }
            }
            Cycle::Shared => lockkit_cycle(lock, names.shared, &opts.shared()).await,
            Cycle::Permit => lockkit_cycle(lock, names.permit, &opts.semaphore(4)).await,
            Cycle::TryHeld => {
                let got = lock
                    .try_acquire(names.held, &opts.no_wait())
                    .await
                    .expect("try_acquire");
                assert!(got.is_none(), "{}: took a held lock", self.backend);
            }
        }
    }
}

/// A criterion group named `name` with each fixture's benchmarks, as `add`
/// defines them.
fn bench_group(
    c: &mut Criterion,
    name: &str,
    mode: RunMode,
    fixtures: &[Fixture],
    mut add: impl FnMut(&mut BenchmarkGroup<'_, WallTime>, &Fixture),
) {
    let mut group = c.benchmark_group(name);
    configure_fast(&mut group, mode);
    if mode == RunMode::Bench {
        // Twelve backends in each group: enough samples, in less time.
        group
            .sample_size(30)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(3));
    }
    for fixture in fixtures {
        add(&mut group, fixture);
    }
    group.finish();
}

/// The generic handoff probe: the waiter is parked once it has had [`PARK`]
/// (and, where the server reports its queue, once it shows there); the
/// yardstick is one `status` call.
struct StatusProbe {
    lock: Arc<dyn DistributedLock>,
    name: &'static str,
}

impl HandoffProbe for StatusProbe {
    type Mark = Instant;

    async fn mark(&self) -> Instant {
        Instant::now()
    }

    async fn until_parked(&self, started: Instant) {
        let deadline = started + Duration::from_secs(10);
        loop {
            let status = self.lock.status(self.name).await.expect("status");
            let queued = status.waiters.is_none_or(|n| n >= 1);
            if queued && started.elapsed() >= PARK {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the waiter never queued: {status:?}"
            );
        }
    }

    async fn yardstick(&self) -> Duration {
        let started = Instant::now();
        self.lock.status(self.name).await.expect("status");
        started.elapsed()
    }
}

fn bench_handoff(
    c: &mut Criterion,
    runtime: &Runtime,
    servers: &Servers,
    fixture: &Fixture,
    mode: RunMode,
) -> HandoffDiag {
    let backend = fixture.backend;
    Handoffs::connect(
        runtime,
        || connect(servers, backend),
        fixture.names.handoff,
        LockOptions::new().ttl(TTL),
        StatusProbe {
            lock: fixture.lock.clone(),
            name: fixture.names.handoff,
        },
    )
    .bench_as(c, runtime, "handoff", backend.label(), mode)
}

/// The table: per backend, the interleaved rounds' medians and paired
/// ratios, and criterion's handoff with its yardstick.
fn summary(
    fixtures: &[Fixture],
    paired: &[Interleaved<Cycle>],
    handoffs: &[HandoffDiag],
    pinned: Option<&str>,
) -> String {
    let rounds = paired.first().map_or(0, Interleaved::rounds);
    let placement = match pinned {
        Some(cpus) => format!(
            "The benchmark and every server it started ran pinned to CPU {cpus} (`{PIN_CPUS}={cpus}`)."
        ),
        None => "The benchmark and its servers ran where the scheduler put them (not pinned)."
            .to_owned(),
    };
    let mut out = format!(
        "## lockkit's backends side by side ({rounds} interleaved rounds per backend)\n\n\
         {placement} \
         Medians over interleaved rounds (every kind in every round, the order turned and reversed every other round); each ratio is paired: the median over rounds of the kind's round mean ÷ its base's in the same round. \
         The base of the exclusive cycles and of the failed `try_acquire` is the backend's raw floor (the same lock cycle written by hand against the server; a failed try is one round trip where the floor's cycle is two on most servers); \
         that of the shared and permit cycles is the exclusive cycle (— where the backend has no such holding). \
         The cycle without a token is that of a client that draws no fencing token, over the same floor, where the token costs a write of its own (single Redis, `fencing=false`: — elsewhere, whose tokens come with the grant or not at all); the gap between the two cycles is the token's cost. \
         The handoff is criterion's median, from the holder's `release()` call to the queued waiter's lock, over one `status` call timed just before it (median of the pairs).\n\n\
         | backend | raw floor | cycle | × floor | cycle, auto-renew on | × floor | cycle without a token | × floor | shared cycle | × cycle | permit cycle | × cycle | try_acquire of a held lock | × floor | handoff | handoff ÷ one `status` |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for ((f, rounds), handoff) in fixtures.iter().zip(paired).zip(handoffs) {
        let cell = |kind: Cycle, base: Cycle| {
            if !f.has(kind) {
                return "— | —".to_owned();
            }
            let ratio = rounds
                .paired_ratio(kind, base)
                .map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}"));
            format!("{} | {ratio}", fmt_opt_ns(rounds.median(kind)))
        };
        let (handoff_median, handoff_ratio) = match handoff.paired_medians() {
            Some((h, y)) => (
                fmt_opt_ns(Some(h.as_nanos() as f64)),
                format!("{:.2}", h.as_secs_f64() / y.as_secs_f64().max(1e-9)),
            ),
            None => ("n/a".to_owned(), "n/a".to_owned()),
        };
        let (cycles, holdings) = CHARTED.split_at(2);
        let cells: Vec<String> = cycles
            .iter()
            .map(|&(kind, base, _)| cell(kind, base))
            .chain([cell(Cycle::Tokenless, Cycle::Raw)])
            .chain(holdings.iter().map(|&(kind, base, _)| cell(kind, base)))
            .chain([cell(Cycle::TryHeld, Cycle::Raw)])
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {handoff_median} | {handoff_ratio} |",
            f.backend.label(),
            fmt_opt_ns(rounds.median(Cycle::Raw)),
            cells.join(" | "),
        );
    }
    out.push_str(
        "\n![The paired ratios per backend](compare-ratios.svg)\n\n\
         The chart shows the table's ratios: `target/lockkit-bench/compare-ratios.svg` (and `.png`) of the same run, copied beside the report by `scripts/reports.sh compare`.\n",
    );
    out
}

/// The ratios the table gives first and the chart draws: kind, its base,
/// and the chart's name for it.
const CHARTED: [(Cycle, Cycle, &str); 4] = [
    (Cycle::Exclusive, Cycle::Raw, "cycle ÷ raw floor"),
    (Cycle::Renewed, Cycle::Raw, "auto-renew on ÷ raw floor"),
    (Cycle::Shared, Cycle::Exclusive, "shared ÷ cycle"),
    (Cycle::Permit, Cycle::Exclusive, "permit ÷ cycle"),
];

/// The paired ratios as grouped bars, one group per backend.
fn chart(fixtures: &[Fixture], paired: &[Interleaved<Cycle>]) {
    let series = CHARTED.map(|(_, _, name)| name);
    let groups: Vec<_> = fixtures
        .iter()
        .zip(paired)
        .map(|(f, rounds)| {
            let ratios = CHARTED
                .iter()
                .map(|&(kind, base, _)| rounds.paired_ratio(kind, base).filter(|_| f.has(kind)))
                .collect();
            (f.backend.label().to_owned(), ratios)
        })
        .collect();
    let stem = target_dir().join("lockkit-bench").join("compare-ratios");
    match lockkit_benches::plot::bar_chart(
        &stem,
        "lockkit's cycles, paired ratios (log scale)",
        "ratio",
        &series,
        &groups,
        1.0,
    ) {
        Ok(()) => println!("chart written to {}.svg and .png", stem.display()),
        Err(e) => println!("no chart: {e}"),
    }
}
