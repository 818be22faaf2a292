//! `LockGuard`: one holding of a lock, with its watchdog and lost signal.

mod watchdog;

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::local_queue::LocalSlot;
use crate::error::{LockError, Result};
use crate::fencing::FencingToken;
use crate::lost::LostReason;
use crate::options::{HoldBounds, LockOptions, check_ttl};
use watchdog::{Timing, Watchdog};

/// The backend side of one holding: what a [`LockGuard`] calls to extend and
/// release. Backends implement it; users never see it.
#[async_trait::async_trait]
pub trait Lease: Send + Sync + fmt::Debug + 'static {
    /// The backend's name for logs, e.g. `"redis"`.
    fn backend_name(&self) -> &'static str;
    /// Makes the lease end `ttl` from now. `Ok(false)`: the lease is no longer ours.
    async fn extend(&self, ttl: Duration) -> Result<bool>;
    /// Releases the lease if it is still ours. `Ok(false)`: it was not (anymore).
    async fn release(&self) -> Result<bool>;
    /// Ends the holding `after` from now on the server, which keeps the
    /// name taken until then and leaves nothing behind afterwards (a
    /// [`min_hold`](crate::LockOptions::min_hold) released early).
    /// `Ok(false)`: the lease is not ours. The default makes the lease end
    /// `after` from now with [`extend`](Self::extend), right for a server
    /// that expires leases by itself.
    async fn release_after(&self, after: Duration) -> Result<bool> {
        self.extend(after).await
    }
}

/// A holding's lost signal: the reason, once there is one, and the futures
/// of [`LockGuard::lost`] waiting for it. Kept apart from [`Shared`] so that
/// those futures hold this alone, not the holding (its lease, its local
/// slot). A `watch` channel would do the same at about five times the size
/// (its nine `Notify`s), for every held lease.
///
/// It also carries the early warning: whether the holding is at risk, and
/// since when (the same waiters are woken when it becomes so).
#[derive(Default)]
struct LostSignal {
    reason: Mutex<Option<LostReason>>,
    at_risk_since: Mutex<Option<Instant>>,
    waiters: Notify,
}

impl LostSignal {
    fn reason(&self) -> Option<LostReason> {
        *lock(&self.reason)
    }

    fn is_at_risk(&self) -> bool {
        lock(&self.at_risk_since).is_some()
    }

    /// Sets or clears the warning; true if that changed it. Counted in the
    /// metrics: each rise, and the time spent at risk when it clears.
    fn set_at_risk(&self, backend: &'static str, on: bool) -> bool {
        let mut since = lock(&self.at_risk_since);
        match (on, *since) {
            (true, None) => {
                *since = Some(Instant::now());
                drop(since);
                crate::metrics::at_risk(backend);
                self.waiters.notify_waiters();
                true
            }
            (false, Some(from)) => {
                *since = None;
                crate::metrics::at_risk_for(backend, from.elapsed());
                true
            }
            _ => false,
        }
    }

    /// Resolves once the holding is at risk or lost.
    async fn wait_at_risk(&self) {
        loop {
            let notified = self.waiters.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.is_at_risk() || self.reason().is_some() {
                return;
            }
            notified.await;
        }
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
    /// The holding's bounds, when any is set (boxed: most holdings have none).
    bounds: Option<Box<Bounds>>,
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
        lock(&self.timing).valid_until()
    }

    fn record_extension(&self, sent: Instant, ttl: Duration) {
        lock(&self.timing).extended(sent, ttl);
    }

    fn free_slot(&self) {
        drop(lock(&self.slot).take());
    }

    /// The lease length to ask the server for when the guard extends by
    /// `ttl` now: with the lock delay added, and never past the max hold.
    fn server_ttl(&self, ttl: Duration) -> Duration {
        match &self.bounds {
            None => ttl,
            Some(bounds) => bounds.server_ttl(ttl, Instant::now()),
        }
    }

