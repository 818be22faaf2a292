#![allow(clippy::print_stdout)]
//! The exclusive cycle's fixed cost over the hand-written floor, measured the
//! way an application meets it: one client in one process, on the two
//! runtime flavours applications run (a current-thread runtime, and a
//! multi-thread one with 4 workers on this 2-core machine).
//!
//! * raw floor: a redis-rs multiplexed connection per server, `SET k tok NX
//!   PX 30000` then an `EVALSHA` compare-and-delete (on Redlock, each on
//!   every instance at once);
//! * lockkit: `try_acquire` (ttl 30 s, `auto_renew(false)`) then `release`,
//!   through `lockkit::connect`, release notifications and the waiting line
//!   included; on Redis once without a fencing token (`fencing=false`), as
//!   the floor draws none, which the target judges, and once with one (the
//!   default), so that the token's cost stands beside it. Redlock draws no
//!   token.
//!
//! Each run interleaves blocks of 100 cycles of each kind (20 blocks after
//! 2 warm-up blocks, the order turned and reversed every other round), and
//! its ratio is the median of the blocks' lockkit/raw ratios; the verdict
//! is on the median over 7 runs, with every run's ratio shown. The summary
//! goes to `target/lockkit-bench/cycle-overhead-summary.md`
//! (`scripts/reports.sh cycle-overhead` makes it a page of docs/reports/).
//!
//! `cargo bench -p lockkit-benches --bench cycle_overhead`

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use lockkit_benches::{
    CycleFixture, CycleKind, Deployment, Interleaved, Limit, RAW_RELEASE, RunMode, Servers, median,
    runtime_of, save_summary,
};
use lockkit_core::{DistributedLock, LockOptions};
use redis::aio::MultiplexedConnection;

const TTL: Duration = Duration::from_secs(30);

/// Runs, blocks per run (after the warm-up blocks) and cycles per block.
fn plan(mode: RunMode) -> (usize, usize, usize) {
    match mode {
        RunMode::Bench => (7, 20, 100),
        RunMode::Quick => (2, 5, 50),
        _ => (1, 1, 3),
    }
}

const WARM_UP_BLOCKS: usize = 2;

/// The backends measured, each with its target.
const BACKENDS: [(Deployment, f64); 2] = [(Deployment::Redis, 1.10), (Deployment::Redlock3, 1.15)];

fn main() {
    let mode = RunMode::from_env();
    if mode == RunMode::List {
        return;
    }
    let boot = runtime_of("current_thread");
    let deployments: Vec<Deployment> = BACKENDS.iter().map(|(d, _)| *d).collect();
    let servers = boot.block_on(Servers::start(&deployments));
    let (runs, blocks, per_block) = plan(mode);
    let mut rows = Vec::new();
    for (deployment, target) in BACKENDS {
        for flavour in ["current_thread", "multi_thread"] {
            let rt = runtime_of(flavour);
            let fixture = rt.block_on(Fixture::new(&servers, deployment, flavour));
            let measured: Vec<Run> = (0..runs)
                .map(|_| rt.block_on(fixture.run(blocks, per_block)))
                .collect();
            for (i, run) in measured.iter().enumerate() {
                println!(
                    "{deployment} {flavour} run {i}: raw {:.1} µs, lockkit {:.1} µs (paired ratio {:.3}), with a token {:.1} µs ({:.3})",
                    run.raw_us, run.lockkit_us, run.ratio, run.fenced_us, run.fenced_ratio
                );
            }
            rows.push(Row {
                backend: deployment,
                flavour,
                target,
                runs: measured,
            });
        }
    }
    save_summary(mode, "cycle-overhead", &summary(mode, &rows));
}

/// Whether a default client of `deployment` draws a fencing token in its
/// cycle (Redis does; Redlock draws none).
fn draws_token(deployment: Deployment) -> bool {
    deployment == Deployment::Redis
}

/// The cycles compared: the floor, lockkit's without a fencing token (as
/// the floor), and lockkit's as a default client runs it (with a token
/// where the backend draws one).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cycle {
    Raw,
    Lockkit,
    Fenced,
}

impl CycleKind for Cycle {
    const ALL: &'static [Cycle] = &[Cycle::Raw, Cycle::Lockkit, Cycle::Fenced];

    fn bench(self) -> &'static str {
        match self {
            Cycle::Raw => "raw_floor",
            Cycle::Lockkit => "lockkit_cycle",
            Cycle::Fenced => "lockkit_cycle_fenced",
        }
    }
}

/// One client of each side, on the runtime that measures it.
struct Fixture {
    raw: Vec<MultiplexedConnection>,
    script: redis::Script,
    /// A client that draws no fencing token (`fencing=false` on Redis;
    /// Redlock draws none).
    locks: std::sync::Arc<dyn DistributedLock>,
    /// A default client: with a token where the backend draws one.
    fenced: std::sync::Arc<dyn DistributedLock>,
    opts: LockOptions,
    tokens: AtomicU64,
    name: String,
}

/// One run: the medians of the blocks' cycle times, and of their ratios.
struct Run {
    raw_us: f64,
    lockkit_us: f64,
    fenced_us: f64,
    /// The tokenless cycle's, which the target judges.
    ratio: f64,
    fenced_ratio: f64,
}

