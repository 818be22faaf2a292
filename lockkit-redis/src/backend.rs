//! The single-instance Redis backend.

use std::time::Duration;

use lockkit_core::{
    Attempt, Capabilities, FencingToken, Handover, LeaseBackend, LeaseLock, LockStatus, OwnerToken,
    ReleaseOnCrash, ReleaseWatch, Result,
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

    fn can_hand_over(&self) -> bool {
        true
    }

    /// One script: the lease becomes `to`'s with a new fencing token.
    async fn hand_over(
        &self,
        keys: &Keys,
        from: &OwnerToken,
        to: &OwnerToken,
        ttl: Duration,
    ) -> Result<Handover> {
        Ok(
            match self
                .instance
                .hand_over(keys, from.as_str(), to.as_str(), ttl, true)
                .await?
            {
                Some(token) => Handover::Passed(Some(FencingToken::new(token))),
                None => Handover::NotOurs,
            },
        )
    }

    /// `PTTL` of the lock key and the fence counter, in one `MULTI`/`EXEC`.
    /// The token reported is the last one drawn for the name: the holder's,
    /// unless the key was set by a client that draws none (redis-py, redsync).
    async fn status(&self, keys: &Keys) -> Result<LockStatus> {
        Ok(match self.instance.holder(keys).await? {
            Some(holder) => LockStatus::held()
                .with_remaining(Some(holder.remaining))
                .with_fencing_token(holder.fence.map(FencingToken::new)),
            None => LockStatus::free(),
        })
    }

    async fn watch(&self, keys: &Keys) -> Result<ReleaseWatch> {
        Ok(self.instance.watch(keys).await)
    }
}
