//! The engine shared by lease-based backends (memory, Redis, Redlock, SQL lease rows).
//!
//! A backend implements [`LeaseBackend`]: a handful of primitive, single-round-trip
//! operations on one lock. [`LeaseLock`] turns it into a full
//! [`DistributedLock`]: validation, a per-name local FIFO, the shared wait policy
//! with release notifications, cancellation safety, guards with a watchdog, and
//! tracing.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::capabilities::Capabilities;
use crate::error::{LockError, Result};
use crate::fencing::FencingToken;
use crate::guard::{Lease, LockGuard};
use crate::local_queue::{LocalQueue, LocalSlot};
use crate::lock::DistributedLock;
use crate::notify::ReleaseWatch;
use crate::options::{LockOptions, Wait, clock_drift};
use crate::token::OwnerToken;
use crate::trace::traced_acquire;
use crate::wait::{Attempt, Waiter};

/// The primitive operations of a lease-based backend; see [`LeaseLock`].
///
/// A lock name is checked and mapped into the backend's keyspace once per
/// acquisition ([`key`](Self::key)); every other method works on that key. Each
/// is one atomic step on the server, bounded by the backend's own timeouts, and
/// must be safe to cancel at any await point.
#[async_trait::async_trait]
pub trait LeaseBackend: Send + Sync + fmt::Debug + 'static {
    /// A lock name in the backend's keyspace (e.g. the Redis keys of a name).
    type Key: Send + Sync + fmt::Debug + 'static;

    /// The backend's name for logs and errors, e.g. `"redis"`.
    fn backend_name(&self) -> &'static str;

    /// What the backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// Checks `name` — at least with [`validate_name`](crate::validate_name) —
    /// and maps it into the backend's keyspace, injectively.
    fn key(&self, name: &str) -> Result<Self::Key>;

    /// Takes the lock for `owner` for `ttl` if nobody holds it: the fencing
    /// token (if the backend has them) on success, the holder's remaining lease
    /// (if known) otherwise.
    async fn try_lock(
        &self,
        key: &Self::Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt<Option<FencingToken>>>;

    /// Makes `owner`'s lease end `ttl` from now. `Ok(false)`: not `owner`'s.
    async fn extend(&self, key: &Self::Key, owner: &OwnerToken, ttl: Duration) -> Result<bool>;

    /// Deletes `owner`'s lease and wakes waiters. `Ok(false)`: not `owner`'s.
    async fn release(&self, key: &Self::Key, owner: &OwnerToken) -> Result<bool>;

    /// Subscribes to release notifications of the lock. Default: none.
    async fn watch(&self, key: &Self::Key) -> Result<ReleaseWatch> {
        let _ = key;
        Ok(ReleaseWatch::none())
    }
}

/// A [`DistributedLock`] built from a [`LeaseBackend`].
///
/// Tasks of one `LeaseLock` that want the same name queue in a local FIFO and
/// only the head of the queue contends on the backend, so a task that releases
/// and asks again cannot starve the others, and the fairness between clients is
/// the backend's.
pub struct LeaseLock<B> {
    backend: Arc<B>,
    local: LocalQueue,
}

impl<B: LeaseBackend> LeaseLock<B> {
    /// Wraps a backend.
    pub fn new(backend: B) -> Self {
        LeaseLock {
            backend: Arc::new(backend),
            local: LocalQueue::default(),
        }
    }

