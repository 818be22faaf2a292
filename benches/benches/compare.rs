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
//! At the end a compact Markdown table gives each backend's medians and its
//! cycles' ratios to its own raw floor; it is printed and written to
//! `target/lockkit-bench/compare-summary.md`. `LOCKKIT_BENCH_BACKENDS=redis,zk`
//! limits the run to some backends; `LOCKKIT_BENCH_QUICK=1` shrinks it.
//!
//! Run with `cargo bench -p lockkit-benches --bench compare`, or
//! `scripts/bench.sh` for this and the load generator's comparisons.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use criterion::{BenchmarkGroup, Criterion, measurement::WallTime};
use lockkit_benches::{
    Deployment, Estimates, HandoffDiag, HandoffProbe, Handoffs, RawFloor, RunMode, Servers,
    configure_fast, connect, fmt_opt_ns, lockkit_cycle, runtime, save_summary, selected,
};
use lockkit_core::{DistributedLock, LockGuard, LockOptions};
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
        }
    }
}

fn main() {
    let mode = RunMode::from_env();
    let runtime = runtime();
    let run_started = SystemTime::now();
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
    save_summary(mode, "compare", &summary(run_started, &fixtures, &handoffs));
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
    held: LockGuard,
    raw: RawFloor,
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
        let opts = LockOptions::new().ttl(TTL);
        // Outside every measurement: first acquires create rows, nodes and
        // connections.
        for _ in 0..3 {
            lockkit_cycle(lock.as_ref(), names.cycle, &opts).await;
            lockkit_cycle(lock.as_ref(), names.renew, &opts).await;
            raw.cycle(names.raw).await;
        }
        Fixture {
            backend,
            names,
            lock,
            held,
            raw,
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

/// The table: per backend, the raw floor, both cycles with their ratio to
/// the floor, `try_fail`, and the handoff with its yardstick.
fn summary(run_started: SystemTime, fixtures: &[Fixture], handoffs: &[HandoffDiag]) -> String {
    let estimates = Estimates::new(run_started);
    let mut out = String::from(
        "## lockkit's backends side by side\n\n\
         Criterion's medians, measured one benchmark after another; each cycle's ratio is to its own backend's raw floor. \
         The handoff is lockkit's, from the holder's `release()` call to the queued waiter's lock; its yardstick is one `status` call timed just before it (median of the pairs).\n\n\
         | backend | raw floor | cycle | × floor | cycle, auto-renew on | × floor | try_acquire of a held lock | handoff | handoff ÷ one `status` |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for (f, handoff) in fixtures.iter().zip(handoffs) {
        let label = f.backend.label();
        let floor = estimates.median("raw_floor", label);
        let off = estimates.median("cycle", &format!("{label}/renew_off"));
        let on = estimates.median("cycle", &format!("{label}/renew_on"));
        let ratio = |x: Option<f64>| match (x, floor) {
            (Some(x), Some(floor)) => format!("{:.2}", x / floor),
            _ => "n/a".to_owned(),
        };
        let (handoff_median, handoff_ratio) = match handoff.paired_medians() {
            Some((h, y)) => (
                fmt_opt_ns(Some(h.as_nanos() as f64)),
                format!("{:.2}", h.as_secs_f64() / y.as_secs_f64().max(1e-9)),
            ),
            None => ("n/a".to_owned(), "n/a".to_owned()),
        };
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {} | {} | {} | {} | {handoff_median} | {handoff_ratio} |",
            fmt_opt_ns(floor),
            fmt_opt_ns(off),
            ratio(off),
            fmt_opt_ns(on),
            ratio(on),
            fmt_opt_ns(estimates.median("try_fail", label)),
        );
    }
    if fixtures
        .iter()
        .all(|f| estimates.median("raw_floor", f.backend.label()).is_none())
    {
        out.push_str(
            "\nNote: criterion wrote no fresh estimates (`--test`/`--list` mode or a filter).\n",
        );
    }
    out
}
