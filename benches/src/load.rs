//! The load generator's scenario ("seckill"): many tasks sell a limited stock
//! under a lock, and the outcome says whether the lock kept every sale
//! exclusive.
//!
//! The same tasks can take the lock's other kinds ([`LoadKind`]): readers
//! (the shared side) and semaphore permits only read the stock, and the
//! outcome checks what those kinds promise instead: the stock unchanged, and
//! for permits never more holders at once (in this process) than permits.
//!
//! Each task repeatedly takes the lock of one key, reads that key's stock
//! from the backend itself ([`Stock`]), writes it back one lower if it is
//! positive (with the holder's fencing token, where the backend has one),
//! and releases. With a working lock the books balance: nothing is sold
//! twice (oversold) and no decrement is lost (two holders reading the same
//! value). Both are counted from the stock itself, not from what the tasks
//! believe.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use distributed_lock::{LockHandle, LockProvider, PostgresLockProvider, RedisLockProvider};
use distributed_lock_mysql::MySqlLockProvider;
use lockkit_core::{DistributedLock, FencingToken, LockError, LockOptions};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::stock::Stock;
use crate::{fmt_duration, percentile};

/// What to run.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Tasks contending at once.
    pub concurrency: usize,
    /// Lock acquisitions in all (each one request).
    pub requests: usize,
    /// Stock per key at the start.
    pub stock: i64,
    /// Distinct keys (and locks); request `i` uses key `i % keys`.
    pub keys: usize,
    /// The run stops after this long even if requests are left.
    pub duration: Duration,
    /// The lease of each acquisition.
    pub ttl: Duration,
    /// Which side of the lock the tasks take.
    pub kind: LoadKind,
}

/// What the tasks hold while in their critical section.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoadKind {
    /// The exclusive lock: each holder sells one unit.
    #[default]
    Exclusive,
    /// The shared (read) side: each holder reads the stock.
    Shared,
    /// One of this many semaphore permits: each holder reads the stock.
    Permits(u32),
}

impl LoadKind {
    /// The lock options of one acquisition.
    fn options(self, ttl: Duration, wait: Duration) -> LockOptions {
        let opts = LockOptions::new().ttl(ttl).wait_for(wait);
        match self {
            LoadKind::Exclusive => opts,
            LoadKind::Shared => opts.shared(),
            LoadKind::Permits(n) => opts.semaphore(n),
        }
    }

    /// Most holders at once this kind allows.
    fn most_holders(self) -> Option<usize> {
        match self {
            LoadKind::Exclusive => Some(1),
            LoadKind::Shared => None,
            LoadKind::Permits(n) => Some(n as usize),
        }
    }
}

impl fmt::Display for LoadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadKind::Exclusive => f.write_str("exclusive"),
            LoadKind::Shared => f.write_str("shared"),
            LoadKind::Permits(n) => write!(f, "permits={n}"),
        }
    }
}

impl FromStr for LoadKind {
    type Err = String;

    /// `exclusive`, `shared` or `permits=N` (N ≥ 1).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "exclusive" => Ok(LoadKind::Exclusive),
            "shared" => Ok(LoadKind::Shared),
            _ => match s.strip_prefix("permits=").map(str::parse::<u32>) {
                Some(Ok(n)) if n >= 1 => Ok(LoadKind::Permits(n)),
                _ => Err(format!(
                    "{s:?} is not a kind: exclusive, shared or permits=N with N ≥ 1"
                )),
            },
        }
    }
}

/// Which library takes the locks of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Client {
    /// lockkit, on any backend.
    #[default]
    Lockkit,
    /// The `rslock` 0.10 crate (Redis and Redlock URLs).
    Rslock,
    /// The `distributed-lock` 0.2 crate (Redis, Redlock, Postgres and MySQL
    /// URLs).
    DistributedLock,
}

impl Client {
    /// The name `--client` takes.
    pub fn name(self) -> &'static str {
        match self {
            Client::Lockkit => "lockkit",
            Client::Rslock => "rslock",
            Client::DistributedLock => "distributed-lock",
        }
    }

    /// The library and version, for reports.
    pub fn library(self) -> &'static str {
        match self {
            Client::Lockkit => "lockkit",
            Client::Rslock => "rslock 0.10",
            Client::DistributedLock => "distributed-lock 0.2",
        }
    }
}

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Client {
    type Err = String;

    fn from_str(s: &str) -> Result<Client, String> {
        [Client::Lockkit, Client::Rslock, Client::DistributedLock]
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("{s:?} is not a client: lockkit, rslock or distributed-lock"))
    }
}

