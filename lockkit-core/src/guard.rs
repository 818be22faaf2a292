//! `LockGuard`: one holding of a lock, with its watchdog and lost signal.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::deferred::{Booking, Due, Timer};
use crate::backend::local_queue::LocalSlot;
use crate::error::{LockError, Result};
use crate::fencing::FencingToken;
use crate::lost::LostReason;
use crate::options::{check_ttl, clock_drift};

/// The backend side of one holding: what a [`LockGuard`] calls to extend and
/// release. Backends implement it; users never see it.
#[async_trait::async_trait]
pub trait Lease: Send + Sync + fmt::Debug + 'static {
    /// The backend's name for logs, e.g. `"redis"`.
    fn backend(&self) -> &'static str;
    /// Makes the lease end `ttl` from now. `Ok(false)`: the lease is no longer ours.
    async fn extend(&self, ttl: Duration) -> Result<bool>;
    /// Releases the lease if it is still ours. `Ok(false)`: it was not (anymore).
    async fn release(&self) -> Result<bool>;
}

struct Timing {
    ttl: Duration,
    valid_until: Instant,
    renewed_at: Instant,
    /// After a failed renewal: the retry delays, and when the next try is due.
    retry: Option<(crate::backoff::Delays, Instant)>,
}

impl Timing {
    /// When the watchdog next has something to do: the next renewal (or its
    /// retry) when auto-renew is on, and in any case the end of the validity.
    /// The renewal is put off to the next point of the renewal grid (see
    /// [`on_renewal_grid`]); the expiry is not.
    fn next_wake(&self, auto_renew: bool) -> Instant {
        if auto_renew {
            on_renewal_grid(self.renew_due(), self.ttl).min(self.valid_until)
        } else {
            self.valid_until
        }
    }

    fn renew_due(&self) -> Instant {
        match &self.retry {
            Some((_, at)) => *at,
            None => self.renewed_at + self.ttl / 3,
        }
    }
}

/// Renewals come due on a grid of points a hundredth of the TTL apart (1 to
/// 10 ms), so that the renewals of many leases come due together and their
/// watchdog steps start as one batch (see [`Step`]). A renewal is put off by
/// less than one step of the grid, against the two thirds of the lease that
/// are left when it is due.
fn on_renewal_grid(at: Instant, ttl: Duration) -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let step = (ttl / 100)
        .clamp(Duration::from_millis(1), Duration::from_millis(10))
        .as_nanos();
    // Any fixed origin will do, and any instant is on its grid: later ones
    // are rounded up from it, earlier ones (another runtime's clock, paused
    // in a test) rounded down towards it.
    let origin = *ORIGIN.get_or_init(|| at);
    let nanos = |steps: u128| u64::try_from(steps * step).ok().map(Duration::from_nanos);
    let point = match at.checked_duration_since(origin) {
        Some(after) => nanos(after.as_nanos().div_ceil(step)).and_then(|d| origin.checked_add(d)),
        None => nanos((origin - at).as_nanos() / step).and_then(|d| origin.checked_sub(d)),
    };
    point.unwrap_or(at)
}

/// Where a guard's watchdog stands. It has no task of its own while it waits:
/// its next deadline is booked on the per-thread timer (see
/// [`deferred`](crate::backend::deferred)). The steps of the watchdogs due
/// at one wake-up of that timer run together in one task (see [`Step`]);
/// each books its next deadline before it ends. A parked task per held lease
/// would cost every holding about a kilobyte, and a task per renewal a spawn,
/// a schedule and a wake-up across threads, a hundred thousand times a second
/// for a million leases.
enum Watchdog {
    /// Nothing booked yet.
    Idle,
    /// The next deadline is booked.
    Booked(Booking<Step>),
    /// A renewal (or the expiry) is running; the waker of its batch task,
    /// once it has been polled, to stop it.
    Running(Option<Waker>),
    /// The holding ended (released, dropped or lost), or there is no runtime.
    Stopped,
}

/// A booked watchdog deadline.
struct Step(Weak<Shared>);

thread_local! {
    static WATCHDOGS: RefCell<Option<Arc<Timer<Step>>>> = const { RefCell::new(None) };
}

