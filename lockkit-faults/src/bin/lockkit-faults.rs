//! `lockkit-faults`: runs the fault-injection scenarios and writes the report.
//!
//! ```text
//! lockkit-faults run [--short] [--backends a,b] [--scenarios x,y] [--out DIR]
//! lockkit-faults soak [--minutes N] [--backends a,b] [--out DIR] [--summary FILE]
//! ```
//!
//! `run`: exit status 0 when every run went end to end and no backend that
//! claims fencing accepted a stale write. `soak`: 0 when the soak passed
//! (see `lockkit_faults::soak`). Otherwise 1; 2 on bad arguments.

use futures_util::StreamExt as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use cap::Cap;
use clap::{Parser, Subcommand};
use lockkit_faults::deploy::Deployment;
use lockkit_faults::report;
use lockkit_faults::run::{RunResult, Settings, run};
use lockkit_faults::scenario::{Scenario, scenarios_for, suite};
use lockkit_faults::soak::{self, SoakSettings};
use lockkit_faults::soak_client::{self, ClientPlan, HeapReport, Target};
use lockkit_faults::worker::{self, WorkerPlan};

/// The system allocator, counted: the soak's client reports its live heap
/// (what a leak would grow), which its resident memory does not show once
/// a fault's backlog is freed and the allocator keeps the pages.
#[global_allocator]
static ALLOCATOR: Cap<std::alloc::System> = Cap::new(std::alloc::System, usize::MAX);

fn live_heap_bytes() -> usize {
    ALLOCATOR.allocated()
}

