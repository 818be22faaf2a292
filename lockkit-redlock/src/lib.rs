#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

use lockkit_core::backend::{Driver, boxed_connect};

mod backend;
mod config;
mod error;
mod quorum;

pub use backend::{
    DEFAULT_INSTANCE_TIMEOUT, REDLOCK_BARGING_CAPABILITIES, REDLOCK_CAPABILITIES, RedlockBackend,
    RedlockLock,
};
pub use config::RedlockLockBuilder;

/// Connects to the instances of a `redlock://` URL; see [`RedlockLockBuilder`].
pub async fn connect(url: &str) -> lockkit_core::Result<RedlockLock> {
    RedlockLockBuilder::from_url(url)?.connect().await
}

/// The Redlock driver, for `lockkit::connect` and `lockkit::Registry`.
pub const DRIVER: Driver =
    Driver::new("redlock", &["redlock"], |url| boxed_connect(connect(url))).with_feature("redlock");
