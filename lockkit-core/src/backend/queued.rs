//! [`QueuedLock`]: the engine of backends whose server queues the waiters.

use std::fmt;

use crate::backend::local_queue::LocalQueue;
use crate::backend::trace::traced_acquire;
use crate::backend::wait::Waiter;
use crate::capabilities::Capabilities;
use crate::error::{LockError, Result};
use crate::guard::LockGuard;
use crate::lock::DistributedLock;
use crate::options::{LockKind, LockOptions, Wait};
use crate::status::LockStatus;

/// The primitive of a backend whose server keeps the queue of waiters
/// (ZooKeeper's sequential nodes, `pg_advisory_lock`, `GET_LOCK`, row
/// locks): join the queue and wait there. [`QueuedLock`] adds the rest, the
/// same for each such backend: the option checks, the shared wait semantics,
/// a per-name local FIFO (so that the tasks of one client queue here, not on
/// the server), and the `lockkit.acquire` span. Only exclusive requests
/// queue locally: readers and permit holders of one client may hold
/// together, so they go to the server's queue at once.
#[async_trait::async_trait]
pub trait QueueBackend: Send + Sync + fmt::Debug + 'static {
    /// The backend's name for logs and errors, e.g. `"zookeeper"`.
    fn backend(&self) -> &'static str;

    /// What this backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// Checks `name` before anything is sent; at least
    /// [`validate_name`](crate::backend::validate_name).
    fn check_name(&self, name: &str) -> Result<()>;

    /// Takes `name` for this caller. With `no_wait`, one try: `Ok(None)` when
    /// someone else holds it, and nothing of the try is left behind. Otherwise
    /// it waits in the server's queue within `waiter`'s deadline, and gives up
    /// with `Ok(None)` or `Err(Timeout)` when the deadline passes. The future
    /// may be dropped at any await point and must then leave nothing held.
    async fn lock(
        &self,
        name: &str,
        opts: &LockOptions,
        waiter: &mut Waiter<'_>,
        no_wait: bool,
    ) -> Result<Option<LockGuard>>;

    /// See [`DistributedLock::status_of`]; only called with kinds the
    /// backend's capabilities claim.
    async fn status(&self, name: &str, kind: LockKind) -> Result<LockStatus>;
}

/// A full [`DistributedLock`] over a [`QueueBackend`].
pub struct QueuedLock<B> {
    backend: B,
    local: LocalQueue,
}

impl<B: fmt::Debug> fmt::Debug for QueuedLock<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuedLock")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl<B: QueueBackend> QueuedLock<B> {
    /// The lock over `backend`.
    pub fn new(backend: B) -> Self {
        QueuedLock {
            backend,
            local: LocalQueue::default(),
        }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    async fn acquire_inner(
        &self,
        name: &str,
        opts: &LockOptions,
        try_only: bool,
    ) -> Result<Option<LockGuard>> {
        self.backend.check_name(name)?;
        opts.validate()?;
        opts.check_supported(self.backend.backend(), &self.backend.capabilities())?;
        let mut waiter = Waiter::new(name, opts);
        let no_wait = try_only || opts.wait() == Wait::NoWait;
        let slot = if opts.kind() != LockKind::Exclusive {
            None
        } else if no_wait {
            match self.local.try_enter(name) {
                Some(slot) => Some(slot),
                None if try_only => return Ok(None),
                None => return Err(waiter.timeout_error()),
            }
        } else {
            Some(waiter.until_deadline(self.local.enter(name)).await?)
        };
        crate::metrics::attempt(self.backend.backend());
        match self.backend.lock(name, opts, &mut waiter, no_wait).await? {
            Some(guard) => {
                if let Some(slot) = slot {
                    guard.attach_slot(slot);
                }
                Ok(Some(guard))
            }
            None if try_only => Ok(None),
            None => Err(waiter.timeout_error()),
        }
    }
}

#[async_trait::async_trait]
impl<B: QueueBackend> DistributedLock for QueuedLock<B> {
    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<LockGuard>> {
        let attempt = self.acquire_inner(name, opts, true);
        traced_acquire(
            "try_acquire",
            name,
            self.backend.backend(),
            attempt,
            Option::is_some,
        )
        .await
    }

    /// The server queues the waiters; the wait ends as `opts` says, with the
    /// same `Timeout` semantics as every backend.
    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard> {
        let acquire = async {
            self.acquire_inner(name, opts, false).await?.ok_or_else(|| {
                LockError::backend(
                    self.backend.backend(),
                    "acquire ended without a lock and without an error",
                )
            })
        };
        traced_acquire("acquire", name, self.backend.backend(), acquire, |_| true).await
    }

    fn capabilities(&self) -> Capabilities {
        self.backend.capabilities()
    }

    async fn status(&self, name: &str) -> Result<LockStatus> {
        self.status_of(name, LockKind::Exclusive).await
    }

    async fn status_of(&self, name: &str, kind: LockKind) -> Result<LockStatus> {
        self.backend.check_name(name)?;
        let opts = LockOptions::of_kind(kind);
        opts.validate()?;
        opts.check_supported(self.backend.backend(), &self.backend.capabilities())?;
        self.backend.status(name, kind).await
    }
}
