#![allow(clippy::print_stdout)]
//! What the bounds cost: the exclusive cycle (`try_acquire`, then
//! `release`) with `lock_delay` and with `max_hold` over the same cycle
//! with no bound, one client in one process, on both runtime flavours.
//! The options off are the cycle of every other benchmark.
//!
//! Each run interleaves 12 blocks of 40 cycles of each kind (after 2
//! warm-up blocks, the order alternating); a run's ratio is the median of
//! its blocks' ratios to the plain cycle, and the verdict is on the median
//! of 7 runs. The summary goes to `target/lockkit-bench/bounds-summary.md`
//! (`scripts/reports.sh bounds` makes it a page of docs/reports/).
//!
//! `cargo bench -p lockkit-benches --bench bounds`

use std::sync::Arc;
use std::time::Duration;

use lockkit_benches::{
    CycleFixture, CycleKind, Deployment, Interleaved, Limit, RunMode, Servers, median, runtime_of,
    save_summary,
};
use lockkit_core::{DistributedLock, LockOptions};

/// Runs, blocks per run (after the warm-up blocks) and cycles per block.
fn plan(mode: RunMode) -> (usize, usize, usize) {
    match mode {
        RunMode::Bench => (7, 12, 40),
        RunMode::Quick => (2, 5, 20),
        _ => (1, 1, 3),
    }
}

const WARM_UP_BLOCKS: usize = 2;

/// The backends measured: those that keep a lock delay on the server.
const BACKENDS: [Deployment; 4] = [
    Deployment::Memory,
    Deployment::Redis,
    Deployment::Redlock3,
    Deployment::PgLease,
];

/// lock_delay ÷ plain, at most.
const TARGET: f64 = 1.1;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Cycle {
    Plain,
    LockDelay,
    MaxHold,
}

impl CycleKind for Cycle {
    const ALL: &'static [Cycle] = &[Cycle::Plain, Cycle::LockDelay, Cycle::MaxHold];

    fn bench(self) -> &'static str {
        match self {
            Cycle::Plain => "plain",
            Cycle::LockDelay => "lock_delay",
            Cycle::MaxHold => "max_hold",
        }
    }
}

struct Fixture {
    locks: Arc<dyn DistributedLock>,
    name: String,
}

struct Run {
    plain_us: f64,
    delay_ratio: f64,
    limit_ratio: f64,
}

fn main() {
    let mode = RunMode::from_env();
    if mode == RunMode::List {
        return;
    }
    let boot = runtime_of("current_thread");
    let servers = boot.block_on(Servers::start(&BACKENDS));
    let (runs, blocks, per_block) = plan(mode);
    let mut rows = Vec::new();
    for deployment in BACKENDS {
        for flavour in ["current_thread", "multi_thread"] {
            let rt = runtime_of(flavour);
            let fixture = rt.block_on(async {
                Fixture {
                    locks: lockkit::connect(&servers.url(deployment))
                        .await
                        .expect("a lockkit client"),
                    name: format!("bench:bounds:{flavour}"),
                }
            });
            let measured: Vec<Run> = (0..runs)
                .map(|_| rt.block_on(fixture.measure(blocks, per_block)))
                .collect();
            for (i, run) in measured.iter().enumerate() {
                println!(
                    "{deployment} {flavour} run {i}: plain {:.1} µs, lock_delay × {:.3}, max_hold × {:.3}",
                    run.plain_us, run.delay_ratio, run.limit_ratio
                );
            }
            rows.push((deployment, flavour, measured));
        }
    }
    save_summary(mode, "bounds", &summary(mode, &rows));
}

impl Fixture {
    async fn measure(&self, blocks: usize, per_block: usize) -> Run {
        Interleaved::<Cycle>::measure(self, WARM_UP_BLOCKS, per_block).await;
        let measured = Interleaved::<Cycle>::measure(self, blocks, per_block).await;
        let ratio = |kind| {
            measured
                .paired_ratio(kind, Cycle::Plain)
                .expect("measured blocks")
        };
        Run {
            plain_us: measured.median(Cycle::Plain).expect("measured blocks") / 1e3,
            delay_ratio: ratio(Cycle::LockDelay),
            limit_ratio: ratio(Cycle::MaxHold),
        }
    }
}

impl CycleFixture for Fixture {
    type Kind = Cycle;

    async fn run(&self, kind: Cycle) {
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .auto_renew(false);
        let opts = match kind {
            Cycle::Plain => opts,
            Cycle::LockDelay => opts.lock_delay(Duration::from_secs(5)),
            Cycle::MaxHold => opts.max_hold(Duration::from_secs(3600)),
        };
        let guard = self
            .locks
            .try_acquire(&self.name, &opts)
            .await
            .expect("try_acquire")
            .expect("the bench's name is free");
        guard.release().await.expect("release");
    }
}

fn summary(mode: RunMode, rows: &[(Deployment, &str, Vec<Run>)]) -> String {
    let mut out = format!(
        "## The exclusive cycle with a bound over the same cycle without ({} run)\n\n\
         | backend | runtime | plain cycle (median of run medians) | `lock_delay(5 s)` × plain, each run (paired) | median of runs | target | `max_hold(1 h)` × plain, median of runs |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
        mode.label()
    );
    for (deployment, flavour, runs) in rows {
        let each: Vec<String> = runs
            .iter()
            .map(|r| format!("{:.2}", r.delay_ratio))
            .collect();
        let (ratio, verdict) =
            Limit::AtMost(TARGET).judge(Some(median(runs.iter().map(|r| r.delay_ratio).collect())));
        let limit = median(runs.iter().map(|r| r.limit_ratio).collect());
        let plain = median(runs.iter().map(|r| r.plain_us).collect());
        out.push_str(&format!(
            "| {deployment} | {} | {plain:.1} µs | {} | {ratio} | {verdict} | {limit:.3} |\n",
            flavour.replace('_', "-"),
            each.join(", "),
        ));
    }
    out
}
