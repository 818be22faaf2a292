//! `lockkit-scale`: how the backends scale, against servers the testkit
//! starts on loopback ports.
//!
//! * `curves`: the load generator's scenario (see `lockkit-load`) per
//!   backend, sweeping the contenders on one key (1, 16, 256, 4096 tasks)
//!   and the keys under 256 tasks (1, 100, 10 000 keys); throughput and p99
//!   acquire latency per point, as a Markdown table, JSON, and charts (SVG
//!   and PNG) under `target/lockkit-bench/`.
//! * `density`: 1 000 000 held, auto-renewed Redis leases in one process:
//!   resident memory per lease, renewals and round trips per second (the
//!   renewals are batched), client CPU, and that none was lost. The heap
//!   the program holds is counted apart from what the allocator keeps from
//!   the system: the binary's global allocator is wrapped by `cap`, which
//!   counts the bytes in use (one atomic add per allocation). That
//!   allocator is mimalloc, or the system's with the `system-allocator`
//!   feature: with glibc's malloc, allocation is the largest single cost
//!   of a renewal in the client.
//! * `held-names`: the cost of an uncontended cycle in 1, 4 and 16 worker
//!   processes while another client holds 10, 100, 1 000 and 10 000 names,
//!   per backend: a table and one chart (see
//!   `lockkit_benches::held_names`).
//!
//! ```sh
//! cargo run --release -p lockkit-benches --bin lockkit-scale -- curves
//! cargo run --release -p lockkit-benches --bin lockkit-scale -- density
//! cargo run --release -p lockkit-benches --bin lockkit-scale -- held-names
//! cargo run --release -p lockkit-benches --features system-allocator --bin lockkit-scale -- density
//! ```

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use lockkit_benches::held_names::HeldPlan;
use lockkit_benches::plot::{Series, log_log_chart};
use lockkit_benches::{
    Deployment, LoadKind, Locker, Outcome, Scenario, Servers, Stock, fmt_duration, run, target_dir,
};
use lockkit_core::{DistributedLock, LockOptions};
use lockkit_testkit::{command_stat, info_field};
use tokio::time::Instant;

/// The global allocator: mimalloc, as a service that holds a million
/// leases would pick, or the system's (glibc's malloc) with the
/// `system-allocator` feature; either way wrapped by `cap`, which counts the
/// bytes in use (no limit is set).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: cap::Cap<mimalloc::MiMalloc> = cap::Cap::new(mimalloc::MiMalloc, usize::MAX);
#[cfg(feature = "system-allocator")]
#[global_allocator]
static ALLOCATOR: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

/// Where the density run's summary goes (under `--out`), one per allocator.
const DENSITY_SUMMARY: &str = if cfg!(feature = "system-allocator") {
    "density-system-summary.md"
} else {
    "density-summary.md"
};

/// The global allocator's name, for the report.
const ALLOCATOR_NAME: &str = if cfg!(feature = "system-allocator") {
    "the system's (glibc malloc; `--features system-allocator`)"
} else {
    "mimalloc (the default of this binary)"
};