    /// The backend, for backend-specific operations.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    async fn try_acquire_inner(&self, name: &str, opts: &LockOptions) -> Result<Option<LockGuard>> {
        let key = self.backend.key(name)?;
        opts.validate()?;
        let Some(slot) = self.local.try_enter(name) else {
            return Ok(None);
        };
        let mut waiter = Waiter::new(name, opts);
        let mut grant = Grant::new(&self.backend, name, key, opts);
        Ok(match grant.attempt(&mut waiter).await? {
            Attempt::Acquired(fencing) => Some(grant.into_guard(fencing, slot)),
            Attempt::Busy { .. } => None,
        })
    }

    async fn acquire_inner(&self, name: &str, opts: &LockOptions) -> Result<LockGuard> {
        let key = self.backend.key(name)?;
        opts.validate()?;
        let mut waiter = Waiter::new(name, opts);
        let slot = if opts.get_wait() == Wait::NoWait {
            self.local
                .try_enter(name)
                .ok_or_else(|| waiter.timeout_error())?
        } else {
            waiter.until_deadline(self.local.enter(name)).await?
        };
        let mut grant = Grant::new(&self.backend, name, key, opts);
        let mut watch = None;
        loop {
            match grant.attempt(&mut waiter).await? {
                Attempt::Acquired(fencing) => return Ok(grant.into_guard(fencing, slot)),
                Attempt::Busy { retry_after } => {
                    let key = grant.key.clone();
                    waiter
                        .busy(retry_after, &mut watch, || async move {
                            self.backend.watch(&key).await
                        })
                        .await?
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl<B: LeaseBackend> DistributedLock for LeaseLock<B> {
    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<LockGuard>> {
        let backend = self.backend.backend_name();
        let attempt = self.try_acquire_inner(name, opts);
        traced_acquire("try_acquire", name, backend, attempt, Option::is_some).await
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard> {
        let backend = self.backend.backend_name();
        let acquire = self.acquire_inner(name, opts);
        traced_acquire("acquire", name, backend, acquire, |_| true).await
    }

    fn capabilities(&self) -> Capabilities {
        self.backend.capabilities()
    }

    async fn watch_releases(&self, name: &str) -> Result<ReleaseWatch> {
        self.backend.watch(&self.backend.key(name)?).await
    }
}

impl<B: fmt::Debug> fmt::Debug for LeaseLock<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseLock")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

/// One acquisition in progress: its key, the owner token of its current
/// attempt, and the duty to release whatever the server may have granted when
/// the caller never saw the outcome (an attempt cancelled, timed out or failed
/// in flight).
struct Grant<'a, B: LeaseBackend> {
    backend: &'a Arc<B>,
    name: &'a str,
    key: Arc<B::Key>,
    owner: OwnerToken,
    ttl: Duration,
    auto_renew: bool,
    sent: Instant,
    in_doubt: bool,
}

impl<'a, B: LeaseBackend> Grant<'a, B> {
    fn new(backend: &'a Arc<B>, name: &'a str, key: B::Key, opts: &LockOptions) -> Self {
        Grant {
            backend,
            name,
            key: Arc::new(key),
            owner: OwnerToken::new(),
            ttl: opts.get_ttl(),
            auto_renew: opts.get_auto_renew(),
            sent: Instant::now(),
            in_doubt: false,
        }
    }

    /// One `try_lock`, bounded by the waiter. Every attempt has an owner token
    /// of its own, so that whatever cleans up after one attempt (a rollback
    /// still in flight on a slow server) can never touch the next one's lease.
    async fn attempt(&mut self, waiter: &mut Waiter<'_>) -> Result<Attempt<Option<FencingToken>>> {
        self.owner = OwnerToken::new();
        self.sent = Instant::now();
        self.in_doubt = true;
        let outcome = waiter
            .attempt(self.backend.try_lock(&self.key, &self.owner, self.ttl))
            .await?;
        if let Attempt::Acquired(_) = outcome
            && Instant::now() >= self.sent + self.ttl - clock_drift(self.ttl)
        {
            // Still in doubt: dropping the grant releases the stale lease.
            return Err(LockError::unavailable(
                self.backend.backend_name(),
                format!(
                    "the lease on {:?} was granted after its ttl of {:?} had run out; the backend is too slow for this ttl",
                    self.name, self.ttl
                ),
            ));
        }
        self.in_doubt = false;
        Ok(outcome)
    }

    fn into_guard(self, fencing: Option<FencingToken>, slot: LocalSlot) -> LockGuard {
        let lease = Arc::new(HeldLease {
            backend: self.backend.clone(),
            key: self.key.clone(),
            owner: self.owner.clone(),
        });
        let guard = LockGuard::new(
            self.name,
            lease,
            fencing,
            self.ttl,
            self.sent,
            self.auto_renew,
        );
        guard.attach_slot(slot);
        guard
    }
}

impl<B: LeaseBackend> Drop for Grant<'_, B> {
    fn drop(&mut self) {
        if !self.in_doubt {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let lease = HeldLease {
            backend: self.backend.clone(),
            key: self.key.clone(),
            owner: self.owner.clone(),
        };
        runtime.spawn(async move {
            if let Err(error) = lease.release().await {
                tracing::warn!(lock.key = ?lease.key, %error, "could not release an interrupted acquire; its lease ends with its TTL");
            }
        });
    }
}

/// The lease behind a guard from a [`LeaseLock`].
struct HeldLease<B: LeaseBackend> {
    backend: Arc<B>,
    key: Arc<B::Key>,
    owner: OwnerToken,
}

impl<B: LeaseBackend> fmt::Debug for HeldLease<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldLease")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl<B: LeaseBackend> Lease for HeldLease<B> {
    fn backend(&self) -> &'static str {
        self.backend.backend_name()
    }

    async fn extend(&self, ttl: Duration) -> Result<bool> {
        self.backend.extend(&self.key, &self.owner, ttl).await
    }

    async fn release(&self) -> Result<bool> {
        self.backend.release(&self.key, &self.owner).await
    }
}