#[derive(Parser, Debug)]
#[command(
    about = "lockkit's fault-injection suite: scenarios per backend, a fenced resource, a report"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs the scenarios and writes DIR/report.md, DIR/timelines/*.svg and
    /// DIR/events/*.txt (every run's events as text; a failed run's are also printed).
    Run(RunArgs),
    /// One worker process (started by `run`).
    #[command(hide = true)]
    Worker(WorkerArgs),
    /// A bounded mixed workload on every backend, with servers paused and
    /// restarted at random; fails when the client's memory or descriptors
    /// grow, a stale write gets through fencing, or a lease is left behind.
    Soak(SoakArgs),
    /// The soak's client process (started by `soak`).
    #[command(hide = true)]
    SoakClient(SoakClientArgs),
    /// A worker process of the fence race (started by its test).
    #[command(hide = true)]
    FenceWorker(FenceWorkerArgs),
}

#[derive(clap::Args, Debug)]
struct FenceWorkerArgs {
    #[arg(long)]
    lock_url: String,
    #[arg(long)]
    pg_url: String,
    #[arg(long)]
    redis_url: String,
    #[arg(long)]
    client: u32,
    #[arg(long, default_value_t = 4)]
    writers: u32,
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Duration,
}

#[derive(clap::Args, Debug)]
struct SoakArgs {
    /// How long the workload runs, in minutes (at least 1.5: the first
    /// minute is the baseline).
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Only these backends (comma-separated labels).
    #[arg(long, value_delimiter = ',')]
    backends: Vec<String>,
    /// Where the report, tallies and client log go.
    #[arg(long, default_value = "target/soak")]
    out: PathBuf,
    /// Also write the summary (the soak report's page) to this file.
    #[arg(long)]
    summary: Option<PathBuf>,
    /// The lease (TTL, ZooKeeper session timeout).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3s")]
    lease: Duration,
}

#[derive(clap::Args, Debug)]
struct SoakClientArgs {
    /// `LABEL@RESOURCE@URL`, once per backend.
    #[arg(long = "target")]
    targets: Vec<String>,
    #[arg(long, value_parser = humantime::parse_duration)]
    lease: Duration,
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Duration,
    #[arg(long)]
    tallies: PathBuf,
    /// Where to report the live heap.
    #[arg(long)]
    heap: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The short version (CI): a 1 s lease, 3 workers, and a tail that ends
    /// once every fault has recovered (1 to 15 leases).
    #[arg(long)]
    short: bool,
    /// Only these backends (comma-separated labels).
    #[arg(long, value_delimiter = ',')]
    backends: Vec<String>,
    /// Only these scenarios (comma-separated labels).
    #[arg(long, value_delimiter = ',')]
    scenarios: Vec<String>,
    /// Where the report goes.
    #[arg(long, default_value = "target/faults")]
    out: PathBuf,
    /// The lease (TTL, ZooKeeper session timeout); default 1 s short, 2 s full.
    #[arg(long, value_parser = humantime::parse_duration)]
    lease: Option<Duration>,
    /// Worker processes per run; default 3 short, 4 full.
    #[arg(long)]
    clients: Option<u32>,
    /// Workers stop writing when the guard reports the lease lost. By
    /// default they report it and write on, as if their pause fell between
    /// the check and the write: the worst case, where only fencing helps.
    #[arg(long)]
    careful: bool,
    /// Runs at once (each on its own servers); the report keeps their
    /// order. 1 by default: runs in parallel share the machine's cores.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    jobs: u32,
}

#[derive(clap::Args, Debug)]
struct WorkerArgs {
    #[arg(long)]
    url: String,
    #[arg(long)]
    name: String,
    #[arg(long)]
    client: u32,
    #[arg(long)]
    resource: SocketAddr,
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Duration,
    #[arg(long, value_parser = humantime::parse_duration)]
    hold: Duration,
    #[arg(long, default_value_t = 3)]
    writes: u32,
    #[arg(long, value_parser = humantime::parse_duration)]
    wait: Duration,
    #[arg(long, value_parser = humantime::parse_duration)]
    deadline: Duration,
    #[arg(long)]
    careful: bool,
    #[arg(long, value_parser = humantime::parse_duration)]
    lock_delay: Option<Duration>,
}

fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn parse_list<T: Copy>(
    labels: &[String],
    all: &[T],
    find: impl Fn(&str) -> Option<T>,
    what: &str,
) -> Result<Vec<T>, String> {
    if labels.is_empty() {
        return Ok(all.to_vec());
    }
    labels
        .iter()
        .map(|label| find(label).ok_or_else(|| format!("unknown {what} {label:?}")))
        .collect()
}

#[tokio::main]
async fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Worker(args) => {
            init_tracing("warn");
            let plan = WorkerPlan {
                url: args.url,
                name: args.name,
                client: args.client,
                resource: args.resource,
                ttl: args.ttl,
                hold: args.hold,
                writes: args.writes,
                wait: args.wait,
                deadline: args.deadline,
                careful: args.careful,
                lock_delay: args.lock_delay,
            };
            match worker::run(plan).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::warn!("worker ends: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::FenceWorker(args) => {
            init_tracing("warn");
            let plan = lockkit_faults::fence_race::RacePlan {
                lock_url: args.lock_url,
                pg_url: args.pg_url,
                redis_url: args.redis_url,
                client: args.client,
                writers: args.writers,
                ttl: args.ttl,
            };
            match lockkit_faults::fence_race::run(plan).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("fence worker ends: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run(args) => {
            init_tracing("info");
            run_suite(args).await
        }
        Command::Soak(args) => {
            init_tracing("info");
            run_soak(args).await
        }
        Command::SoakClient(args) => {
            init_tracing("error");
            let targets: Result<Vec<Target>, String> =
                args.targets.iter().map(|t| Target::parse(t)).collect();
            let targets = match targets {
                Ok(targets) => targets,
                Err(e) => {
                    tracing::error!("{e}");
                    return ExitCode::from(2);
                }
            };
            let plan = ClientPlan {
                targets,
                lease: args.lease,
                duration: args.duration,
                tallies: args.tallies,
                heap: args.heap.map(|file| HeapReport {
                    file,
                    live_bytes: live_heap_bytes,
                }),
            };
            match soak_client::run(plan).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("cannot write the tallies: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn run_soak(args: SoakArgs) -> ExitCode {
    let backends = match parse_list(
        &args.backends,
        &soak::BACKENDS,
        Deployment::from_label,
        "backend",
    ) {
        Ok(backends) => backends,
        Err(e) => {
            let all: Vec<&str> = soak::BACKENDS.iter().map(|d| d.label()).collect();
            tracing::error!("{e}; backends: {}", all.join(","));
            return ExitCode::from(2);
        }
    };
    if !(args.minutes.is_finite() && (1.5..=24.0 * 60.0).contains(&args.minutes)) {
        tracing::error!(
            "--minutes must be between 1.5 and 1440, not {}",
            args.minutes
        );
        return ExitCode::from(2);
    }
    let client_exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            tracing::error!("cannot find this program's path: {e}");
            return ExitCode::FAILURE;
        }
    };
    let short = args.minutes < 5.0;
    let settings = SoakSettings {
        backends,
        duration: Duration::from_secs_f64(args.minutes * 60.0),
        lease: args.lease,
        sample_every: Duration::from_secs(10),
        fault_every: if short {
            (Duration::from_secs(6), Duration::from_secs(12))
        } else {
            (Duration::from_secs(10), Duration::from_secs(30))
        },
        client_exe,
        out: args.out.clone(),
    };
    let report = match soak::soak(&settings).await {
        Ok(report) => report,
        Err(e) => {
            tracing::error!("the soak could not run: {e}");
            return ExitCode::FAILURE;
        }
    };
    let command = lockkit_testkit::stamp::this_command();
    // One stamp for both: the summary and the full report are one run's.
    let stamp = lockkit_testkit::stamp::stamp(&command);
    let summary = format!("{stamp}\n\n{}", report.summary(&settings, &command));
    let _ = std::io::stdout().write_all(summary.as_bytes());
    let path = args.out.join("soak.md");
    let full = format!("{stamp}\n\n{}", report.full(&settings, &command));
    if let Err(e) = std::fs::write(&path, full) {
        tracing::error!("cannot write {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    if let Some(file) = &args.summary {
        let written = file
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(file, &summary));
        if let Err(e) = written {
            tracing::error!("cannot write {}: {e}", file.display());
            return ExitCode::FAILURE;
        }
    }
    let leftovers = lockkit_faults::run::leftover_children();
    let mut problems = report.problems.clone();
    if !leftovers.is_empty() {
        problems.push(format!("processes left behind: {leftovers:?}"));
    }
    for problem in &problems {
        tracing::error!("{problem}");
    }
    tracing::info!("report: {}", path.display());
    if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs the short form leaves out, as another deployment's run covers them
/// (the full suite runs them all): a frozen holder on Redis Cluster with
/// replicas, on Sentinel with `wait_replicas`, on a ZooKeeper ensemble or an
/// etcd cluster is frozen the same way as on the deployment beside it (the
/// fault is in the client); and the SQL `row` modes share the session
/// machinery of `advisory` (PostgreSQL) and `named` (MariaDB) for faults of
/// the holder, so only the servers' faults run on both.
fn repeats_in_short(backend: Deployment, scenario: Scenario) -> bool {
    match scenario {
        Scenario::HolderPaused => matches!(
            backend,
            Deployment::RedisClusterReplicas
                | Deployment::RedisClusterReplicasWait
                | Deployment::RedisSentinelWait
                | Deployment::ZkEnsemble
                | Deployment::EtcdCluster
                | Deployment::PgRow
                | Deployment::MariaDbRow
        ),
        Scenario::HolderKilled => matches!(backend, Deployment::PgRow | Deployment::MariaDbRow),
        _ => false,
    }
}

async fn run_suite(args: RunArgs) -> ExitCode {
    let backends = parse_list(&args.backends, &suite(), Deployment::from_label, "backend");
    let scenarios = parse_list(
        &args.scenarios,
        &Scenario::ALL,
        Scenario::from_label,
        "scenario",
    );
    let (backends, scenarios) = match (backends, scenarios) {
        (Ok(b), Ok(s)) => (b, s),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(
                "{e}; backends: {}; scenarios: {}",
                suite()
                    .iter()
                    .map(|d| d.label())
                    .collect::<Vec<_>>()
                    .join(","),
                Scenario::ALL.map(Scenario::label).join(",")
            );
            return ExitCode::from(2);
        }
    };
    let lease = args
        .lease
        .unwrap_or(Duration::from_secs(if args.short { 1 } else { 2 }));
    let log_dir = args.out.join("logs");
    if let Err(e) = std::fs::create_dir_all(&log_dir) {
        tracing::error!("cannot create {}: {e}", log_dir.display());
        return ExitCode::FAILURE;
    }
    let worker_exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            tracing::error!("cannot find this program's path: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The real stores every fenced write also goes to.
    let stores = match lockkit_faults::stores::FenceStores::start().await {
        Ok(stores) => std::sync::Arc::new(stores),
        Err(e) => {
            tracing::error!("cannot start the fence stores (PostgreSQL, Redis): {e}");
            return ExitCode::FAILURE;
        }
    };
    let settings = Settings {
        lease,
        clients: args
            .clients
            .unwrap_or(if args.short { 3 } else { 4 })
            .max(2),
        // The short tail ends once every fault has recovered, so its bound
        // costs only a run that does not. It covers a ZooKeeper ensemble's
        // own timeouts (a leader cut off steps down after syncLimit ticks,
        // 2.5 s; an election round that hears nothing is asked again after
        // up to 2 s), which on a loaded machine outran 6 leases of 1 s: a
        // server partition's recovery takes 3 to 4.5 s on a quiet one.
        tail_leases: if args.short { 15 } else { 5 },
        cut_tail: args.short,
        run_timeout: lease * 40 + Duration::from_secs(30),
        worker_exe,
        log_dir,
        careful: args.careful,
        stores: Some(stores),
    };
    // Every run, in report order: a second run of the same scenario with a
    // lock delay where it is compared.
    let mut planned = Vec::new();
    for backend in backends {
        for &scenario in scenarios_for(backend) {
            if (args.short && repeats_in_short(backend, scenario)) || !scenarios.contains(&scenario)
            {
                continue;
            }
            let delays =
                std::iter::once(None).chain(scenario.compared_lock_delay(backend, lease).map(Some));
            planned.extend(delays.map(|lock_delay| (backend, scenario, lock_delay)));
        }
    }
    let settings = &settings;
    // Each run starts as soon as one of the `jobs` ends (a long run does not
    // hold back the ones after it); the report puts them back in order.
    let mut results: Vec<(usize, RunResult)> =
        futures_util::stream::iter(planned.into_iter().enumerate())
            .map(|(index, (backend, scenario, lock_delay))| async move {
                let result = run(backend, scenario, lock_delay, settings).await;
                tracing::info!(
                    "{}: {:?}{}",
                    result.slug(),
                    result.outcome,
                    result
                        .error
                        .as_deref()
                        .map(|e| format!(" ERROR {e}"))
                        .unwrap_or_default()
                );
                (index, result)
            })
            .buffer_unordered(args.jobs as usize)
            .collect()
            .await;
    results.sort_by_key(|(index, _)| *index);
    let results: Vec<RunResult> = results.into_iter().map(|(_, result)| result).collect();
    let table = report::table(&results, None);
    let _ = std::io::stdout().write_all(table.as_bytes());
    let mut problems = report::problems(&results);
    // The fence stores' servers stop here, before the check for leftovers.
    if let Some(stores) = &settings.stores {
        stores.stop();
    }
    let leftovers = lockkit_faults::run::leftover_children();
    if !leftovers.is_empty() {
        problems.push(format!("processes left behind: {leftovers:?}"));
    }
    let command = lockkit_testkit::stamp::this_command();
    if let Err(e) = report::write(&args.out, &results, settings, &command, &problems) {
        tracing::error!("cannot write the report into {}: {e}", args.out.display());
        return ExitCode::FAILURE;
    }

    let _ = std::io::stderr().write_all(report::failed_runs_events(&results, &problems).as_bytes());
    for problem in &problems {
        tracing::error!("{problem}");
    }
    tracing::info!("report: {}", args.out.join("report.md").display());
    if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
