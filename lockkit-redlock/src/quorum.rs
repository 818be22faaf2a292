//! Sending one request to every instance in parallel and counting the answers.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use lockkit_core::Result;
use lockkit_redis::RedisInstance;
use tokio::sync::watch;

/// The least time that instances behind (see [`ask`]) are waited for once
/// every other instance has answered, or once the outcome is decided while
/// they are still answering.
const BEHIND_GRACE: Duration = Duration::from_millis(1);

/// How many of a client's requests about one lock an instance that is
/// still answering may be left with, unanswered, before a decided [`ask`]
/// waits for it.
const MAX_BEHIND: usize = 3;

/// The answers of the instances that answered in time (by instance index), and
/// why the others did not.
#[derive(Debug)]
pub(crate) struct Votes<T> {
    pub(crate) answers: Vec<(usize, T)>,
    pub(crate) failures: Vec<String>,
    /// By instance, the requests still running (in the background) when
    /// [`ask`] returned, each with a signal that fires when it has finished.
    pub(crate) late: Vec<(usize, watch::Receiver<()>)>,
}

impl<T> Votes<T> {
    /// How many answers match.
    pub(crate) fn count(&self, pred: impl Fn(&T) -> bool) -> usize {
        self.answers.iter().filter(|(_, a)| pred(a)).count()
    }

    /// The instances whose answer matches.
    pub(crate) fn which(&self, pred: impl Fn(&T) -> bool) -> Vec<usize> {
        self.answers
            .iter()
            .filter(|(_, a)| pred(a))
            .map(|(i, _)| *i)
            .collect()
    }

    /// Takes instance `index`'s answer (or failure), noting it in `heard`.
    fn hear(&mut self, heard: &mut Vec<usize>, index: usize, answer: Result<T>) {
        heard.push(index);
        match answer {
            Ok(answer) => self.answers.push((index, answer)),
            Err(error) => self.failures.push(error.to_string()),
        }
    }

    /// The instances that gave no answer (yet).
    pub(crate) fn silent(&self, total: usize) -> Vec<usize> {
        (0..total)
            .filter(|i| !self.answers.iter().any(|(j, _)| j == i))
            .collect()
    }
}

/// Resolves once the request whose signal `done` is has finished (the task
/// that drives it drops the sender then, see [`ask`]).
pub(crate) async fn finished(mut done: watch::Receiver<()>) {
    while done.changed().await.is_ok() {}
}

/// Whether the request whose signal `done` is has finished already.
pub(crate) fn has_finished(done: &watch::Receiver<()>) -> bool {
    done.has_changed().is_err()
}

/// By instance: the last request that [`ask`] left to finish in the
/// background, with the lock it was about, until it has finished.
///
/// A client's two connections to an instance (lockkit-redis's direct one
/// and redis-rs's multiplexed one) do not keep requests in the order they
/// were issued: a request that finds the direct connection busy with one
/// that was issued earlier takes the other and can reach the server first.
/// Where the earlier one is still awaited, that is two concurrent requests;
/// where `ask` returned without it (a release decided by a quorum, its
/// delete to the last instance still on the way), the caller's next request
/// about the same lock to that instance (the next acquire) would overtake
/// it and find the old holding there. One slot per instance keeps this
/// bounded whatever the number of names; a second lock's straggler there
/// replaces the first's (both are then seldom still running).
///
/// Each slot also counts the answers its instance has given (in [`ask`] or
/// in the background): an instance behind that answered meanwhile is alive
/// and catching up, one that did not may be frozen.
#[derive(Clone, Debug)]
pub(crate) struct Stragglers(Arc<[Slot]>);

/// One instance's request in the background, and its answers so far.
#[derive(Debug, Default)]
struct Slot {
    straggler: Mutex<Option<Straggler>>,
    answers: AtomicU64,
}

/// A request left running in the background, and its lock's channel (one
/// per lock or semaphore name, whatever the kind).
#[derive(Debug)]
struct Straggler {
    lock: String,
    done: watch::Receiver<()>,
    /// How many of the client's requests to the instance about `lock` are
    /// still running, this one and those it waits for (each for the one
    /// before): one count that they share, less one as each finishes.
    backlog: Arc<AtomicUsize>,
}

