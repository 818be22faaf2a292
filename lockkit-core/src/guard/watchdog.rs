//! A guard's watchdog: renewals at a third of the TTL (retried until the
//! validity runs out), and the loss at its end, with no task of its own
//! while it waits.

use std::cell::RefCell;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio::time::Instant;

use super::{Shared, lock};
use crate::backend::deferred::{Booking, Due, Timer};
use crate::lost::LostReason;
use crate::options::clock_drift;

pub(super) struct Timing {
    ttl: Duration,
    valid_until: Instant,
    renewed_at: Instant,
    /// Grant + max hold: no validity reaches past it.
    limit: Option<Instant>,
    /// After a failed renewal: the retry delays, and when the next try is due.
    retry: Option<(crate::backoff::Delays, Instant)>,
}

impl Timing {
    /// A lease granted for `ttl` by a request sent at `sent`: valid until
    /// `sent + ttl` less the drift allowance (see [`clock_drift`]), and
    /// never past `limit` (the max hold's end).
    pub(super) fn granted(sent: Instant, ttl: Duration, limit: Option<Instant>) -> Timing {
        let valid_until = sent + ttl - clock_drift(ttl);
        Timing {
            ttl,
            valid_until: limit.map_or(valid_until, |limit| valid_until.min(limit)),
            renewed_at: sent,
            limit,
            retry: None,
        }
    }

    /// The lease was extended by `ttl` by a request sent at `sent`.
    pub(super) fn extended(&mut self, sent: Instant, ttl: Duration) {
        *self = Timing::granted(sent, ttl, self.limit);
    }

    /// Whether the validity ends at the max hold: no renewal can move it.
    fn at_limit(&self) -> bool {
        self.limit.is_some_and(|limit| self.valid_until >= limit)
    }

    /// Whether `now` is at or past the max hold's end.
    fn limit_reached(&self, now: Instant) -> bool {
        self.limit.is_some_and(|limit| now >= limit)
    }

    pub(super) fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// Why the holding is over at `now`, if its validity has run out: the
    /// max hold reached, renewals that failed until then, or (without
    /// auto-renew) the lease expired.
    pub(super) fn lapsed(&self, now: Instant, auto_renew: bool) -> Option<LostReason> {
        (now >= self.valid_until).then(|| {
            if self.limit_reached(now) {
                LostReason::HoldLimit
            } else if auto_renew {
                LostReason::RenewalFailed
            } else {
                LostReason::Expired
            }
        })
    }

