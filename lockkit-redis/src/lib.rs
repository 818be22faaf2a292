#![doc = include_str!("../README.md")]

mod backend;
mod config;
mod error;
mod instance;
mod keys;
mod notifications;
mod scripts;

pub use backend::{REDIS_CAPABILITIES, RedisBackend, RedisLock};
pub use config::{
    DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_SUBSCRIPTION_LINGER, RedisConfig,
    RedisLockBuilder,
};
pub use instance::{Holder, RedisInstance};
pub use keys::{DEFAULT_PREFIX, Keys};

/// Connects to the Redis server of a `redis://` or `rediss://` URL; see
/// [`RedisLockBuilder`] for the URL parameters.
pub async fn connect(url: &str) -> lockkit_core::Result<RedisLock> {
    RedisLockBuilder::from_url(url)?.connect().await
}