    /// Sets or clears the early warning; see [`LockGuard::is_at_risk`].
    fn set_at_risk(&self, on: bool) {
        // Cleared for good once lost: the loss has been told.
        let on = on && self.lost_reason().is_none();
        if self.lost.set_at_risk(self.lease.backend_name(), on) && on {
            tracing::warn!(lock.name = %self.name, lock.backend = self.lease.backend_name(), "lock at risk: the holding cannot be confirmed right now");
        }
    }

    /// Ends the holding on the server as `end` says, honouring its bounds:
    /// before the min hold's end the name is kept until then; a holding
    /// lost with a lock delay is left to end on the server by itself.
    /// `Ok(false)`: the lease was not ours.
    async fn end_on_server(&self, end: End) -> Result<bool> {
        let bounds = self.bounds.as_deref();
        let now = Instant::now();
        let floor = bounds
            .and_then(Bounds::floor)
            .filter(|floor| *floor > now && end != End::Lost(LostReason::HoldLimit));
        if let Some(floor) = floor {
            let left = floor - now;
            if left >= crate::options::MIN_TTL {
                return self.lease.release_after(left).await;
            }
            tokio::time::sleep_until(floor).await;
        }
        if let End::Lost(reason) = end
            && reason != LostReason::HoldLimit
            && bounds.is_some_and(|b| b.asked.lock_delay.is_some())
        {
            // Its lease, lengthened by the delay, ends on the server.
            return Ok(false);
        }
        self.lease.release().await
    }

    /// Marks the holding lost if its validity has run out and no loss is
    /// recorded yet (a holder that was paused, or whose runtime was busy,
    /// past its lease may come back before its watchdog does); the reason,
    /// if this call marked it. The caller then ends it with
    /// [`end_lost`](Self::end_lost).
    fn lapse(&self) -> Option<LostReason> {
        let reason = lock(&self.timing).lapsed(Instant::now(), self.auto_renew)?;
        self.mark_lost(reason).then_some(reason)
    }

    /// Ends a holding just marked lost for `reason` on the server, as far as
    /// the client still can: for session-based backends this frees the node
    /// or session lock; for lease backends it is a harmless
    /// compare-and-delete, or nothing with a lock delay (the server keeps
    /// the name for it). Bounded: the lease ends by itself anyway.
    async fn end_lost(&self, reason: LostReason) {
        let _ops = self.ops.lock().await;
        let end = self.end_on_server(End::Lost(reason));
        let _ = tokio::time::timeout(LOST_END_TIMEOUT, end).await;
    }

    /// Marks the holding lost; true if this call did it.
    fn mark_lost(&self, reason: LostReason) -> bool {
        let first = self.lost.mark(reason, || {
            crate::metrics::lost(self.lease.backend_name(), reason.label());
        });
        if first {
            self.lost.set_at_risk(self.lease.backend_name(), false);
            tracing::warn!(lock.name = %self.name, lock.backend = self.lease.backend_name(), %reason, "lock lost");
            self.cancel_booking();
            self.free_slot();
        }
        first
    }

