//! Contention on one key: tasks loop acquire → release until a number of
//! critical sections is done, and the run tells how fair and how fast the
//! hand-overs were (the releasing task taking the lock straight back, the
//! wait from one holder's release to the next holder's grant).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockkit_core::{DistributedLock, LockGuard, LockOptions};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::mode::verdict;
use crate::{fmt_duration, percentile};

/// The lease of the contending tasks: long, so that no renewal runs.
const TTL: Duration = Duration::from_secs(30);

/// The outcome of one contention run.
#[derive(Debug)]
pub struct Contention {
    tasks: usize,
    critical_sections: usize,
    elapsed: Duration,
    capped: bool,
    errors: usize,
    /// Consecutive critical sections held by the same task.
    straight_back: usize,
    /// Pairs of consecutive critical sections.
    pairs: usize,
    /// Handoffs where the next holder's acquire returned before the previous
    /// holder's release call did (the release reply was still in flight).
    overlapping: usize,
    /// From the previous holder's release returning to the next holder's
    /// acquire returning, for every change of holder; sorted.
    handoff_waits: Vec<Duration>,
    /// From calling `acquire` to its return (time queued behind other tasks),
    /// for every critical section; sorted.
    acquire_waits: Vec<Duration>,
}

/// What a contending task takes and gives back: a lockkit client, or a
/// peer library's lock.
pub trait Contender: Send + Sync + 'static {
    /// A holding, ended by [`give_back`](Self::give_back).
    type Held: Send + 'static;

    /// Takes the lock `name`, waiting as long as it takes.
    fn take(&self, name: &'static str) -> impl Future<Output = Result<Self::Held, String>> + Send;

    /// Ends a holding.
    fn give_back(&self, held: Self::Held) -> impl Future<Output = Result<(), String>> + Send;
}

impl Contender for Arc<dyn DistributedLock> {
    type Held = LockGuard;

    async fn take(&self, name: &'static str) -> Result<LockGuard, String> {
        let opts = LockOptions::new().ttl(TTL);
        self.as_ref()
            .acquire(name, &opts)
            .await
            .map_err(|e| e.to_string())
    }

    async fn give_back(&self, held: LockGuard) -> Result<(), String> {
        held.release().await.map_err(|e| e.to_string())
    }
}

/// One critical section of a contention run: the task, when its acquire
/// returned, when its release returned, and how long its acquire call took.
type Section = (usize, Instant, Instant, Duration);

