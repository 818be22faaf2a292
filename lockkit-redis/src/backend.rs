//! The single-instance Redis backend.

use std::time::Duration;

use lockkit_core::{
    Attempt, Capabilities, FencingToken, LeaseBackend, LeaseLock, OwnerToken, ReleaseOnCrash,
    ReleaseWatch, Result,
};

use crate::error::BACKEND;
use crate::instance::RedisInstance;
use crate::keys::Keys;

/// A lock client on one Redis server: [`LeaseLock`] over [`RedisBackend`].
pub type RedisLock = LeaseLock<RedisBackend>;

/// What the single-instance Redis backend guarantees.
pub const REDIS_CAPABILITIES: Capabilities = Capabilities::new(ReleaseOnCrash::Ttl)
    .with_fencing(true)
    .with_notified_wait(true);

/// The [`LeaseBackend`] of one Redis server.
#[derive(Debug)]
pub struct RedisBackend {
    instance: RedisInstance,
    prefix: String,
}

impl RedisBackend {
    /// A backend on a connected instance with a key prefix.
    pub fn new(instance: RedisInstance, prefix: impl Into<String>) -> Self {
        RedisBackend {
            instance,
            prefix: prefix.into(),
        }
    }

    /// The server connection.
    pub fn instance(&self) -> &RedisInstance {
        &self.instance
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis keys of `name`.
    pub fn keys(&self, name: &str) -> Result<Keys> {
        Keys::new(&self.prefix, name)
    }
}

#[lockkit_core::async_trait]
impl LeaseBackend for RedisBackend {
    type Key = Keys;

    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    fn key(&self, name: &str) -> Result<Keys> {
        self.keys(name)
    }

    fn capabilities(&self) -> Capabilities {
        REDIS_CAPABILITIES
    }

    async fn try_lock(
        &self,
        keys: &Keys,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt<Option<FencingToken>>> {
        self.instance
            .try_lock(keys, owner.as_str(), ttl, true)
            .await
    }

    async fn extend(&self, keys: &Keys, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.instance.extend(keys, owner.as_str(), ttl).await
    }

    async fn release(&self, keys: &Keys, owner: &OwnerToken) -> Result<bool> {
        self.instance.release(keys, owner.as_str(), true).await
    }

    async fn watch(&self, keys: &Keys) -> Result<ReleaseWatch> {
        Ok(self.instance.watch(keys).await)
    }
}