/// The lock under test: a lockkit client, or a peer crate for comparison
/// (no fencing tokens, their own retries).
#[derive(Clone)]
pub enum Locker {
    /// Any lockkit backend.
    Lockkit(Arc<dyn DistributedLock>),
    /// `rslock` 0.10 with its default retries (3 tries, 0–200 ms apart),
    /// looped until the lock is taken or the run is over.
    Rslock(Arc<rslock::LockManager>),
    /// `distributed-lock` 0.2's exclusive lock, looped until taken or the
    /// run is over.
    DistributedLock(PeerProvider),
}

/// A `distributed-lock` 0.2 provider: one per process, as its users hold.
#[derive(Clone)]
pub enum PeerProvider {
    /// One Redis server, or Redlock over several.
    Redis(Arc<RedisLockProvider>),
    /// Postgres advisory locks.
    Postgres(Arc<PostgresLockProvider>),
    /// MySQL `GET_LOCK`.
    MySql(Arc<MySqlLockProvider>),
}

impl fmt::Debug for PeerProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PeerProvider::Redis(_) => "PeerProvider::Redis",
            PeerProvider::Postgres(_) => "PeerProvider::Postgres",
            PeerProvider::MySql(_) => "PeerProvider::MySql",
        })
    }
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Locker::Lockkit(lock) => write!(f, "Locker::Lockkit({lock:?})"),
            Locker::Rslock(_) => f.write_str("Locker::Rslock"),
            Locker::DistributedLock(provider) => write!(f, "Locker::DistributedLock({provider:?})"),
        }
    }
}

/// A peer's release, made when its lock was taken and run when the holder
/// lets go.
type PeerRelease = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// A holding of a [`Locker`], ended by [`Locker::release`].
pub enum Held {
    /// lockkit's guard.
    Lockkit(lockkit_core::LockGuard),
    /// rslock's lock.
    Rslock(rslock::Lock),
    /// `distributed-lock`'s release, to run.
    Peer(PeerRelease),
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Held::Lockkit(_) => "Held::Lockkit",
            Held::Rslock(_) => "Held::Rslock",
            Held::Peer(_) => "Held::Peer",
        })
    }
}

/// The part of a URL before its query (lockkit's options, which the peers
/// do not read).
fn without_query(url: &str) -> &str {
    url.split('?').next().unwrap_or(url)
}

/// The Redis master URLs behind a redis:// or redlock:// URL.
fn redis_masters(url: &str) -> Option<Vec<String>> {
    let url = without_query(url);
    if url.starts_with("redis://") {
        return Some(vec![url.to_owned()]);
    }
    let hosts = url.strip_prefix("redlock://")?;
    Some(hosts.split(',').map(|h| format!("redis://{h}")).collect())
}

impl Locker {
    /// The library behind it.
    pub fn client(&self) -> Client {
        match self {
            Locker::Lockkit(_) => Client::Lockkit,
            Locker::Rslock(_) => Client::Rslock,
            Locker::DistributedLock(_) => Client::DistributedLock,
        }
    }

    /// `client`'s locks on the servers of lockkit URL `url`; `Ok(None)` when
    /// that library has no lock on that kind of server.
    pub async fn connect(client: Client, url: &str) -> Result<Option<Locker>, String> {
        let e = |e: distributed_lock::LockError| format!("{}: {e}", client.library());
        Ok(Some(match client {
            Client::Lockkit => {
                Locker::Lockkit(lockkit::connect(url).await.map_err(|e| e.to_string())?)
            }
            Client::Rslock => match redis_masters(url) {
                Some(masters) => Locker::Rslock(Arc::new(rslock::LockManager::new(masters))),
                None => return Ok(None),
            },
            Client::DistributedLock => {
                let plain = without_query(url);
                let scheme = plain.split("://").next().unwrap_or("");
                Locker::DistributedLock(match scheme {
                    "redis" | "redlock" => {
                        let masters = redis_masters(url).unwrap_or_default();
                        let provider = RedisLockProvider::builder().urls(&masters).build();
                        PeerProvider::Redis(Arc::new(provider.await.map_err(e)?))
                    }
                    "postgres" | "postgresql" => {
                        let provider = PostgresLockProvider::builder()
                            .connection_string(plain)
                            .build();
                        PeerProvider::Postgres(Arc::new(provider.await.map_err(e)?))
                    }
                    "mysql" | "mariadb" => {
                        let provider = MySqlLockProvider::builder()
                            .connection_string(plain.replacen("mariadb://", "mysql://", 1))
                            .build();
                        PeerProvider::MySql(Arc::new(provider.await.map_err(e)?))
                    }
                    _ => return Ok(None),
                })
            }
        }))
    }

