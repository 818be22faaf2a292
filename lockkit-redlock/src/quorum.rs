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

    /// The instances that gave no answer (failed, timed out, or not awaited).
    pub(crate) fn silent(&self, total: usize) -> Vec<usize> {
        (0..total)
            .filter(|i| !self.answers.iter().any(|(j, _)| j == i))
            .collect()
    }
}

/// Sends `request` to the given instances at once, each bounded by `timeout`,
/// and collects the answers until all are in or `decided` says the rest cannot
/// change the outcome. Requests still in flight then are dropped without being
/// cancelled on the server: one that was already sent still runs there, which
/// every caller must tolerate.
pub(crate) async fn ask<'a, T, F, Fut>(
    instances: &'a [RedisInstance],
    which: impl IntoIterator<Item = usize>,
    timeout: Duration,
    request: F,
    decided: impl Fn(&Votes<T>) -> bool,
) -> Votes<T>
where
    F: Fn(&'a RedisInstance) -> Fut,
    Fut: Future<Output = Result<T>> + 'a,
{
    let request = &request;
    let mut pending: FuturesUnordered<_> = which
        .into_iter()
        .map(|index| {
            let instance = &instances[index];
            async move {
                let answer = tokio::time::timeout(timeout, request(instance)).await;
                (index, instance.address(), answer)
            }
        })
        .collect();
    let mut votes = Votes {
        answers: Vec::with_capacity(instances.len()),
        failures: Vec::new(),
    };
    while let Some((index, address, answer)) = pending.next().await {
        match answer {
            Ok(Ok(answer)) => {
                votes.answers.push((index, answer));
                if decided(&votes) {
                    break;
                }
            }
            Ok(Err(error)) => votes.failures.push(error.to_string()),
            Err(_) => votes
                .failures
                .push(format!("{address}: no reply within {timeout:?}")),
        }
    }
    votes
}
