//! The `fifo` capability: a backend that claims it serves the waiters of a
//! held name in the order they began to wait, whichever client each is on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockkit_core::{DistributedLock, LockError, LockOptions};
use tokio::time::Instant;

use super::Harness;
use crate::cases::unique;

/// Waiters queued behind the holder, each on a client of its own.
const WAITERS: usize = 4;
/// Where `status` does not count waiters: how long each waiter is given to
/// reach the server's queue before the next one starts.
const QUEUE_PAUSE: Duration = Duration::from_millis(500);

/// Where [`capabilities().fifo`](lockkit_core::Capabilities::fifo) is
/// claimed: waiters that queue one after another on a held name, each on a
/// client of its own, get the lock in that order once it is released.
/// Backends that do not claim it (whose servers do not queue) are not held
/// to an order.
pub async fn fifo_backends_serve_waiters_in_order(h: &dyn Harness) {
    let holder = h.client().await;
    if !holder.capabilities().fifo {
        return;
    }
    let name = unique("fifo");
    let ttl = Duration::from_secs(20);
    let opts = LockOptions::new().ttl(ttl);
    let guard = holder
        .acquire(&name, &opts.clone().wait_for(Duration::from_secs(10)))
        .await
        .expect("the holder takes the lock");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let client = h.client().await;
        let (own_name, order, opts) = (name.clone(), order.clone(), opts.clone());
        waiters.push(tokio::spawn(async move {
            let guard = client
                .acquire(&own_name, &opts.wait_for(Duration::from_secs(30)))
                .await?;
            order.lock().unwrap_or_else(|p| p.into_inner()).push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await.map(drop)
        }));
        until_queued(holder.as_ref(), &name, i + 1).await;
    }
    guard.release().await.expect("the holder releases");
    for (i, waiter) in waiters.into_iter().enumerate() {
        let done: Result<(), LockError> = waiter.await.expect("a waiter task");
        done.unwrap_or_else(|e| panic!("waiter {i} never got the lock: {e}"));
    }
    let order = order.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(
        order,
        (0..WAITERS).collect::<Vec<_>>(),
        "the waiters were served out of the order they queued in"
    );
}

/// Returns once `n` waiters queue on `name`, where `status` counts them;
/// after a pause of 500 ms where it does not. Panics if they do not within
/// 10 s.
pub async fn until_queued(lock: &dyn DistributedLock, name: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiters = lock.status(name).await.ok().and_then(|s| s.waiters);
        match waiters {
            Some(queued) if queued >= n => return,
            Some(queued) => assert!(
                Instant::now() < deadline,
                "waiter {n} never showed in the queue ({queued} waiting)"
            ),
            None => {
                tokio::time::sleep(QUEUE_PAUSE).await;
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
