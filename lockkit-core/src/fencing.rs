//! Fencing tokens.

use std::fmt;

use crate::error::{LockError, Result};
use crate::lock::DistributedLock;

/// A number that strictly increases from one holder of a lock to the next.
///
/// Pass it with every write to the resource the lock protects, and let the
/// resource reject a write whose token is lower than the last one it accepted.
/// That keeps a holder that was paused past its lease (GC, swap, a stopped VM)
/// from overwriting the work of the holder that came after it — something a lock
/// alone cannot prevent.
///
/// ```
/// use lockkit_core::FencingToken;
/// let older = FencingToken::new(41);
/// let newer = FencingToken::new(42);
/// assert!(older < newer);
/// assert_eq!(newer.get(), 42);
/// assert_eq!(newer.to_string(), "42");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token.
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }

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

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.0
    }
}