impl Due for Step {
    /// Runs the steps of the watchdogs still booked in one task, on the
    /// runtime of the timer (that of the guards).
    fn start(due: Vec<Step>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let steps: FuturesUnordered<_> = due
            .into_iter()
            .filter_map(|Step(weak)| weak.upgrade())
            .filter(|shared| shared.begin_step())
            .map(stoppable_step)
            .collect();
        if !steps.is_empty() {
            runtime.spawn(steps.for_each(|()| std::future::ready(())));
        }
    }
}

/// A watchdog step that ends as soon as the holding ends (release, drop),
/// dropping the renewal it may be waiting for, as an aborted task would.
/// A step that panics (a backend's bug) ends its own holding, marked lost,
/// and not the other steps of its batch.
async fn stoppable_step(shared: Arc<Shared>) {
    let mut step = std::pin::pin!(watchdog_step(shared.clone()));
    let stoppable = std::future::poll_fn(|cx| {
        if shared.stop_requested(cx) {
            return Poll::Ready(());
        }
        step.as_mut().poll(cx)
    });
    if AssertUnwindSafe(stoppable).catch_unwind().await.is_err() {
        tracing::error!(lock.name = %shared.name, lock.backend = shared.lease.backend(), "the watchdog's step panicked; the holding is given up as lost");
        shared.mark_lost(LostReason::RenewalFailed);
        shared.stop_watchdog_quietly();
    }
}

/// A holding's lost signal: the reason, once there is one, and the futures
/// of [`LockGuard::lost`] waiting for it. Kept apart from [`Shared`] so that
/// those futures hold this alone, not the holding (its lease, its local
/// slot). A `watch` channel would do the same at about five times the size
/// (its nine `Notify`s), for every held lease.
#[derive(Default)]
struct LostSignal {
    reason: Mutex<Option<LostReason>>,
    waiters: Notify,
}

impl LostSignal {
    fn reason(&self) -> Option<LostReason> {
        *lock(&self.reason)
    }

    /// Records `reason` unless there is one already, then wakes the
    /// waiters; `first` runs before anyone can see the reason (the loss is
    /// counted there). True if this call recorded it.
    fn mark(&self, reason: LostReason, first: impl FnOnce()) -> bool {
        {
            let mut recorded = lock(&self.reason);
            if recorded.is_some() {
                return false;
            }
            first();
            *recorded = Some(reason);
        }
        self.waiters.notify_waiters();
        true
    }

    /// Resolves once there is a reason.
    async fn wait(&self) -> LostReason {
        loop {
            let notified = self.waiters.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the reason is read, so that a loss marked
            // in between still wakes this.
            notified.as_mut().enable();
            if let Some(reason) = self.reason() {
                return reason;
            }
            notified.await;
        }
    }
}

struct Shared {
    name: Box<str>,
    watchdog: Mutex<Watchdog>,
    fencing: Option<FencingToken>,
    auto_renew: bool,
    lease: Arc<dyn Lease>,
    lost: Arc<LostSignal>,
    timing: Mutex<Timing>,
    /// Serialises extends (watchdog and user) and release, so that the last lease
    /// length applied on the server is the one recorded here.
    ops: tokio::sync::Mutex<()>,
    /// This client's local FIFO slot for the name, freed as soon as the holding ends.
    slot: Mutex<Option<LocalSlot>>,
}

impl Shared {
    fn lost_reason(&self) -> Option<LostReason> {
        self.lost.reason()
    }

    fn valid_until(&self) -> Instant {
        lock(&self.timing).valid_until
    }

    fn record_extension(&self, sent: Instant, ttl: Duration) {
        let mut timing = lock(&self.timing);
        timing.ttl = ttl;
        timing.renewed_at = sent;
        timing.valid_until = sent + ttl - clock_drift(ttl);
        timing.retry = None;
    }

    fn free_slot(&self) {
        drop(lock(&self.slot).take());
    }

    /// Books the watchdog's next deadline on the current runtime, unless the
    /// holding has ended or a booking is in place already. Called when the
    /// guard is made, and by each watchdog step before it ends.
    fn schedule(self: &Arc<Self>) {
        let mut state = lock(&self.watchdog);
        if matches!(*state, Watchdog::Stopped | Watchdog::Booked(_)) {
            return;
        }
        let wake = lock(&self.timing).next_wake(self.auto_renew);
        // Booked while the state is locked: a deadline that is already past
        // starts on the timer task, whose `begin_step` waits for this to be
        // recorded.
        *state = match crate::backend::deferred::book(&WATCHDOGS, wake, Step(Arc::downgrade(self)))
        {
            Some(booking) => Watchdog::Booked(booking),
            None => Watchdog::Stopped,
        };
    }

