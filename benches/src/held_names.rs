//! The cost of a lock cycle with many names held at once, across client
//! processes: `lockkit-scale held-names`.
//!
//! Per backend, one client in this process takes and holds `names` distinct
//! names (auto-renewed leases, TTL 30 s; more are added for each next
//! count), and meanwhile `processes` worker processes (this program again,
//! `lockkit-scale held-names-worker`) each run uncontended `acquire` +
//! `release` cycles of a name of their own for a fixed time, all starting
//! at the same moment. A point is every cycle's duration, from all workers:
//! its p50 and p99, and the cycles per second of all of them together. What
//! grows with the names held is what the server does for them meanwhile:
//! the renewals (one per lease every `ttl / 3`, batched where the backend
//! batches them), its larger keyspace, table or tree.
//!
//! A session mode (`row`, `advisory`, `named`) holds a lock by keeping a
//! database connection of its own in it: holding 1 000 names takes 1 000
//! connections. The run stops such a backend at [`SESSION_NAMES`] names, and
//! the table says so.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use lockkit_core::{DistributedLock, LockGuard, LockOptions};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::plot::{Series, log_log_panels};
use crate::{Deployment, Servers, fmt_duration, percentile, wall_ns};

/// The most names a session mode holds in the run (a connection each).
pub const SESSION_NAMES: usize = 100;
/// The TTL of the held leases and of the workers' cycles.
const TTL: Duration = Duration::from_secs(30);
/// Acquires (and releases) of held names in flight at once.
const IN_FLIGHT: usize = 32;
/// Bound of one acquire or release of a held name, and of a worker's cycle.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// One measured point.
#[derive(Debug)]
pub struct HeldPoint {
    /// The backend.
    pub backend: Deployment,
    /// Names held by the other client meanwhile.
    pub names: usize,
    /// Worker processes running cycles.
    pub processes: usize,
    /// Cycles completed by all workers.
    pub cycles: usize,
    /// Cycles per second, all workers together.
    pub per_second: f64,
    /// The median cycle.
    pub p50: Option<Duration>,
    /// The 99th-percentile cycle.
    pub p99: Option<Duration>,
    /// What went wrong, if anything.
    pub errors: Vec<String>,
}

/// What the run measures.
#[derive(Clone, Debug)]
pub struct HeldPlan {
    /// Names held at once, ascending.
    pub names: Vec<usize>,
    /// Worker process counts.
    pub processes: Vec<usize>,
    /// How long the workers run their cycles per point.
    pub point: Duration,
}

/// Whether `backend` holds a lock by keeping a connection in it.
fn holds_a_connection(backend: Deployment) -> bool {
    use Deployment::*;
    matches!(backend, PgRow | PgAdvisory | MariaDbRow | MariaDbNamed)
}

/// The held name `index`.
fn held_name(index: usize) -> String {
    format!("held-names/held/{index}")
}

/// Runs `plan` on every backend of `backends`; `exe` is this program (the
/// workers are `exe held-names-worker`). Each point's line goes to standard
/// error as it is measured.
#[allow(clippy::print_stderr)]
pub async fn held_names(
    servers: &Servers,
    backends: &[Deployment],
    plan: &HeldPlan,
    exe: &Path,
) -> Vec<HeldPoint> {
    let mut points = Vec::new();
    for &backend in backends {
        let holder = match crate::connect(servers, backend).await {
            Ok(lock) => lock,
            Err(e) => {
                points.push(failed(backend, plan, format!("connect: {e}")));
                continue;
            }
        };
        let mut guards: Vec<LockGuard> = Vec::new();
        for &names in &plan.names {
            if holds_a_connection(backend) && names > SESSION_NAMES {
                break;
            }
            if let Err(e) = hold(&holder, &mut guards, names).await {
                points.push(failed(backend, plan, format!("holding {names} names: {e}")));
                break;
            }
            for &processes in &plan.processes {
                let url = servers.url(backend);
                let point = cycles(&url, backend, names, processes, plan.point, exe).await;
                eprintln!("{}", point.line());
                points.push(point);
            }
        }
        release(guards).await;
    }
    points
}

#[allow(clippy::print_stderr)]
fn failed(backend: Deployment, plan: &HeldPlan, error: String) -> HeldPoint {
    eprintln!("{backend}: {error}");
    HeldPoint {
        backend,
        names: plan.names.first().copied().unwrap_or(0),
        processes: 0,
        cycles: 0,
        per_second: 0.0,
        p50: None,
        p99: None,
        errors: vec![error],
    }
}