impl Fixture {
    /// A client of each side. The lock's name is the flavour's: a release
    /// that Redlock decided on a quorum finishes on the last instance in
    /// the background, and the runtime before this one was dropped with
    /// its last such delete unsent (the key then stays on that instance for
    /// its 30 s lease).
    async fn new(servers: &Servers, deployment: Deployment, flavour: &str) -> Fixture {
        let script = redis::Script::new(RAW_RELEASE);
        let mut raw = Vec::new();
        for addr in servers.addrs(deployment) {
            raw.push(raw_connection(addr, &script).await);
        }
        let hosts: Vec<String> = servers
            .addrs(deployment)
            .iter()
            .map(ToString::to_string)
            .collect();
        let tokenless = if draws_token(deployment) {
            vec![("fencing", "false".to_owned())]
        } else {
            Vec::new()
        };
        let client = |params: Vec<(&'static str, String)>| {
            let url = servers.url_with(deployment, &hosts, &params);
            async move { lockkit::connect(&url).await.expect("a lockkit client") }
        };
        let locks = client(tokenless).await;
        let fenced = client(Vec::new()).await;
        Fixture {
            raw,
            script,
            locks,
            fenced,
            opts: LockOptions::new().ttl(TTL).auto_renew(false),
            tokens: AtomicU64::new(0),
            name: format!("bench:overhead:lockkit:{flavour}"),
        }
    }

    /// Warm-up blocks (not counted), then `blocks` interleaved blocks of
    /// `per_block` cycles of each kind, the order turned and reversed every
    /// other round.
    async fn run(&self, blocks: usize, per_block: usize) -> Run {
        Interleaved::<Cycle>::measure(self, WARM_UP_BLOCKS, per_block).await;
        let measured = Interleaved::<Cycle>::measure(self, blocks, per_block).await;
        let us = |kind| measured.median(kind).expect("measured blocks") / 1e3;
        let ratio = |kind| {
            measured
                .paired_ratio(kind, Cycle::Raw)
                .expect("measured blocks")
        };
        Run {
            raw_us: us(Cycle::Raw),
            lockkit_us: us(Cycle::Lockkit),
            fenced_us: us(Cycle::Fenced),
            ratio: ratio(Cycle::Lockkit),
            fenced_ratio: ratio(Cycle::Fenced),
        }
    }

    /// `SET NX PX` on every server at once, then the compare-and-delete on
    /// every server at once.
    async fn raw_cycle(&self) {
        let token = format!("raw-{}", self.tokens.fetch_add(1, Ordering::Relaxed));
        let set = join_all(self.raw.iter().map(|conn| {
            let mut conn = conn.clone();
            let token = &token;
            async move {
                redis::cmd("SET")
                    .arg("bench:overhead:raw")
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL.as_millis() as u64)
                    .query_async::<Option<String>>(&mut conn)
                    .await
            }
        }))
        .await;
        assert!(
            set.iter().all(|s| matches!(s, Ok(Some(_)))),
            "raw SET NX: {set:?}"
        );
        let deleted = join_all(self.raw.iter().map(|conn| {
            let mut conn = conn.clone();
            let script = &self.script;
            let token = &token;
            async move {
                script
                    .key("bench:overhead:raw")
                    .arg(token)
                    .invoke_async::<i64>(&mut conn)
                    .await
            }
        }))
        .await;
        assert!(
            deleted.iter().all(|d| matches!(d, Ok(1))),
            "raw compare-and-delete: {deleted:?}"
        );
    }
}

impl CycleFixture for Fixture {
    type Kind = Cycle;

    async fn run(&self, kind: Cycle) {
        match kind {
            Cycle::Raw => self.raw_cycle().await,
            Cycle::Lockkit | Cycle::Fenced => {
                let locks = if kind == Cycle::Lockkit {
                    &self.locks
                } else {
                    &self.fenced
                };
                let guard = locks
                    .try_acquire(&self.name, &self.opts)
                    .await
                    .expect("try_acquire")
                    .expect("an uncontended lock");
                guard.release().await.expect("release");
            }
        }
    }
}

async fn raw_connection(addr: SocketAddr, script: &redis::Script) -> MultiplexedConnection {
    let client = redis::Client::open(format!("redis://{addr}")).expect("a redis URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("a redis connection");
    script
        .prepare_invoke()
        .load_async(&mut conn)
        .await
        .expect("SCRIPT LOAD");
    conn
}

struct Row {
    backend: Deployment,
    flavour: &'static str,
    target: f64,
    runs: Vec<Run>,
}

fn summary(mode: RunMode, rows: &[Row]) -> String {
    let mut out = format!(
        "## The exclusive cycle over its raw floor, one client ({} run)\n\n\
         The lockkit cycle draws no fencing token, as the floor draws none (`fencing=false` on Redis; Redlock draws none); \
         the last columns give the cycle of a default client, with its token, over the same floor (the token's cost).\n\n\
         | backend | runtime | raw floor (median of run medians) | lockkit cycle | × floor, each run (paired) | median of runs | target | with a fencing token | × floor, median of runs |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        mode.label()
    );
    for row in rows {
        let each: Vec<String> = row.runs.iter().map(|r| format!("{:.2}", r.ratio)).collect();
        let ratio = median(row.runs.iter().map(|r| r.ratio).collect());
        let (ratio, verdict) = Limit::AtMost(row.target).judge(Some(ratio));
        let (fenced, fenced_ratio) = if draws_token(row.backend) {
            (
                format!(
                    "{:.1} µs",
                    median(row.runs.iter().map(|r| r.fenced_us).collect())
                ),
                format!(
                    "{:.3}",
                    median(row.runs.iter().map(|r| r.fenced_ratio).collect())
                ),
            )
        } else {
            ("— (no token)".to_owned(), "—".to_owned())
        };
        out.push_str(&format!(
            "| {} | {} | {:.1} µs | {:.1} µs | {} | {ratio} | {verdict} | {fenced} | {fenced_ratio} |\n",
            row.backend,
            row.flavour.replace('_', "-"),
            median(row.runs.iter().map(|r| r.raw_us).collect()),
            median(row.runs.iter().map(|r| r.lockkit_us).collect()),
            each.join(", "),
        ));
    }
    out
}
