//! `lockkit-load`: the "seckill" load generator. Many tasks (optionally in
//! several processes) sell a limited stock kept in the lock's own backend,
//! each sale under the lock; the run reports throughput, acquire latency,
//! how long the lock sat idle between holders (short with notified waits,
//! long with polling), sales, refusals, and — from the stock itself —
//! oversold units and lost updates, which must be 0 (exit status 1
//! otherwise). With `--kind shared,permits=4` the same tasks also take the
//! lock's read side and a semaphore's permits, in the same run, and read
//! the stock only: the stock must stay as it was, and no key may have more
//! holders at once than permits (checked within each process).
//!
//! ```sh
//! # against servers started here by the testkit (loopback, killed at exit):
//! cargo run --release -p lockkit-benches --bin lockkit-load -- --start redis --compare-rslock
//! # in 8 processes, with rslock and distributed-lock on the same servers:
//! cargo run --release -p lockkit-benches --bin lockkit-load -- \
//!     --start redis,redlock5,pg-advisory,zk --processes 8 -c 64 \
//!     --compare-rslock --compare-distributed-lock
//! # against a server of your own (loopback only in lockkit's own runs):
//! cargo run --release -p lockkit-benches --bin lockkit-load -- --url redis://127.0.0.1:6379
//! # the exclusive lock, readers and permits on the same work, one run:
//! cargo run --release -p lockkit-benches --bin lockkit-load -- --start redis \
//!     --kind exclusive,shared,permits=4 -c 64 -n 5000 --markdown /tmp/family-load.md
//! ```

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use lockkit_benches::{
    Client, Deployment, LoadKind, Locker, Outcome, Scenario, Servers, Stock, Tally, run, run_tasks,
};
use tokio::time::Instant;

#[derive(Debug, Parser)]
#[command(
    name = "lockkit-load",
    about = "The seckill load generator: a limited stock sold under a lock"
)]
struct Args {
    /// The lock URL (the stock lives in the same backend).
    #[arg(long, required_unless_present = "start", conflicts_with = "start")]
    url: Option<String>,
    /// Start the servers of these backends here instead (comma separated:
    /// memory, redis, redlock3, redlock5, zk, pg-lease, pg-row, pg-advisory,
    /// mariadb-lease, mariadb-row, mariadb-named, sqlite-lease, etcd), and
    /// run each.
    #[arg(long, value_delimiter = ',')]
    start: Vec<String>,
    /// Tasks contending at once (in all processes together).
    #[arg(long, short = 'c', default_value_t = 1000)]
    concurrency: usize,
    /// Lock acquisitions in all.
    #[arg(long, short = 'n', default_value_t = 20_000)]
    requests: usize,
    /// Stock per key at the start.
    #[arg(long, default_value_t = 10_000)]
    stock: i64,
    /// Distinct keys (locks).
    #[arg(long, default_value_t = 1)]
    keys: usize,
    /// Stop after this long even if requests are left.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// The lease of each acquisition.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Run the tasks in this many OS processes (the stock is shared).
    #[arg(long, default_value_t = 1)]
    processes: usize,
    /// Also run the same scenario (the exclusive lock) with the `rslock`
    /// crate on the same Redis server(s) (redis and redlock backends), in
    /// the same run and the same number of processes.
    #[arg(long)]
    compare_rslock: bool,
    /// Also run the same scenario (the exclusive lock) with the
    /// `distributed-lock` 0.2 crate on the same server(s) (redis, redlock,
    /// Postgres and MySQL backends), in the same run and the same number of
    /// processes.
    #[arg(long)]
    compare_distributed_lock: bool,
    /// What the tasks hold, one run per kind in this order (comma
    /// separated): exclusive (the seckill), shared, permits=N.
    #[arg(long, value_delimiter = ',', default_value = "exclusive")]
    kind: Vec<LoadKind>,
    /// Print one JSON object per run instead of text.
    #[arg(long)]
    json: bool,
    /// Also write the runs as a Markdown table to this file (each kind's
    /// throughput against the exclusive run's on the same backend).
    #[arg(long)]
    markdown: Option<std::path::PathBuf>,
    /// Internal: run tasks only (no reset, no check) and print their tally.
    #[arg(long, hide = true)]
    worker: bool,
    /// Internal: the library a worker's tasks use.
    #[arg(long, hide = true, default_value = "lockkit")]
    client: Client,
}