    /// Waits for key `k`'s lock until `deadline`; `Ok(None)` when the wait
    /// ran out.
    pub async fn acquire(
        &self,
        k: usize,
        kind: LoadKind,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Option<(Held, Option<FencingToken>)>, String> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self {
            Locker::Lockkit(lock) => {
                let opts = kind.options(ttl, left);
                match lock.acquire(&format!("lockkit-load/{k}"), &opts).await {
                    Ok(guard) => {
                        let token = guard.fencing_token();
                        Ok(Some((Held::Lockkit(guard), token)))
                    }
                    Err(LockError::Timeout { .. }) => Ok(None),
                    Err(e) => Err(e.to_string()),
                }
            }
            Locker::Rslock(_) | Locker::DistributedLock(_) if kind != LoadKind::Exclusive => Err(
                format!("the peers are compared on the exclusive lock only, not {kind}"),
            ),
            Locker::Rslock(manager) => {
                let resource = format!("lockkit-load-rslock:{k}");
                loop {
                    if Instant::now() >= deadline {
                        return Ok(None);
                    }
                    match manager.lock(resource.as_bytes(), ttl).await {
                        Ok(lock) => return Ok(Some((Held::Rslock(lock), None))),
                        Err(rslock::LockError::TtlTooLarge) => return Err("ttl too large".into()),
                        Err(_) => continue,
                    }
                }
            }
            Locker::DistributedLock(provider) => {
                let name = format!("lockkit-load-dl/{k}");
                // Its Redis lock makes one attempt per `acquire` whatever
                // the timeout (and spawns a timer task for one), so it gets
                // none; its SQL locks wait on the server for the time left.
                match provider {
                    PeerProvider::Redis(p) => {
                        peer_acquire(p.as_ref(), &name, deadline, false).await
                    }
                    PeerProvider::Postgres(p) => {
                        peer_acquire(p.as_ref(), &name, deadline, true).await
                    }
                    PeerProvider::MySql(p) => peer_acquire(p.as_ref(), &name, deadline, true).await,
                }
            }
        }
    }

    /// Ends a holding that [`acquire`](Self::acquire) returned.
    pub async fn release(&self, held: Held) -> Result<(), String> {
        match (self, held) {
            (_, Held::Lockkit(guard)) => guard.release().await.map_err(|e| e.to_string()),
            (Locker::Rslock(manager), Held::Rslock(lock)) => {
                manager.unlock(&lock).await;
                Ok(())
            }
            (_, Held::Peer(release)) => release.await,
            (_, Held::Rslock(_)) => Err("an rslock holding of another library's locker".into()),
        }
    }
}

/// How long a peer's release may take before the load loop counts it as
/// an error and goes on.
const PEER_RELEASE_BOUND: Duration = Duration::from_secs(10);

