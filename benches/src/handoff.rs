//! The handoff benchmark: from the moment a holder calls `release()` to the
//! moment a waiter on another client, already parked inside `acquire`, gets
//! the lock. Each handoff is paired with a yardstick (e.g. one round trip)
//! timed just before it, so that its ratio survives a noisy machine.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use criterion::{Criterion, SamplingMode};
use lockkit_core::{DistributedLock, LockOptions};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::mode::{Limit, RunMode, judge_optional};
use crate::{fmt_duration, percentile};

/// What a handoff needs to know of its backend: when the waiter is parked,
/// and the yardstick timed just before the release.
#[allow(async_fn_in_trait)]
pub trait HandoffProbe {
    /// Taken once the holder has the lock, before the waiter calls `acquire`
    /// (e.g. a counter on the server), and given to
    /// [`until_parked`](Self::until_parked).
    type Mark;

    /// The mark before the waiter starts.
    async fn mark(&self) -> Self::Mark;

    /// Returns once the waiter is parked inside `acquire` (its request queued
    /// and its wake-up armed), found by polling the server: that keeps the
    /// machine as warm as a loop of cycles does, where sleeping a fixed time
    /// would measure a wake-up from idle instead.
    async fn until_parked(&self, mark: Self::Mark);

    /// Runs the yardstick once and returns how long its measured part took.
    async fn yardstick(&self) -> Duration;

    /// Called after every handoff, outside the timing (e.g. to delete what the
    /// yardstick created). Does nothing by default.
    async fn after_handoff(&self) {}
}

/// A holder, a waiter on another client, the lock they pass between them,
/// the probe of their backend, and what the handoffs measured so far.
#[derive(Debug)]
pub struct Handoffs<L, P> {
    holder: Arc<L>,
    waiter: Arc<L>,
    name: &'static str,
    opts: LockOptions,
    probe: P,
    diag: Mutex<HandoffDiag>,
}

impl<L, P> Handoffs<L, P>
where
    L: DistributedLock + 'static,
    P: HandoffProbe,
{
    /// Handoffs of lock `name` (taken with `opts`) between two clients made
    /// by `connect` on `runtime`: the holder and the waiter.
    pub fn connect<Fut>(
        runtime: &Runtime,
        connect: impl Fn() -> Fut,
        name: &'static str,
        opts: LockOptions,
        probe: P,
    ) -> Self
    where
        Fut: Future<Output = lockkit_core::Result<L>>,
    {
        let client = || runtime.block_on(connect()).expect("a lock client connects");
        Handoffs {
            holder: Arc::new(client()),
            waiter: Arc::new(client()),
            name,
            opts,
            probe,
            diag: Mutex::new(HandoffDiag::default()),
        }
    }

    /// One measured handoff, recorded with its yardstick; returns its duration.
    pub async fn once(&self) -> Duration {
        let held = self
            .holder
            .acquire(self.name, &self.opts)
            .await
            .expect("A acquires");
        let mark = self.probe.mark().await;
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn({
            let (waiter, name, opts) = (self.waiter.clone(), self.name, self.opts.clone());
            async move {
                let guard = waiter.acquire(name, &opts).await.expect("B acquires");
                let _ = tx.send(Instant::now());
                guard.release().await.expect("B releases");
            }
        });
        self.probe.until_parked(mark).await;
        assert!(
            !task.is_finished(),
            "the waiter got the lock while A held it"
        );
        // The yardstick of this handoff, timed just before it.
        let yardstick = self.probe.yardstick().await;
        let start = Instant::now();
        held.release().await.expect("A releases");
        let released = Instant::now();
        let acquired = rx.await.expect("the waiter reports its acquisition");
        task.await.expect("the waiter task");
        let handoff = acquired.saturating_duration_since(start);
        self.probe.after_handoff().await;
        self.diag.lock().unwrap_or_else(|p| p.into_inner()).record(
            released - start,
            acquired < released,
            handoff,
            yardstick,
        );
        handoff
    }

    /// The criterion group `group` with one benchmark, `handoff`, after two
    /// handoffs outside the measurement (the waiter's first wait may open
    /// connections). Returns what the benchmark's handoffs measured, and
    /// prints a line about them.
    pub fn bench(
        self,
        c: &mut Criterion,
        runtime: &Runtime,
        group: &str,
        mode: RunMode,
    ) -> HandoffDiag {
        self.bench_as(c, runtime, group, "handoff", mode)
    }

    /// [`bench`](Self::bench) with the benchmark named `id` instead of
    /// `handoff` (several backends' handoffs in one group).
    #[allow(clippy::print_stdout)]
    pub fn bench_as(
        self,
        c: &mut Criterion,
        runtime: &Runtime,
        group: &str,
        id: &str,
        mode: RunMode,
    ) -> HandoffDiag {
        runtime.block_on(async {
            for _ in 0..2 {
                self.once().await;
            }
        });
        *self.diag.lock().unwrap_or_else(|p| p.into_inner()) = HandoffDiag::default();

        let mut group = c.benchmark_group(group);
        // Criterion plans the iteration counts from the wall time of its
        // warm-up (each handoff also costs the setup and the polling until the
        // waiter is parked), while the samples it analyses are the measured
        // handoff durations. So these budgets are wall time.
        group.sampling_mode(SamplingMode::Flat);
        match mode {
            RunMode::Quick => group
                .sample_size(10)
                .warm_up_time(Duration::from_millis(50))
                .measurement_time(Duration::from_millis(300)),
            _ => group
                .sample_size(25)
                .warm_up_time(Duration::from_millis(200))
                .measurement_time(Duration::from_secs(2)),
        };
        group.bench_function(id, |b| {
            b.to_async(runtime).iter_custom(|iters| {
                let this = &self;
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        total += this.once().await;
                    }
                    total
                }
            });
        });
        group.finish();
        let mut diag = self.diag.into_inner().unwrap_or_else(|p| p.into_inner());
        diag.release_calls.sort();
        if let Some(line) = diag.describe() {
            println!("{id}: {line}");
        }
        diag
    }
}

