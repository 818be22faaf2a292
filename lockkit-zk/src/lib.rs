#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

use lockkit_core::backend::{Driver, boxed_connect};

mod config;
mod error;
mod lease;
mod lock;
mod node;
mod path;
mod session;
mod settings;

pub use config::ZkLockBuilder;
pub use lock::{ZK_CAPABILITIES, ZkBackend, ZkLock};
pub use path::{SEMAPHORES, encode_name};
pub use settings::{
    DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_ROOT, DEFAULT_SESSION_TIMEOUT,
};

/// Connects to the ensemble of a `zk://` URL; see [`ZkLockBuilder`].
pub async fn connect(url: &str) -> lockkit_core::Result<ZkLock> {
    ZkLockBuilder::from_url(url)?.connect().await
}

/// The ZooKeeper driver, for `lockkit::connect` and `lockkit::Registry`.
pub const DRIVER: Driver =
    Driver::new("zookeeper", &["zk"], |url| boxed_connect(connect(url))).with_feature("zk");
