//! The soak's client process: on every backend at once, the whole family of
//! locks, again and again until its deadline. Exclusive holders write to the
//! soak's fenced resource (each a [`crate::worker`]); readers and
//! writers, semaphore permits, election candidates and short-lived names
//! share one connection per backend and count what they did. The soak
//! samples this process's memory and descriptors, so it does nothing else.
//!
//! After its deadline, once every holding that was dropped unreleased has
//! had time to run out (twice the lease), it checks on a fresh connection
//! per backend that nothing was left behind: every name can be taken
//! exclusively at once, every semaphore gives all its permits.
//!
//! Its tallies go to a file, one line per backend and kind it ran,
//! `LABEL KIND done failed lost`, then `client panics N` (panics of any
//! thread: lockkit's tasks, its drivers'), then `LABEL leftover WHAT` per
//! name left held.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lockkit::{DistributedLock, Election, LockOptions};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::worker::{self, WorkerPlan};

/// Exclusive holders per backend, each a worker with its own connection.
pub const EXCLUSIVE_WORKERS: u32 = 2;
/// The exclusive lock the workers write under.
pub const EXCLUSIVE_NAME: &str = "soak-x";
/// Names the readers and writers pick from.
pub const RW_NAMES: usize = 6;
/// Names the permit holders pick from, and the permits of each.
pub const SEMAPHORE_NAMES: usize = 3;
/// Permits per semaphore.
pub const PERMITS: u32 = 2;
/// The election's name.
pub const ELECTION_NAME: &str = "soak-lead";

/// A reader/writer name.
pub fn rw_name(index: usize) -> String {
    format!("soak-rw-{index}")
}

/// A semaphore name.
pub fn semaphore_name(index: usize) -> String {
    format!("soak-sem-{index}")
}

/// Slack over a wait before an operation counts as hung.
const SLACK: Duration = Duration::from_secs(10);

/// One backend the client works on.
#[derive(Clone, Debug)]
pub struct Target {
    /// Its deployment label.
    pub label: String,
    /// Its URL.
    pub url: String,
    /// The fenced resource of its exclusive holders.
    pub resource: SocketAddr,
}

impl Target {
    /// Parses `LABEL@RESOURCE@URL`.
    pub fn parse(text: &str) -> Result<Target, String> {
        let mut parts = text.splitn(3, '@');
        let (Some(label), Some(resource), Some(url)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("{text:?} is not LABEL@RESOURCE@URL"));
        };
        let resource = resource
            .parse()
            .map_err(|e| format!("resource address {resource:?}: {e}"))?;
        Ok(Target {
            label: label.to_owned(),
            url: url.to_owned(),
            resource,
        })
    }

    /// The `LABEL@RESOURCE@URL` form.
    pub fn to_arg(&self) -> String {
        format!("{}@{}@{}", self.label, self.resource, self.url)
    }
}

/// What the client does.
#[derive(Clone, Debug)]
pub struct ClientPlan {
    /// The backends.
    pub targets: Vec<Target>,
    /// The lease of every holding (TTL, session timeout).
    pub lease: Duration,
    /// How long the client works.
    pub duration: Duration,
    /// Where the tallies go.
    pub tallies: PathBuf,
    /// Where the client reports its live heap, if it can count it.
    pub heap: Option<HeapReport>,
}

/// The client's live heap, reported through a file every [`HEAP_EVERY`]:
/// the bytes its allocator has handed out and not yet got back, in KiB.
/// Unlike resident memory, this falls back when a fault's backlog is
/// freed, whatever the allocator keeps for later: a leak shows here.
#[derive(Clone, Debug)]
pub struct HeapReport {
    /// The file, rewritten whole (written aside, then renamed).
    pub file: PathBuf,
    /// The process's live heap bytes (its global allocator's count).
    pub live_bytes: fn() -> usize,
}

/// Between two reports of the live heap.
pub const HEAP_EVERY: Duration = Duration::from_secs(1);