    /// A booked deadline has come: true if its step is to run (the holding
    /// has not ended meanwhile).
    fn begin_step(&self) -> bool {
        let mut state = lock(&self.watchdog);
        if let Watchdog::Booked(_) = &*state {
            *state = Watchdog::Running(None);
            true
        } else {
            false
        }
    }

    /// Whether the running step is to stop (the holding ended); otherwise
    /// keeps the waker that stops it.
    fn stop_requested(&self, cx: &Context<'_>) -> bool {
        let mut state = lock(&self.watchdog);
        match &mut *state {
            Watchdog::Stopped => true,
            Watchdog::Running(waker) => {
                if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *waker = Some(cx.waker().clone());
                }
                false
            }
            Watchdog::Idle | Watchdog::Booked(_) => false,
        }
    }

    /// The deadline changed (an extension by the user): a booking is
    /// replaced; a running step books from the new timing when it ends.
    fn replan(self: &Arc<Self>) {
        let rebook = {
            let mut state = lock(&self.watchdog);
            match std::mem::replace(&mut *state, Watchdog::Idle) {
                Watchdog::Booked(booking) => {
                    booking.cancel();
                    true
                }
                other => {
                    *state = other;
                    false
                }
            }
        };
        if rebook {
            self.schedule();
        }
    }

    /// A step is over: from running back to idle (then the step books the
    /// next deadline), unless the holding ended meanwhile.
    fn step_done(&self) {
        let mut state = lock(&self.watchdog);
        if let Watchdog::Running(_) = &*state {
            *state = Watchdog::Idle;
        }
    }

    /// Stops the watchdog for good (the holding ends).
    fn stop_watchdog(&self) {
        match std::mem::replace(&mut *lock(&self.watchdog), Watchdog::Stopped) {
            Watchdog::Booked(booking) => {
                booking.cancel();
            }
            Watchdog::Running(Some(waker)) => waker.wake(),
            Watchdog::Running(None) | Watchdog::Idle | Watchdog::Stopped => {}
        }
    }

    /// Cancels a booked deadline after a loss, leaving a running step to
    /// finish (it sees the loss itself).
    fn cancel_booking(&self) {
        let mut state = lock(&self.watchdog);
        match std::mem::replace(&mut *state, Watchdog::Stopped) {
            Watchdog::Booked(booking) => {
                booking.cancel();
            }
            // A running step sees the loss itself, and stops.
            running @ Watchdog::Running(_) => *state = running,
            Watchdog::Idle | Watchdog::Stopped => {}
        }
    }

    /// Marks the holding lost; true if this call did it.
    fn mark_lost(&self, reason: LostReason) -> bool {
        let first = self.lost.mark(reason, || {
            crate::metrics::lost(self.lease.backend(), reason.label());
        });
        if first {
            tracing::warn!(lock.name = %self.name, lock.backend = self.lease.backend(), %reason, "lock lost");
            self.cancel_booking();
            self.free_slot();
        }
        first
    }

    async fn extend(self: &Arc<Self>, ttl: Duration) -> Result<()> {
        let _ops = self.ops.lock().await;
        if let Some(reason) = self.lost_reason() {
            return Err(LockError::lost(&self.name, reason));
        }
        let sent = Instant::now();
        if self.lease.extend(ttl).await? {
            self.record_extension(sent, ttl);
            // The next renewal and the validity moved (a shorter TTL moves
            // them earlier): book afresh.
            self.replan();
            Ok(())
        } else {
            self.mark_lost(LostReason::Revoked);
            Err(LockError::lost(&self.name, LostReason::Revoked))
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these short critical sections cannot leave
    // the data half-updated, so poisoning is ignored.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One holding of a lock. Not `Clone`: there is exactly one guard per holding.
///
/// * While the guard lives and `auto_renew` is on, a watchdog extends the
///   lease about every `ttl / 3`. If renewal fails it keeps trying until the lease's
///   validity runs out, then marks the guard lost.
/// * [`release`](Self::release) frees the lock with an atomic compare-and-delete:
///   it never removes someone else's lease.
/// * Dropping the guard without `release` stops the watchdog and spawns a
///   best-effort release on the current tokio runtime, so an early return or a
///   panic frees the lock within a round trip instead of after the TTL. Outside a
///   runtime the lock stays held until its TTL runs out. Call `release` when you
///   want to know that it worked.
/// * [`lost`](Self::lost) resolves when the lease is gone; `select!` on it around
///   the work the lock protects.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockkit_core::Result<()> {
/// use lockkit_core::{DistributedLock, LockOptions, MemoryLock};
///
/// let locks = MemoryLock::shared();
/// let guard = locks.acquire("nightly-report", &LockOptions::new()).await?;
/// tokio::select! {
///     reason = guard.lost() => eprintln!("lock lost: {reason}"),
///     _ = async { /* the work */ } => {}
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub struct LockGuard {
    shared: Arc<Shared>,
    /// Set once `release` has finished, so that `Drop` does not release again.
    finished: bool,
}

impl LockGuard {
    /// Builds the guard of a fresh holding and arranges its watchdog (spawned
    /// when it first has work: the first renewal or the expiry). For backend
    /// implementors. Outside a tokio runtime the guard has no watchdog: it is not
    /// renewed and its lost signal does not fire (`is_lost` still turns true
    /// once the validity is over).
    ///
    /// `sent_at` is when the acquiring request was sent: the lease is valid until
    /// `sent_at + ttl - drift` (see [`clock_drift`]).
    pub fn new(
        name: &str,
        lease: Arc<dyn Lease>,
        fencing: Option<FencingToken>,
        ttl: Duration,
        sent_at: Instant,
        auto_renew: bool,
    ) -> LockGuard {
        let shared = Arc::new(Shared {
            name: name.into(),
            watchdog: Mutex::new(Watchdog::Idle),
            fencing,
            auto_renew,
            lease,
            lost: Arc::default(),
            timing: Mutex::new(Timing {
                ttl,
                valid_until: sent_at + ttl - clock_drift(ttl),
                renewed_at: sent_at,
                retry: None,
            }),
            ops: tokio::sync::Mutex::new(()),
            slot: Mutex::new(None),
        });
        // No task yet: the watchdog's first deadline (the first renewal, or
        // the expiry) is booked, and most holdings end before it.
        match tokio::runtime::Handle::try_current() {
            Ok(_) => shared.schedule(),
            Err(_) => {
                *lock(&shared.watchdog) = Watchdog::Stopped;
                tracing::warn!(lock.name = %name, "guard created outside a tokio runtime: no auto-renewal and no lost signal");
            }
        }
        LockGuard {
            shared,
            finished: false,
        }
    }

    /// Hands this client's local FIFO slot to the guard, which gives it up when
    /// the holding ends (released, dropped or lost). For backend implementors.
    pub fn attach_slot(&self, slot: LocalSlot) {
        if let Some(since) = slot.take_handoff_start() {
            crate::metrics::handoff(self.shared.lease.backend(), since.elapsed());
        }
        let mut held = lock(&self.shared.slot);
        // Checked under the slot lock, which `mark_lost` takes after setting
        // the reason: a concurrent loss cannot strand the slot here.
        if self.shared.lost_reason().is_none() {
            *held = Some(slot);
        }
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The fencing token of this holding, where the backend gives one
    /// (see [`Capabilities::fencing`](crate::Capabilities::fencing)).
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.shared.fencing
    }

    /// Until when the lease is valid as far as this client can tell: the last
    /// grant or renewal's send time plus the TTL minus the drift allowance.
    pub fn valid_until(&self) -> Option<Instant> {
        Some(self.shared.valid_until())
    }

    /// Whether the lease is known to be gone, or its validity has run out.
    pub fn is_lost(&self) -> bool {
        self.shared.lost_reason().is_some() || Instant::now() >= self.shared.valid_until()
    }

    /// Resolves with the reason once the lease is lost (renewal failed, the lease
    /// was deleted or taken over, the session or connection died). It never
    /// resolves for a lease that is released normally. The future does not borrow
    /// the guard, so it can be spawned.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let lost = Arc::clone(&self.shared.lost);
        // A holding that ends without a loss is never marked: this pends.
        async move { lost.wait().await }
    }

    /// A handle through which the backend can report a loss it notices on its own
    /// (session expiry, a dropped connection). For backend implementors.
    pub fn loss_notifier(&self) -> LossNotifier {
        LossNotifier(Arc::downgrade(&self.shared))
    }

    /// Extends the lease so that it ends `ttl` from now; the watchdog uses `ttl`
    /// from then on. Only the holder can extend: `LockError::Lost` if the lease is
    /// already gone.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        check_ttl(ttl)?;
        let span = tracing::debug_span!(
            "lockkit.extend",
            lock.name = %self.shared.name,
            lock.backend = self.shared.lease.backend(),
            outcome = tracing::field::Empty,
        );
        let result = self.shared.extend(ttl).instrument(span.clone()).await;
        span.record("outcome", outcome(&result));
        result
    }

    /// Releases the lock with an atomic compare-and-delete. `LockError::Lost` if
    /// the lease was already gone (it is never someone else's that gets deleted).
    pub async fn release(mut self) -> Result<()> {
        self.stop_watchdog();
        let shared = self.shared.clone();
        let span = tracing::debug_span!(
            "lockkit.release",
            lock.name = %shared.name,
            lock.backend = shared.lease.backend(),
            outcome = tracing::field::Empty,
        );
        let result = async {
            if let Some(reason) = shared.lost_reason() {
                return Err(LockError::lost(&shared.name, reason));
            }
            let released = {
                let _ops = shared.ops.lock().await;
                shared.lease.release().await?
            };
            if released {
                shared.free_slot();
                Ok(())
            } else {
                // The backend may have recorded a more precise reason meanwhile
                // (a dropped connection, an expired session).
                shared.mark_lost(LostReason::Revoked);
                let reason = shared.lost_reason().unwrap_or(LostReason::Revoked);
                Err(LockError::lost(&shared.name, reason))
            }
        }
        .instrument(span.clone())
        .await;
        span.record("outcome", outcome(&result));
        // On a transport error the outcome is unknown: leave `finished` unset so
        // that `Drop` tries once more in the background.
        self.finished = !matches!(
            result,
            Err(LockError::Unavailable { .. } | LockError::Backend { .. })
        );
        result
    }

    fn stop_watchdog(&mut self) {
        self.shared.stop_watchdog();
    }
}

