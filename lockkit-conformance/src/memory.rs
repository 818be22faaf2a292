//! The in-memory backend as a conformance harness.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{DistributedLock, MemoryLock, MemoryStore, Result};

use super::{Disposable, Harness};

/// Turns a memory client into the lock under test (e.g. an adaptor around it).
pub type Wrap = fn(MemoryLock) -> Arc<dyn DistributedLock>;

/// Runs the suite on a private [`MemoryStore`]. "Killing" or pausing a
/// disposable store switches it off, so every call fails with `Unavailable`,
/// as it would against a dead server.
#[derive(Debug)]
pub struct MemoryHarness {
    store: Arc<MemoryStore>,
    wrap: Wrap,
}

impl MemoryHarness {
    /// Memory clients as they are.
    pub fn new() -> Self {
        Self::wrapping(|lock| Arc::new(lock))
    }

    /// Memory clients passed through `wrap`, to test an adaptor over them.
    pub fn wrapping(wrap: Wrap) -> Self {
        MemoryHarness {
            store: MemoryStore::new(),
            wrap,
        }
    }
}

impl Default for MemoryHarness {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait::async_trait]
impl Harness for MemoryHarness {
    async fn client(&self) -> Arc<dyn DistributedLock> {
        (self.wrap)(MemoryLock::with_store(self.store.clone()))
    }

    async fn revoke(&self, name: &str) {
        assert!(self.store.revoke(name), "no lease on {name:?} to revoke");
    }

    async fn disposable(&self) -> Box<dyn Disposable> {
        Box::new(MemoryHarness::wrapping(self.wrap))
    }

    fn connect_timeout(&self) -> Duration {
        Duration::ZERO
    }

    async fn stored_entries(&self, prefix: &str) -> usize {
        self.store.names_kept(prefix)
    }
}

#[async_trait::async_trait]
impl Disposable for MemoryHarness {
    async fn connect(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(self.client().await)
    }

    async fn kill(&mut self) {
        self.store.outage(true);
    }

    async fn pause(&mut self) {
        self.store.outage(true);
    }

    async fn resume(&mut self) {
        self.store.outage(false);
    }

    async fn restart(&self) {
        self.store.outage(false);
    }

    async fn connect_within(&self, _timeout: Duration) -> Result<Arc<dyn DistributedLock>> {
        Ok(self.client().await)
    }
}