/// Side observations of the handoff benchmark, to tell where its time goes.
#[derive(Debug, Default)]
pub struct HandoffDiag {
    /// How long the holder's `release()` call took; sorted once complete.
    release_calls: Vec<Duration>,
    /// Handoffs where the waiter had the lock before the holder's `release()`
    /// call returned.
    waiter_first: usize,
    /// Every measured handoff, and the yardstick timed just before it.
    pairs: Vec<(Duration, Duration)>,
}

impl HandoffDiag {
    /// Records one handoff: how long the holder's release call took, whether
    /// the waiter had the lock before it returned, the handoff, and the
    /// yardstick timed just before it.
    pub fn record(
        &mut self,
        release_call: Duration,
        waiter_first: bool,
        handoff: Duration,
        yardstick: Duration,
    ) {
        self.release_calls.push(release_call);
        self.waiter_first += usize::from(waiter_first);
        self.pairs.push((handoff, yardstick));
    }

    /// Medians of the handoffs and of the yardsticks timed just before them.
    pub fn paired_medians(&self) -> Option<(Duration, Duration)> {
        let mut handoffs: Vec<Duration> = self.pairs.iter().map(|p| p.0).collect();
        let mut yardsticks: Vec<Duration> = self.pairs.iter().map(|p| p.1).collect();
        handoffs.sort();
        yardsticks.sort();
        Some((percentile(&handoffs, 50.0)?, percentile(&yardsticks, 50.0)?))
    }

    /// One line: how many handoffs, how long the holder's release call took,
    /// and how often the waiter had the lock before it returned.
    pub fn describe(&self) -> Option<String> {
        let p50 = percentile(&self.release_calls, 50.0)?;
        Some(format!(
            "{} handoffs measured; the holder's release() call took {} (p50); the waiter had the lock before that call returned in {} of them",
            self.release_calls.len(),
            fmt_duration(p50),
            self.waiter_first
        ))
    }

    /// A summary table row `| label | median | ratio (yardstick median) | target |`:
    /// the handoffs' median and its ratio to the median of their yardsticks
    /// (named `yardstick`), judged by `limit` (`—` without one).
    pub fn row(&self, label: &str, yardstick: &str, limit: Option<Limit>) -> String {
        let medians = self.paired_medians();
        let judge = |ratio| judge_optional(limit, ratio);
        let (ratio, target) = match medians {
            Some((handoff, base)) => {
                let (r, t) = judge(Some(handoff.as_secs_f64() / base.as_secs_f64()));
                (format!("{r} ({yardstick} {})", fmt_duration(base)), t)
            }
            None => judge(None),
        };
        format!(
            "| {label} | {} | {ratio} | {target} |",
            medians.map_or_else(|| "n/a".to_owned(), |(h, _)| fmt_duration(h))
        )
    }
}