fn outcome<T>(result: &Result<T>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(LockError::Lost { .. }) => "lost",
        Err(LockError::Timeout { .. }) => "timeout",
        Err(_) => "error",
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.stop_watchdog();
        if self.finished || self.shared.lost_reason().is_some() {
            return;
        }
        release_in_background(self.shared.clone());
    }
}

/// Spawns a best-effort release that keeps the local slot until it is done.
fn release_in_background(shared: Arc<Shared>) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(async move {
                let _ops = shared.ops.lock().await;
                match shared.lease.release().await {
                    Ok(_) => {
                        tracing::debug!(lock.name = %shared.name, "released in the background")
                    }
                    Err(error) => tracing::warn!(
                        lock.name = %shared.name,
                        %error,
                        "background release failed; the lease ends with its TTL"
                    ),
                }
            });
        }
        Err(_) => tracing::warn!(
            lock.name = %shared.name,
            "guard dropped outside a tokio runtime; the lock stays held until its TTL runs out"
        ),
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.shared.name)
            .field("backend", &self.shared.lease.backend())
            .field("fencing_token", &self.shared.fencing)
            .field("valid_until", &self.shared.valid_until())
            .field("lost", &self.shared.lost_reason())
            .finish()
    }
}

/// Reports a loss that the backend noticed on its own; see [`LockGuard::loss_notifier`].
#[derive(Clone, Debug)]
pub struct LossNotifier(Weak<Shared>);