/// Takes `name` with `distributed-lock`'s `provider`, trying again at once
/// after each failed attempt until `deadline`; `wait`: whether each attempt
/// is given the time left.
async fn peer_acquire<P>(
    provider: &P,
    name: &str,
    deadline: Instant,
    wait: bool,
) -> Result<Option<(Held, Option<FencingToken>)>, String>
where
    P: LockProvider,
    <P::Lock as distributed_lock::DistributedLock>::Handle: Send + 'static,
{
    use distributed_lock::DistributedLock as _;
    let lock = provider.create_lock(name);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        // Bounded here too: an attempt of its Redis lock once waited with
        // no timer at all (a CI run's worker hung for minutes after its
        // run's end), and the load loop must end by its deadline.
        let Ok(attempt) = tokio::time::timeout(left, lock.acquire(wait.then_some(left))).await
        else {
            return Ok(None);
        };
        match attempt {
            Ok(handle) => {
                let release: PeerRelease = Box::pin(async move {
                    match tokio::time::timeout(PEER_RELEASE_BOUND, handle.release()).await {
                        Ok(released) => released.map_err(|e| e.to_string()),
                        Err(_) => Err(format!(
                            "distributed-lock's release did not end within {PEER_RELEASE_BOUND:?}"
                        )),
                    }
                });
                return Ok(Some((Held::Peer(release), None)));
            }
            Err(distributed_lock::LockError::Timeout(_)) => continue,
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// What one process's tasks did (mergeable across processes).
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Requests that got the lock.
    pub acquired: usize,
    /// Units sold (a write of stock − 1 that was applied).
    pub sold: u64,
    /// Requests that found the stock at 0.
    pub refused: u64,
    /// Fenced writes the stock refused (a stale token).
    pub stale_rejected: u64,
    /// Waits that ran out at the end of the run.
    pub timeouts: u64,
    /// Errors (from the lock or the stock), counted; the first few kept.
    pub errors: u64,
    /// The first errors' messages.
    pub error_samples: Vec<String>,
    /// Releases that found the lease gone.
    pub lost: u64,
    /// Most holders of one key at once seen in this process (with several
    /// processes: the most any one of them saw).
    pub most_holders: usize,
    /// Time from asking for the lock to holding it, per acquisition.
    pub acquire_latency: Vec<Duration>,
    /// Per acquisition: key, and the critical section's start and end
    /// relative to the run's start (one process's clock only).
    pub sections: Vec<(usize, Duration, Duration)>,
}

impl Tally {
    fn error(&mut self, message: String) {
        self.errors += 1;
        if self.error_samples.len() < 5 {
            self.error_samples.push(message);
        }
    }

    /// Adds `other` to this tally.
    pub fn merge(&mut self, other: Tally) {
        self.acquired += other.acquired;
        self.sold += other.sold;
        self.refused += other.refused;
        self.stale_rejected += other.stale_rejected;
        self.timeouts += other.timeouts;
        self.errors += other.errors;
        for e in other.error_samples {
            if self.error_samples.len() < 5 {
                self.error_samples.push(e);
            }
        }
        self.lost += other.lost;
        self.most_holders = self.most_holders.max(other.most_holders);
        self.acquire_latency.extend(other.acquire_latency);
        self.sections.extend(other.sections);
    }

    /// As JSON, for a parent process (sections are left out: another
    /// process's clock is not this one's).
    pub fn to_json(&self) -> Value {
        json!({
            "acquired": self.acquired,
            "sold": self.sold,
            "refused": self.refused,
            "stale_rejected": self.stale_rejected,
            "timeouts": self.timeouts,
            "errors": self.errors,
            "error_samples": self.error_samples,
            "lost": self.lost,
            "most_holders": self.most_holders,
            "acquire_latency_us": self.acquire_latency.iter().map(|d| d.as_micros() as u64).collect::<Vec<_>>(),
        })
    }

    /// Reads what [`to_json`](Self::to_json) wrote.
    pub fn from_json(value: &Value) -> Option<Tally> {
        let n = |key: &str| value.get(key)?.as_u64();
        Some(Tally {
            acquired: n("acquired")? as usize,
            sold: n("sold")?,
            refused: n("refused")?,
            stale_rejected: n("stale_rejected")?,
            timeouts: n("timeouts")?,
            errors: n("errors")?,
            error_samples: value
                .get("error_samples")?
                .as_array()?
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            lost: n("lost")?,
            most_holders: n("most_holders")? as usize,
            acquire_latency: value
                .get("acquire_latency_us")?
                .as_array()?
                .iter()
                .filter_map(Value::as_u64)
                .map(Duration::from_micros)
                .collect(),
            sections: Vec::new(),
        })
    }
}

/// Runs `scenario`'s tasks in this process against `locker` and `stock`
/// (which the caller has reset), sharing out `requests` among them.
pub async fn run_tasks(locker: &Locker, stock: &Arc<Stock>, scenario: &Scenario) -> Tally {
    let next = Arc::new(AtomicUsize::new(0));
    let holders = Arc::new(Holders::new(scenario.keys));
    let started = Instant::now();
    let deadline = started + scenario.duration;
    let tasks: Vec<_> = (0..scenario.concurrency)
        .map(|_| {
            let (locker, stock, next, scenario, holders) = (
                locker.clone(),
                stock.clone(),
                next.clone(),
                scenario.clone(),
                holders.clone(),
            );
            tokio::spawn(async move {
                let mut tally = Tally::default();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= scenario.requests || Instant::now() >= deadline {
                        break;
                    }
                    let request = Request {
                        k: i % scenario.keys,
                        started,
                        deadline,
                    };
                    one_request(&locker, &stock, &scenario, &holders, request, &mut tally).await;
                }
                tally
            })
        })
        .collect();
    let mut total = Tally::default();
    for task in tasks {
        match task.await {
            Ok(tally) => total.merge(tally),
            Err(e) => total.error(format!("a task panicked: {e}")),
        }
    }
    total.most_holders = holders.most();
    total
}

