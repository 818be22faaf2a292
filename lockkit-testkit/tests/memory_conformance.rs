//! The conformance suite against the in-memory backend.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{DistributedLock, MemoryLock, MemoryStore, Result};
use lockkit_testkit::conformance::{Disposable, Harness};

struct MemoryHarness {
    store: Arc<MemoryStore>,
}

impl MemoryHarness {
    fn new() -> Self {
        MemoryHarness {
            store: MemoryStore::new(),
        }
    }
}

#[async_trait::async_trait]
impl Harness for MemoryHarness {
    async fn client(&self) -> Arc<dyn DistributedLock> {
        Arc::new(MemoryLock::with_store(self.store.clone()))
    }

    async fn revoke(&self, name: &str) {
        assert!(self.store.revoke(name), "no lease on {name:?} to revoke");
    }

    async fn disposable(&self) -> Box<dyn Disposable> {
        Box::new(DisposableStore {
            store: MemoryStore::new(),
        })
    }

    fn connect_timeout(&self) -> Duration {
        Duration::ZERO
    }
}

/// A store of its own; "killing" it switches it off, so every call fails with
/// `Unavailable` as it would against a dead server.
struct DisposableStore {
    store: Arc<MemoryStore>,
}

#[async_trait::async_trait]
impl Disposable for DisposableStore {
    async fn connect(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(MemoryLock::with_store(self.store.clone())))
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

lockkit_testkit::conformance_suite!(MemoryHarness::new());