#[derive(Debug, Parser)]
#[command(
    name = "lockkit-scale",
    about = "Scaling curves and lease density of lockkit's backends"
)]
struct Args {
    /// Where the results go (default: `<target dir>/lockkit-bench`).
    #[arg(long, global = true)]
    out: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Throughput and p99 acquire latency versus contenders and keys.
    Curves {
        /// Backends (labels as in the compare bench); default: all.
        #[arg(long, value_delimiter = ',')]
        backends: Vec<String>,
        /// Contender counts on one key.
        #[arg(long, value_delimiter = ',', default_value = "1,16,256,4096")]
        contenders: Vec<usize>,
        /// Key counts under `--key-tasks` tasks.
        #[arg(long, value_delimiter = ',', default_value = "1,100,10000")]
        keys: Vec<usize>,
        /// Tasks of the key sweep.
        #[arg(long, default_value_t = 256)]
        key_tasks: usize,
        /// Requests per point (the time cap usually ends it first).
        #[arg(long, default_value_t = 20_000)]
        requests: usize,
        /// Time cap per point.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        point: Duration,
    },
    /// Many held, auto-renewed Redis leases in one process.
    Density {
        /// Leases held at once.
        #[arg(long, default_value_t = 1_000_000)]
        leases: usize,
        /// Their TTL (renewed every third of it). They are held for one
        /// renewal period after the first renewals.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
    /// The cost of a cycle while another client holds many names, in
    /// several worker processes.
    HeldNames {
        /// Backends (labels as in the compare bench); default: all but
        /// `memory` (one process's store).
        #[arg(long, value_delimiter = ',')]
        backends: Vec<String>,
        /// Counts of names held at once.
        #[arg(long, value_delimiter = ',', default_value = "10,100,1000,10000")]
        names: Vec<usize>,
        /// Counts of worker processes.
        #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
        processes: Vec<usize>,
        /// How long the workers run per point.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        point: Duration,
    },
    /// One worker process of `held-names` (started by it).
    #[command(hide = true)]
    HeldNamesWorker {
        #[arg(long)]
        url: String,
        #[arg(long)]
        name: String,
        /// When to start, wall-clock ns.
        #[arg(long)]
        start_at: u64,
        /// When to stop, wall-clock ns.
        #[arg(long)]
        end_at: u64,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let out = args
        .out
        .unwrap_or_else(|| target_dir().join("lockkit-bench"));
    let result = match args.command {
        Command::Curves {
            backends,
            contenders,
            keys,
            key_tasks,
            requests,
            point,
        } => {
            curves(
                &out,
                &backends,
                &contenders,
                &keys,
                key_tasks,
                requests,
                point,
            )
            .await
        }
        Command::Density { leases, ttl } => density(&out, leases, ttl).await,
        Command::HeldNames {
            backends,
            names,
            processes,
            point,
        } => {
            let mut names = names;
            names.sort_unstable();
            let plan = HeldPlan {
                names,
                processes,
                point,
            };
            held_names(&out, &backends, &plan).await
        }
        Command::HeldNamesWorker {
            url,
            name,
            start_at,
            end_at,
        } => {
            let report = lockkit_benches::held_names::worker(&url, &name, start_at, end_at).await;
            println!("{report}");
            Ok(report["error"].is_null())
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("lockkit-scale: {e}");
            ExitCode::from(2)
        }
    }
}

/// One measured point of a curve.
struct Point {
    backend: Deployment,
    sweep: &'static str,
    x: usize,
    outcome: Outcome,
}

async fn curves(
    dir: &std::path::Path,
    labels: &[String],
    contenders: &[usize],
    keys: &[usize],
    key_tasks: usize,
    requests: usize,
    point: Duration,
) -> Result<bool, String> {
    let backends: Vec<Deployment> = if labels.is_empty() {
        lockkit_benches::benched()
    } else {
        parse_backends(labels)?
    };
    let servers = Servers::start(&backends).await;
    let mut points = Vec::new();
    for &backend in &backends {
        let url = servers.url(backend);
        let stock = Arc::new(Stock::for_lock_url(&url).await?);
        let lock = lockkit_benches::connect(&servers, backend)
            .await
            .map_err(|e| format!("{backend}: {e}"))?;
        let locker = Locker::Lockkit(lock);
        let plan = contenders
            .iter()
            .map(|&c| ("contenders", c, c, 1))
            .chain(keys.iter().map(|&k| ("keys", k, key_tasks, k)));
        for (sweep, x, concurrency, keys) in plan {
            let scenario = Scenario {
                concurrency,
                requests,
                stock: requests as i64,
                keys,
                duration: point,
                ttl: Duration::from_secs(30),
                kind: LoadKind::Exclusive,
            };
            let outcome = run(backend.label(), &locker, &stock, &scenario).await?;
            eprintln!(
                "{backend} {sweep}={x}: {:.0} cs/s, p99 {}, {}",
                outcome.throughput(),
                outcome.latency(99.0).map_or("n/a".into(), fmt_duration),
                if outcome.ok() { "ok" } else { "FAILED" }
            );
            points.push(Point {
                backend,
                sweep,
                x,
                outcome,
            });
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let json: Vec<serde_json::Value> = points
        .iter()
        .map(|p| {
            let mut v = p.outcome.to_json();
            v["sweep"] = p.sweep.into();
            v["x"] = p.x.into();
            v
        })
        .collect();
    std::fs::write(
        dir.join("scaling.json"),
        serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    for (sweep, x_label) in [
        ("contenders", "tasks contending for one key"),
        ("keys", "distinct keys (256 tasks)"),
    ] {
        let series = |metric: fn(&Outcome) -> Option<f64>| -> Vec<Series> {
            backends
                .iter()
                .map(|&b| {
                    let pts = points
                        .iter()
                        .filter(|p| p.backend == b && p.sweep == sweep)
                        .filter_map(|p| Some((p.x as f64, metric(&p.outcome)?)))
                        .collect();
                    (b.label().to_owned(), pts)
                })
                .collect()
        };
        log_log_chart(
            &dir.join(format!("scaling-throughput-vs-{sweep}")),
            &format!("Critical sections per second vs {sweep}"),
            x_label,
            "critical sections / s",
            &series(|o| Some(o.throughput()).filter(|t| *t > 0.0)),
        )?;
        log_log_chart(
            &dir.join(format!("scaling-p99-vs-{sweep}")),
            &format!("p99 acquire latency vs {sweep}"),
            x_label,
            "p99 acquire latency (ms)",
            &series(|o| {
                o.latency(99.0)
                    .map(|d| d.as_secs_f64() * 1000.0)
                    .filter(|ms| *ms > 0.0)
            }),
        )?;
    }
    let summary = curves_table(&points, &backends, contenders, keys);
    println!("{summary}");
    std::fs::write(dir.join("scaling-summary.md"), stamped(&summary)).map_err(|e| e.to_string())?;
    println!(
        "written to {}: scaling-summary.md, scaling.json, scaling-*.svg/png",
        dir.display()
    );
    Ok(points
        .iter()
        .all(|p| p.outcome.oversold() == 0 && p.outcome.lost_updates() == 0))
}

async fn held_names(
    dir: &std::path::Path,
    labels: &[String],
    plan: &HeldPlan,
) -> Result<bool, String> {
    let backends: Vec<Deployment> = if labels.is_empty() {
        lockkit_benches::benched()
            .into_iter()
            .filter(|b| *b != Deployment::Memory)
            .collect()
    } else {
        parse_backends(labels)?
    };
    if backends.contains(&Deployment::Memory) {
        return Err("memory:// is one process's store: the workers would not share it".into());
    }
    if plan.names.is_empty() || plan.processes.is_empty() || plan.processes.contains(&0) {
        return Err("--names and --processes need at least one count each, none of them 0".into());
    }
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let servers = Servers::start(&backends).await;
    let points = lockkit_benches::held_names::held_names(&servers, &backends, plan, &exe).await;
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    lockkit_benches::held_names::chart(dir, &points, &backends, plan)?;
    let summary = lockkit_benches::held_names::summary(&points, &backends, plan);
    println!("{summary}");
    std::fs::write(dir.join("held-names-summary.md"), stamped(&summary))
        .map_err(|e| e.to_string())?;
    println!(
        "written to {}: held-names-summary.md, held-names-cost.svg/png",
        dir.display()
    );
    Ok(points.iter().all(|p| p.errors.is_empty()))
}

/// Backends by their labels.
fn parse_backends(labels: &[String]) -> Result<Vec<Deployment>, String> {
    labels
        .iter()
        .map(|l| Deployment::from_label(l).ok_or_else(|| format!("unknown backend {l:?}")))
        .collect()
}

/// The curves as a table: per backend and sweep, throughput / p99 per point.
fn curves_table(
    points: &[Point],
    backends: &[Deployment],
    contenders: &[usize],
    keys: &[usize],
) -> String {
    let mut out =
        String::from("## Scaling: critical sections per second / p99 acquire latency\n\n");
    for (sweep, xs, what) in [
        ("contenders", contenders, "tasks on one key"),
        ("keys", keys, "keys, 256 tasks"),
    ] {
        let _ = write!(out, "| backend |");
        for x in xs {
            let _ = write!(out, " {x} {what} |");
        }
        let _ = write!(out, "\n| --- |{}\n", " --- |".repeat(xs.len()));
        for &b in backends {
            let _ = write!(out, "| {b} |");
            for &x in xs {
                let cell = points
                    .iter()
                    .find(|p| p.backend == b && p.sweep == sweep && p.x == x)
                    .map_or("n/a".to_owned(), |p| {
                        format!(
                            "{:.0} / {}{}",
                            p.outcome.throughput(),
                            p.outcome.latency(99.0).map_or("n/a".into(), fmt_duration),
                            if p.outcome.ok() { "" } else { " FAILED" }
                        )
                    });
                let _ = write!(out, " {cell} |");
            }
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

/// Resident memory of this process, in bytes (`/proc/self/statm`).
fn resident_bytes() -> Result<u64, String> {
    let statm = std::fs::read_to_string("/proc/self/statm").map_err(|e| e.to_string())?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or("bad /proc/self/statm")?;
    Ok(pages * 4096)
}

/// CPU time of this process so far (`/proc/self/stat`, clock ticks of 10 ms).
fn cpu_time() -> Result<Duration, String> {
    let stat = std::fs::read_to_string("/proc/self/stat").map_err(|e| e.to_string())?;
    let after_name = stat.rsplit_once(')').ok_or("bad /proc/self/stat")?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .ok_or("bad /proc/self/stat")
    };
    // utime and stime: fields 14 and 15 of the whole line, 12 and 13 here.
    Ok(Duration::from_millis((ticks(11)? + ticks(12)?) * 10))
}

/// What the server counted: script calls (round trips), the `GET`s they
/// ran (one per renewal of a lock key), and its CPU time (`INFO`).
#[derive(Debug, Clone, Copy)]
struct ServerCounts {
    calls: u64,
    renewals: u64,
    cpu: Duration,
}

async fn server_counts(conn: &mut redis::aio::ConnectionManager) -> Result<ServerCounts, String> {
    let info: String = redis::cmd("INFO")
        .arg("all")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    let calls = |command: &str| command_stat(&info, command, "calls").unwrap_or(0);
    let seconds = |field: &str| {
        info_field(&info, field)
            .and_then(|n| n.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok(ServerCounts {
        calls: calls("evalsha"),
        renewals: calls("get"),
        cpu: Duration::from_secs_f64(seconds("used_cpu_user") + seconds("used_cpu_sys")),
    })
}

/// The targets of issue 22: client memory and CPU of a million leases.
const MAX_BYTES_PER_LEASE: f64 = 1536.0;
const MAX_CPU_SHARE: f64 = 0.5;

fn verdict(pass: bool) -> &'static str {
    if pass { "PASS" } else { "MISS" }
}

async fn density(dir: &std::path::Path, leases: usize, ttl: Duration) -> Result<bool, String> {
    let servers = Servers::start(&[Deployment::Redis]).await;
    let url = servers.url(Deployment::Redis);
    let locks: Arc<dyn DistributedLock> = Arc::new(
        lockkit_redis::connect(&url)
            .await
            .map_err(|e| e.to_string())?,
    );
    let mut admin = redis::aio::ConnectionManager::new(
        redis::Client::open(url.as_str()).map_err(|e| e.to_string())?,
    )
    .await
    .map_err(|e| e.to_string())?;
    // Warm the allocator and the connection, then take the baseline.
    let warm = locks
        .acquire("density-warm", &LockOptions::new().ttl(ttl))
        .await
        .map_err(|e| e.to_string())?;
    warm.release().await.map_err(|e| e.to_string())?;
    let (baseline, heap_baseline) = (resident_bytes()?, ALLOCATOR.allocated());

    let started = Instant::now();
    let opts = LockOptions::new().ttl(ttl).auto_renew(true);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let takers: Vec<_> = (0..64)
        .map(|_| {
            let (locks, opts, next) = (locks.clone(), opts.clone(), next.clone());
            tokio::spawn(async move {
                let mut guards = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= leases {
                        return Ok::<_, String>(guards);
                    }
                    let guard = locks
                        .acquire(&format!("density/{i}"), &opts)
                        .await
                        .map_err(|e| e.to_string())?;
                    guards.push(guard);
                }
            })
        })
        .collect();
    let mut guards = Vec::with_capacity(leases);
    for taker in takers {
        guards.extend(taker.await.map_err(|e| e.to_string())??);
    }
    let took = started.elapsed();
    let held_at = Instant::now();
    // Measured after every lease's first renewal, over one renewal period
    // (ttl / 3): each lease renews exactly once in it.
    let period = ttl / 3;
    let first_renewals = held_at + period + Duration::from_secs(2);
    tokio::time::sleep_until(first_renewals).await;
    let (resident, heap) = (resident_bytes()?, ALLOCATOR.allocated());
    let (calls_from, cpu_from, window_from) = (
        server_counts(&mut admin).await?,
        cpu_time()?,
        Instant::now(),
    );
    tokio::time::sleep_until(window_from + period).await;
    let (calls_to, cpu_to, window) = (
        server_counts(&mut admin).await?,
        cpu_time()?,
        window_from.elapsed(),
    );
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let keys: u64 = redis::cmd("DBSIZE")
        .query_async(&mut admin)
        .await
        .map_err(|e| e.to_string())?;

    // Released as they were taken: by 64 tasks.
    let released = Instant::now();
    let mut chunks: Vec<Vec<_>> = (0..64).map(|_| Vec::new()).collect();
    for (i, guard) in guards.into_iter().enumerate() {
        chunks[i % 64].push(guard);
    }
    let releasers: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            tokio::spawn(async move {
                let mut failures = Vec::new();
                for guard in chunk {
                    if let Err(e) = guard.release().await {
                        failures.push(e.to_string());
                    }
                }
                failures
            })
        })
        .collect();
    let mut failures = Vec::new();
    for releaser in releasers {
        failures.extend(releaser.await.map_err(|e| e.to_string())?);
    }
    let release_failures = failures.len();
    if let Some(first) = failures.first() {
        eprintln!("lockkit-scale: {release_failures} releases failed, e.g.: {first}");
    }
    let release_time = released.elapsed();

    let per_lease = resident.saturating_sub(baseline) as f64 / leases as f64;
    let heap_per_lease = heap.saturating_sub(heap_baseline) as f64 / leases as f64;
    let per_s = |n: u64| n as f64 / window.as_secs_f64();
    let round_trips_per_s = per_s(calls_to.calls - calls_from.calls);
    let renewals_per_s = per_s(calls_to.renewals - calls_from.renewals);
    let server_share =
        (calls_to.cpu.saturating_sub(calls_from.cpu)).as_secs_f64() / window.as_secs_f64();
    let expected = leases as f64 / (ttl.as_secs_f64() / 3.0);
    let cpu_share = (cpu_to - cpu_from).as_secs_f64() / window.as_secs_f64();
    let memory_ok = per_lease <= MAX_BYTES_PER_LEASE;
    let cpu_ok = cpu_share <= MAX_CPU_SHARE;
    let pass = memory_ok && cpu_ok && lost == 0 && release_failures == 0;
    let summary = format!(
        "## Lease density: {leases} held, auto-renewed Redis leases in one process (ttl {ttl:?})\n\n\
         | measurement | value | target |\n| --- | --- | --- |\n\
         | global allocator of the process | {ALLOCATOR_NAME} | — |\n\
         | leases taken (64 tasks) | {leases} in {:.1} s | — |\n\
         | resident memory per held lease (RSS growth / leases, after the first renewals) | {per_lease:.0} bytes | ≤ {MAX_BYTES_PER_LEASE:.0}: {} |\n\
         | heap in use per held lease (the allocator's count of live bytes, same moment) | {heap_per_lease:.0} bytes | — |\n\
         | renewals per second (the server's `GET`s over one renewal period, {:.1} s) | {renewals_per_s:.0} (expected {expected:.0}: one per lease per ttl/3) | — |\n\
         | round trips per second (the server's script calls, same period) | {round_trips_per_s:.0} ({:.0} renewals each) | — |\n\
         | client CPU during the hold | {:.0} % of one core | ≤ {:.0} %: {} |\n\
         | Redis server CPU, same period (same machine) | {:.0} % of one core | — |\n\
         | leases lost | {lost} | 0: {} |\n\
         | lock keys in Redis while held | {keys} | — |\n\
         | release of all | {:.1} s, {release_failures} failures | 0 failures |\n",
        took.as_secs_f64(),
        verdict(memory_ok),
        window.as_secs_f64(),
        renewals_per_s / round_trips_per_s.max(1e-9),
        cpu_share * 100.0,
        MAX_CPU_SHARE * 100.0,
        verdict(cpu_ok),
        server_share * 100.0,
        verdict(lost == 0),
        release_time.as_secs_f64(),
    );
    println!("{summary}");
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(DENSITY_SUMMARY), stamped(&summary)).map_err(|e| e.to_string())?;
    Ok(pass)
}

/// `summary` under the stamp of this run (`scripts/reports.sh` copies it).
fn stamped(summary: &str) -> String {
    lockkit_testkit::stamp::stamped(&lockkit_testkit::stamp::this_command(), summary)
}
