//! Sending one request to every instance in parallel and counting the answers.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use lockkit_core::Result;
use lockkit_redis::RedisInstance;
use tokio::sync::watch;

/// The least time that instances behind (see [`ask`]) are waited for once
/// every other instance has answered.
const BEHIND_GRACE: Duration = Duration::from_millis(1);

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
#[derive(Debug)]
pub(crate) struct Stragglers(Vec<Mutex<Option<Straggler>>>);

/// A request left running in the background, and its lock's channel (one
/// per lock or semaphore name, whatever the kind).
#[derive(Debug)]
struct Straggler {
    lock: String,
    done: watch::Receiver<()>,
}

impl Stragglers {
    /// No request in the background on any of `instances`.
    pub(crate) fn new(instances: usize) -> Self {
        Stragglers((0..instances).map(|_| Mutex::new(None)).collect())
    }

    fn slot(&self, index: usize) -> std::sync::MutexGuard<'_, Option<Straggler>> {
        self.0[index].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The request about `lock` still running in the background on
    /// instance `index`.
    fn running(&self, index: usize, lock: &str) -> Option<watch::Receiver<()>> {
        let mut slot = self.slot(index);
        if slot
            .as_ref()
            .is_some_and(|straggler| has_finished(&straggler.done))
        {
            *slot = None;
        }
        slot.as_ref()
            .filter(|straggler| straggler.lock == lock)
            .map(|straggler| straggler.done.clone())
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
            let before = stragglers.running(index, lock).map(|before| {
                behind.push(index);
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
    let mut votes = Votes {
        answers: Vec::with_capacity(asked.len()),
        failures: Vec::new(),
        late: Vec::new(),
    };
    let mut heard = Vec::with_capacity(asked.len());
    let started = tokio::time::Instant::now();
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    // Once only instances behind are left to answer (see above), they get
    // as long again as the others took (at least `BEHIND_GRACE`), not the
    // rest of `timeout`.
    let mut waiting_for_behind = false;
    loop {
        if (until.decided)(&votes) {
            // Polls every request once (see above), and the answers
            // already in count too: an instance left behind costs its
            // caller a rollback, or a wait before its next request there.
            while let Some(Some((index, answer))) = pending.next().now_or_never() {
                votes.hear(&mut heard, index, answer);
            }
            break;
        }
        if !waiting_for_behind
            && votes.answers.len() >= until.enough
            && !behind.is_empty()
            && asked
                .iter()
                .all(|i| heard.contains(i) || behind.contains(i))
        {
            waiting_for_behind = true;
            let grace = started.elapsed().max(BEHIND_GRACE);
            let cut = deadline.deadline().min(tokio::time::Instant::now() + grace);
            deadline.as_mut().reset(cut);
        }
        tokio::select! {
            biased;
            next = pending.next() => match next {
                None => break,
                Some((index, answer)) => votes.hear(&mut heard, index, answer),
            },
            () = &mut deadline => {
                for &index in asked.iter().filter(|i| !heard.contains(i)) {
                    let why = if behind.contains(&index) {
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
        // A signal for each request left running, fired (its sender
        // dropped) by the task that drives them once it has finished.
        let mut signals = Vec::new();
        for &index in asked.iter().filter(|i| !heard.contains(i)) {
            let (signal, done) = watch::channel(());
            *stragglers.slot(index) = Some(Straggler {
                lock: lock.to_owned(),
                done: done.clone(),
            });
            votes.late.push((index, done));
            signals.push((index, signal));
        }
        runtime.spawn(async move {
            while let Some((index, _)) = pending.next().await {
                signals.retain(|(i, _)| *i != index);
            }
        });
    }
    votes
}
