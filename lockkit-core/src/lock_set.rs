//! Lock sets: several names taken together, all or nothing.

use tokio::time::Instant;

use crate::error::{LockError, Result};
use crate::guard::LockGuard;
use crate::lock::DistributedLock;
use crate::options::{LockOptions, Wait};

/// Takes every lock of `names` with `opts`, all or nothing.
///
/// The names are deduplicated and taken one at a time in ascending byte
/// order, so two callers whose sets overlap always take their common names
/// in the same order and cannot deadlock each other. One deadline covers the
/// whole set: `opts`' wait (`wait_for`, `no_wait`, `wait_forever`) is the
/// time for all of them together, each name waiting for what is left of it.
/// On a timeout or an error every lock taken so far is released before the
/// error is returned; if the returned future is dropped, the guards taken so
/// far are dropped with it, which releases them (as dropping any
/// [`LockGuard`] does).
///
/// The guards come back in the order the names were taken (sorted,
/// without duplicates). An empty `names` is
/// [`InvalidOptions`](LockError::InvalidOptions).
///
/// ```
/// # async fn demo() -> lockkit_core::Result<()> {
/// use std::time::Duration;
/// use lockkit_core::{LockOptions, MemoryLock, MemoryStore, acquire_all};
///
/// let locks = MemoryLock::with_store(MemoryStore::new());
/// let opts = LockOptions::new().wait_for(Duration::from_secs(5));
/// // Moves stock between two warehouses: both rows, in one order everywhere.
/// let guards = acquire_all(&locks, &["stock/berlin", "stock/amsterdam"], &opts).await?;
/// assert_eq!(guards[0].name(), "stock/amsterdam");
/// for guard in guards {
///     guard.release().await?;
/// }
/// # Ok(())
/// # }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
pub async fn acquire_all(
    locks: &dyn DistributedLock,
    names: &[&str],
    opts: &LockOptions,
) -> Result<Vec<LockGuard>> {
    if names.is_empty() {
        return Err(LockError::invalid_options(
            "acquire_all needs at least one name",
        ));
    }
    opts.validate()?;
    let mut sorted = names.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let deadline = match opts.wait() {
        Wait::For(wait) => Some(Instant::now() + wait),
        Wait::NoWait | Wait::Forever => None,
    };
    let mut guards: Vec<LockGuard> = Vec::with_capacity(sorted.len());
    for name in sorted {
        let this = match deadline {
            // What is left of the one deadline; none left: one try.
            Some(deadline) => opts
                .clone()
                .wait_for(deadline.saturating_duration_since(Instant::now())),
            None => opts.clone(),
        };
        match locks.acquire(name, &this).await {
            Ok(guard) => guards.push(guard),
            Err(error) => {
                release_all(guards).await;
                return Err(error);
            }
        }
    }
    Ok(guards)
}

/// Releases `guards`, newest first; a failed release is logged (the lease
/// still ends with its TTL or session).
async fn release_all(guards: Vec<LockGuard>) {
    for guard in guards.into_iter().rev() {
        let name = guard.name().to_owned();
        if let Err(error) = guard.release().await {
            tracing::warn!(lock.name = %name, %error, "could not release a lock of an incomplete set");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{MemoryLock, MemoryStore};

    #[tokio::test]
    async fn empty_sets_are_refused_and_duplicates_taken_once() {
        let locks = MemoryLock::with_store(MemoryStore::new());
        let opts = LockOptions::new().no_wait();
        let err = acquire_all(&locks, &[], &opts).await.unwrap_err();
        assert!(matches!(err, LockError::InvalidOptions { .. }), "{err}");
        let guards = acquire_all(&locks, &["b", "a", "b"], &opts).await.unwrap();
        let names: Vec<&str> = guards.iter().map(LockGuard::name).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[tokio::test]
    async fn a_busy_name_releases_what_was_taken() {
        let locks = MemoryLock::with_store(MemoryStore::new());
        let opts = LockOptions::new().wait_for(Duration::from_millis(50));
        let held = locks.acquire("c", &opts).await.unwrap();
        let err = acquire_all(&locks, &["a", "b", "c"], &opts)
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }), "{err}");
        for name in ["a", "b"] {
            let free = locks.try_acquire(name, &opts).await.unwrap();
            assert!(free.is_some(), "{name} was left held");
        }
        held.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn one_deadline_covers_the_set() {
        let locks = MemoryLock::with_store(MemoryStore::new());
        let short = LockOptions::new().no_wait();
        let held = [
            locks.acquire("x", &short).await.unwrap(),
            locks.acquire("y", &short).await.unwrap(),
        ];
        let started = Instant::now();
        let opts = LockOptions::new().wait_for(Duration::from_millis(200));
        let err = acquire_all(&locks, &["w", "x", "y"], &opts)
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }), "{err}");
        // Two busy names would take 400 ms with a wait each.
        assert!(
            started.elapsed() < Duration::from_millis(350),
            "{:?}",
            started.elapsed()
        );
        for guard in held {
            guard.release().await.unwrap();
        }
    }
}
