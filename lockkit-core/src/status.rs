//! What a backend can tell about a lock without taking it.

use std::fmt;
use std::time::Duration;

use crate::fencing::FencingToken;

/// The state of a lock as its backend reports it, without taking the lock;
/// see [`DistributedLock::status`](crate::DistributedLock::status).
///
/// `held` is always known. The other fields are `None` where the backend
/// cannot tell: a session lock (ZooKeeper, SQL `row`/`advisory`/`named`) has
/// no server-side TTL, a Redlock holding has no fencing token, and only
/// servers that queue waiters can count them.
///
/// The answer is a snapshot: by the time the caller reads it, the lock may
/// have changed hands. Use it for monitoring and scripts, never to decide
/// whether it is safe to go ahead without the lock.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockkit_core::Result<()> {
/// use lockkit_core::{DistributedLock, LockOptions, MemoryLock};
///
/// let locks = MemoryLock::with_store(lockkit_core::MemoryStore::new());
/// assert!(!locks.status("nightly").await?.held);
/// let guard = locks.acquire("nightly", &LockOptions::new()).await?;
/// let status = locks.status("nightly").await?;
/// assert!(status.held);
/// assert_eq!(status.fencing_token, guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStatus {
    /// Someone holds the lock.
    pub held: bool,
    /// The holder's fencing token, where the backend records it per holding.
    pub fencing_token: Option<FencingToken>,
    /// How long the holder's lease still runs on the server, where the server
    /// keeps a TTL (`Duration::MAX` for a key without expiry, e.g. one set by
    /// hand).
    pub remaining: Option<Duration>,
    /// How many contenders queue behind the holder, where the server queues
    /// them (ZooKeeper, Postgres advisory locks, fair Redis locks, and the
    /// lines of waiting clients of Postgres and SQLite `lease` mode: there
    /// one per waiting client, whose tasks queue among themselves).
    pub waiters: Option<usize>,
    /// The holder's identity ([`LockOptions::holder`](crate::LockOptions::holder));
    /// for shared or semaphore holdings, any one of them. `None` where none
    /// was recorded or the backend cannot tell.
    pub holder: Option<String>,
    /// How many holdings there are (more than one only for shared locks and
    /// semaphores), where the backend can count them.
    pub holders: Option<usize>,
}

impl LockStatus {
    /// A free lock.
    pub const fn free() -> Self {
        LockStatus {
            held: false,
            fencing_token: None,
            remaining: None,
            waiters: None,
            holder: None,
            holders: None,
        }
    }

    /// A held lock about which nothing more is known.
    pub const fn held() -> Self {
        LockStatus {
            held: true,
            fencing_token: None,
            remaining: None,
            waiters: None,
            holder: None,
            holders: None,
        }
    }

    /// With the holder's fencing token.
    pub const fn with_fencing_token(mut self, token: Option<FencingToken>) -> Self {
        self.fencing_token = token;
        self
    }

    /// With the holder's remaining lease.
    pub const fn with_remaining(mut self, remaining: Option<Duration>) -> Self {
        self.remaining = remaining;
        self
    }

    /// With the number of queued contenders.
    pub const fn with_waiters(mut self, waiters: Option<usize>) -> Self {
        self.waiters = waiters;
        self
    }

    /// With the holder's identity.
    pub fn with_holder(mut self, holder: Option<String>) -> Self {
        self.holder = holder;
        self
    }

    /// With the number of holdings.
    pub const fn with_holders(mut self, holders: Option<usize>) -> Self {
        self.holders = holders;
        self
    }
}

impl fmt::Display for LockStatus {
    /// `free`, or `held` followed by whatever else is known, e.g.
    /// `held, fencing token 42, 29.5s left`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.held {
            return f.write_str("free");
        }
        f.write_str("held")?;
        if let Some(token) = self.fencing_token {
            write!(f, ", fencing token {token}")?;
        }
        match self.remaining {
            Some(Duration::MAX) => f.write_str(", no expiry")?,
            Some(left) => write!(f, ", {:.1}s left", left.as_secs_f64())?,
            None => {}
        }
        if let Some(holder) = &self.holder {
            write!(f, ", by {holder:?}")?;
        }
        if let Some(holders) = self.holders.filter(|&n| n != 1) {
            write!(f, ", {holders} holders")?;
        }
        if let Some(waiters) = self.waiters {
            write!(f, ", {waiters} waiting")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display() {
        assert_eq!(LockStatus::free().to_string(), "free");
        assert_eq!(LockStatus::held().to_string(), "held");
        let full = LockStatus::held()
            .with_fencing_token(Some(FencingToken::new(42)))
            .with_remaining(Some(Duration::from_millis(29_540)))
            .with_waiters(Some(3));
        assert_eq!(
            full.to_string(),
            "held, fencing token 42, 29.5s left, 3 waiting"
        );
        let shared = LockStatus::held()
            .with_holder(Some("web-1:42".into()))
            .with_holders(Some(3));
        assert_eq!(shared.to_string(), "held, by \"web-1:42\", 3 holders");
        let forever = LockStatus::held().with_remaining(Some(Duration::MAX));
        assert_eq!(forever.to_string(), "held, no expiry");
    }
}
