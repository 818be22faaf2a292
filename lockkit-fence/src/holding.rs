//! Asking the lock service itself (Chubby's `CheckSequencer`): is this token
//! still the current holding of the name?

use lockkit_core::{DistributedLock, FencingToken, LockError};

/// Whether `token` is the fencing token of the current holding of `name`
/// on `locks`: `Ok(false)` once the name is free or held by a later holder.
/// The same as [`FencingToken::is_current`].
///
/// This answers for one moment: a holding may end right after. A store
/// that keeps a fence (SQL, Redis, etcd: see the crate docs) refuses a
/// stale write atomically with it, which this cannot. Use it where the
/// resource cannot keep a fence, as Chubby's servers did.
///
/// Fails with [`LockError::Unsupported`] where the backend cannot tell: it
/// reports no status, or no token for the holding it reports (Redlock; SQL
/// session modes; shared holdings and semaphores).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockkit_core::Result<()> {
/// use lockkit_core::{DistributedLock, LockOptions, MemoryLock, MemoryStore};
///
/// let locks = MemoryLock::with_store(MemoryStore::new());
/// let guard = locks.acquire("report", &LockOptions::new()).await?;
/// let token = guard.fencing_token().expect("memory locks fence");
/// assert!(lockkit_fence::is_current(&locks, "report", token).await?);
/// guard.release().await?;
/// assert!(!lockkit_fence::is_current(&locks, "report", token).await?);
/// # Ok(()) }
/// ```
pub async fn is_current(
    locks: &(impl DistributedLock + ?Sized),
    name: &str,
    token: FencingToken,
) -> Result<bool, LockError> {
    token.is_current(locks, name).await
}
