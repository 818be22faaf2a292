//! Sending one request to every instance in parallel and counting the answers.

use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lockkit_core::Result;
use lockkit_redis::RedisInstance;

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

/// Sends `request` to the given instances at once, each bounded by `timeout`,
/// and collects the answers until all are in or `decided` says the rest cannot
/// change the outcome.
///
/// Requests still pending then are not dropped: redis-rs discards a queued
/// request whose caller went away, so a release would silently never reach a
/// slow instance. They are driven to completion by a background task instead.
pub(crate) async fn ask<T, F, Fut>(
    instances: &[RedisInstance],
    which: impl IntoIterator<Item = usize>,
    timeout: Duration,
    request: F,
    decided: impl Fn(&Votes<T>) -> bool,
) -> Votes<T>
where
    T: Send + 'static,
    F: Fn(RedisInstance) -> Fut,
    Fut: Future<Output = Result<T>> + Send + 'static,
{
    let mut pending: FuturesUnordered<_> = which
        .into_iter()
        .map(|index| {
            let instance = instances[index].clone();
            let answer = tokio::time::timeout(timeout, request(instance.clone()));
            async move { (index, instance, answer.await) }
        })
        .collect();
    let mut votes = Votes {
        answers: Vec::with_capacity(instances.len()),
        failures: Vec::new(),
    };
    while let Some((index, instance, answer)) = pending.next().await {
        match answer {
            Ok(Ok(answer)) => {
                votes.answers.push((index, answer));
                if decided(&votes) {
                    break;
                }
            }
            Ok(Err(error)) => votes.failures.push(error.to_string()),
            Err(_) => votes.failures.push(format!(
                "{}: no reply within {timeout:?}",
                instance.address()
            )),
        }
    }
    if !pending.is_empty()
        && let Ok(runtime) = tokio::runtime::Handle::try_current()
    {
        runtime.spawn(async move { while pending.next().await.is_some() {} });
    }
    votes
}