    async fn extend(self: &Arc<Self>, ttl: Duration) -> Result<()> {
        // A lapsed holding is lost for good, even where its lease is still
        // on the server (a lock delay keeps it): no extension revives it.
        if let Some(reason) = self.lapse() {
            self.end_lost(reason).await;
        }
        let _ops = self.ops.lock().await;
        if let Some(reason) = self.lost_reason() {
            return Err(LockError::lost(&self.name, reason));
        }
        let sent = Instant::now();
        if self.lease.extend(self.server_ttl(ttl)).await? {
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

/// How long [`Shared::end_lost`] tries before it leaves the lease to end
/// by itself.
const LOST_END_TIMEOUT: Duration = Duration::from_secs(5);

/// How a holding ends, for [`Shared::end_on_server`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// `release`, or the guard dropped.
    Release,
    /// Lost for this reason.
    Lost(LostReason),
}

/// A holding's bounds (see [`LockOptions::max_hold`],
/// [`min_hold`](LockOptions::min_hold), [`lock_delay`](LockOptions::lock_delay))
/// and the grant they count from.
#[derive(Debug)]
struct Bounds {
    asked: HoldBounds,
    granted: Instant,
}

impl Bounds {
    fn of(asked: HoldBounds, granted: Instant) -> Option<Box<Bounds>> {
        asked.any().then(|| Box::new(Bounds { asked, granted }))
    }

    /// Grant + max hold.
    fn limit(&self) -> Option<Instant> {
        self.asked.max_hold.map(|d| self.granted + d)
    }

    /// Grant + min hold.
    fn floor(&self) -> Option<Instant> {
        self.asked.min_hold.map(|d| self.granted + d)
    }

    /// The lease to ask the server for when the guard extends by `ttl` at
    /// `now`.
    fn server_ttl(&self, ttl: Duration, now: Instant) -> Duration {
        let left = self
            .limit()
            .map(|limit| limit.saturating_duration_since(now));
        self.asked.server_ttl_within(ttl, left)
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
    /// `sent_at + ttl - drift` (see [`clock_drift`](crate::options::clock_drift)).
    pub fn new(
        name: &str,
        lease: Arc<dyn Lease>,
        fencing: Option<FencingToken>,
        ttl: Duration,
        sent_at: Instant,
        auto_renew: bool,
    ) -> LockGuard {
        Self::build(
            name,
            lease,
            fencing,
            sent_at,
            ttl,
            auto_renew,
            HoldBounds::default(),
        )
    }

    /// Like [`new`](Self::new), with the TTL, auto-renewal and bounds
    /// ([`max_hold`](LockOptions::max_hold),
    /// [`min_hold`](LockOptions::min_hold),
    /// [`lock_delay`](LockOptions::lock_delay)) of `opts`. The backend asked
    /// the server for [`HoldBounds::server_ttl`] of the TTL at `sent_at`;
    /// the guard renews likewise, ends the holding at its max hold, and
    /// keeps the name until its min hold is over. For backend implementors.
    pub fn granted(
        name: &str,
        lease: Arc<dyn Lease>,
        fencing: Option<FencingToken>,
        sent_at: Instant,
        opts: &LockOptions,
    ) -> LockGuard {
        Self::build(
            name,
            lease,
            fencing,
            sent_at,
            opts.lease_ttl(),
            opts.auto_renews(),
            opts.bounds(),
        )
    }

    fn build(
        name: &str,
        lease: Arc<dyn Lease>,
        fencing: Option<FencingToken>,
        sent_at: Instant,
        ttl: Duration,
        auto_renew: bool,
        bounds: HoldBounds,
    ) -> LockGuard {
        let bounds = Bounds::of(bounds, sent_at);
        let limit = bounds.as_ref().and_then(|b| b.limit());
        let shared = Arc::new(Shared {
            name: name.into(),
            watchdog: Mutex::new(Watchdog::Idle),
            bounds,
            fencing,
            auto_renew,
            lease,
            lost: Arc::default(),
            timing: Mutex::new(Timing::granted(sent_at, ttl, limit)),
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
            crate::metrics::handoff(self.shared.lease.backend_name(), since.elapsed());
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

    /// Whether the holding is at risk: this client cannot confirm it right
    /// now (a renewal failed and is being retried, or is overdue; the
    /// connection or session is down), though its validity has not run out
    /// (Curator's SUSPENDED). It clears when a renewal succeeds; if none
    /// does before [`valid_until`](Self::valid_until), the holding is lost.
    /// False once lost or released.
    pub fn is_at_risk(&self) -> bool {
        self.shared.lost.is_at_risk() && !self.is_lost()
    }

    /// Resolves when the holding becomes at risk (see
    /// [`is_at_risk`](Self::is_at_risk)), or is lost (a loss ends every
    /// risk, so a task that waits only for the warning is not left
    /// waiting). It never resolves for a holding that is released while
    /// confirmed. Like [`lost`](Self::lost) it does not borrow the guard.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockkit_core::Result<()> {
    /// use lockkit_core::{DistributedLock, LockOptions, MemoryLock};
    ///
    /// let guard = MemoryLock::shared().acquire("ledger", &LockOptions::new()).await?;
    /// tokio::select! {
    ///     () = guard.at_risk() => eprintln!("pausing writes: the lock cannot be confirmed"),
    ///     _ = async { /* the work */ } => {}
    /// }
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn at_risk(&self) -> impl Future<Output = ()> + Send + 'static {
        let signal = Arc::clone(&self.shared.lost);
        async move { signal.wait_at_risk().await }
    }

    /// A handle through which the backend can report a loss it notices on its own
    /// (session expiry, a dropped connection). For backend implementors.
    pub fn loss_notifier(&self) -> LossNotifier {
        LossNotifier(Arc::downgrade(&self.shared))
    }

    /// Extends the lease so that it ends `ttl` from now; the watchdog uses `ttl`
    /// from then on. Only the holder can extend: `LockError::Lost` if the lease is
    /// already gone, or its validity has run out (a lost holding stays lost).
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        check_ttl(ttl)?;
        let span = tracing::debug_span!(
            "lockkit.extend",
            lock.name = %self.shared.name,
            lock.backend = self.shared.lease.backend_name(),
            outcome = tracing::field::Empty,
        );
        let result = self.shared.extend(ttl).instrument(span.clone()).await;
        span.record("outcome", outcome(&result));
        result
    }

    /// Releases the lock with an atomic compare-and-delete. `LockError::Lost` if
    /// the lease was already gone (it is never someone else's that gets deleted),
    /// or if its validity has run out (see [`is_lost`](Self::is_lost)): that
    /// holding ended without a release, and a
    /// [`lock_delay`](LockOptions::lock_delay) then keeps the name taken.
    pub async fn release(mut self) -> Result<()> {
        self.stop_watchdog();
        let shared = self.shared.clone();
        let span = tracing::debug_span!(
            "lockkit.release",
            lock.name = %shared.name,
            lock.backend = shared.lease.backend_name(),
            outcome = tracing::field::Empty,
        );
        let result = async {
            // Past its validity the holding ended without a release: a
            // loss, whose lock delay (if asked) keeps the name taken.
            if let Some(reason) = shared.lapse() {
                shared.end_lost(reason).await;
            }
            if let Some(reason) = shared.lost_reason() {
                return Err(LockError::lost(&shared.name, reason));
            }
            let released = {
                let _ops = shared.ops.lock().await;
                shared.end_on_server(End::Release).await?
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
        if self.finished {
            return;
        }
        if let Some(reason) = self.shared.lapse() {
            end_in_background(self.shared.clone(), reason);
        } else if self.shared.lost_reason().is_none() {
            release_in_background(self.shared.clone());
        }
    }
}

/// Spawns [`Shared::end_lost`] for a guard dropped past its validity.
fn end_in_background(shared: Arc<Shared>, reason: LostReason) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move { shared.end_lost(reason).await });
    }
}

/// Spawns a best-effort release that keeps the local slot until it is done.
fn release_in_background(shared: Arc<Shared>) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(async move {
                let _ops = shared.ops.lock().await;
                match shared.end_on_server(End::Release).await {
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
            .field("backend", &self.shared.lease.backend_name())
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

    /// Reports that the holding cannot be confirmed right now (`true`: the
    /// connection or session is down) or can again (`false`); see
    /// [`LockGuard::is_at_risk`].
    pub fn set_at_risk(&self, on: bool) {
        if let Some(shared) = self.0.upgrade() {
            shared.set_at_risk(on);
        }
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Kept;

    #[async_trait::async_trait]
    impl Lease for Kept {
        fn backend_name(&self) -> &'static str {
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
}
