//! The `DistributedLock` trait.

use std::fmt::Debug;
use std::sync::Arc;

use crate::backend::notify::ReleaseWatch;
use crate::backend::wait::{Attempt, acquire_by_attempts};
use crate::capabilities::Capabilities;
use crate::error::{LockError, Result};
use crate::guard::LockGuard;
use crate::options::{LockKind, LockOptions};
use crate::status::LockStatus;

/// A distributed lock service: one client of one backend.
///
/// Object-safe, so an application can hold an `Arc<dyn DistributedLock>` and
/// swap backends by URL ([`DynDistributedLock`] names the trait object).
///
/// Callers use [`try_acquire`](Self::try_acquire), [`acquire`](Self::acquire) and
/// [`capabilities`](Self::capabilities). Implementors write `try_acquire` and
/// `capabilities`, and may refine the provided `acquire` through two hooks:
/// [`attempt`](Self::attempt) (one try that reports the holder's remaining lease)
/// and [`watch_releases`](Self::watch_releases) (release notifications). Backends
/// whose server queues waiters override `acquire` itself and keep its semantics
/// with a [`Waiter`](crate::backend::Waiter).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockkit_core::Result<()> {
/// use std::{sync::Arc, time::Duration};
/// use lockkit_core::{DistributedLock, LockOptions, MemoryLock};
///
/// let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::shared());
/// let opts = LockOptions::new().ttl(Duration::from_secs(10)).wait_for(Duration::from_secs(1));
/// let guard = locks.acquire("migrate-schema", &opts).await?;
/// assert!(locks.try_acquire("migrate-schema", &opts).await?.is_none());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[async_trait::async_trait]
pub trait DistributedLock: Send + Sync + Debug {
    /// One attempt, no waiting. `Ok(None)` when someone else holds `name`.
    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<LockGuard>>;

    /// Waits as `opts` says; `Err(LockError::Timeout { .. })` once the wait is over.
    ///
    /// Cancellation-safe: dropping the future at any await point leaks no
    /// lease. lockkit's backends take back an attempt dropped in flight in
    /// the background, and while the server does not answer (an outage, in
    /// which the attempt may still land) they keep trying until it answers
    /// or the lease would have run out by itself.
    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard> {
        acquire_by_attempts(
            name,
            opts,
            || self.attempt(name, opts),
            || self.watch_releases(name),
        )
        .await
    }

    /// What this backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// Whether `name` is held, and what else the backend can tell about the
    /// holding (fencing token, remaining lease, queued waiters), without
    /// taking the lock. A snapshot, for monitoring and scripts (`lockkit
    /// status`); see [`LockStatus`].
    ///
    /// Every lockkit backend implements it; the default, for backends that
    /// cannot tell, is [`LockError::Unsupported`].
    async fn status(&self, name: &str) -> Result<LockStatus> {
        let _ = name;
        Err(LockError::Unsupported {
            backend: "this backend",
            operation: "report a lock's status",
        })
    }

    /// Like [`status`](Self::status), for a kind of holding: `Exclusive` and
    /// `Shared` both ask about the reader-writer lock `name` (`holders`
    /// counts its readers while they hold it), `Semaphore { permits }` about
    /// the semaphore `name` (`holders` counts the permits held). Pass the
    /// semaphore's own `permits`: backends that keep permits in numbered
    /// slots (the SQL modes) look at that many slots, and would miss a permit
    /// held in a later one. The default answers about the lock and says
    /// [`LockError::Unsupported`] for a semaphore.
    async fn status_of(&self, name: &str, kind: LockKind) -> Result<LockStatus> {
        match kind {
            LockKind::Semaphore { .. } => Err(LockError::Unsupported {
                backend: "this backend",
                operation: "report a semaphore's status",
            }),
            LockKind::Exclusive | LockKind::Shared => self.status(name).await,
        }
    }

