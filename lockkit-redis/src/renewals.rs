//! Batched renewals: the leases of one instance renew in one script call
//! per batch, so that their round trips do not grow with the number held.
//!
//! A renewal is queued to a batching task of the instance. The task waits
//! [`LINGER`] after the first renewal of a batch, takes up to
//! [`MAX_BATCH`] queued ones, and runs them as one `EXTEND_MANY` script
//! (each renewal exactly as the single `EXTEND` or `EXTEND_MEMBER` would),
//! with at most [`MAX_IN_FLIGHT`] batches on the wire at once. So a process
//! holding a million leases renewed every ten seconds sends a few hundred
//! calls a second, not a hundred thousand, and one that holds a few sends
//! one call per renewal, [`LINGER`] later than it would alone (a lease's
//! new end is counted from before it was queued, so the wait only makes
//! the guard's view more cautious).
//!
//! Each batch is bounded by the command timeout; a failed batch fails each
//! of its renewals with the batch's error (the guards' watchdogs retry as
//! they would after a failed single renewal). The task is started on the
//! runtime of the first renewal and again if that runtime has gone; it ends
//! with the instance.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockkit_core::{LockError, Result};
use redis::RedisError;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::connection::Connection;
use crate::error::{BACKEND, map_error, timed_out};
use crate::scripts::{Call, SCRIPTS};

/// How long a batch waits for more renewals after its first.
pub(crate) const LINGER: Duration = Duration::from_millis(2);
/// The most renewals in one call (the server runs a call's renewals without
/// serving anyone else: a few hundred microseconds at this size).
pub(crate) const MAX_BATCH: usize = 256;
/// The most batches awaiting their replies at once.
pub(crate) const MAX_IN_FLIGHT: usize = 4;

/// Which kind of lease a renewal extends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// A lock key holding the owner's token.
    Lock,
    /// The owner's member in a sorted set of leases (a reader, a permit).
    Member,
}

/// One lease to renew: its key, fence counter and owner token in one
/// buffer (a renewal allocates once).
#[derive(Debug)]
pub(crate) struct Renewal {
    held: Held,
    text: String,
    fence_at: usize,
    owner_at: usize,
    ttl_ms: u64,
}

impl Renewal {
    pub(crate) fn new(held: Held, key: &str, fence: &str, owner: &str, ttl_ms: u64) -> Renewal {
        let mut text = String::with_capacity(key.len() + fence.len() + owner.len());
        text.push_str(key);
        text.push_str(fence);
        text.push_str(owner);
        Renewal {
            held,
            text,
            fence_at: key.len(),
            owner_at: key.len() + fence.len(),
            ttl_ms,
        }
    }

    pub(crate) fn held(&self) -> Held {
        self.held
    }

    pub(crate) fn key(&self) -> &str {
        &self.text[..self.fence_at]
    }

    pub(crate) fn fence(&self) -> &str {
        &self.text[self.fence_at..self.owner_at]
    }

    pub(crate) fn owner(&self) -> &str {
        &self.text[self.owner_at..]
    }

    pub(crate) fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }
}

type Request = (Renewal, oneshot::Sender<Result<bool>>);

/// A renewal on its way: whether it extended the lease.
pub(crate) type Renewing<'a> = Pin<Box<dyn Future<Output = Result<bool>> + Send + 'a>>;

/// The batching task of one instance, started on first use.
pub(crate) struct Renewals {
    commands: Connection,
    address: Arc<str>,
    timeout: Duration,
    queue: Mutex<Option<mpsc::UnboundedSender<Request>>>,
}

impl Renewals {
    pub(crate) fn new(commands: Connection, address: String, timeout: Duration) -> Renewals {
        Renewals {
            commands,
            address: Arc::from(address),
            timeout,
            queue: Mutex::new(None),
        }
    }

    /// Queues `renewal` for the next batch at once; the future tells
    /// whether it extended the lease (false: the lease is not the owner's)
    /// and holds nothing but the answer's channel, so that the renewals a
    /// slow server has not served yet cost little. Must be called within a
    /// tokio runtime.
    pub(crate) fn renew(&self, renewal: Renewal) -> Renewing<'static> {
        let (reply, answer) = oneshot::channel();
        if let Err(mpsc::error::SendError((renewal, _))) = self.queue().send((renewal, reply)) {
            return Box::pin(std::future::ready(Err(LockError::unavailable(
                BACKEND,
                format!(
                    "renew {:?} on {}: the renewal task has stopped",
                    renewal.key(),
                    self.address
                ),
            ))));
        }
        let address = self.address.clone();
        // Every batch is bounded by the command timeout and answers each of
        // its renewals; a dropped answer means the task's runtime went away.
        Box::pin(async move {
            answer.await.unwrap_or_else(|_| {
                Err(LockError::unavailable(
                    BACKEND,
                    format!("renew on {address}: the renewal task stopped with its runtime"),
                ))
            })
        })
    }

    /// The queue of a running batching task; starts one if none runs.
    fn queue(&self) -> mpsc::UnboundedSender<Request> {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        match &*queue {
            Some(sender) if !sender.is_closed() => sender.clone(),
            _ => {
                let (sender, requests) = mpsc::unbounded_channel();
                tokio::spawn(batching(
                    requests,
                    self.commands.clone(),
                    self.address.clone(),
                    self.timeout,
                ));
                *queue = Some(sender.clone());
                sender
            }
        }
    }
}