    /// When the watchdog next has something to do: the next renewal (or its
    /// retry) when auto-renew is on, and in any case the end of the validity.
    /// The renewal is put off to the next point of the renewal grid (see
    /// [`on_renewal_grid`]); the expiry is not.
    fn next_wake(&self, auto_renew: bool) -> Instant {
        if auto_renew && !self.at_limit() {
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
pub(super) enum Watchdog {
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
pub(super) struct Step(Weak<Shared>);

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
        tracing::error!(lock.name = %shared.name, lock.backend = shared.lease.backend_name(), "the watchdog's step panicked; the holding is given up as lost");
        shared.mark_lost(LostReason::RenewalFailed);
        shared.stop_watchdog();
    }
}

impl Shared {
    /// Books the watchdog's next deadline on the current runtime, unless the
    /// holding has ended or a booking is in place already. Called when the
    /// guard is made, and by each watchdog step before it ends.
    pub(super) fn schedule(self: &Arc<Self>) {
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
    pub(super) fn replan(self: &Arc<Self>) {
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

    /// Stops the watchdog for good (the holding ends). A running step is
    /// woken to end; a step that stops its own watchdog only wakes itself,
    /// which is harmless.
    pub(super) fn stop_watchdog(&self) {
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
    pub(super) fn cancel_booking(&self) {
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
}

/// How renewals are retried after a failure: full jitter between 10 ms and a
/// tenth of the lease (at most 1 s), so that several retries fit into what is
/// left of the validity and a short outage costs no more than it lasts.
fn retry_backoff(ttl: Duration) -> crate::backoff::Backoff {
    let cap = (ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
    crate::backoff::Backoff::new(Duration::from_millis(10), cap)
}

/// How long a renewal may go unanswered before the holding counts as at
/// risk: a sixth of the lease (half the time from the renewal to the
/// point where the next one would be due), at least 10 ms.
fn overdue_after(ttl: Duration) -> Duration {
    (ttl / 6).max(Duration::from_millis(10))
}

/// Awaits `renewal` until `deadline` (`None` once it passes), marking the
/// holding at risk if it has not answered within [`overdue_after`]. One
/// timer serves both: set for the overdue point, then moved to the
/// deadline.
async fn renew_within<F: Future>(
    shared: &Shared,
    ttl: Duration,
    deadline: Instant,
    renewal: F,
) -> Option<F::Output> {
    let mut renewal = std::pin::pin!(renewal);
    let overdue = (Instant::now() + overdue_after(ttl)).min(deadline);
    let timer = tokio::time::sleep_until(overdue);
    let mut timer = std::pin::pin!(timer);
    loop {
        tokio::select! {
            biased;
            answer = renewal.as_mut() => return Some(answer),
            () = timer.as_mut() => {
                if timer.deadline() >= deadline {
                    return None;
                }
                shared.set_at_risk(true);
                timer.as_mut().reset(deadline);
            }
        }
    }
}

/// One step of the watchdog, at a booked deadline: marks the guard lost
/// once its validity is over (releasing what a session backend still holds),
/// otherwise renews the lease (when auto-renew is on) and books the next
/// deadline. A failed renewal is retried, paced by the lease (see
/// [`retry_backoff`]), until the validity runs out.
async fn watchdog_step(shared: Arc<Shared>) {
    if shared.lost_reason().is_some() {
        shared.stop_watchdog();
        return;
    }
    let now = Instant::now();
    let (ttl, valid_until, renew_due, at_limit, lapsed) = {
        let timing = lock(&shared.timing);
        (
            timing.ttl,
            timing.valid_until,
            timing.renew_due(),
            timing.at_limit(),
            timing.lapsed(now, shared.auto_renew),
        )
    };
    if let Some(reason) = lapsed {
        if shared.mark_lost(reason) {
            shared.end_lost(reason).await;
        }
        shared.stop_watchdog();
        return;
    }
    if shared.auto_renew && !at_limit && now >= renew_due {
        let ops = shared.ops.lock().await;
        if shared.lost_reason().is_some() {
            shared.stop_watchdog();
            return;
        }
        let sent = Instant::now();
        let renewal = shared.lease.extend(shared.server_ttl(ttl));
        match renew_within(&shared, ttl, valid_until, renewal).await {
            Some(Ok(true)) => {
                crate::metrics::renewal(shared.lease.backend_name(), "renewed");
                shared.record_extension(sent, ttl);
                shared.set_at_risk(false);
                tracing::trace!(lock.name = %shared.name, "lease renewed");
            }
            Some(Ok(false)) => {
                crate::metrics::renewal(shared.lease.backend_name(), "refused");
                drop(ops);
                shared.mark_lost(LostReason::Revoked);
                shared.stop_watchdog();
                return;
            }
            Some(Err(error)) => {
                crate::metrics::renewal(shared.lease.backend_name(), "failed");
                shared.set_at_risk(true);
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
            None => {
                crate::metrics::renewal(shared.lease.backend_name(), "failed");
                // The validity ran out while the renewal was in flight; the
                // next step marks the guard lost.
            }
        }
    }
    shared.step_done();
    shared.schedule();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Result;
    use crate::guard::{Lease, LockGuard};

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
            limit: None,
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

    /// Counts its renewals, or panics in them.
    #[derive(Debug, Default)]
    struct Renewing {
        renewals: std::sync::atomic::AtomicUsize,
        panics: bool,
    }

    #[async_trait::async_trait]
    impl Lease for Renewing {
        fn backend_name(&self) -> &'static str {
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