/// Holders of each key at once in this process, and the most seen.
struct Holders {
    now: Vec<AtomicUsize>,
    most: AtomicUsize,
}

impl Holders {
    fn new(keys: usize) -> Self {
        Holders {
            now: (0..keys).map(|_| AtomicUsize::new(0)).collect(),
            most: AtomicUsize::new(0),
        }
    }

    fn enter(&self, k: usize) {
        let now = self.now[k].fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self, k: usize) {
        self.now[k].fetch_sub(1, Ordering::SeqCst);
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

/// One request: its key, and the run's start and end.
struct Request {
    k: usize,
    started: Instant,
    deadline: Instant,
}

async fn one_request(
    locker: &Locker,
    stock: &Stock,
    scenario: &Scenario,
    holders: &Holders,
    request: Request,
    tally: &mut Tally,
) {
    let Request {
        k,
        started,
        deadline,
    } = request;
    let asked = Instant::now();
    let acquired = locker.acquire(k, scenario.kind, scenario.ttl, deadline);
    let (held, token) = match acquired.await {
        Ok(Some(held)) => held,
        Ok(None) => {
            tally.timeouts += 1;
            return;
        }
        Err(e) => {
            tally.error(format!("acquire: {e}"));
            return;
        }
    };
    let entered = Instant::now();
    holders.enter(k);
    tally.acquired += 1;
    tally.acquire_latency.push(entered - asked);
    match (stock.read(k).await, scenario.kind) {
        (Ok(qty), LoadKind::Exclusive) if qty > 0 => match stock.write(k, qty - 1, token).await {
            Ok(true) => tally.sold += 1,
            Ok(false) => tally.stale_rejected += 1,
            Err(e) => tally.error(format!("write: {e}")),
        },
        (Ok(_), LoadKind::Exclusive) => tally.refused += 1,
        (Ok(_), _) => {}
        (Err(e), _) => tally.error(format!("read: {e}")),
    }
    holders.leave(k);
    let left = Instant::now();
    tally.sections.push((k, entered - started, left - started));
    if let Err(e) = locker.release(held).await {
        if e.contains("lost") {
            tally.lost += 1;
        } else {
            tally.error(format!("release: {e}"));
        }
    }
}

/// The outcome of a run: the tally, and what the stock says.
#[derive(Debug)]
pub struct Outcome {
    /// Where it ran (the backend).
    pub label: String,
    /// The library that took the locks.
    pub client: Client,
    /// The scenario.
    pub scenario: Scenario,
    /// Processes the tasks ran in.
    pub processes: usize,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// What the tasks counted.
    pub tally: Tally,
    /// The stock before and after.
    pub stock_before: i64,
    /// The stock after.
    pub stock_after: i64,
}

impl Outcome {
    /// Units that left the stock beyond what it held: must be 0.
    pub fn oversold(&self) -> u64 {
        self.tally
            .sold
            .saturating_sub(self.stock_before.max(0) as u64)
            + self.stock_after.min(0).unsigned_abs()
    }

    /// Sales the stock does not show (two holders wrote the same value):
    /// must be 0.
    pub fn lost_updates(&self) -> u64 {
        let gone = (self.stock_before - self.stock_after).max(0) as u64;
        self.tally.sold.saturating_sub(gone)
    }

    /// Stock that vanished without a sale being counted (a write applied
    /// whose task then failed): reported, not an exclusion failure.
    pub fn unaccounted(&self) -> u64 {
        let gone = (self.stock_before - self.stock_after).max(0) as u64;
        gone.saturating_sub(self.tally.sold)
    }

    /// Critical sections per second.
    pub fn throughput(&self) -> f64 {
        self.tally.acquired as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Whether the books balance (readers and permit holders leave the
    /// stock as it was), no kind had more holders at once than it allows,
    /// and nothing failed.
    pub fn ok(&self) -> bool {
        let books = match self.scenario.kind {
            LoadKind::Exclusive => self.oversold() == 0 && self.lost_updates() == 0,
            _ => self.stock_after == self.stock_before,
        };
        books && self.within_holders() && self.tally.errors == 0
    }

    /// Whether no key had more holders at once (in one process) than the
    /// kind allows.
    pub fn within_holders(&self) -> bool {
        self.scenario
            .kind
            .most_holders()
            .is_none_or(|most| self.tally.most_holders <= most)
    }

    /// The acquire latency at percentile `p`.
    pub fn latency(&self, p: f64) -> Option<Duration> {
        let mut sorted = self.tally.acquire_latency.clone();
        sorted.sort();
        percentile(&sorted, p)
    }

    /// Per key, consecutive critical sections (one process's clock): how
    /// many overlapped, and the sorted idle gaps between them.
    pub fn gaps(&self) -> (usize, Vec<Duration>) {
        let mut by_key: HashMap<usize, Vec<(Duration, Duration)>> = HashMap::new();
        for &(k, start, end) in &self.tally.sections {
            by_key.entry(k).or_default().push((start, end));
        }
        let (mut overlaps, mut gaps) = (0, Vec::new());
        for sections in by_key.values_mut() {
            sections.sort();
            for pair in sections.windows(2) {
                match pair[1].0.checked_sub(pair[0].1) {
                    Some(gap) => gaps.push(gap),
                    None => overlaps += 1,
                }
            }
        }
        gaps.sort();
        (overlaps, gaps)
    }

    /// A few lines for people.
    pub fn report(&self) -> String {
        let s = &self.scenario;
        let t = &self.tally;
        let ms = |d: Option<Duration>| d.map_or("n/a".to_owned(), fmt_duration);
        let (overlaps, gaps) = self.gaps();
        let mut out = format!(
            "{}{} ({}): {} tasks{} on {} key(s), {} of {} requests in {:.2} s (cap {:?}); ttl {:?}\n\
             throughput: {:.0} critical sections/s\n\
             acquire latency: p50 {} / p90 {} / p99 {} / max {}\n",
            match self.client {
                Client::Lockkit => String::new(),
                peer => format!("{} on ", peer.library()),
            },
            self.label,
            s.kind,
            s.concurrency,
            if self.processes > 1 {
                format!(" in {} processes", self.processes)
            } else {
                String::new()
            },
            s.keys,
            t.acquired,
            s.requests,
            self.elapsed.as_secs_f64(),
            s.duration,
            s.ttl,
            self.throughput(),
            ms(self.latency(50.0)),
            ms(self.latency(90.0)),
            ms(self.latency(99.0)),
            ms(self.latency(100.0)),
        );
        if self.processes == 1 {
            out.push_str(&format!(
                "lock idle between holders of a key: p50 {} / p99 {} / max {}; overlapping sections seen: {overlaps}\n",
                ms(percentile(&gaps, 50.0)),
                ms(percentile(&gaps, 99.0)),
                ms(percentile(&gaps, 100.0)),
            ));
        }
        out.push_str(&format!(
            "most holders of a key at once: {}{}\n",
            t.most_holders,
            match s.kind.most_holders() {
                Some(most) => format!(" (at most {most} allowed)"),
                None => String::new(),
            }
        ));
        out.push_str(&format!(
            "sold {} of {} in stock, refused {} (sold out), stale writes rejected {}, waits timed out {}, leases lost {}, errors {}\n\
             stock {} → {}: oversold {}, lost updates {}{} — {}\n",
            t.sold,
            self.stock_before,
            t.refused,
            t.stale_rejected,
            t.timeouts,
            t.lost,
            t.errors,
            self.stock_before,
            self.stock_after,
            self.oversold(),
            self.lost_updates(),
            match self.unaccounted() {
                0 => String::new(),
                n => format!(", {n} unaccounted"),
            },
            if self.ok() { "OK" } else { "FAILED" },
        ));
        for e in &t.error_samples {
            out.push_str(&format!("  error: {e}\n"));
        }
        out
    }

    /// The figures as JSON.
    pub fn to_json(&self) -> Value {
        let us = |d: Option<Duration>| d.map(|d| d.as_micros() as u64);
        let (overlaps, gaps) = self.gaps();
        json!({
            "label": self.label,
            "client": self.client.name(),
            "kind": self.scenario.kind.to_string(),
            "most_holders": self.tally.most_holders,
            "concurrency": self.scenario.concurrency,
            "keys": self.scenario.keys,
            "requests": self.scenario.requests,
            "processes": self.processes,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "acquired": self.tally.acquired,
            "throughput": self.throughput(),
            "acquire_p50_us": us(self.latency(50.0)),
            "acquire_p90_us": us(self.latency(90.0)),
            "acquire_p99_us": us(self.latency(99.0)),
            "acquire_max_us": us(self.latency(100.0)),
            "idle_gap_p50_us": us(percentile(&gaps, 50.0)),
            "idle_gap_p99_us": us(percentile(&gaps, 99.0)),
            "overlaps_seen": overlaps,
            "sold": self.tally.sold,
            "refused": self.tally.refused,
            "stale_rejected": self.tally.stale_rejected,
            "timeouts": self.tally.timeouts,
            "lost": self.tally.lost,
            "errors": self.tally.errors,
            "stock_before": self.stock_before,
            "stock_after": self.stock_after,
            "oversold": self.oversold(),
            "lost_updates": self.lost_updates(),
            "ok": self.ok(),
        })
    }
}

/// Resets the stock, runs the scenario in this process, and reads the stock
/// back.
pub async fn run(
    label: &str,
    locker: &Locker,
    stock: &Arc<Stock>,
    scenario: &Scenario,
) -> Result<Outcome, String> {
    stock.reset(scenario.keys, scenario.stock).await?;
    let stock_before = stock.total(scenario.keys).await?;
    let started = Instant::now();
    let tally = run_tasks(locker, stock, scenario).await;
    let elapsed = started.elapsed();
    let stock_after = stock.total(scenario.keys).await?;
    Ok(Outcome {
        label: label.to_owned(),
        client: locker.client(),
        scenario: scenario.clone(),
        processes: 1,
        elapsed,
        tally,
        stock_before,
        stock_after,
    })
}

#[cfg(test)]
mod tests {
    use super::{Client, LoadKind, redis_masters};

    #[test]
    fn clients_parse_and_print_back() {
        for client in [Client::Lockkit, Client::Rslock, Client::DistributedLock] {
            assert_eq!(client.name().parse::<Client>(), Ok(client));
        }
        let err = "redsync".parse::<Client>().unwrap_err();
        assert!(err.contains("lockkit, rslock or distributed-lock"), "{err}");
    }

    #[test]
    fn redis_masters_drop_lockkit_options() {
        assert_eq!(
            redis_masters("redis://127.0.0.1:6379/0?ttl=5s"),
            Some(vec!["redis://127.0.0.1:6379/0".to_owned()])
        );
        assert_eq!(
            redis_masters("redlock://127.0.0.1:1,127.0.0.1:2?ttl=5s"),
            Some(vec![
                "redis://127.0.0.1:1".to_owned(),
                "redis://127.0.0.1:2".to_owned()
            ])
        );
        assert_eq!(redis_masters("postgres://127.0.0.1/x"), None);
    }

    #[test]
    fn kinds_parse_and_print_back() {
        for text in ["exclusive", "shared", "permits=4"] {
            let kind: LoadKind = text.parse().unwrap();
            assert_eq!(kind.to_string(), text);
        }
        for bad in ["permits=0", "permits=", "permits=x", "read", ""] {
            assert!(bad.parse::<LoadKind>().is_err(), "{bad:?}");
        }
    }
}
