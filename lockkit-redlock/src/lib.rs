#![doc = include_str!("../README.md")]

mod backend;
mod config;
mod error;
mod quorum;

pub use backend::{DEFAULT_INSTANCE_TIMEOUT, REDLOCK_CAPABILITIES, RedlockBackend, RedlockLock};
pub use config::RedlockBuilder;

/// Connects to the instances of a `redlock://` URL; see [`RedlockBuilder`].
pub async fn connect(url: &str) -> lockkit_core::Result<RedlockLock> {
    RedlockBuilder::from_url(url)?.connect().await
}
