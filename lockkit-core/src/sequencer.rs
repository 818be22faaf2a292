//! Asking the lock service whether a token is still the holding of a name
//! (Chubby's `CheckSequencer`).

use crate::error::{LockError, Result};
use crate::fencing::FencingToken;
use crate::lock::DistributedLock;

impl FencingToken {
    /// Whether this token is the fencing token of the current holding of
    /// `name` on `locks` (Chubby's `CheckSequencer`): `Ok(false)` once the
    /// name is free or held by a later holder.
    ///
    /// This answers for one moment: the holding may end right after. A store
    /// that keeps a fence (see `lockkit::fence`) refuses a stale write
    /// atomically with the write, which this cannot; ask the lock service
    /// only where the resource cannot keep a fence.
    ///
    /// Fails with [`LockError::Unsupported`] where the backend cannot tell:
    /// it reports no status, or no token for the holding it reports
    /// (Redlock; SQL session modes; shared holdings and semaphores).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockkit_core::Result<()> {
    /// use lockkit_core::{DistributedLock, LockOptions, MemoryLock, MemoryStore};
    ///
    /// let locks = MemoryLock::with_store(MemoryStore::new());
    /// let guard = locks.acquire("report", &LockOptions::new()).await?;
    /// let token = guard.fencing_token().expect("memory locks fence");
    /// assert!(token.is_current(&locks, "report").await?);
    /// guard.release().await?;
    /// assert!(!token.is_current(&locks, "report").await?);
    /// # Ok(()) }
    /// ```
    pub async fn is_current(
        self,
        locks: &(impl DistributedLock + ?Sized),
        name: &str,
    ) -> Result<bool> {
        let status = locks.status(name).await?;
        if !status.held {
            return Ok(false);
        }
        match status.fencing_token {
            Some(current) => Ok(current == self),
            None => Err(LockError::Unsupported {
                backend: "this backend",
                operation: "report the fencing token of a holding",
            }),
        }
    }
}