    /// Hook for the provided `acquire`, for backend implementors: one attempt
    /// that says how long the holder keeps the lock. The default calls
    /// [`try_acquire`](Self::try_acquire) and reports no expiry. Applications
    /// call `try_acquire` or `acquire` instead; like `lockkit_core::backend`,
    /// this hook is less stable than the rest of the trait.
    async fn attempt(&self, name: &str, opts: &LockOptions) -> Result<Attempt<LockGuard>> {
        Ok(match self.try_acquire(name, opts).await? {
            Some(guard) => Attempt::Acquired(guard),
            None => Attempt::Busy { retry_after: None },
        })
    }

    /// Hook for the provided `acquire`, for backend implementors: a
    /// subscription to release notifications of `name`. The default has none,
    /// so waiting relies on backoff alone. Applications do not call it; like
    /// `lockkit_core::backend`, this hook is less stable than the rest of the
    /// trait.
    async fn watch_releases(&self, name: &str) -> Result<ReleaseWatch> {
        let _ = name;
        Ok(ReleaseWatch::none())
    }
}

/// The trait object type, as applications hold it: `Arc<DynDistributedLock>`.
pub type DynDistributedLock = dyn DistributedLock;

/// Implements the trait for smart pointers by forwarding every method. The
/// lint makes a method added to the trait later, and not forwarded here, a
/// compile error instead of a silent fall back to its default.
///
/// Each method hands back the pointee's own future, as `async_trait`
/// spells the signature, rather than an `async fn` awaiting it: an
/// application calls its `Arc<dyn DistributedLock>` through this impl, and
/// an `async fn` would box a second future around the backend's on every
/// call.
macro_rules! forward_impl {
    ($($ptr:ty),*) => {$(
        #[async_trait::async_trait]
        #[deny(clippy::missing_trait_methods)]
        impl<T: DistributedLock + ?Sized> DistributedLock for $ptr {
            fn try_acquire<'s, 'n, 'o, 'f>(&'s self, name: &'n str, opts: &'o LockOptions) -> Forwarded<'f, Option<LockGuard>>
            where 's: 'f, 'n: 'f, 'o: 'f, Self: 'f {
                (**self).try_acquire(name, opts)
            }
            fn acquire<'s, 'n, 'o, 'f>(&'s self, name: &'n str, opts: &'o LockOptions) -> Forwarded<'f, LockGuard>
            where 's: 'f, 'n: 'f, 'o: 'f, Self: 'f {
                (**self).acquire(name, opts)
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            fn status<'s, 'n, 'f>(&'s self, name: &'n str) -> Forwarded<'f, LockStatus>
            where 's: 'f, 'n: 'f, Self: 'f {
                (**self).status(name)
            }
            fn status_of<'s, 'n, 'f>(&'s self, name: &'n str, kind: LockKind) -> Forwarded<'f, LockStatus>
            where 's: 'f, 'n: 'f, Self: 'f {
                (**self).status_of(name, kind)
            }
            fn attempt<'s, 'n, 'o, 'f>(&'s self, name: &'n str, opts: &'o LockOptions) -> Forwarded<'f, Attempt<LockGuard>>
            where 's: 'f, 'n: 'f, 'o: 'f, Self: 'f {
                (**self).attempt(name, opts)
            }
            fn watch_releases<'s, 'n, 'f>(&'s self, name: &'n str) -> Forwarded<'f, ReleaseWatch>
            where 's: 'f, 'n: 'f, Self: 'f {
                (**self).watch_releases(name)
            }
        }
    )*};
}

/// The future of a trait method as `async_trait` declares it.
type Forwarded<'f, T> = futures_util::future::BoxFuture<'f, Result<T>>;

forward_impl!(Arc<T>, Box<T>);

/// Compile-time proof that the trait stays object-safe and that the trait
/// object is shareable across tasks.
#[allow(dead_code)]
fn _object_safe(lock: Arc<dyn DistributedLock>) -> impl Send + Sync + 'static {
    fn send_sync<T: Send + Sync + 'static>(t: T) -> T {
        t
    }
    send_sync(lock)
}
