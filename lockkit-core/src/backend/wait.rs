//! The shared wait policy: one deadline, backoff with full jitter, and waking
//! on release notifications or at the holder's expiry.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::local_queue::{LocalQueue, LocalSlot};
use crate::backend::notify::ReleaseWatch;
use crate::backoff::Delays;
use crate::error::{LockError, Result};
use crate::options::{LockOptions, Wait};

/// One try, or a wait: what an acquisition asks of a backend. The one word
/// for it in every engine and backend ([`LeaseBackend::try_lock`](crate::backend::LeaseBackend::try_lock),
/// [`QueueBackend::lock`](crate::backend::QueueBackend::lock)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intent {
    /// `try_acquire`, or `acquire` without a wait: busy is the final answer,
    /// and nothing of the try is left behind.
    Try,
    /// An `acquire` that waits (in the server's queue, or trying again) while
    /// busy, within the waiter's deadline.
    Wait,
}

impl Intent {
    /// What an `acquire` with this wait asks: one try for
    /// [`Wait::NoWait`], a wait otherwise.
    pub fn of(wait: Wait) -> Intent {
        match wait {
            Wait::NoWait => Intent::Try,
            _ => Intent::Wait,
        }
    }
}

/// How long an attempt that started before the deadline may run past it.
/// Together with the final attempt this keeps `Timeout` within `wait + 100 ms`.
pub const DEADLINE_GRACE: Duration = Duration::from_millis(50);

/// Sleep this much past a holder's reported expiry, so the key is gone when we retry.
const EXPIRY_SLACK: Duration = Duration::from_millis(1);

/// The outcome of one attempt to take a lock.
#[derive(Debug)]
pub enum Attempt<T> {
    /// The lock is ours.
    Acquired(T),
    /// Someone else holds it.
    Busy {
        /// How long the holder's lease still runs, when the backend can tell.
        /// The waiter never sleeps past it.
        retry_after: Option<Duration>,
    },
}

/// The state of one `acquire` call under the shared wait policy.
///
/// Backends that override [`DistributedLock::acquire`](crate::DistributedLock::acquire) use it too, so every
/// backend has the same deadline and timeout semantics:
///
/// ```
/// # use lockkit_core::{LockOptions, Result};
/// # use lockkit_core::backend::{Attempt, Waiter, ReleaseWatch};
/// # async fn try_once() -> Result<Attempt<()>> { Ok(Attempt::Acquired(())) }
/// # async fn example() -> Result<()> {
/// let opts = LockOptions::new();
/// let mut waiter = Waiter::new("job", &opts);
/// let mut watch = ReleaseWatch::none();
/// loop {
///     match waiter.attempt(try_once()).await? {
///         Attempt::Acquired(()) => break,
///         Attempt::Busy { retry_after } => waiter.pause(retry_after, &mut watch).await?,
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Waiter<'a> {
    name: &'a str,
    started: Instant,
    deadline: Option<Instant>,
    delays: Delays,
    attempts: u32,
}

impl<'a> Waiter<'a> {
    /// Starts the clock for a wait on `name` as `opts` says.
    pub fn new(name: &'a str, opts: &LockOptions) -> Self {
        let started = Instant::now();
        let deadline = match opts.wait() {
            Wait::NoWait => Some(started),
            // Past the end of time is the same as forever.
            Wait::For(wait) => started.checked_add(wait),
            Wait::Forever => None,
        };
        Waiter {
            name,
            started,
            deadline,
            delays: opts.backoff_policy().delays(),
            attempts: 0,
        }
    }

