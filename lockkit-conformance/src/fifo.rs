//! Who gets a released name: where the `fifo` capability is claimed, the
//! waiters in the order they began to wait, whichever client each is on;
//! where waits are notified, a client that was waiting rather than the one
//! that released and asked again at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockkit_core::{DistributedLock, LockError, LockGuard, LockOptions};
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

/// Where waits are notified ([`notified_wait`](lockkit_core::Capabilities::notified_wait))
/// and `status` counts the waiters (or the harness sees them on the
/// server, [`Harness::waiting_clients`]): a client that releases a name
/// and at once asks for it again queues behind a client that was waiting
/// for it, instead of taking it straight back (which, with a critical
/// section of a few round trips, would starve the waiting clients and wake
/// them all for nothing on every release). Backends where neither shows
/// that a client was waiting are not held to it.
pub async fn a_release_goes_to_a_waiting_client(h: &dyn Harness) {
    let releaser = h.client().await;
    if !releaser.capabilities().notified_wait {
        return;
    }
    let name = unique("handoff");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(20))
        .wait_for(Duration::from_secs(30));
    let guard = releaser
        .acquire(&name, &opts)
        .await
        .expect("the first holder takes the lock");
    let counted = releaser.status(&name).await.ok().and_then(|s| s.waiters);
    let seen = counted.is_some() || h.waiting_clients(&name).await.is_some();
    if !seen {
        guard.release().await.expect("the holder releases");
        return;
    }
    let order = Arc::new(Mutex::new(Vec::new()));
    let waiter = h.client().await;
    let waiting = {
        let (name, order, opts) = (name.clone(), order.clone(), opts.clone());
        tokio::spawn(async move {
            let guard = waiter.acquire(&name, &opts).await?;
            order
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push("waiter");
            guard.release().await.map(drop)
        })
    };
    match counted {
        Some(_) => until_queued(releaser.as_ref(), &name, 1).await,
        None => until_seen_waiting(h, &name).await,
    }
    guard.release().await.expect("the holder releases");
    let again = releaser
        .acquire(&name, &opts)
        .await
        .expect("the releaser gets the lock again");
    order
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push("releaser");
    again.release().await.expect("the releaser releases again");
    let waited: Result<(), LockError> = waiting.await.expect("the waiter task");
    waited.expect("the waiter gets the lock");
    let order = order.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(
        order,
        ["waiter", "releaser"],
        "the lock went straight back to the client that released it, not to the client waiting for it"
    );
}

/// Where waits are notified: a client that waited for a name, then
/// released it to a client waiting for it, and does not ask for it again,
/// holds up none of the turns that follow. Once the client it released to
/// lets go at once, a third client gets the lock within a wait far shorter
/// than the leases: a place in line that the release kept for the client
/// (as the Redis backend keeps one, for a next acquisition that comes at
/// once) is given up, and its turn passed on; a lease granted on that turn
/// to nobody would hold the name for its whole ttl.
pub async fn a_client_that_does_not_ask_again_holds_up_no_turn(h: &dyn Harness) {
    let (a, b, c) = (h.client().await, h.client().await, h.client().await);
    if !a.capabilities().notified_wait {
        return;
    }
    let name = unique("no-ask");
    let o = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .wait_for(Duration::from_secs(30));
    let held = held_after_a_wait(&a, &b, &name, &o).await;
    // `b` waits; `a` releases to it and does not ask again; `b` lets go
    // at once.
    let b_waits = {
        let (b, name, o) = (b.clone(), name.clone(), o.clone());
        tokio::spawn(async move {
            let guard = b.acquire(&name, &o).await?;
            guard.release().await.map(drop)
        })
    };
    until_queued(a.as_ref(), &name, 1).await;
    held.release().await.expect("a releases");
    let passed: Result<(), LockError> = b_waits.await.expect("b's task");
    passed.expect("b gets the lock and releases it");
    third_client_gets_the_lock(&c, &name, &o, "a client that did not ask again").await;
}

