//! Sending one request to every instance in parallel and counting the answers.

use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lockkit_core::Result;
use lockkit_redis::RedisInstance;
use tokio::sync::watch;

/// The answers of the instances that answered in time (by instance index), and
/// why the others did not.
#[derive(Debug)]
pub(crate) struct Votes<T> {
    pub(crate) answers: Vec<(usize, T)>,
    pub(crate) failures: Vec<String>,
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

    /// The instances that gave no answer (yet).
    pub(crate) fn silent(&self, total: usize) -> Vec<usize> {
        (0..total)
            .filter(|i| !self.answers.iter().any(|(j, _)| j == i))
            .collect()
    }
}

/// Resolves once the request that holds `done`'s sender has finished (the
/// sender is dropped with it).
pub(crate) async fn finished(mut done: watch::Receiver<()>) {
    while done.changed().await.is_ok() {}
}

/// Sends `request` to the given instances at once and collects the answers
/// that arrive within `timeout`, until all are in or `decided` says the rest
/// cannot change the outcome.
///
/// Two properties keep requests to one instance in program order and make
/// sure each one is sent:
///
/// * every request is first polled here, in the caller's task, which queues it
///   on its instance's connection before anything asked later;
/// * a request is never dropped while it is queued (redis-rs then discards it,
///   and a release would silently never reach a slow instance): `timeout`
///   bounds how long this waits for answers, and requests still pending then
///   are driven to completion by a background task, bounded only by the
///   instance's own command timeout.
pub(crate) async fn ask<T, F, Fut>(
    instances: &[RedisInstance],
    which: impl IntoIterator<Item = usize>,
    timeout: Duration,
    request: F,
    decided: impl Fn(&Votes<T>) -> bool,
) -> Votes<T>
where
    T: Send + 'static,
    F: FnMut(usize, RedisInstance) -> Fut,
    Fut: Future<Output = Result<T>> + Send + 'static,
{
    let mut request = request;
    let asked: Vec<usize> = which.into_iter().collect();
    let mut pending: FuturesUnordered<_> = asked
        .iter()
        .map(|&index| {
            let answer = request(index, instances[index].clone());
            async move { (index, answer.await) }
        })
        .collect();
    let mut votes = Votes {
        answers: Vec::with_capacity(asked.len()),
        failures: Vec::new(),
    };
    let mut heard = Vec::with_capacity(asked.len());
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            biased;
            next = pending.next() => match next {
                None => break,
                Some((index, answer)) => {
                    heard.push(index);
                    match answer {
                        Ok(answer) => {
                            votes.answers.push((index, answer));
                            if decided(&votes) {
                                break;
                            }
                        }
                        Err(error) => votes.failures.push(error.to_string()),
                    }
                }
            },
            () = &mut deadline => {
                for &index in asked.iter().filter(|i| !heard.contains(i)) {
                    votes.failures.push(format!(
                        "{}: no reply within {timeout:?}",
                        instances[index].address()
                    ));
                }
                break;
            }
        }
    }
    if !pending.is_empty()
        && let Ok(runtime) = tokio::runtime::Handle::try_current()
    {
        runtime.spawn(async move { while pending.next().await.is_some() {} });
    }
    votes
}