    /// When the wait ends, if it does.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Whether the deadline has passed.
    pub fn is_over(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// The `Timeout` error of this wait.
    pub fn timeout_error(&self) -> LockError {
        LockError::Timeout {
            name: self.name.to_owned(),
            waited: self.started.elapsed(),
        }
    }

    /// Runs one attempt. The first attempt always runs to completion (bounded by
    /// the backend's own command timeout), so even `no_wait` makes one honest
    /// try; later ones are cut off [`DEADLINE_GRACE`] after the deadline, with
    /// `Timeout`. A cut-off attempt is dropped: it must be cancellation-safe.
    pub async fn attempt<T>(&mut self, attempt: impl Future<Output = Result<T>>) -> Result<T> {
        self.attempts += 1;
        match self.deadline {
            Some(deadline) if self.attempts > 1 => {
                match tokio::time::timeout_at(deadline + DEADLINE_GRACE, attempt).await {
                    Ok(result) => result,
                    Err(_) => Err(self.timeout_error()),
                }
            }
            _ => attempt.await,
        }
    }

    /// This client's turn on `name` in `queue`, waited for until the
    /// deadline. The wait (boxed: it would make every acquisition's future
    /// as large) is set up only when another task of this client has the
    /// turn.
    pub(crate) async fn local_turn(&self, queue: &LocalQueue, name: &str) -> Result<LocalSlot> {
        match queue.try_enter(name) {
            Some(slot) => Ok(slot),
            None => Box::pin(self.until_deadline(queue.enter(name))).await,
        }
    }

    /// Runs a local wait (a queue, a subscription) that must end by the deadline.
    pub async fn until_deadline<T>(&self, wait: impl Future<Output = T>) -> Result<T> {
        match self.deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, wait)
                .await
                .map_err(|_| self.timeout_error()),
            None => Ok(wait.await),
        }
    }

    /// After a busy attempt: `Timeout` if the wait is over; otherwise sleeps
    /// until a release notification, the holder's expiry (`retry_after`), the
    /// next backoff delay or the deadline, whichever comes first. A watch
    /// that [tells turns](ReleaseWatch::tells_turns) leaves the backoff out
    /// when the attempt said when to ask again.
    pub async fn pause(
        &mut self,
        retry_after: Option<Duration>,
        watch: &mut ReleaseWatch,
    ) -> Result<()> {
        let now = Instant::now();
        if self.deadline.is_some_and(|d| now >= d) {
            return Err(self.timeout_error());
        }
        let delay = match retry_after {
            // In line on the server: the turn is announced.
            Some(remaining) if watch.tells_turns() => remaining + EXPIRY_SLACK,
            _ => {
                let delay = self.delays.next().unwrap_or(Duration::from_millis(1));
                retry_after.map_or(delay, |remaining| delay.min(remaining + EXPIRY_SLACK))
            }
        };
        let mut wake = now + delay;
        if let Some(deadline) = self.deadline {
            wake = wake.min(deadline);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = watch.changed() => self.delays.reset(),
        }
        Ok(())
    }
}

impl Waiter<'_> {
    /// After a busy attempt, the whole policy in one call: `Timeout` if the wait
    /// is over; on the first busy attempt without a watch, subscribe with
    /// `subscribe` and return at once when the subscription is live, so that
    /// the caller tries again right away (a release that came before the
    /// subscription is then seen); otherwise [`pause`](Self::pause). (A
    /// watch taken before the first attempt, live already, sees every
    /// release after it: no second attempt.)
    pub async fn busy<F, Fut>(
        &mut self,
        retry_after: Option<Duration>,
        watch: &mut Option<ReleaseWatch>,
        subscribe: F,
    ) -> Result<()>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<ReleaseWatch>>,
    {
        if self.is_over() {
            return Err(self.timeout_error());
        }
        let watch = match watch {
            Some(watch) => watch,
            None => {
                let subscribed = watch.insert(self.until_deadline(subscribe()).await??);
                if subscribed.is_active() {
                    return Ok(());
                }
                subscribed
            }
        };
        self.pause(retry_after, watch).await
    }
}

