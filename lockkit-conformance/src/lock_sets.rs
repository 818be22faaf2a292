//! The cases of lock sets ([`acquire_all`]): several names taken together,
//! in one order, all or nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockkit_core::{LockOptions, acquire_all};

use super::Harness;
use crate::cases::unique;

/// Two callers on two clients take overlapping sets named in opposite
/// orders, 100 times each, at the same time: neither deadlocks, every set is
/// granted, and no two sets are ever held at once.
pub async fn lock_sets_in_opposite_orders_never_deadlock(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let base = unique("set");
    let names: Vec<String> = ["x", "y", "z"]
        .iter()
        .map(|n| format!("{base}/{n}"))
        .collect();
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_for(Duration::from_secs(30));
    let mut tasks = Vec::new();
    for (client, reversed) in [(a, false), (b, true)] {
        let mut set = names.clone();
        if reversed {
            set.reverse();
        }
        let (inside, most, opts) = (inside.clone(), most.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            let set: Vec<&str> = set.iter().map(String::as_str).collect();
            for round in 0..100 {
                let guards = acquire_all(client.as_ref(), &set, &opts)
                    .await
                    .unwrap_or_else(|e| panic!("round {round} of {set:?}: {e}"));
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                for guard in guards {
                    guard.release().await.expect("release a lock of the set");
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("a caller");
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "two sets were held at once");
}

/// An `acquire_all` cancelled while it waits for its second name leaves
/// nothing held: once the name it waited for is released, every name of
/// the set is free well before the set's leases would have run out. (The
/// probe's wait is bounded by a quarter of those leases, not by how fast
/// the hand-off goes: a release may have reserved the name for the
/// cancelled client a moment before it left the line, and that turn is
/// passed on, or runs out, within a few seconds.)
pub async fn cancelled_lock_set_leaves_nothing(h: &dyn Harness) {
    let (holder, asker, probe) = (h.client().await, h.client().await, h.client().await);
    let base = unique("set-cancel");
    let names: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|n| format!("{base}/{n}"))
        .collect();
    let opts = LockOptions::new().ttl(Duration::from_secs(60));
    let held = holder
        .acquire(&names[1], &opts)
        .await
        .expect("hold the middle name");
    // The client stays: the case is the cancelled set, not a dropped client.
    let asker_client = asker.clone();
    let waiting = {
        let (names, opts) = (names.clone(), opts.clone());
        tokio::spawn(async move {
            let set: Vec<&str> = names.iter().map(String::as_str).collect();
            acquire_all(
                asker.as_ref(),
                &set,
                &opts.wait_for(Duration::from_secs(30)),
            )
            .await
        })
    };
    // Long enough to take the first name and wait for the second.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the set did not wait for its busy name"
    );
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    held.release().await.expect("release the middle name");
    let within = opts.clone().wait_for(Duration::from_secs(15));
    for name in &names {
        let guard = probe
            .acquire(name, &within)
            .await
            .unwrap_or_else(|e| panic!("{name} is still held after the cancelled set: {e}"));
        guard.release().await.expect("release");
    }
    drop(asker_client);
}
