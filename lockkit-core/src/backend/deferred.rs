//! Deferred starts: run something at an instant, without a task of its own.
//!
//! A guard's watchdog has nothing to do before its first renewal (a third of
//! the TTL) or its expiry, and most holdings end well before either. Spawning
//! a watchdog task for every guard would cost every acquire a cross-thread
//! wake-up, which is more than a whole lock cycle on a fast backend. A guard
//! therefore books its deadlines here, and its watchdog runs only if the
//! guard still holds when a deadline comes.
//!
//! Bookings go to a timer task of the booking thread's runtime: one per
//! thread and kind of booking, found through a thread-local, so that bookings
//! never contend across threads and the timer runs on the clock of the
//! runtime the guard was made in (paused time in tests included). Booking
//! wakes the timer task only when the new deadline is earlier than the one it
//! already sleeps until, so a stream of short holdings wakes it about once
//! per TTL/3. A cancelled booking is removed at once, so the bookings held
//! are those of live guards.
//!
//! The timer hands everything due at one wake-up to [`Due::start`] at once:
//! the watchdogs of a million leases start a few hundred batches a second,
//! not a hundred thousand tasks.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::thread::LocalKey;

use tokio::sync::Notify;
use tokio::time::Instant;

/// What a timer starts: everything due at one wake-up is started together.
pub(crate) trait Due: Send + Sized + 'static {
    /// Starts the bookings whose instant has come (on the timer task, or
    /// while its runtime shuts down).
    fn start(due: Vec<Self>);
}

/// A closure booked by [`spawn_at`].
struct Call(Box<dyn FnOnce() + Send>);

impl Due for Call {
    fn start(due: Vec<Call>) {
        for Call(start) in due {
            start();
        }
    }
}

/// The bookings of one timer task.
pub(crate) struct Timer<T> {
    state: Mutex<State<T>>,
    wake: Notify,
}

struct State<T> {
    bookings: BTreeMap<(Instant, u64), T>,
    next_id: u64,
    /// What the timer task sleeps until: `None` while it waits for a booking.
    sleeping_until: Option<Instant>,
    /// The task is gone (its runtime shut down): book with a new one.
    dead: bool,
    /// How many times the task looked at the bookings.
    #[cfg(test)]
    looks: u64,
}

impl<T> Default for Timer<T> {
    fn default() -> Self {
        Timer {
            state: Mutex::new(State {
                bookings: BTreeMap::new(),
                next_id: 0,
                sleeping_until: None,
                dead: false,
                #[cfg(test)]
                looks: 0,
            }),
            wake: Notify::new(),
        }
    }
}

/// The timer of each thread, for one kind of booking: a `thread_local!`
/// of this type, passed to [`book`].
pub(crate) type Timers<T> = LocalKey<RefCell<Option<Arc<Timer<T>>>>>;

thread_local! {
    static CALLS: RefCell<Option<Arc<Timer<Call>>>> = const { RefCell::new(None) };
}

/// A booking made by [`book`]; [`cancel`](Booking::cancel) it when its start
/// is no longer wanted.
pub(crate) struct Booking<T> {
    timer: Arc<Timer<T>>,
    key: (Instant, u64),
}

impl<T> Booking<T> {
    /// Removes the booking. True if it had not started yet (it never will).
    pub(crate) fn cancel(self) -> bool {
        lock(&self.timer.state).bookings.remove(&self.key).is_some()
    }
}

/// A task booked with [`spawn_at`], not spawned yet.
pub struct ScheduledSpawn(Booking<Call>);

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
    let start = Call(Box::new(move || drop(runtime.spawn(task))));
    book(&CALLS, at, start).map(ScheduledSpawn)
}