/// A request left running in the background: its instance, its signal
/// (fired by dropping it, once it has finished) and its backlog's count.
struct Running {
    index: usize,
    _signal: watch::Sender<()>,
    backlog: Arc<AtomicUsize>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.backlog.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Stragglers {
    /// No request in the background on any of `instances`.
    pub(crate) fn new(instances: usize) -> Self {
        Stragglers((0..instances).map(|_| Slot::default()).collect())
    }

    fn slot(&self, index: usize) -> std::sync::MutexGuard<'_, Option<Straggler>> {
        self.0[index]
            .straggler
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The answers instance `index` has given so far (failures not
    /// counted: a frozen instance's requests fail on their timeouts).
    fn answers(&self, index: usize) -> u64 {
        self.0[index].answers.load(Ordering::Relaxed)
    }

    /// Counts `answer` of instance `index`, if it is one.
    fn count<T>(&self, index: usize, answer: &Result<T>) {
        if answer.is_ok() {
            self.0[index].answers.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The request about `lock` still running in the background on
    /// instance `index`.
    fn running(&self, index: usize, lock: &str) -> Option<(watch::Receiver<()>, Arc<AtomicUsize>)> {
        let mut slot = self.slot(index);
        if slot
            .as_ref()
            .is_some_and(|straggler| has_finished(&straggler.done))
        {
            *slot = None;
        }
        slot.as_ref()
            .filter(|straggler| straggler.lock == lock)
            .map(|straggler| (straggler.done.clone(), Arc::clone(&straggler.backlog)))
    }
}

/// When [`ask`] may stop collecting answers: once `decided` says the rest
/// cannot change the outcome, or once `enough` answered and only instances
/// behind are left (see [`ask`]).
pub(crate) struct Until<D> {
    pub(crate) decided: D,
    pub(crate) enough: usize,
}

/// Sends `request` to the given instances at once and collects the answers
/// that arrive within `timeout`, until all are in or `until.decided` says
/// the rest cannot change the outcome (asked before any answer too: a rollback
/// waits for no one when nothing granted).
///
/// Three properties keep requests to one instance in program order and make
/// sure each one is sent:
///
/// * every request is first polled here, in the caller's task, which queues it
///   on its instance's connection before anything asked later;
/// * a request is never dropped while it is queued (redis-rs then discards it,
///   and a release would silently never reach a slow instance): `timeout`
///   bounds how long this waits for answers, and requests still pending then
///   are driven to completion by a background task, bounded only by the
///   instance's own command timeout;
/// * a request to an instance where such a background request about the
///   same `lock` (its channel) is still running (see [`Stragglers`]) is sent
///   once that one has finished, or after `timeout` (an instance that slow
///   does not answer in time anyway, and a frozen one must not make a chain
///   of requests each waiting for the one before).
///
/// Such an instance is *behind*: it has not answered the last request about
/// `lock` yet. Once every other instance asked has answered, and at least
/// `until.enough` of them (the caller's quorum: so many answers make an
/// outcome, if not the one asked for), the instances behind are waited for
/// only as long again as the others took (at least [`BEHIND_GRACE`]), not
/// for the rest of `timeout`: a frozen instance answers nothing, and waiting
/// it out changed no outcome. (With fewer answers, an instance behind
/// because it is busy with the same client's other requests about the lock
/// is waited for: cutting it short would make the outcome `Unavailable`.)
/// Without this, a writer whose answers split evenly among the live
/// instances of five (two grants and two refusals, one instance frozen)
/// waited out the timeout on every attempt, and a name under contention
/// changed hands many times more slowly while one instance of five was
/// frozen.
///
/// Once the outcome is decided, the answers that arrived meanwhile count,
/// and on a current-thread runtime once more after one turn of it (it then
/// polls its I/O driver and runs the tasks that drive this client's earlier
/// requests): there the answers of the last instance, and of the request
/// before it, are seldom read before the decision (a multi-thread
/// runtime's other workers read them meanwhile).
/// Then an instance behind by [`MAX_BEHIND`] of this client's requests
/// about `lock` that has answered any request since this one began (it is
/// alive, working through them) is waited for, as long again as the
/// decision took (at least [`BEHIND_GRACE`]); a frozen one, which answers
/// nothing, is not, nor is one behind by fewer. Without these, an instance
/// that once answered late could stay behind for good on a client that
/// locks and releases in a loop: each request to it waited for the one
/// before, each decision was made without it, and the line of requests to
/// it grew (40 deep after a few thousand cycles on a current-thread
/// runtime), until a `try_acquire` of a free lock that needed its vote was
/// refused. (Without the turn, about one request in ten waited for it
/// there.)
pub(crate) async fn ask<T, F, Fut>(
    instances: &[RedisInstance],
    stragglers: &Stragglers,
    lock: &str,
    which: impl IntoIterator<Item = usize>,
    timeout: Duration,
    request: F,
    until: Until<impl Fn(&Votes<T>) -> bool>,
) -> Votes<T>
where
    T: Send + 'static,
    F: FnMut(usize, RedisInstance) -> Fut,
    Fut: Future<Output = Result<T>> + Send + 'static,
{
    let mut request = request;
    let asked: Vec<usize> = which.into_iter().collect();
    let mut behind = Vec::new();
    let mut pending: FuturesUnordered<_> = asked
        .iter()
        .map(|&index| {
            // Boxed, and so is the wait for a request before it: each
            // instance's task then holds two pointers, not the request's
            // future (over a kilobyte) beside a timer's, and stays small
            // enough for the allocator's per-thread cache.
            let answer = Box::pin(request(index, instances[index].clone()));
            let before = stragglers.running(index, lock).map(|(before, backlog)| {
                behind.push((index, backlog));
                // Bounded: see above.
                Box::pin(tokio::time::timeout(timeout, finished(before)))
            });
            async move {
                if let Some(before) = before {
                    let _ = before.await;
                }
                (index, answer.await)
            }
        })
        .collect();
    // What the instances far behind had answered before this request.
    let far_behind: Vec<(usize, u64)> = behind
        .iter()
        .filter(|(_, backlog)| backlog.load(Ordering::Relaxed) >= MAX_BEHIND)
        .map(|(index, _)| (*index, stragglers.answers(*index)))
        .collect();
    let is_behind = |index: &usize| behind.iter().any(|(i, _)| i == index);
    let mut votes = Votes {
        answers: Vec::with_capacity(asked.len()),
        failures: Vec::new(),
        late: Vec::new(),
    };
    let mut heard = Vec::with_capacity(asked.len());
    let hear = |votes: &mut Votes<T>, heard: &mut Vec<usize>, index, answer| {
        stragglers.count(index, &answer);
        votes.hear(heard, index, answer);
    };
    let started = tokio::time::Instant::now();
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    // Once only instances behind are left to answer (see above), they get
    // as long again as the others took (at least `BEHIND_GRACE`), not the
    // rest of `timeout`.
    let mut waiting_for_behind = false;
    // Once decided: the instances far behind that are still answering,
    // waited for (see above).
    let mut catching_up: Option<Vec<usize>> = None;
    loop {
        if catching_up.is_none() && (until.decided)(&votes) {
            // Polls every request once (see above), and the answers
            // already in count too: an instance left behind costs its
            // caller a rollback, or a wait before its next request there.
            while let Some(Some((index, answer))) = pending.next().now_or_never() {
                hear(&mut votes, &mut heard, index, answer);
            }
            if !pending.is_empty() && on_current_thread() {
                // Once more after a turn of the runtime (see above).
                tokio::task::yield_now().await;
                while let Some(Some((index, answer))) = pending.next().now_or_never() {
                    hear(&mut votes, &mut heard, index, answer);
                }
            }
            let alive: Vec<usize> = far_behind
                .iter()
                .filter(|&&(index, before)| {
                    !heard.contains(&index) && stragglers.answers(index) != before
                })
                .map(|&(index, _)| index)
                .collect();
            if alive.is_empty() {
                break;
            }
            cut_to_grace(deadline.as_mut(), started);
            catching_up = Some(alive);
        }
        if let Some(alive) = &catching_up {
            if alive.iter().all(|i| heard.contains(i)) {
                break;
            }
        } else if !waiting_for_behind
            && votes.answers.len() >= until.enough
            && !behind.is_empty()
            && asked.iter().all(|i| heard.contains(i) || is_behind(i))
        {
            waiting_for_behind = true;
            cut_to_grace(deadline.as_mut(), started);
        }
        tokio::select! {
            biased;
            next = pending.next() => match next {
                None => break,
                Some((index, answer)) => hear(&mut votes, &mut heard, index, answer),
            },
            () = &mut deadline => {
                if catching_up.is_some() {
                    // Decided: those still behind finish in the background.
                    break;
                }
                for &index in asked.iter().filter(|i| !heard.contains(i)) {
                    let why = if is_behind(&index) {
                        "behind (an earlier request about this lock is unanswered)".to_owned()
                    } else {
                        format!("no reply within {timeout:?}")
                    };
                    votes
                        .failures
                        .push(format!("{}: {why}", instances[index].address()));
                }
                break;
            }
        }
    }
    if !pending.is_empty()
        && let Ok(runtime) = tokio::runtime::Handle::try_current()
    {
        // Each request left running, dropped by the task that drives them
        // once it has finished.
        let mut running = Vec::new();
        let stragglers = stragglers.clone();
        for &index in asked.iter().filter(|i| !heard.contains(i)) {
            let (signal, done) = watch::channel(());
            // The backlog of the request this one waits for, if any.
            let backlog = behind
                .iter()
                .find(|(i, _)| *i == index)
                .map_or_else(Arc::default, |(_, backlog)| Arc::clone(backlog));
            backlog.fetch_add(1, Ordering::Relaxed);
            *stragglers.slot(index) = Some(Straggler {
                lock: lock.to_owned(),
                done: done.clone(),
                backlog: Arc::clone(&backlog),
            });
            votes.late.push((index, done));
            running.push(Running {
                index,
                _signal: signal,
                backlog,
            });
        }
        runtime.spawn(async move {
            while let Some((index, answer)) = pending.next().await {
                stragglers.count(index, &answer);
                running.retain(|r| r.index != index);
            }
        });
    }
    votes
}

/// Brings `deadline` forward, if that is sooner, to as long again from now
/// as has passed since `started` (at least [`BEHIND_GRACE`]): the wait for
/// instances behind.
fn cut_to_grace(deadline: Pin<&mut tokio::time::Sleep>, started: tokio::time::Instant) {
    let grace = started.elapsed().max(BEHIND_GRACE);
    let cut = deadline.deadline().min(tokio::time::Instant::now() + grace);
    deadline.reset(cut);
}

/// Whether this task runs on a current-thread runtime.
fn on_current_thread() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|runtime| {
        runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use lockkit_redis::{RedisConfig, RedisInstance};
    use tokio::time::{Instant, sleep};

    use super::{MAX_BEHIND, Stragglers, Until, Votes, ask};

    /// The others' answer time in [`asks`], and a slower instance's (whole
    /// milliseconds: the timer's resolution).
    const ANSWER: Duration = Duration::from_millis(3);
    const SLOWER: Duration = Duration::from_millis(4);

    /// Counts a request from its creation until it is dropped (answered, or
    /// given up on).
    struct Counted(Arc<AtomicUsize>);

    impl Counted {
        fn new(count: &Arc<AtomicUsize>) -> Counted {
            count.fetch_add(1, Ordering::Relaxed);
            Counted(Arc::clone(count))
        }
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// `cycles` asks in a row about one lock of 3 instances, each decided by
    /// 2 answers, as a client that locks and releases in a loop makes them.
    /// Instances 1 and 2 answer after [`ANSWER`], instance 0 after `first`
    /// (never: `None`). Returns how long each ask took, and the requests to
    /// instance 0 not finished when the last one returned. (No traffic: the
    /// requests only sleep, on the test's paused clock.)
    async fn asks(first: Option<Duration>, cycles: usize) -> (Vec<Duration>, usize) {
        let instances: Vec<RedisInstance> = (1..=3)
            .map(|port| {
                let config = RedisConfig::from_url(&format!("redis://127.0.0.1:{port}"))
                    .expect("a redis URL");
                RedisInstance::connect_lazy(config).expect("a lazy instance")
            })
            .collect();
        let stragglers = Stragglers::new(instances.len());
        let unfinished = Arc::new(AtomicUsize::new(0));
        let mut took = Vec::with_capacity(cycles);
        for _ in 0..cycles {
            let started = Instant::now();
            ask(
                &instances,
                &stragglers,
                "lock",
                0..3,
                Duration::from_secs(1),
                |index, _| {
                    let counted = (index == 0).then(|| Counted::new(&unfinished));
                    async move {
                        let _counted = counted;
                        match (index, first) {
                            (0, Some(after)) => sleep(after).await,
                            (0, None) => std::future::pending().await,
                            _ => sleep(ANSWER).await,
                        }
                        Ok(())
                    }
                },
                Until {
                    decided: |votes: &Votes<()>| votes.answers.len() >= 2,
                    enough: 2,
                },
            )
            .await;
            took.push(started.elapsed());
        }
        (took, unfinished.load(Ordering::Relaxed))
    }

    /// An instance a little slower than the others is left behind by most
    /// decisions, and catches up: no more than [`MAX_BEHIND`] requests to
    /// it wait for one another (they piled up, by one for every four
    /// cycles here, before a decided ask waited for it).
    #[tokio::test(start_paused = true)]
    async fn a_slower_instance_does_not_fall_further_behind() {
        let (took, unfinished) = asks(Some(SLOWER), 200).await;
        assert!(
            unfinished <= MAX_BEHIND,
            "{unfinished} requests to the slower instance unfinished after 200 asks"
        );
        // The wait for it is as long again as the decision took, at most.
        let slowest = took.iter().max().expect("asks");
        assert!(*slowest <= ANSWER * 2, "an ask took {slowest:?}");
    }

    /// A frozen instance answers nothing: no decided ask waits for it.
    #[tokio::test(start_paused = true)]
    async fn a_frozen_instance_is_not_waited_for() {
        let (took, _) = asks(None, 50).await;
        assert!(
            took.iter().all(|t| *t == ANSWER),
            "each ask is decided by the others' answers: {took:?}"
        );
    }
}