/// Takes names until `guards` holds `names` of them.
async fn hold(
    lock: &Arc<dyn DistributedLock>,
    guards: &mut Vec<LockGuard>,
    names: usize,
) -> Result<(), String> {
    let options = LockOptions::new().ttl(TTL);
    let taken: Vec<_> = futures_util::stream::iter(guards.len()..names)
        .map(|index| {
            let options = options.clone();
            async move {
                let name = held_name(index);
                match tokio::time::timeout(CALL_TIMEOUT, lock.try_acquire(&name, &options)).await {
                    Ok(Ok(Some(guard))) => Ok(guard),
                    Ok(Ok(None)) => Err(format!("{name} was not free")),
                    Ok(Err(e)) => Err(format!("{name}: {e}")),
                    Err(_) => Err(format!("{name}: no answer within {CALL_TIMEOUT:?}")),
                }
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let mut first_error = None;
    for result in taken {
        match result {
            Ok(guard) => guards.push(guard),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Releases every held name.
#[allow(clippy::print_stderr)]
async fn release(guards: Vec<LockGuard>) {
    let count = guards.len();
    let failures = futures_util::stream::iter(guards)
        .map(|guard| async move {
            matches!(
                tokio::time::timeout(CALL_TIMEOUT, guard.release()).await,
                Ok(Ok(()))
            )
        })
        .buffer_unordered(IN_FLIGHT)
        .filter(|released| std::future::ready(!released))
        .count()
        .await;
    if failures > 0 {
        eprintln!("{failures} of {count} held names were not released (their leases run out)");
    }
}

/// One point: `processes` workers' cycles on `url` for `point`.
async fn cycles(
    url: &str,
    backend: Deployment,
    names: usize,
    processes: usize,
    point: Duration,
    exe: &Path,
) -> HeldPoint {
    // Every worker starts at the same moment, after its client is up.
    let start_at = wall_ns() + 1_000_000_000 + 100_000_000 * processes as u64;
    let end_at = start_at + point.as_nanos() as u64;
    let children: Vec<_> = (0..processes)
        .map(|worker| {
            tokio::process::Command::new(exe)
                .args(["held-names-worker", "--url", url, "--name"])
                .arg(format!("held-names/cycle/{worker}"))
                .args(["--start-at", &start_at.to_string()])
                .args(["--end-at", &end_at.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
        })
        .collect();
    let mut durations = Vec::new();
    let mut errors = Vec::new();
    for (worker, child) in children.into_iter().enumerate() {
        let output = match child {
            Ok(child) => child.wait_with_output().await,
            Err(e) => Err(e),
        };
        match output {
            Ok(out) => {
                let text = String::from_utf8_lossy(&out.stdout);
                match serde_json::from_str::<Value>(text.trim()) {
                    Ok(value) if out.status.success() => {
                        let cycles = value["cycles_ns"].as_array().into_iter().flatten();
                        durations
                            .extend(cycles.filter_map(Value::as_u64).map(Duration::from_nanos));
                        if let Some(e) = value["error"].as_str() {
                            errors.push(format!("worker {worker}: {e}"));
                        }
                    }
                    _ => errors.push(format!("worker {worker}: {} {text}", out.status)),
                }
            }
            Err(e) => errors.push(format!("worker {worker}: {e}")),
        }
    }
    durations.sort();
    HeldPoint {
        backend,
        names,
        processes,
        cycles: durations.len(),
        per_second: durations.len() as f64 / point.as_secs_f64(),
        p50: percentile(&durations, 50.0),
        p99: percentile(&durations, 99.0),
        errors,
    }
}

/// A worker: uncontended cycles of `name` from `start_at` to `end_at` (wall
/// clock, ns); prints `{"cycles_ns": [...], "error": ...}`.
pub async fn worker(url: &str, name: &str, start_at: u64, end_at: u64) -> Value {
    let lock = match lockkit::connect(url).await {
        Ok(lock) => lock,
        Err(e) => return json!({"cycles_ns": [], "error": format!("connect: {e}")}),
    };
    let options = LockOptions::new().ttl(TTL).wait_for(CALL_TIMEOUT);
    tokio::time::sleep(Duration::from_nanos(start_at.saturating_sub(wall_ns()))).await;
    let deadline = Instant::now() + Duration::from_nanos(end_at.saturating_sub(wall_ns()));
    let mut cycles = Vec::new();
    let mut error = None;
    while Instant::now() < deadline {
        let started = Instant::now();
        let cycle = async { lock.acquire(name, &options).await?.release().await };
        match tokio::time::timeout(CALL_TIMEOUT, cycle).await {
            Ok(Ok(())) => cycles.push(started.elapsed().as_nanos() as u64),
            Ok(Err(e)) => {
                error = Some(e.to_string());
                break;
            }
            Err(_) => {
                error = Some(format!("a cycle took over {CALL_TIMEOUT:?}"));
                break;
            }
        }
    }
    json!({"cycles_ns": cycles, "error": error})
}

impl HeldPoint {
    fn line(&self) -> String {
        format!(
            "{} {} names held, {} processes: {} cycles, {:.0}/s, p50 {}, p99 {}{}",
            self.backend,
            self.names,
            self.processes,
            self.cycles,
            self.per_second,
            self.p50.map_or("n/a".into(), fmt_duration),
            self.p99.map_or("n/a".into(), fmt_duration),
            if self.errors.is_empty() {
                String::new()
            } else {
                format!(", errors: {}", self.errors.join("; "))
            }
        )
    }
}

/// The points as a Markdown summary: one table, a row per backend and
/// process count, a column per count of names held.
pub fn summary(points: &[HeldPoint], backends: &[Deployment], plan: &HeldPlan) -> String {
    let mut out = String::from("## Cost of a cycle with names held\n\n");
    let _ = writeln!(
        out,
        "Each cell: the p50 / p99 of one `acquire` + `release` cycle in a worker \
         process, and the cycles per second of all workers, while another \
         client holds that many names. {} s per point.\n",
        plan.point.as_secs_f64()
    );
    let _ = write!(out, "| backend | processes |");
    for names in &plan.names {
        let _ = write!(out, " {names} names held |");
    }
    let _ = writeln!(out, "\n| --- | --- |{}", " --- |".repeat(plan.names.len()));
    for &backend in backends {
        for &processes in &plan.processes {
            let _ = write!(out, "| {backend} | {processes} |");
            for &names in &plan.names {
                let point = points
                    .iter()
                    .find(|p| p.backend == backend && p.names == names && p.processes == processes);
                let cell = match point {
                    Some(p) if p.errors.is_empty() => format!(
                        "{} / {} · {:.0}/s",
                        p.p50.map_or("n/a".into(), fmt_duration),
                        p.p99.map_or("n/a".into(), fmt_duration),
                        p.per_second
                    ),
                    Some(p) => format!("failed: {}", p.errors.join("; ")),
                    None if holds_a_connection(backend) && names > SESSION_NAMES => {
                        "— (a connection per held name)".to_owned()
                    }
                    None => "not run".to_owned(),
                };
                let _ = write!(out, " {cell} |");
            }
            out.push('\n');
        }
    }
    let failures: Vec<String> = points
        .iter()
        .filter(|p| p.processes == 0)
        .map(|p| format!("* {}: {}", p.backend, p.errors.join("; ")))
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(out, "\nNot measured:\n\n{}", failures.join("\n"));
    }
    let _ = writeln!(
        out,
        "\n![p50 cycle versus names held, one panel per process count](held-names-cost.svg)"
    );
    out
}

/// The chart: p50 cycle versus names held, a panel per process count and a
/// line per backend, written to `<dir>/held-names-cost.svg` (and `.png`).
pub fn chart(
    dir: &Path,
    points: &[HeldPoint],
    backends: &[Deployment],
    plan: &HeldPlan,
) -> Result<(), String> {
    let panels: Vec<(String, Vec<Series>)> = plan
        .processes
        .iter()
        .map(|&processes| {
            let series = backends
                .iter()
                .map(|&backend| {
                    let line = points
                        .iter()
                        .filter(|p| p.backend == backend && p.processes == processes)
                        .filter(|p| p.errors.is_empty())
                        .filter_map(|p| Some((p.names as f64, p.p50?.as_secs_f64() * 1e3)))
                        .collect();
                    (backend.label().to_owned(), line)
                })
                .collect();
            let title = match processes {
                1 => "1 worker process".to_owned(),
                n => format!("{n} worker processes"),
            };
            (title, series)
        })
        .collect();
    log_log_panels(
        &dir.join("held-names-cost"),
        "p50 cycle (acquire + release) versus names held by another client",
        "names held",
        "p50 cycle (ms)",
        &panels,
    )
}