impl HeapReport {
    /// Writes the live heap now.
    pub(crate) fn write(&self) -> std::io::Result<()> {
        let aside = self.file.with_extension("new");
        std::fs::write(&aside, format!("{}\n", (self.live_bytes)() / 1024))?;
        std::fs::rename(&aside, &self.file)
    }

    /// Writes it every [`HEAP_EVERY`] until its task is aborted.
    async fn keep_writing(self) {
        let mut every = tokio::time::interval(HEAP_EVERY);
        loop {
            every.tick().await;
            if let Err(e) = self.write() {
                tracing::warn!("cannot write {}: {e}", self.file.display());
            }
        }
    }
}

/// Reads what [`HeapReport`] wrote: the live heap in KiB.
pub fn read_heap_kib(file: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// Counts of one kind of work on one backend.
#[derive(Debug, Default)]
struct Tally {
    done: AtomicU64,
    failed: AtomicU64,
    lost: AtomicU64,
}

impl Tally {
    fn add(&self, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Done => &self.done,
            Outcome::Failed => &self.failed,
            Outcome::Lost => &self.lost,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy, Debug)]
enum Outcome {
    Done,
    Failed,
    Lost,
}

/// The kinds of work, in the tallies' order.
pub const KINDS: [&str; 5] = ["shared", "exclusive-rw", "permit", "leadership", "churn"];

#[derive(Debug, Default)]
struct Tallies([Tally; KINDS.len()]);

impl Tallies {
    fn of(&self, kind: &str) -> &Tally {
        let index = KINDS.iter().position(|k| *k == kind).unwrap_or(0);
        &self.0[index]
    }
}

/// Panics anywhere in the client (a task of lockkit's or of a driver's),
/// counted by the panic hook that [`run`] installs.
static PANICS: AtomicU64 = AtomicU64::new(0);

/// Counts every panic and logs where it happened, without a backtrace (its
/// symbols would be loaded into the very memory the soak watches).
fn count_panics() {
    std::panic::set_hook(Box::new(|info| {
        PANICS.fetch_add(1, Ordering::Relaxed);
        let location = info
            .location()
            .map_or_else(|| "?".to_owned(), |l| format!("{}:{}", l.file(), l.line()));
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let thread = std::thread::current();
        tracing::error!(
            thread = thread.name().unwrap_or("?"),
            "panic at {location}: {message}"
        );
    }));
}

/// Runs the client until its deadline, then writes the tallies.
pub async fn run(plan: ClientPlan) -> std::io::Result<()> {
    count_panics();
    let heap = plan
        .heap
        .clone()
        .map(|heap| tokio::spawn(heap.keep_writing()));
    let started = Instant::now();
    let deadline = started + plan.duration;
    let mut tasks = JoinSet::new();
    let mut all = Vec::new();
    for target in &plan.targets {
        for client in 0..EXCLUSIVE_WORKERS {
            let worker = WorkerPlan {
                url: target.url.clone(),
                name: EXCLUSIVE_NAME.to_owned(),
                client,
                resource: target.resource,
                ttl: plan.lease,
                hold: plan.lease / 10,
                writes: 3,
                wait: plan.lease * 3,
                deadline: plan.duration,
                careful: false,
                lock_delay: None,
            };
            tasks.spawn(async move {
                if let Err(e) = worker::run(worker).await {
                    tracing::warn!("exclusive worker ends early: {e}");
                }
            });
        }
        let tallies = Arc::new(Tallies::default());
        all.push((target.label.clone(), Arc::clone(&tallies)));
        let target = target.clone();
        let lease = plan.lease;
        tasks.spawn(async move { family(target, lease, deadline, tallies).await });
    }
    while tasks.join_next().await.is_some() {}
    tokio::time::sleep(plan.lease * 2 + Duration::from_secs(1)).await;
    let mut text = String::new();
    for (label, tallies) in &all {
        for kind in KINDS {
            let tally = tallies.of(kind);
            let counts =
                [&tally.done, &tally.failed, &tally.lost].map(|c| c.load(Ordering::Relaxed));
            // A kind the backend does not have (no round at all) is left out.
            if counts.iter().any(|&count| count > 0) {
                let [done, failed, lost] = counts;
                let _ = writeln!(text, "{label} {kind} {done} {failed} {lost}");
            }
        }
    }
    let _ = writeln!(text, "client panics {}", PANICS.load(Ordering::Relaxed));
    for target in &plan.targets {
        for leftover in leftovers(target, plan.lease).await {
            let _ = writeln!(text, "{} leftover {leftover}", target.label);
        }
    }
    if let Some(heap) = heap {
        heap.abort();
    }
    std::fs::write(&plan.tallies, text)
}

/// What is still held on `target`'s names, seen from a fresh connection.
async fn leftovers(target: &Target, lease: Duration) -> Vec<String> {
    let check_deadline = Instant::now() + SLACK * 3;
    let Some(lock) = worker::connect_until(&target.url, check_deadline).await else {
        return vec!["(no connection for the check)".to_owned()];
    };
    let options = LockOptions::new().ttl(lease).no_wait();
    let mut left = Vec::new();
    let exclusive = [EXCLUSIVE_NAME.to_owned(), ELECTION_NAME.to_owned()]
        .into_iter()
        .chain((0..RW_NAMES).map(rw_name));
    let semaphores = (0..SEMAPHORE_NAMES).map(semaphore_name);
    let names = exclusive
        .map(|name| (name, options.clone(), 1))
        .chain(semaphores.map(|name| (name, options.clone().semaphore(PERMITS), PERMITS)));
    for (name, options, count) in names {
        let mut guards = Vec::new();
        for _ in 0..count {
            match tokio::time::timeout(SLACK, lock.try_acquire(&name, &options)).await {
                Ok(Ok(Some(guard))) => guards.push(guard),
                Ok(Ok(None)) => left.push(format!("{name} (held)")),
                Ok(Err(e)) => left.push(format!("{name} (the check failed: {e})")),
                Err(_) => left.push(format!("{name} (the check hung)")),
            }
        }
        for guard in guards {
            let _ = tokio::time::timeout(SLACK, guard.release()).await;
        }
    }
    left
}

/// The family's tasks on one connection.
async fn family(target: Target, lease: Duration, deadline: Instant, tallies: Arc<Tallies>) {
    let Some(lock) = worker::connect_until(&target.url, deadline).await else {
        return;
    };
    let caps = lock.capabilities();
    let options = LockOptions::new().ttl(lease).wait_for(lease * 3);
    let mut tasks = JoinSet::new();
    let mut spawn = |kind: &'static str, task: Work| {
        let lock = Arc::clone(&lock);
        let options = options.clone();
        let tallies = Arc::clone(&tallies);
        tasks.spawn(async move {
            let mut round = 0_u64;
            while Instant::now() < deadline {
                let outcome = task.once(&lock, &options, round).await;
                tallies.of(kind).add(outcome);
                if matches!(outcome, Outcome::Failed) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                round += 1;
            }
        });
    };
    if caps.shared {
        for reader in 0..3 {
            spawn("shared", Work::Shared { seed: reader });
        }
        spawn("exclusive-rw", Work::Writer);
    }
    if caps.semaphore {
        for holder in 0..3 {
            spawn("permit", Work::Permit { seed: holder });
        }
    }
    for candidate in 0..2 {
        spawn("leadership", Work::Candidate { candidate });
    }
    spawn("churn", Work::Churn);
    while tasks.join_next().await.is_some() {}
    drop(lock);
}

