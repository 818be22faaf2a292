//! What a backend leaves on its server once names are released: nothing per
//! name. A service that locks per order or per tenant uses names without
//! end; the server must not keep a key, row or node for each of them.

use std::time::Duration;

use lockkit_core::{DistributedLock, LockOptions};

use super::Harness;
use crate::cases::unique;

/// How many distinct names [`released_names_leave_bounded_storage`] takes.
pub const DISTINCT_NAMES: usize = 2000;

/// How many entries they may leave on the server, in all.
pub const MAX_LEFT: usize = 50;

/// How many acquisitions run at once.
const CONCURRENCY: usize = 8;

/// The kind of the `i`-th name: every kind the client claims, in turn.
fn options_for(i: usize, lock: &dyn DistributedLock) -> LockOptions {
    let caps = lock.capabilities();
    let base = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_for(Duration::from_secs(10));
    match i % 4 {
        1 if caps.shared => base.shared(),
        2 if caps.semaphore => base.semaphore(3),
        _ => base,
    }
}

/// 2 000 distinct names, of every kind the backend holds, taken and released
/// leave at most 50 keys, rows or nodes on the server
/// ([`Harness::stored_entries`]); and fencing tokens of one name keep rising
/// across the clean-up of its storage.
#[allow(clippy::print_stdout, reason = "prints its figure for people")]
pub async fn released_names_leave_bounded_storage(h: &dyn Harness) {
    let client = h.client().await;
    let prefix = unique("bounded");
    let before = h.stored_entries(&prefix).await;
    assert_eq!(before, 0, "nothing is stored under a new prefix");
    let mut tasks = tokio::task::JoinSet::new();
    for first in 0..CONCURRENCY {
        let (client, prefix) = (client.clone(), prefix.clone());
        tasks.spawn(async move {
            for i in (first..DISTINCT_NAMES).step_by(CONCURRENCY) {
                let name = format!("{prefix}/{i}");
                let opts = options_for(i, client.as_ref());
                let guard = client
                    .acquire(&name, &opts)
                    .await
                    .unwrap_or_else(|e| panic!("acquire {name:?} with {opts:?}: {e}"));
                guard
                    .release()
                    .await
                    .unwrap_or_else(|e| panic!("release {name:?}: {e}"));
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a task taking names panicked");
    }
    let left = settled_entries(h, &prefix, MAX_LEFT).await;
    // Shown with `--no-capture`, for a reader of the run (the test
    // harness captures it otherwise).
    println!("bounded storage: {left} entries left after {DISTINCT_NAMES} names");
    assert!(
        left <= MAX_LEFT,
        "{DISTINCT_NAMES} names taken and released left {left} entries on the server \
         (at most {MAX_LEFT} may stay)"
    );

    // Tokens of one name, each taken after the last holding's storage was
    // cleaned up, with both clients (of different connections) in turn.
    let other = h.client().await;
    let fencing = client.capabilities().fencing;
    let name = format!("{prefix}/again");
    let shared = client.capabilities().shared;
    let mut last = None;
    for i in 0..40 {
        let lock = if i % 2 == 0 { &client } else { &other };
        // Writers and readers draw from one sequence (a semaphore of the
        // same name is another namespace, with a sequence of its own).
        let mut opts = options_for(0, lock.as_ref());
        if shared && i % 3 == 1 {
            opts = opts.shared();
        }
        let guard = lock
            .acquire(&name, &opts)
            .await
            .unwrap_or_else(|e| panic!("acquire {name:?} ({i}): {e}"));
        let token = guard.fencing_token();
        guard.release().await.expect("release");
        if !fencing {
            continue;
        }
        let token = token.unwrap_or_else(|| panic!("holding {i} has no fencing token"));
        if let Some(previous) = last {
            assert!(
                token > previous,
                "holding {i}: token {token} after {previous}, across a clean-up"
            );
        }
        last = Some(token);
        if i % 8 == 7 {
            // Long enough for storage kept a little past a release (a
            // counter ahead of the clock, a container node) to go.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let left = settled_entries(h, &name, 2).await;
    assert!(left <= 2, "{left} entries left for one released name");
}

/// How long a release's clean-up that goes on after the release returned
/// may take: Redlock releases on the instances past its quorum in the
/// background.
const CLEAN_UP: Duration = Duration::from_secs(10);

/// The entries stored for `prefix` once at most `max`, or, if they stay
/// more for [`CLEAN_UP`], the last count.
async fn settled_entries(h: &dyn Harness, prefix: &str, max: usize) -> usize {
    let deadline = tokio::time::Instant::now() + CLEAN_UP;
    loop {
        let left = h.stored_entries(prefix).await;
        if left <= max || tokio::time::Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