/// Starts `item` at `at` (on the timer task of this thread's runtime, for
/// `timers`' kind), unless the booking is cancelled first. `None` outside a
/// tokio runtime.
pub(crate) fn book<T: Due>(timers: &'static Timers<T>, at: Instant, item: T) -> Option<Booking<T>> {
    let timer = timers.with(|slot| {
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
        state.bookings.insert(key, item);
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
async fn run<T: Due>(timer: Arc<Timer<T>>) {
    // Dropped when the runtime shuts down: later bookings go to a new task,
    // and the ones pending here start now (a start spawns on the runtime of
    // its own guard, if that one still runs).
    let _dead = OnDrop(timer.clone());
    loop {
        let (due, next) = {
            let mut state = lock(&timer.state);
            #[cfg(test)]
            {
                state.looks += 1;
            }
            let now = Instant::now();
            let later = state.bookings.split_off(&(now, u64::MAX));
            let due = std::mem::replace(&mut state.bookings, later);
            // With nothing booked, the task keeps the instant it slept
            // toward, if that is still to come: the bookings of holdings
            // that end before their deadline are cancelled before the task
            // looks again, and forgetting the instant would make the next
            // such booking (later than it) wake the task, once per holding.
            // Looking again at that instant costs one wake-up.
            let next = state
                .bookings
                .keys()
                .next()
                .map(|&(at, _)| at)
                .or(state.sleeping_until.filter(|&until| until > now));
            state.sleeping_until = next;
            (due, next)
        };
        if !due.is_empty() {
            T::start(due.into_values().collect());
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

struct OnDrop<T: Due>(Arc<Timer<T>>);

impl<T: Due> Drop for OnDrop<T> {
    fn drop(&mut self) {
        let pending = {
            let mut state = lock(&self.0.state);
            state.dead = true;
            std::mem::take(&mut state.bookings)
        };
        if !pending.is_empty() {
            T::start(pending.into_values().collect());
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

    fn call_at(at: Instant, start: impl FnOnce() + Send + 'static) -> Option<Booking<Call>> {
        book(&CALLS, at, Call(Box::new(start)))
    }

    /// Records the size of each batch it is started in.
    struct Counted(Arc<Mutex<Vec<usize>>>);

    impl Due for Counted {
        fn start(due: Vec<Counted>) {
            if let Some(first) = due.first() {
                lock(&first.0).push(due.len());
            }
        }
    }

    thread_local! {
        static COUNTED: RefCell<Option<Arc<Timer<Counted>>>> = const { RefCell::new(None) };
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_due_at_one_wake_up_starts_together() {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let at = Instant::now() + Duration::from_secs(1);
        for _ in 0..3 {
            book(&COUNTED, at, Counted(batches.clone())).unwrap();
        }
        let cancelled = book(&COUNTED, at, Counted(batches.clone())).unwrap();
        book(
            &COUNTED,
            at + Duration::from_secs(1),
            Counted(batches.clone()),
        )
        .unwrap();
        assert!(cancelled.cancel());
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(*lock(&batches), vec![3, 1]);
    }

    /// Holdings that end long before their deadline: each books a start a
    /// little later than the last and cancels it before the task looks at
    /// the bookings. The task wakes for the first one only.
    #[tokio::test(start_paused = true)]
    async fn short_holdings_do_not_wake_the_task_each() {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let mut timer = None;
        for i in 0..100 {
            let booking = book(
                &COUNTED,
                Instant::now() + Duration::from_secs(10) + Duration::from_millis(i),
                Counted(batches.clone()),
            )
            .unwrap();
            timer.get_or_insert_with(|| booking.timer.clone());
            assert!(booking.cancel());
            tokio::task::yield_now().await;
        }
        let looks = lock(&timer.unwrap().state).looks;
        assert!(looks <= 2, "the task looked {looks} times");
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert!(lock(&batches).is_empty(), "nothing started");
    }

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
        let kept = call_at(at, count(&started)).unwrap();
        let cancelled = call_at(at, count(&started)).unwrap();
        // An earlier booking made while the task sleeps wakes it.
        let _early = call_at(at - Duration::from_secs(5), count(&started)).unwrap();
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
                call_at(Instant::now() + Duration::from_secs(3600), move || {
                    started.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
                tokio::task::yield_now().await;
            });
        }
        assert_eq!(started.load(Ordering::SeqCst), 2);
        assert!(call_at(Instant::now(), || {}).is_none(), "no runtime");
    }
}
