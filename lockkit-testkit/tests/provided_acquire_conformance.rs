//! The conformance suite against locks that implement only `try_acquire` (and
//! optionally the notification hook), so that the trait's *provided* `acquire`
//! — the shared wait policy every backend can fall back on — is held to the
//! same contract as the backends' own.

use std::sync::Arc;

use lockkit_conformance::MemoryHarness;
use lockkit_core::backend::ReleaseWatch;
use lockkit_core::{
    Capabilities, DistributedLock, LockGuard, LockKind, LockOptions, LockStatus, MemoryLock, Result,
};

/// Forwards `try_acquire` (and, when `notified`, `watch_releases`) to a memory
/// lock and leaves `acquire` to the trait's provided implementation.
#[derive(Debug)]
struct TryOnly {
    inner: MemoryLock,
    notified: bool,
}

#[async_trait::async_trait]
impl DistributedLock for TryOnly {
    /// Refuses what it does not claim, as a backend of its own would.
    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<LockGuard>> {
        opts.validate()?;
        opts.check_supported("try-only", &self.capabilities())?;
        self.inner.try_acquire(name, opts).await
    }

    /// No shared holdings: the provided `acquire` makes only attempts that do
    /// not wait, so it cannot keep readers behind a waiting writer.
    /// Semaphores work through it.
    fn capabilities(&self) -> Capabilities {
        self.inner
            .capabilities()
            .with_notified_wait(self.notified)
            .with_shared(false)
    }

    async fn status(&self, name: &str) -> Result<LockStatus> {
        self.inner.status(name).await
    }

    async fn status_of(&self, name: &str, kind: LockKind) -> Result<LockStatus> {
        self.inner.status_of(name, kind).await
    }

    async fn watch_releases(&self, name: &str) -> Result<ReleaseWatch> {
        if self.notified {
            self.inner.watch_releases(name).await
        } else {
            Ok(ReleaseWatch::none())
        }
    }
}

mod polling {
    use super::*;
    lockkit_conformance::conformance_suite!(MemoryHarness::wrapping(|inner| Arc::new(TryOnly {
        inner,
        notified: false
    })));
}

mod notified {
    use super::*;
    lockkit_conformance::conformance_suite!(MemoryHarness::wrapping(|inner| Arc::new(TryOnly {
        inner,
        notified: true
    })));
}