/// Where waits are notified: a client that waited for a name, then
/// released it to a client waiting for it, and is dropped at once, holds
/// up none of the turns that follow either. Its subscriptions may outlive
/// it for a while (a subscriber lingers for the next wait), so that the
/// server can still tell it a turn that a place kept for it brings; the
/// client gives such places up as it goes. A third client gets the lock
/// within a wait far shorter than the leases.
pub async fn a_dropped_client_holds_up_no_turn(h: &dyn Harness) {
    let (a, b, c) = (h.client().await, h.client().await, h.client().await);
    if !a.capabilities().notified_wait {
        return;
    }
    let name = unique("dropped");
    let o = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .wait_for(Duration::from_secs(30));
    let held = held_after_a_wait(&a, &b, &name, &o).await;
    // `b` waits; `a` releases to it, and the client `a` is dropped.
    let (go, let_go) = tokio::sync::oneshot::channel::<()>();
    let b_waits = {
        let (b, name, o) = (b.clone(), name.clone(), o.clone());
        tokio::spawn(async move {
            let guard = b.acquire(&name, &o).await?;
            let _ = let_go.await;
            guard.release().await.map(drop)
        })
    };
    until_queued(a.as_ref(), &name, 1).await;
    held.release().await.expect("a releases");
    drop(a);
    // `b` lets go once `a` is gone.
    let _ = go.send(());
    let passed: Result<(), LockError> = b_waits.await.expect("b's task");
    passed.expect("b gets the lock and releases it");
    third_client_gets_the_lock(&c, &name, &o, "a client dropped after its release").await;
}

/// `a`'s holding of `name`, taken after waiting once while `b` held it (as
/// a worker does), so that `a` hears its turns.
async fn held_after_a_wait(
    a: &Arc<dyn DistributedLock>,
    b: &Arc<dyn DistributedLock>,
    name: &str,
    o: &LockOptions,
) -> LockGuard {
    let first = b.acquire(name, o).await.expect("the first holder");
    let a_waits = {
        let (a, name, o) = (a.clone(), name.to_owned(), o.clone());
        tokio::spawn(async move { a.acquire(&name, &o).await })
    };
    until_queued(b.as_ref(), name, 1).await;
    first.release().await.expect("the first holder releases");
    a_waits.await.expect("a's task").expect("a gets the lock")
}

/// A third client, `c`, gets `name` within a wait far shorter than the
/// leases of `o`; `who` is what would have held it up.
async fn third_client_gets_the_lock(
    c: &Arc<dyn DistributedLock>,
    name: &str,
    o: &LockOptions,
    who: &str,
) {
    let wait = Duration::from_secs(20);
    let guard = c
        .acquire(name, &o.clone().wait_for(wait))
        .await
        .unwrap_or_else(|e| panic!("{who} held the lock up past {wait:?}: {e}"));
    guard.release().await.expect("the third client releases");
}

/// Where a client watches a name's releases (an active
/// [`watch_releases`](DistributedLock::watch_releases), as its waiters do
/// between tries), a release by another client wakes the watch: a wake-up
/// comes only from a notification, so a backend whose waiters would
/// otherwise find a release only on their next try fails here, and so does
/// one that claims [`notified_wait`](lockkit_core::Capabilities::notified_wait)
/// but gives an inactive watch. (One client watches here: a backend that
/// wakes a bounded few of the watching clients per release wakes it.)
/// Backends with a waiting line on the server (FIFO, or watches that tell turns)
/// hand a release to its head rather than to every watcher, and are left to
/// [`fifo_backends_serve_waiters_in_order`] and the cases of their own.
pub async fn a_release_wakes_the_watchers_of_other_clients(h: &dyn Harness) {
    let holder = h.client().await;
    if holder.capabilities().fifo {
        return;
    }
    let name = unique("woken");
    let guard = holder
        .acquire(&name, &LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .expect("the holder takes the lock");
    let watcher = h.client().await;
    let mut watch = watcher
        .watch_releases(&name)
        .await
        .expect("a watch of the name's releases");
    guard.release().await.expect("the holder releases");
    if watcher.capabilities().notified_wait {
        assert!(
            watch.is_active(),
            "the backend says its waits are notified, but a watch of a held name is not active"
        );
    }
    if !watch.is_active() || watch.tells_turns() {
        return;
    }
    tokio::time::timeout(WAKE_GRACE, watch.changed())
        .await
        .unwrap_or_else(|_| {
            panic!("another client's release did not wake an active watch within {WAKE_GRACE:?}")
        });
}

/// How long [`a_release_wakes_the_watchers_of_other_clients`] gives a
/// release to reach a watch: a notification's trip, with room for a loaded
/// machine.
const WAKE_GRACE: Duration = Duration::from_secs(20);

/// Returns once the harness sees a client waiting for `name` on the
/// server (see [`Harness::waiting_clients`]). Panics if none does within
/// 10 s.
async fn until_seen_waiting(h: &dyn Harness, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = h.waiting_clients(name).await.unwrap_or(0);
        if seen >= 1 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the waiting client never showed on the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