/// The provided [`DistributedLock::acquire`](crate::DistributedLock::acquire):
/// repeated attempts under the shared wait policy, woken by release
/// notifications. `attempt` makes one try; `subscribe` opens a subscription to
/// the releases of `name` (the trait's
/// [`watch_releases`](crate::DistributedLock::watch_releases)).
///
/// The subscription is made after the first busy attempt and followed at once by
/// another attempt, so a release can never fall between the two unnoticed.
pub async fn acquire_by_attempts<T, A, AF, S, SF>(
    name: &str,
    opts: &LockOptions,
    mut attempt: A,
    mut subscribe: S,
) -> Result<T>
where
    A: FnMut() -> AF,
    AF: Future<Output = Result<Attempt<T>>>,
    S: FnMut() -> SF,
    SF: Future<Output = Result<ReleaseWatch>>,
{
    opts.validate()?;
    let mut waiter = Waiter::new(name, opts);
    let mut watch = None;
    loop {
        let waited = match waiter.attempt(attempt()).await {
            Ok(Attempt::Acquired(held)) => return Ok(held),
            Ok(Attempt::Busy { retry_after }) => {
                waiter.busy(retry_after, &mut watch, &mut subscribe).await
            }
            Err(error) => Err(error),
        };
        if let Err(error) = waited {
            // Giving up: the watch's clean-up runs before the caller hears
            // of it (see `ReleaseWatch::closing_with`).
            if let Some(watch) = watch.take() {
                watch.close().await;
            }
            return Err(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::notify::NotifyHub;

    #[tokio::test(start_paused = true)]
    async fn no_wait_times_out_after_one_attempt() {
        let opts = LockOptions::new().no_wait();
        let mut waiter = Waiter::new("x", &opts);
        let busy: Attempt<()> = waiter
            .attempt(async { Ok(Attempt::Busy { retry_after: None }) })
            .await
            .unwrap();
        assert!(matches!(busy, Attempt::Busy { .. }));
        let err = waiter
            .pause(None, &mut ReleaseWatch::none())
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn pause_never_sleeps_past_holder_expiry() {
        let opts = LockOptions::new().backoff(crate::Backoff::new(
            Duration::from_secs(10),
            Duration::from_secs(10),
        ));
        let mut waiter = Waiter::new("x", &opts);
        let before = Instant::now();
        waiter
            .pause(Some(Duration::from_millis(30)), &mut ReleaseWatch::none())
            .await
            .unwrap();
        assert!(
            before.elapsed() <= Duration::from_millis(31),
            "{:?}",
            before.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pause_wakes_on_notification() {
        let hub = NotifyHub::new();
        let (mut watch, _) = hub.watch("x");
        let opts = LockOptions::new().backoff(crate::Backoff::new(
            Duration::from_secs(10),
            Duration::from_secs(10),
        ));
        let mut waiter = Waiter::new("x", &opts);
        let notifier = hub.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            notifier.notify("x");
        });
        let before = Instant::now();
        waiter.pause(None, &mut watch).await.unwrap();
        // Without the notification the jittered sleep would be uniform in 0..10 s.
        assert!(
            before.elapsed() <= Duration::from_millis(6),
            "{:?}",
            before.elapsed()
        );
    }

    /// A waiter in a server's line sleeps until its place needs asking for
    /// (`retry_after`) or a notification, not on the backoff: a backoff of
    /// at most 1 ms would have it ask again a hundred times in 100 ms.
    #[tokio::test(start_paused = true)]
    async fn a_watch_telling_turns_leaves_the_backoff_out() {
        let hub = NotifyHub::new();
        let opts = LockOptions::new().backoff(crate::Backoff::new(
            Duration::from_millis(1),
            Duration::from_millis(1),
        ));
        let place = Duration::from_millis(100);
        for (turns, slept) in [(false, Duration::from_millis(1)), (true, place)] {
            let (watch, _) = hub.watch("x");
            let mut watch = if turns { watch.telling_turns() } else { watch };
            assert_eq!(watch.tells_turns(), turns);
            let mut waiter = Waiter::new("x", &opts);
            let before = Instant::now();
            waiter.pause(Some(place), &mut watch).await.unwrap();
            assert!(
                before.elapsed() <= slept + EXPIRY_SLACK,
                "turns {turns}: {:?}",
                before.elapsed()
            );
            if turns {
                assert!(before.elapsed() >= place, "{:?}", before.elapsed());
            }
        }
        // A watch that can hear nothing cannot tell turns.
        assert!(!ReleaseWatch::none().telling_turns().tells_turns());
    }

    #[tokio::test(start_paused = true)]
    async fn pause_stops_at_deadline() {
        let opts = LockOptions::new()
            .wait_for(Duration::from_millis(100))
            .backoff(crate::Backoff::new(
                Duration::from_secs(10),
                Duration::from_secs(10),
            ));
        let mut waiter = Waiter::new("x", &opts);
        let mut none = ReleaseWatch::none();
        let mut pauses = 0;
        let err = loop {
            match waiter.pause(None, &mut none).await {
                Ok(()) => pauses += 1,
                Err(e) => break e,
            }
            assert!(pauses < 1000);
        };
        assert!(matches!(err, LockError::Timeout { .. }));
        assert!(waiter.started.elapsed() >= Duration::from_millis(100));
        assert!(waiter.started.elapsed() < Duration::from_millis(101));
    }

    #[tokio::test(start_paused = true)]
    async fn later_attempts_are_cut_at_deadline_plus_grace() {
        let opts = LockOptions::new().wait_for(Duration::from_millis(10));
        let mut waiter = Waiter::new("x", &opts);
        let first: Result<()> = waiter
            .attempt(async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok(())
            })
            .await;
        assert!(first.is_ok(), "the first attempt runs to completion");
        let start = Instant::now();
        let second: Result<()> = waiter.attempt(std::future::pending()).await;
        assert!(matches!(second, Err(LockError::Timeout { .. })));
        assert!(start.elapsed() <= DEADLINE_GRACE);
    }
}