impl Args {
    /// The load these arguments ask for, of `kind`.
    fn scenario(&self, kind: LoadKind) -> Scenario {
        Scenario {
            concurrency: self.concurrency.max(1),
            requests: self.requests,
            stock: self.stock,
            keys: self.keys.max(1),
            duration: self.duration,
            ttl: self.ttl,
            kind,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if args.worker {
        return worker(&args).await;
    }
    let scenario = args.scenario(LoadKind::Exclusive);
    let mut ok = true;
    let mut all = Vec::new();
    let mut report = |outcome: Outcome| {
        ok &= outcome.ok();
        if args.json {
            println!("{}", outcome.to_json());
        } else {
            println!("{}", outcome.report());
        }
        all.push(outcome);
    };
    if args.start.is_empty() {
        let url = args.url.clone().expect("clap requires --url or --start");
        match run_url(&args, &url, &url, &scenario).await {
            Ok(outcomes) => outcomes.into_iter().for_each(&mut report),
            Err(e) => {
                eprintln!("lockkit-load: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        let backends: Vec<Deployment> = match args
            .start
            .iter()
            .map(|l| Deployment::from_label(l).ok_or(l))
            .collect()
        {
            Ok(backends) => backends,
            Err(unknown) => {
                eprintln!("lockkit-load: unknown backend {unknown:?} for --start");
                return ExitCode::from(2);
            }
        };
        let servers = Servers::start(&backends).await;
        for backend in backends {
            match run_url(&args, backend.label(), &servers.url(backend), &scenario).await {
                Ok(outcomes) => outcomes.into_iter().for_each(&mut report),
                Err(e) => {
                    eprintln!("lockkit-load: {backend}: {e}");
                    return ExitCode::from(2);
                }
            }
        }
    }
    if let Some(path) = &args.markdown
        && let Err(e) = std::fs::write(
            path,
            lockkit_testkit::stamp::stamped(
                &lockkit_testkit::stamp::this_command(),
                &markdown(&all),
            ),
        )
    {
        eprintln!("lockkit-load: write {}: {e}", path.display());
        return ExitCode::from(2);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The runs as a Markdown table: per backend, library and kind, throughput,
/// acquire latency, most holders at once, oversold units, and throughput
/// against lockkit's exclusive run on the same backend in as many processes
/// (when there was one).
fn markdown(outcomes: &[Outcome]) -> String {
    let title = if outcomes
        .iter()
        .all(|o| o.scenario.kind == LoadKind::Exclusive)
    {
        "The seckill: a stock sold under the exclusive lock"
    } else {
        "The lock family under load"
    };
    let mut out = format!(
        "## {title}\n\n\
         | backend | library | kind | processes | tasks | critical sections/s | × lockkit exclusive | acquire p50 | acquire p99 | acquire max | most holders at once | oversold | books |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let us = |d: Option<Duration>| d.map_or("n/a".to_owned(), lockkit_benches::fmt_duration);
    for o in outcomes {
        let exclusive = outcomes.iter().find(|e| {
            e.label == o.label
                && e.client == Client::Lockkit
                && e.scenario.kind == LoadKind::Exclusive
                && e.processes == o.processes
        });
        let ratio = match exclusive {
            Some(e) if e.throughput() > 0.0 => format!("{:.2}", o.throughput() / e.throughput()),
            _ => "—".to_owned(),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} |\n",
            o.label,
            o.client.library(),
            o.scenario.kind,
            o.processes,
            o.scenario.concurrency,
            o.throughput(),
            ratio,
            us(o.latency(50.0)),
            us(o.latency(99.0)),
            us(o.latency(100.0)),
            o.tally.most_holders,
            match o.scenario.kind {
                LoadKind::Exclusive => o.oversold().to_string(),
                _ => "—".to_owned(),
            },
            if o.ok() { "OK" } else { "FAILED" },
        ));
    }
    out
}

/// The scenario on one URL with lockkit, each kind in turn, then with the
/// peers asked for (the exclusive lock) where they have a lock for it.
async fn run_url(
    args: &Args,
    label: &str,
    url: &str,
    scenario: &Scenario,
) -> Result<Vec<Outcome>, String> {
    let stock = Arc::new(Stock::for_lock_url(url).await?);
    let mut runs: Vec<(Client, Scenario)> = args
        .kind
        .iter()
        .map(|&kind| {
            let scenario = Scenario {
                kind,
                ..scenario.clone()
            };
            (Client::Lockkit, scenario)
        })
        .collect();
    for (asked, peer) in [
        (args.compare_rslock, Client::Rslock),
        (args.compare_distributed_lock, Client::DistributedLock),
    ] {
        if asked {
            runs.push((peer, scenario.clone()));
        }
    }
    let mut outcomes = Vec::new();
    for (client, scenario) in runs {
        let Some(locker) = Locker::connect(client, url).await? else {
            eprintln!(
                "lockkit-load: {label}: {} has no lock for it",
                client.library()
            );
            continue;
        };
        outcomes.push(if args.processes > 1 {
            run_processes(args, label, url, client, &stock, &scenario).await?
        } else {
            run(label, &locker, &stock, &scenario).await?
        });
    }
    Ok(outcomes)
}

/// The scenario's tasks spread over `args.processes` child processes of this
/// binary; the stock is reset and checked here.
async fn run_processes(
    args: &Args,
    label: &str,
    url: &str,
    client: Client,
    stock: &Arc<Stock>,
    scenario: &Scenario,
) -> Result<Outcome, String> {
    stock.reset(scenario.keys, scenario.stock).await?;
    let stock_before = stock.total(scenario.keys).await?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let n = args.processes;
    let started = Instant::now();
    let children: Vec<_> = (0..n)
        .map(|i| {
            let share = |total: usize| total / n + usize::from(i < total % n);
            tokio::process::Command::new(&exe)
                .args(["--worker", "--url", url, "--client", client.name()])
                .args([
                    "--concurrency",
                    &share(scenario.concurrency).max(1).to_string(),
                ])
                .args(["--requests", &share(scenario.requests).to_string()])
                .args(["--keys", &scenario.keys.to_string()])
                .args([
                    "--duration",
                    &humantime::format_duration(scenario.duration).to_string(),
                ])
                .args([
                    "--ttl",
                    &humantime::format_duration(scenario.ttl).to_string(),
                ])
                .args(["--kind", &scenario.kind.to_string()])
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("start a worker process: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut tally = Tally::default();
    for child in children {
        let out = child.wait_with_output().await.map_err(|e| e.to_string())?;
        let json: serde_json::Value =
            serde_json::from_slice(&out.stdout).map_err(|e| format!("a worker's output: {e}"))?;
        tally.merge(Tally::from_json(&json).ok_or("a worker's tally")?);
    }
    let elapsed = started.elapsed();
    let stock_after = stock.total(scenario.keys).await?;
    Ok(Outcome {
        label: label.to_owned(),
        client,
        scenario: scenario.clone(),
        processes: n,
        elapsed,
        tally,
        stock_before,
        stock_after,
    })
}

/// A worker process: its share of the tasks, its tally on stdout as JSON.
async fn worker(args: &Args) -> ExitCode {
    let Some(url) = &args.url else {
        return ExitCode::from(2);
    };
    let scenario = args.scenario(args.kind.first().copied().unwrap_or_default());
    let setup = async {
        let locker = Locker::connect(args.client, url)
            .await?
            .ok_or_else(|| format!("{} has no lock for {url}", args.client))?;
        Ok::<_, String>((Arc::new(Stock::for_lock_url(url).await?), locker))
    };
    match setup.await {
        Ok((stock, locker)) => {
            let tally = run_tasks(&locker, &stock, &scenario).await;
            println!("{}", tally.to_json());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("lockkit-load worker: {e}");
            ExitCode::from(2)
        }
    }
}
