#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

use lockkit_core::backend::{Driver, boxed_connect};

mod client;
mod config;
mod deletions;
mod error;
mod keys;
mod leases;
mod lock;
mod settings;

pub use config::EtcdLockBuilder;
pub use keys::{SEMAPHORES, encode_name};
pub use lock::{ETCD_CAPABILITIES, EtcdBackend, EtcdLock};
pub use settings::{
    DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, KEEP_ALIVE_INTERVAL,
};

/// Connects to the cluster of an `etcd://` URL; see [`EtcdLockBuilder`].
pub async fn connect(url: &str) -> lockkit_core::Result<EtcdLock> {
    EtcdLockBuilder::from_url(url)?.connect().await
}

/// The etcd driver, for `lockkit::connect` and `lockkit::Registry`.
pub const DRIVER: Driver =
    Driver::new("etcd", &["etcd"], |url| boxed_connect(connect(url))).with_feature("etcd");