/// One kind of work, one round at a time.
#[derive(Clone, Copy, Debug)]
enum Work {
    /// A reader of one of the reader/writer names.
    Shared { seed: u64 },
    /// A writer of one of them, sometimes of two at once (a lock set).
    Writer,
    /// A permit of one of the semaphores.
    Permit { seed: u64 },
    /// A candidate of the election, which leads a while and resigns.
    Candidate { candidate: u32 },
    /// A name never used before, taken without waiting and released.
    Churn,
}

fn pause_for(range: std::ops::Range<u64>) -> Duration {
    Duration::from_millis(fastrand::u64(range))
}

impl Work {
    async fn once(
        self,
        lock: &Arc<dyn DistributedLock>,
        options: &LockOptions,
        round: u64,
    ) -> Outcome {
        let bound = options.lease_ttl() * 3 + SLACK;
        let work = async {
            match self {
                Work::Shared { seed } => {
                    let name = rw_name(((seed + round) as usize) % RW_NAMES);
                    hold(lock.acquire(&name, &options.clone().shared()).await, 30..80).await
                }
                Work::Writer if round % 4 == 3 => {
                    let first = fastrand::usize(0..RW_NAMES);
                    let names = [rw_name(first), rw_name((first + 1) % RW_NAMES)];
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    match lockkit::acquire_all(lock.as_ref(), &names, options).await {
                        Ok(guards) => {
                            tokio::time::sleep(pause_for(20..60)).await;
                            let mut outcome = Outcome::Done;
                            for guard in guards {
                                outcome = merge(outcome, end(guard).await);
                            }
                            outcome
                        }
                        Err(e) => failed("lock set", &e),
                    }
                }
                Work::Writer => {
                    let name = rw_name(fastrand::usize(0..RW_NAMES));
                    hold(lock.acquire(&name, options).await, 20..60).await
                }
                Work::Permit { seed } => {
                    let name = semaphore_name(((seed + round) as usize) % SEMAPHORE_NAMES);
                    let permit = options.clone().semaphore(PERMITS);
                    hold(lock.acquire(&name, &permit).await, 30..100).await
                }
                Work::Candidate { candidate } => {
                    let election = Election::new(
                        Arc::clone(lock),
                        ELECTION_NAME,
                        format!("candidate-{candidate}"),
                    );
                    match election.campaign(options).await {
                        Ok(leadership) => {
                            tokio::time::sleep(pause_for(100..300)).await;
                            let lost = leadership.is_lost();
                            match (lost, leadership.resign().await) {
                                (true, _) => Outcome::Lost,
                                (false, Ok(())) => Outcome::Done,
                                (false, Err(e)) => failed("resign", &e),
                            }
                        }
                        Err(e) => failed("campaign", &e),
                    }
                }
                Work::Churn => {
                    let name = format!("soak-churn-{round}-{}", fastrand::u32(..));
                    match lock.try_acquire(&name, &options.clone().no_wait()).await {
                        Ok(Some(guard)) => end(guard).await,
                        Ok(None) => Outcome::Failed,
                        Err(e) => failed("churn", &e),
                    }
                }
            }
        };
        let outcome = tokio::time::timeout(bound, work).await.unwrap_or_else(|_| {
            tracing::warn!("{self:?}: no outcome within {bound:?}");
            Outcome::Failed
        });
        if matches!(self, Work::Churn) {
            tokio::time::sleep(pause_for(20..60)).await;
        } else {
            tokio::time::sleep(pause_for(5..30)).await;
        }
        outcome
    }
}

fn failed(what: &str, error: &lockkit::LockError) -> Outcome {
    tracing::debug!("{what}: {error}");
    Outcome::Failed
}

fn merge(a: Outcome, b: Outcome) -> Outcome {
    match (a, b) {
        (Outcome::Lost, _) | (_, Outcome::Lost) => Outcome::Lost,
        (Outcome::Failed, _) | (_, Outcome::Failed) => Outcome::Failed,
        _ => Outcome::Done,
    }
}

async fn hold(
    acquired: lockkit::Result<lockkit::LockGuard>,
    millis: std::ops::Range<u64>,
) -> Outcome {
    match acquired {
        Ok(guard) => {
            tokio::time::sleep(pause_for(millis)).await;
            end(guard).await
        }
        Err(e) => failed("acquire", &e),
    }
}

/// Releases a holding; a lost one is dropped (its release is the backend's).
async fn end(guard: lockkit::LockGuard) -> Outcome {
    if guard.is_lost() {
        drop(guard);
        return Outcome::Lost;
    }
    match guard.release().await {
        Ok(()) => Outcome::Done,
        Err(e) => failed("release", &e),
    }
}