impl LossNotifier {
    /// Marks the holding lost (if it still exists and is not lost already).
    /// Returns true if this call marked it.
    pub fn mark_lost(&self, reason: LostReason) -> bool {
        self.0
            .upgrade()
            .is_some_and(|shared| shared.mark_lost(reason))
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// How renewals are retried after a failure: full jitter between 10 ms and a
/// tenth of the lease (at most 1 s), so that several retries fit into what is
/// left of the validity and a short outage costs no more than it lasts.
fn retry_backoff(ttl: Duration) -> crate::backoff::Backoff {
    let cap = (ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
    crate::backoff::Backoff::new(Duration::from_millis(10), cap)
}

/// One step of the watchdog, at a booked deadline: marks the guard lost
/// once its validity is over (releasing what a session backend still holds),
/// otherwise renews the lease (when auto-renew is on) and books the next
/// deadline. A failed renewal is retried, paced by the lease (see
/// [`retry_backoff`]), until the validity runs out.
async fn watchdog_step(shared: Arc<Shared>) {
    if shared.lost_reason().is_some() {
        shared.stop_watchdog_quietly();
        return;
    }
    let (ttl, valid_until, renew_due) = {
        let timing = lock(&shared.timing);
        (timing.ttl, timing.valid_until, timing.renew_due())
    };
    let now = Instant::now();
    if now >= valid_until {
        let reason = if shared.auto_renew {
            LostReason::RenewalFailed
        } else {
            LostReason::Expired
        };
        if shared.mark_lost(reason) {
            // For session-based backends this frees the node or session lock;
            // for lease backends it is a harmless compare-and-delete.
            let _ops = shared.ops.lock().await;
            let _ = tokio::time::timeout(Duration::from_secs(5), shared.lease.release()).await;
        }
        shared.stop_watchdog_quietly();
        return;
    }
    if shared.auto_renew && now >= renew_due {
        let ops = shared.ops.lock().await;
        if shared.lost_reason().is_some() {
            shared.stop_watchdog_quietly();
            return;
        }
        let sent = Instant::now();
        let budget = valid_until.saturating_duration_since(sent);
        match tokio::time::timeout(budget, shared.lease.extend(ttl)).await {
            Ok(Ok(true)) => {
                crate::metrics::renewal(shared.lease.backend(), "renewed");
                shared.record_extension(sent, ttl);
                tracing::trace!(lock.name = %shared.name, "lease renewed");
            }
            Ok(Ok(false)) => {
                crate::metrics::renewal(shared.lease.backend(), "refused");
                drop(ops);
                shared.mark_lost(LostReason::Revoked);
                shared.stop_watchdog_quietly();
                return;
            }
            Ok(Err(error)) => {
                crate::metrics::renewal(shared.lease.backend(), "failed");
                let mut timing = lock(&shared.timing);
                let mut delays = timing
                    .retry
                    .take()
                    .map_or_else(|| retry_backoff(ttl).delays(), |(delays, _)| delays);
                let delay = delays.next().unwrap_or(Duration::from_millis(10));
                timing.retry = Some((delays, Instant::now() + delay));
                drop(timing);
                tracing::warn!(lock.name = %shared.name, %error, "lease renewal failed; retrying until the lease runs out");
            }
            Err(_elapsed) => {
                crate::metrics::renewal(shared.lease.backend(), "failed");
                // The validity ran out while the renewal was in flight; the
                // next step marks the guard lost.
            }
        }
    }
    shared.step_done();
    shared.schedule();
}

impl Shared {
    /// The watchdog ends from inside its own step (no abort of itself).
    fn stop_watchdog_quietly(&self) {
        let mut state = lock(&self.watchdog);
        if let Watchdog::Booked(booking) = std::mem::replace(&mut *state, Watchdog::Stopped) {
            booking.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_retries_fit_into_the_lease() {
        assert_eq!(
            retry_backoff(Duration::from_millis(600)).max(),
            Duration::from_millis(60)
        );
        assert_eq!(
            retry_backoff(Duration::from_secs(30)).max(),
            Duration::from_secs(1)
        );
        assert_eq!(
            retry_backoff(Duration::from_millis(10)).max(),
            Duration::from_millis(10)
        );
        let delays = retry_backoff(Duration::from_millis(600)).delays_seeded(1);
        assert!(delays.take(50).all(|d| d <= Duration::from_millis(60)));
    }

    #[test]
    fn renewals_come_due_on_a_grid_and_expiries_do_not() {
        let ttl = Duration::from_secs(30);
        let step = Duration::from_millis(10);
        let start = Instant::now();
        let points: Vec<Instant> = (0..200u64)
            .map(|i| {
                let at = start + Duration::from_micros(i * 137);
                let point = on_renewal_grid(at, ttl);
                assert!(point >= at && point < at + step, "{i}");
                point
            })
            .collect();
        // 200 deadlines spread over 27 ms come due at four points at most.
        let mut distinct = points.clone();
        distinct.dedup();
        assert!(distinct.len() <= 4, "{distinct:?}");
        for pair in distinct.windows(2) {
            assert_eq!(pair[1] - pair[0], step);
        }
        // Instants long before (or after) the grid's origin are on it too.
        for far in [
            start.checked_sub(Duration::from_secs(3600)),
            start.checked_add(Duration::from_secs(3600)),
        ]
        .into_iter()
        .flatten()
        {
            let point = on_renewal_grid(far, ttl);
            assert!(point >= far && point < far + step);
        }
        // A short lease has a fine grid (a hundredth of it, at least 1 ms).
        let short = start + Duration::from_micros(2500);
        assert!(
            on_renewal_grid(short, Duration::from_millis(100)) < short + Duration::from_millis(1)
        );

        let timing = |renewed_at: Instant, valid_until: Instant| Timing {
            ttl,
            valid_until,
            renewed_at,
            retry: None,
        };
        let renewed_at = start + Duration::from_micros(1234);
        let valid_until = renewed_at + ttl;
        // Without auto-renew the watchdog wakes at the expiry, unmoved.
        assert_eq!(
            timing(renewed_at, valid_until).next_wake(false),
            valid_until
        );
        let renew = timing(renewed_at, valid_until).next_wake(true);
        assert!(renew >= renewed_at + ttl / 3 && renew < renewed_at + ttl / 3 + step);
        // A renewal due at the very end of the validity does not put off
        // the expiry.
        let close = renewed_at + ttl / 3;
        assert_eq!(timing(renewed_at, close).next_wake(true), close);
    }

    #[derive(Debug)]
    struct Kept;

    #[async_trait::async_trait]
    impl Lease for Kept {
        fn backend(&self) -> &'static str {
            "test"
        }
        async fn extend(&self, _ttl: Duration) -> Result<bool> {
            Ok(true)
        }
        async fn release(&self) -> Result<bool> {
            Ok(true)
        }
    }

    fn guard() -> LockGuard {
        LockGuard::new(
            "signal",
            Arc::new(Kept),
            None,
            Duration::from_secs(30),
            Instant::now(),
            false,
        )
    }

    #[tokio::test]
    async fn the_lost_signal_reaches_futures_made_before_and_after_the_loss() {
        let guard = guard();
        let before = tokio::spawn(guard.lost());
        tokio::task::yield_now().await;
        assert!(!before.is_finished());
        assert!(guard.loss_notifier().mark_lost(LostReason::Revoked));
        assert!(
            !guard.loss_notifier().mark_lost(LostReason::Expired),
            "marked once"
        );
        assert_eq!(before.await.unwrap(), LostReason::Revoked);
        assert_eq!(guard.lost().await, LostReason::Revoked);
        // A future made before the guard went still answers afterwards.
        let kept = guard.lost();
        drop(guard);
        assert_eq!(kept.await, LostReason::Revoked);
    }

    #[tokio::test]
    async fn a_released_holding_is_never_lost_and_its_future_holds_nothing_else() {
        let guard = guard();
        let lost = guard.lost();
        let shared = Arc::downgrade(&guard.shared);
        guard.release().await.unwrap();
        assert!(
            shared.upgrade().is_none(),
            "the future keeps only the signal"
        );
        let outcome = tokio::time::timeout(Duration::from_millis(50), lost).await;
        assert!(outcome.is_err(), "never resolves: {outcome:?}");
    }

    /// Counts its renewals, or panics in them.
    #[derive(Debug, Default)]
    struct Renewing {
        renewals: std::sync::atomic::AtomicUsize,
        panics: bool,
    }

    #[async_trait::async_trait]
    impl Lease for Renewing {
        fn backend(&self) -> &'static str {
            "test"
        }
        async fn extend(&self, _ttl: Duration) -> Result<bool> {
            assert!(!self.panics, "a backend's bug");
            self.renewals
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(true)
        }
        async fn release(&self) -> Result<bool> {
            Ok(true)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_renewal_loses_its_own_holding_and_no_other() {
        let ttl = Duration::from_secs(30);
        let sent = Instant::now();
        let kept = Arc::new(Renewing::default());
        let panicky = Arc::new(Renewing {
            panics: true,
            ..Renewing::default()
        });
        // Made at the same instant: their renewals are due in one batch.
        let good = LockGuard::new("good", kept.clone(), None, ttl, sent, true);
        let bad = LockGuard::new("bad", panicky, None, ttl, sent, true);
        let reason = tokio::time::timeout(ttl / 3 + Duration::from_secs(1), bad.lost())
            .await
            .expect("the panicking holding is marked lost");
        assert_eq!(reason, LostReason::RenewalFailed);
        tokio::time::sleep(ttl).await;
        assert!(!good.is_lost());
        assert!(
            kept.renewals.load(std::sync::atomic::Ordering::SeqCst) >= 3,
            "the other holding of the batch kept renewing"
        );
        good.release().await.unwrap();
    }
}