/// One task per entry of `locks` (the same client several times, or a
/// client each) loops acquire → release on `name` until `total` critical
/// sections are done, or `cap` has passed.
pub async fn contention<C: Contender>(
    locks: Vec<C>,
    name: &'static str,
    total: usize,
    cap: Duration,
) -> Contention {
    let tasks = locks.len();
    let records: Arc<Mutex<Vec<Section>>> = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let taken = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let (done_tx, done_rx) = oneshot::channel::<()>();
    let done_tx = Arc::new(Mutex::new(Some(done_tx)));

    let started = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for (task_id, locks) in locks.into_iter().enumerate() {
        let (records, taken, errors, done_tx) = (
            records.clone(),
            taken.clone(),
            errors.clone(),
            done_tx.clone(),
        );
        let mut stop = stop_rx.clone();
        handles.push(tokio::spawn(async move {
            loop {
                let called_at = Instant::now();
                let guard = tokio::select! {
                    biased;
                    _ = stop.wait_for(|stop| *stop) => return,
                    result = locks.take(name) => match result {
                        Ok(guard) => guard,
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    },
                };
                let acquired_at = Instant::now();
                let index = taken.fetch_add(1, Ordering::SeqCst);
                if index >= total {
                    let _ = locks.give_back(guard).await;
                    return;
                }
                if locks.give_back(guard).await.is_err() {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                let released_at = Instant::now();
                let finished = {
                    let mut records = records.lock().unwrap_or_else(|p| p.into_inner());
                    records.push((task_id, acquired_at, released_at, acquired_at - called_at));
                    records.len() == total
                };
                if finished
                    && let Some(done) = done_tx.lock().unwrap_or_else(|p| p.into_inner()).take()
                {
                    let _ = done.send(());
                }
            }
        }));
    }

    let capped = tokio::time::timeout(cap, done_rx).await.is_err();
    let elapsed = started.elapsed();
    let _ = stop_tx.send(true);
    for handle in handles {
        if tokio::time::timeout(Duration::from_secs(5), handle)
            .await
            .is_err()
        {
            tracing::warn!("contention: a task did not stop within 5 s");
        }
    }

    let mut records = std::mem::take(&mut *records.lock().unwrap_or_else(|p| p.into_inner()));
    records.sort_by_key(|&(_, acquired, _, _)| acquired);
    let mut acquire_waits: Vec<Duration> = records.iter().map(|r| r.3).collect();
    acquire_waits.sort();
    let mut straight_back = 0;
    let mut overlapping = 0;
    let mut handoff_waits = Vec::new();
    for pair in records.windows(2) {
        let ((prev_task, _, prev_released, _), (task, acquired, _, _)) = (pair[0], pair[1]);
        if task == prev_task {
            straight_back += 1;
        } else {
            if acquired < prev_released {
                overlapping += 1;
            }
            handoff_waits.push(acquired.saturating_duration_since(prev_released));
        }
    }
    handoff_waits.sort();
    Contention {
        tasks,
        critical_sections: records.len(),
        elapsed,
        capped,
        errors: errors.load(Ordering::Relaxed),
        straight_back,
        pairs: records.len().saturating_sub(1),
        overlapping,
        handoff_waits,
        acquire_waits,
    }
}

impl Contention {
    /// Critical sections per second.
    pub fn per_second(&self) -> f64 {
        self.critical_sections as f64 / self.elapsed.as_secs_f64()
    }

    /// The share of consecutive critical sections held by the same task.
    pub fn straight_back_rate(&self) -> f64 {
        if self.pairs == 0 {
            0.0
        } else {
            self.straight_back as f64 / self.pairs as f64
        }
    }

    /// The `p`-th percentile of the handoff waits.
    pub fn wait(&self, p: f64) -> Option<Duration> {
        percentile(&self.handoff_waits, p)
    }

    /// The `p`-th percentile of the time spent in `acquire` (queued behind
    /// the other tasks), over every critical section.
    pub fn queued(&self, p: f64) -> Option<Duration> {
        percentile(&self.acquire_waits, p)
    }

    /// Whether the run ended by its time cap, short of its critical sections.
    pub fn capped(&self) -> bool {
        self.capped
    }

    /// Acquires or releases that failed.
    pub fn errors(&self) -> usize {
        self.errors
    }

    /// One line for the log.
    pub fn describe(&self) -> String {
        let at = |p| self.wait(p).map_or_else(|| "n/a".to_owned(), fmt_duration);
        format!(
            "{} tasks, {} critical sections in {} ({:.0}/s){}, {} errors, {} of {} consecutive pairs by the same task, {} handoffs (p50 {}, p90 {}, p99 {}, max {}), {} overlapping",
            self.tasks,
            self.critical_sections,
            fmt_duration(self.elapsed),
            self.per_second(),
            if self.capped { " (capped)" } else { "" },
            self.errors,
            self.straight_back,
            self.pairs,
            self.handoff_waits.len(),
            at(50.0),
            at(90.0),
            at(99.0),
            at(100.0),
            self.overlapping,
        )
    }

    /// Where some handoffs overlapped: a sentence saying how many, which
    /// the handoff waits count as 0.
    pub fn overlap_note(&self) -> Option<String> {
        (self.overlapping > 0).then(|| {
            format!(
                "{} tasks: in {} of {} handoffs the next holder's acquire returned before the previous holder's release call did (counted as 0 wait).",
                self.tasks,
                self.overlapping,
                self.handoff_waits.len()
            )
        })
    }

    /// A row of a summary's table (label | figures | | target), judged
    /// against `target` (the handoff wait's p99) when there is one.
    pub fn row(&self, label: &str, target: Option<Duration>) -> String {
        let waits = match (self.wait(50.0), self.wait(99.0), self.handoff_waits.last()) {
            (Some(p50), Some(p99), Some(max)) => format!(
                "{} / {} / {}",
                fmt_duration(p50),
                fmt_duration(p99),
                fmt_duration(*max)
            ),
            _ => "no handoffs".to_owned(),
        };
        let mut notes = Vec::new();
        if self.capped {
            notes.push(format!(
                "stopped by the cap after {}",
                fmt_duration(self.elapsed)
            ));
        }
        if self.errors > 0 {
            notes.push(format!("{} errors", self.errors));
        }
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join(", "))
        };
        let target = match target {
            Some(limit) => match self.wait(99.0) {
                Some(p99) => format!(
                    "p99 ≤ {}: {}",
                    fmt_duration(limit),
                    verdict(p99 <= limit && !self.capped && self.errors == 0)
                ),
                None => format!("p99 ≤ {}: MISS (no handoffs)", fmt_duration(limit)),
            },
            None => "—".to_owned(),
        };
        let queued = match (
            percentile(&self.acquire_waits, 50.0),
            percentile(&self.acquire_waits, 99.0),
        ) {
            (Some(p50), Some(p99)) => format!(
                "; queued in acquire p50/p99 {} / {}",
                fmt_duration(p50),
                fmt_duration(p99)
            ),
            _ => String::new(),
        };
        format!(
            "| {label}: {:.0} cs/s, straight-back {:.1} %{queued}; handoff wait p50/p99/max{notes} | {waits} | | {target} |",
            self.per_second(),
            100.0 * self.straight_back_rate(),
        )
    }
}
