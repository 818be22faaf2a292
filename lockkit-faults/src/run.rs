//! One run: fresh servers, worker processes, the scenario's faults, the check.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use lockkit_testkit::ServerProcess;

use crate::check::{Outcome, check};
use crate::deploy::{Deployment, Testbed};
use crate::record::{Trace, millis};
use crate::resource::Resource;
use crate::scenario::{Scenario, Stage};
use crate::stores::FenceStores;

/// Critical sections that must complete before the fault is injected.
const WARMUP_SECTIONS: u64 = 2;
/// How many of each server's last log lines a run that did not recover keeps.
const SERVER_LOG_LINES: usize = 80;

/// How a suite runs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The lease length (TTL; ZooKeeper session timeout).
    pub lease: Duration,
    /// Worker processes per run.
    pub clients: u32,
    /// How long the workers go on after the faults are healed, in leases
    /// (at most, with [`cut_tail`](Self::cut_tail)).
    pub tail_leases: u32,
    /// Ends the tail as soon as every fault has recovered (a critical
    /// section granted after its start completed), one lease after the
    /// healing at the soonest (the short suite); otherwise the tail always
    /// lasts `tail_leases`. Either way, a fault that did not recover fails
    /// the suite ([`problems`](crate::report::problems)).
    pub cut_tail: bool,
    /// The bound of one whole run.
    pub run_timeout: Duration,
    /// The worker program (this binary).
    pub worker_exe: PathBuf,
    /// Where the workers' logs go.
    pub log_dir: PathBuf,
    /// Workers abandon a section on the lease-lost signal instead of
    /// writing on (see [`WorkerPlan::careful`](crate::worker::WorkerPlan::careful)).
    pub careful: bool,
    /// Real stores that every fenced write also goes to (PostgreSQL and
    /// Redis, fenced by `lockkit::fence`), beside the in-process resource.
    pub stores: Option<Arc<FenceStores>>,
}

/// The result of one run.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// The backend.
    pub backend: Deployment,
    /// The scenario.
    pub scenario: Scenario,
    /// Whether the backend claims fencing (its capabilities).
    pub fencing: bool,
    /// What was recorded.
    pub trace: Trace,
    /// What the checker found.
    pub outcome: Outcome,
    /// Why the run did not go end to end, if it did not.
    pub error: Option<String>,
    /// The workers' lock delay, if they asked for one.
    pub lock_delay: Option<Duration>,
    /// What the servers said of themselves at the end of a run whose fault
    /// did not recover, where they say more than their clients do (a
    /// ZooKeeper ensemble's members: each one's mode and last log lines).
    pub servers: Option<String>,
}

impl RunResult {
    /// `backend--scenario` (`--lock-delay` added for a run with one), for
    /// file names.
    pub fn slug(&self) -> String {
        slug(self.backend, self.scenario, self.lock_delay)
    }

    /// The backend, with its lock delay if it had one.
    pub fn backend_label(&self) -> String {
        match self.lock_delay {
            Some(delay) => format!(
                "{} + lock_delay {}",
                self.backend,
                humantime::format_duration(delay)
            ),
            None => self.backend.to_string(),
        }
    }
}

fn slug(backend: Deployment, scenario: Scenario, lock_delay: Option<Duration>) -> String {
    let delayed = if lock_delay.is_some() {
        "--lock-delay"
    } else {
        ""
    };
    format!("{backend}--{scenario}{delayed}")
}

fn worker_command(
    settings: &Settings,
    scenario: Scenario,
    lock_delay: Option<Duration>,
    url: &str,
    name: &str,
    client: u32,
    resource: &Resource,
) -> Command {
    let mut command = Command::new(&settings.worker_exe);
    command
        .arg("worker")
        .args(["--url", url, "--name", name])
        .args(["--client", &client.to_string()])
        .args(["--resource", &resource.addr().to_string()])
        .args(["--ttl", &millis(scenario.lease(settings.lease))])
        .args([
            "--hold",
            &millis(scenario.hold(scenario.lease(settings.lease))),
        ])
        .args(["--wait", &millis(scenario.lease(settings.lease) * 3)])
        .args(["--deadline", &millis(settings.run_timeout)])
        .args(settings.careful.then_some("--careful"))
        .args(lock_delay.map(|delay| format!("--lock-delay={}", millis(delay))))
        .env(
            "RUST_LOG",
            std::env::var("LOCKKIT_FAULTS_WORKER_LOG").unwrap_or_else(|_| "warn".into()),
        );
    command
}

/// The lock the workers of run `slug` take.
fn lock_name(slug: &str) -> String {
    format!("faults-{slug}")
}

async fn spawn_workers(
    settings: &Settings,
    scenario: Scenario,
    lock_delay: Option<Duration>,
    deployment: &Testbed,
    resource: &Resource,
    slug: &str,
) -> Result<Vec<ServerProcess>, String> {
    let name = lock_name(slug);
    let mut workers = Vec::new();
    for client in 0..settings.clients {
        let url = deployment.url(Some(client));
        let log = settings.log_dir.join(format!("{slug}--worker{client}.log"));
        // A fresh log per run (the spawn appends).
        let _ = std::fs::remove_file(&log);
        let command = worker_command(
            settings, scenario, lock_delay, &url, &name, client, resource,
        );
        let worker = ServerProcess::spawn(&format!("worker {client}"), &command, &log, &log)
            .await
            .map_err(|e| e.to_string())?;
        workers.push(worker);
    }
    Ok(workers)
}

