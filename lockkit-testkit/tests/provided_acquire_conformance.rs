//! The conformance suite against locks that implement only `try_acquire` (and
//! optionally the notification hook), so that the trait's *provided* `acquire`
//! — the shared wait policy every backend can fall back on — is held to the
//! same contract as the backends' own.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{
    Capabilities, DistributedLock, LockGuard, LockOptions, MemoryLock, MemoryStore, ReleaseWatch,
    Result,
};
use lockkit_testkit::conformance::{Disposable, Harness};

/// Forwards `try_acquire` (and, when `notified`, `watch_releases`) to a memory
/// lock and leaves `acquire` to the trait's provided implementation.
#[derive(Debug)]
struct TryOnly {
    inner: MemoryLock,
    notified: bool,
}

#[async_trait::async_trait]
impl DistributedLock for TryOnly {
    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<LockGuard>> {
        self.inner.try_acquire(name, opts).await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities().with_notified_wait(self.notified)
    }

    async fn watch_releases(&self, name: &str) -> Result<ReleaseWatch> {
        if self.notified {
            self.inner.watch_releases(name).await
        } else {
            Ok(ReleaseWatch::none())
        }
    }
}

struct TryOnlyHarness {
    store: Arc<MemoryStore>,
    notified: bool,
}

fn client(store: &Arc<MemoryStore>, notified: bool) -> Arc<dyn DistributedLock> {
    Arc::new(TryOnly {
        inner: MemoryLock::with_store(store.clone()),
        notified,
    })
}

#[async_trait::async_trait]
impl Harness for TryOnlyHarness {
    async fn client(&self) -> Arc<dyn DistributedLock> {
        client(&self.store, self.notified)
    }

    async fn revoke(&self, name: &str) {
        assert!(self.store.revoke(name), "no lease on {name:?} to revoke");
    }

    async fn disposable(&self) -> Box<dyn Disposable> {
        Box::new(DisposableStore {
            store: MemoryStore::new(),
            notified: self.notified,
        })
    }

    fn connect_timeout(&self) -> Duration {
        Duration::ZERO
    }
}

struct DisposableStore {
    store: Arc<MemoryStore>,
    notified: bool,
}

#[async_trait::async_trait]
impl Disposable for DisposableStore {
    async fn connect(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(client(&self.store, self.notified))
    }

    async fn kill(&mut self) {
        self.store.set_available(false);
    }

    async fn pause(&mut self) {
        self.store.set_available(false);
    }

    async fn resume(&mut self) {
        self.store.set_available(true);
    }
}

mod polling {
    use super::*;
    lockkit_testkit::conformance_suite!(TryOnlyHarness {
        store: MemoryStore::new(),
        notified: false,
    });
}

mod notified {
    use super::*;
    lockkit_testkit::conformance_suite!(TryOnlyHarness {
        store: MemoryStore::new(),
        notified: true,
    });
}