/// The batching task: gathers queued renewals into calls until every
/// sender (the instance) is gone.
async fn batching(
    mut requests: mpsc::UnboundedReceiver<Request>,
    commands: Connection,
    address: Arc<str>,
    timeout: Duration,
) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    loop {
        let Ok(slot) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let mut batch = Vec::with_capacity(MAX_BATCH);
        if requests.recv_many(&mut batch, MAX_BATCH).await == 0 {
            return;
        }
        if batch.len() < MAX_BATCH {
            tokio::time::sleep(LINGER).await;
            while batch.len() < MAX_BATCH {
                match requests.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
        }
        let (commands, address) = (commands.clone(), address.clone());
        tokio::spawn(async move {
            send(batch, commands, &address, timeout).await;
            drop(slot);
        });
    }
}

/// Runs one batch and answers each of its renewals.
async fn send(batch: Vec<Request>, mut commands: Connection, address: &str, timeout: Duration) {
    let what = "renew";
    let result = match tokio::time::timeout(timeout, extend_many(&batch, &mut commands)).await {
        Ok(Ok(extended)) if extended.len() == batch.len() => Ok(extended),
        Ok(Ok(extended)) => Err(LockError::backend(
            BACKEND,
            format!(
                "{what} on {address}: {} answers to a batch of {} renewals",
                extended.len(),
                batch.len()
            ),
        )),
        Ok(Err(error)) => Err(map_error(address, what, error)),
        Err(_) => Err(timed_out(address, what, timeout)),
    };
    tracing::trace!(
        redis.address = %address,
        renewals = batch.len(),
        ok = result.is_ok(),
        "renewal batch"
    );
    match result {
        Ok(extended) => {
            for ((_, reply), extended) in batch.into_iter().zip(extended) {
                // A renewal whose guard has gone has nobody to tell.
                let _ = reply.send(Ok(extended == 1));
            }
        }
        Err(error) => {
            let mut replies = batch.into_iter().map(|(_, reply)| reply);
            let last = replies.next_back();
            for reply in replies {
                let _ = reply.send(Err(copy_of(&error)));
            }
            if let Some(reply) = last {
                let _ = reply.send(Err(error));
            }
        }
    }
}

/// One `EVALSHA` of `EXTEND_MANY` for the batch (a [`Call`]: one command,
/// the script loaded first if the server lost it).
async fn extend_many(
    batch: &[Request],
    commands: &mut Connection,
) -> std::result::Result<Vec<i64>, RedisError> {
    let keys = batch.iter().flat_map(|(r, _)| [r.key(), r.fence()]);
    let mut call = Call::new(&SCRIPTS.extend_many, keys);
    for (renewal, _) in batch {
        let held = match renewal.held() {
            Held::Lock => "x",
            Held::Member => "m",
        };
        call.arg(held).arg(renewal.owner()).arg(renewal.ttl_ms());
    }
    call.invoke(commands).await
}

/// The same failure for another renewal of a failed batch (without the
/// client library's error, which only one can own).
fn copy_of(error: &LockError) -> LockError {
    match error {
        LockError::Backend { message, .. } => LockError::backend(BACKEND, message.clone()),
        LockError::Unavailable { message, .. } => LockError::unavailable(BACKEND, message.clone()),
        other => LockError::unavailable(BACKEND, other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use redis::aio::{ConnectionManager, ConnectionManagerConfig};

    use crate::connection::Single;

    use super::*;

    /// What a client keeps per renewal that the server has not answered
    /// yet, beyond the request itself: the future of a batched renewal
    /// holds only its answer's channel (as one `async fn` it was 1 728
    /// bytes). With a million leases and a server that falls behind, there
    /// are hundreds of thousands of them.
    #[tokio::test]
    async fn a_batched_renewal_is_a_small_future() {
        // Nothing listens there: the batch fails, and nothing waits for it.
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let connection = ConnectionManager::new_lazy_with_config(
            client,
            ConnectionManagerConfig::new().set_number_of_retries(0),
        )
        .unwrap();
        let renewals = Renewals::new(
            Connection::Single(Single::new(connection, None)),
            "127.0.0.1:1".to_owned(),
            Duration::from_secs(1),
        );
        let renewal = Renewal::new(
            Held::Lock,
            "{lockkit:a}",
            "{lockkit:a}:fence",
            "owner",
            30_000,
        );
        let renewing = renewals.renew(renewal);
        let size = size_of_val(&*renewing);
        assert!(size <= 64, "a queued renewal's future is {size} bytes");
    }
}