/// Runs `scenario` on `backend` (its workers asking for `lock_delay`, if
/// given), bounded by the settings' run timeout.
pub async fn run(
    backend: Deployment,
    scenario: Scenario,
    lock_delay: Option<Duration>,
    settings: &Settings,
) -> RunResult {
    let slug = slug(backend, scenario, lock_delay);
    tracing::info!("run {slug}");
    let stores = settings.stores.as_ref().map(|stores| {
        (
            Arc::clone(stores),
            format!("faults/{slug}/{}", std::process::id()),
        )
    });
    let resource = match Resource::start(stores).await {
        Ok(resource) => resource,
        Err(e) => return failed(backend, scenario, lock_delay, format!("resource: {e}")),
    };
    let mut staged = Staged::default();
    let finished = tokio::time::timeout(
        settings.run_timeout,
        stage(
            backend,
            scenario,
            lock_delay,
            settings,
            &resource,
            &mut staged,
        ),
    )
    .await;
    let error = match finished {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => Some(format!("not done within {:?}", settings.run_timeout)),
    };
    let Staged {
        fencing,
        mut workers,
        servers,
    } = staged;
    for worker in &mut workers {
        worker.kill();
    }
    let trace = resource.trace(settings.clients);
    let outcome = check(&trace);
    if let Some(error) = &error {
        tracing::warn!("{slug}: {error}");
    }
    RunResult {
        backend,
        scenario,
        fencing,
        trace,
        outcome,
        error,
        lock_delay,
        servers,
    }
}

fn failed(
    backend: Deployment,
    scenario: Scenario,
    lock_delay: Option<Duration>,
    error: String,
) -> RunResult {
    RunResult {
        backend,
        scenario,
        fencing: false,
        trace: Trace::default(),
        outcome: Outcome::default(),
        error: Some(error),
        lock_delay,
        servers: None,
    }
}

/// What [`stage`] leaves behind, also when it is cut off by the run's
/// timeout.
#[derive(Default)]
struct Staged {
    /// Whether the backend claims fencing.
    fencing: bool,
    /// The worker processes, to be killed.
    workers: Vec<ServerProcess>,
    /// What the servers said of themselves, if the fault did not recover.
    servers: Option<String>,
}

async fn stage(
    backend: Deployment,
    scenario: Scenario,
    lock_delay: Option<Duration>,
    settings: &Settings,
    resource: &Resource,
    staged: &mut Staged,
) -> Result<(), String> {
    let slug = &slug(backend, scenario, lock_delay);
    let lease = scenario.lease(settings.lease);
    let deployment = Testbed::start(backend, settings.clients, lease, scenario.servers()).await?;
    let probe = lockkit::connect(&deployment.url(None))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    staged.fencing = probe.capabilities().fencing;
    drop(probe);
    staged.workers =
        spawn_workers(settings, scenario, lock_delay, &deployment, resource, slug).await?;
    let warmup = lease * 10;
    if !resource.wait_completed(WARMUP_SECTIONS, warmup).await {
        return Err(format!(
            "only {} critical sections completed within {warmup:?} before the fault; see {}",
            resource.completed(),
            log_hint(&settings.log_dir, slug)
        ));
    }
    let mut stage = Stage {
        deployment: &deployment,
        resource,
        workers: &mut staged.workers,
        lease,
        lock_name: &lock_name(slug),
    };
    scenario.inject(&mut stage).await?;
    // A lock delay keeps a lost holder's name taken that much longer.
    if !tail(resource, lease, lock_delay.unwrap_or_default(), settings).await {
        // Taken while they still run: a fault that did not recover may be
        // the servers' doing.
        staged.servers = deployment.describe(SERVER_LOG_LINES).await;
    }
    for worker in &mut staged.workers {
        worker.kill();
    }
    Ok(())
}

/// The workers go on after the faults are healed (a run with a lock delay
/// that much longer): the whole tail, or with
/// [`Settings::cut_tail`] until every fault has recovered (after one lease
/// at least, so that a holder resumed at the end of the faults has
/// written). Whether they all did, the answer, is the report's verdict
/// ([`problems`](crate::report::problems)).
async fn tail(resource: &Resource, lease: Duration, delay: Duration, settings: &Settings) -> bool {
    let recovered = || check(&resource.trace(settings.clients)).recovered();
    let longest = lease * settings.tail_leases + delay;
    if !settings.cut_tail {
        tokio::time::sleep(longest).await;
        return recovered();
    }
    let shortest = lease.min(longest);
    let deadline = tokio::time::Instant::now() + longest;
    tokio::time::sleep(shortest).await;
    loop {
        let done = resource.completed();
        if recovered() {
            return true;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if !resource.wait_completed(done + 1, left).await {
            return recovered();
        }
    }
}

fn log_hint(dir: &Path, slug: &str) -> String {
    dir.join(format!("{slug}--worker*.log"))
        .display()
        .to_string()
}

/// This process's children still alive (zombies excluded): after a suite,
/// every server and worker must be gone.
pub fn leftover_children() -> Vec<(u32, String)> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (name, rest) = stat.rsplit_once(") ")?;
            let mut fields = rest.split_ascii_whitespace();
            let state = fields.next()?;
            let parent: u32 = fields.next()?.parse().ok()?;
            let name = name.split_once(" (").map_or(name, |(_, name)| name);
            (parent == me && state != "Z").then(|| (pid, name.to_owned()))
        })
        .collect()
}
