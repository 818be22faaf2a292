//! Deferred starts: run a closure at an instant, without a task of its own.
//!
//! A guard's watchdog has nothing to do before its first renewal (a third of
//! the TTL) or its expiry, and most holdings end well before either. Spawning
//! a watchdog task for every guard would cost every acquire a cross-thread
//! wake-up, which is more than a whole lock cycle on a fast backend. A guard
//! therefore books its first deadline here, and its watchdog task is spawned
//! only if the guard still holds when that deadline comes.
//!
//! Bookings go to a timer task of the booking thread's runtime: one per
//! thread, found through a thread-local, so that bookings never contend across
//! threads and the timer runs on the clock of the runtime the guard was made
//! in (paused time in tests included). Booking wakes the timer task only when
//! the new deadline is earlier than the one it already sleeps until, so a
//! stream of short holdings wakes it about once per TTL/3. A cancelled booking
//! is removed at once, so the bookings held are those of live guards.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;

/// What a booking runs when its instant comes.
type Start = Box<dyn FnOnce() + Send>;

/// The bookings of one timer task.
#[derive(Default)]
struct Timer {
    state: Mutex<State>,
    wake: Notify,
}

#[derive(Default)]
struct State {
    bookings: BTreeMap<(Instant, u64), Start>,
    next_id: u64,
    /// What the timer task sleeps until: `None` while it waits for a booking.
    sleeping_until: Option<Instant>,
    /// The task is gone (its runtime shut down): book with a new one.
    dead: bool,
}

thread_local! {
    static TIMER: RefCell<Option<Arc<Timer>>> = const { RefCell::new(None) };
}

/// A booking made by [`book`]; [`cancel`](Booking::cancel) it when its start
/// is no longer wanted.
pub(crate) struct Booking {
    timer: Arc<Timer>,
    key: (Instant, u64),
}

impl Booking {
    /// Removes the booking. True if it had not started yet (it never will).
    pub(crate) fn cancel(self) -> bool {
        lock(&self.timer.state).bookings.remove(&self.key).is_some()
    }
}

/// A task booked with [`spawn_at`], not spawned yet.
pub struct ScheduledSpawn(Booking);

impl fmt::Debug for ScheduledSpawn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScheduledSpawn")
            .field("at", &self.0.key.0)
            .finish()
    }
}

impl ScheduledSpawn {
    /// Cancels the spawn. True if the task had not been spawned yet (it never
    /// will be; its future is dropped).
    pub fn cancel(self) -> bool {
        self.0.cancel()
    }
}

/// Spawns `task` on the current tokio runtime at `at`, unless the returned
/// [`ScheduledSpawn`] is cancelled first; `None` outside a runtime. For
/// backend implementors: background work that has nothing to do before `at`
/// (a periodic check of a held lock) costs no task, and no cross-thread
/// wake-up, for holdings that end sooner. Dropping the `ScheduledSpawn` does
/// not cancel it. If the runtime shuts down first, the task is dropped.
pub fn spawn_at<F>(at: Instant, task: F) -> Option<ScheduledSpawn>
where
    F: Future<Output = ()> + Send + 'static,
{
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    book(at, move || drop(runtime.spawn(task))).map(ScheduledSpawn)
}

/// Runs `start` at `at` (on the timer task of this thread's runtime), unless
/// the booking is cancelled first. `None` outside a tokio runtime.
pub(crate) fn book(at: Instant, start: impl FnOnce() + Send + 'static) -> Option<Booking> {
    let timer = TIMER.with(|slot| {
        let mut slot = slot.borrow_mut();
        match &*slot {
            Some(timer) if !lock(&timer.state).dead => Some(timer.clone()),
            _ => {
                let runtime = tokio::runtime::Handle::try_current().ok()?;
                let timer = Arc::new(Timer::default());
                runtime.spawn(run(timer.clone()));
                *slot = Some(timer.clone());
                Some(timer)
            }
        }
    })?;
    let (key, wake) = {
        let mut state = lock(&timer.state);
        let key = (at, state.next_id);
        state.next_id += 1;
        state.bookings.insert(key, Box::new(start));
        let wake = state.sleeping_until.is_none_or(|until| at < until);
        if wake {
            // Until the task has looked again, nobody else needs to wake it.
            state.sleeping_until = Some(at);
        }
        (key, wake)
    };
    if wake {
        timer.wake.notify_one();
    }
    Some(Booking { timer, key })
}

/// The timer task: starts the bookings whose instant has come, then sleeps
/// until the next one or until an earlier one is booked.
async fn run(timer: Arc<Timer>) {
    // Dropped when the runtime shuts down: later bookings go to a new task,
    // and the ones pending here start now (a start spawns on the runtime of
    // its own guard, if that one still runs).
    let _dead = OnDrop(timer.clone());
    loop {
        let (due, next) = {
            let mut state = lock(&timer.state);
            let now = Instant::now();
            let later = state.bookings.split_off(&(now, u64::MAX));
            let due = std::mem::replace(&mut state.bookings, later);
            let next = state.bookings.keys().next().map(|&(at, _)| at);
            state.sleeping_until = next;
            (due, next)
        };
        for start in due.into_values() {
            start();
        }
        match next {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = timer.wake.notified() => {}
                }
            }
            None => timer.wake.notified().await,
        }
    }
}

struct OnDrop(Arc<Timer>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        let pending = {
            let mut state = lock(&self.0.state);
            state.dead = true;
            std::mem::take(&mut state.bookings)
        };
        for start in pending.into_values() {
            start();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Short critical sections that cannot leave the data half-updated.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn starts_at_its_instant_unless_cancelled() {
        let started = Arc::new(AtomicUsize::new(0));
        let at = Instant::now() + Duration::from_secs(10);
        let count = |started: &Arc<AtomicUsize>| {
            let started = started.clone();
            move || {
                started.fetch_add(1, Ordering::SeqCst);
            }
        };
        let kept = book(at, count(&started)).unwrap();
        let cancelled = book(at, count(&started)).unwrap();
        // An earlier booking made while the task sleeps wakes it.
        let _early = book(at - Duration::from_secs(5), count(&started)).unwrap();
        assert!(cancelled.cancel());
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(started.load(Ordering::SeqCst), 0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(started.load(Ordering::SeqCst), 1, "the early one");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(started.load(Ordering::SeqCst), 2, "and the kept one");
        assert!(!kept.cancel(), "already started");
    }

    #[tokio::test(start_paused = true)]
    async fn spawn_at_spawns_at_its_instant_unless_cancelled() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let at = Instant::now() + Duration::from_secs(1);
        let (kept, cancelled) = (tx.clone(), tx);
        let _kept = spawn_at(at, async move { kept.send("kept").unwrap() }).unwrap();
        let cancelled = spawn_at(at, async move { cancelled.send("cancelled").unwrap() }).unwrap();
        assert!(cancelled.cancel());
        assert_eq!(rx.recv().await, Some("kept"));
        assert!(Instant::now() >= at);
        // Both senders are gone: the cancelled future was dropped unrun.
        assert_eq!(rx.recv().await, None);
    }

    #[test]
    fn a_new_runtime_gets_a_new_timer_and_pending_starts_run_at_shutdown() {
        let started = Arc::new(AtomicUsize::new(0));
        for _ in 0..2 {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            let started = started.clone();
            runtime.block_on(async move {
                book(Instant::now() + Duration::from_secs(3600), move || {
                    started.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
                tokio::task::yield_now().await;
            });
        }
        assert_eq!(started.load(Ordering::SeqCst), 2);
        assert!(book(Instant::now(), || {}).is_none(), "no runtime");
    }
}
