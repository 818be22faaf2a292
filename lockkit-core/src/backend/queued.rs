//! [`QueuedLock`]: the engine of backends whose server queues the waiters.

use std::fmt;

use crate::backend::local_queue::LocalQueue;
use crate::backend::trace::traced_acquire;
use crate::backend::wait::{Intent, Waiter};
use crate::capabilities::Capabilities;
use crate::error::Result;
use crate::guard::LockGuard;
use crate::lock::DistributedLock;
use crate::options::{LockKind, LockOptions};
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
    fn backend_name(&self) -> &'static str;

    /// What this backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// Checks `name` before anything is sent; at least (and by default)
    /// [`validate_name`](crate::backend::validate_name).
    fn check_name(&self, name: &str) -> Result<()> {
        crate::backend::validate_name(name)
    }

    /// Takes the request's name for this caller. With [`Intent::Try`], one
    /// try: `Ok(None)` when someone else holds it, and nothing of the try is
    /// left behind. With [`Intent::Wait`] it waits in the server's queue
    /// within the waiter's deadline, and gives up with `Ok(None)` or
    /// `Err(Timeout)` when the deadline passes. The future may be dropped at
    /// any await point and must then leave nothing held.
    async fn lock(&self, request: Request<'_, '_>) -> Result<Option<LockGuard>>;

    /// See [`DistributedLock::status_of`]; only called with kinds the
    /// backend's capabilities claim.
    async fn status(&self, name: &str, kind: LockKind) -> Result<LockStatus>;
}

/// One acquire, as [`QueuedLock`] hands it to [`QueueBackend::lock`].
#[derive(Debug)]
pub struct Request<'a, 'w> {
    /// The lock's name, checked by [`QueueBackend::check_name`].
    pub name: &'a str,
    /// The caller's options (kind, TTL, holder identity).
    pub opts: &'a LockOptions,
    /// The caller's wait: its deadline, and the error when it passes.
    pub waiter: &'a mut Waiter<'w>,
    /// One try, or a wait.
    pub intent: Intent,
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

    /// Takes `name` as `intent` says, within `waiter`'s deadline: the local
    /// queue of this client first (for an exclusive holding), then the
    /// server's. `Ok(None)` when it was not taken.
    async fn acquire_inner(
        &self,
        name: &str,
        opts: &LockOptions,
        waiter: &mut Waiter<'_>,
        intent: Intent,
    ) -> Result<Option<LockGuard>> {
        self.backend.check_name(name)?;
        opts.validate()?;
        opts.check_supported(self.backend.backend_name(), &self.backend.capabilities())?;
        let slot = if opts.kind() != LockKind::Exclusive {
            None
        } else {
            match intent {
                Intent::Try => match self.local.try_enter(name) {
                    Some(slot) => Some(slot),
                    None => return Ok(None),
                },
                Intent::Wait => Some(waiter.local_turn(&self.local, name).await?),
            }
        };
        crate::metrics::attempt(self.backend.backend_name());
        let request = Request {
            name,
            opts,
            waiter,
            intent,
        };
        let guard = self.backend.lock(request).await?;
        if let (Some(guard), Some(slot)) = (&guard, slot) {
            guard.attach_slot(slot);
        }
        Ok(guard)
    }
}

#[async_trait::async_trait]
impl<B: QueueBackend> DistributedLock for QueuedLock<B> {
    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<LockGuard>> {
        let attempt = async {
            let mut waiter = Waiter::new(name, opts);
            self.acquire_inner(name, opts, &mut waiter, Intent::Try)
                .await
        };
        traced_acquire(
            "try_acquire",
            name,
            self.backend.backend_name(),
            attempt,
            Option::is_some,
        )
        .await
    }

    /// The server queues the waiters; the wait ends as `opts` says, with the
    /// same `Timeout` semantics as every backend.
    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard> {
        let acquire = async {
            let mut waiter = Waiter::new(name, opts);
            self.acquire_inner(name, opts, &mut waiter, Intent::of(opts.wait()))
                .await?
                .ok_or_else(|| waiter.timeout_error())
        };
        traced_acquire(
            "acquire",
            name,
            self.backend.backend_name(),
            acquire,
            |_| true,
        )
        .await
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
        opts.check_supported(self.backend.backend_name(), &self.backend.capabilities())?;
        self.backend.status(name, kind).await
    }
}
