#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

use lockkit_core::backend::{Driver, boxed_connect};

mod backend;
mod config;
mod connection;
mod direct;
mod error;
mod holding;
mod instance;
mod keys;
mod notifications;
mod places;
mod renewals;
mod scripts;
mod sentinel;
mod settings;
mod turns;
mod url;

pub use backend::{
    REDIS_BARGING_CAPABILITIES, REDIS_CAPABILITIES, REDIS_FAIR_CAPABILITIES,
    REDIS_REPLICATED_CAPABILITIES, RedisBackend, RedisLock,
};
pub use config::RedisLockBuilder;
pub use holding::{Holder, Holdings, RedisKey};
pub use instance::RedisInstance;
pub use keys::{
    DEFAULT_PREFIX, HOLDER_SEPARATOR, Keys, LeaseSet, QUEUE_PLACE, Queue, SemaphoreKeys, TURN,
    holder_of,
};
pub use places::{Keeping, KeptPlaces};
pub use scripts::{Release, Waiting};
pub use settings::{
    DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_SUBSCRIPTION_LINGER,
    DEFAULT_WAIT_TIMEOUT, RedisConfig,
};
pub use turns::{instant_of as turn_instant, stamp as turn_stamp};

/// Connects to the Redis server of a `redis://` or `rediss://` URL, the Redis
/// Cluster of a `redis+cluster://` URL, or the Sentinel-monitored master of a
/// `redis+sentinel://` URL; see [`RedisLockBuilder`] for the URL forms and
/// parameters.
pub async fn connect(url: &str) -> lockkit_core::Result<RedisLock> {
    RedisLockBuilder::from_url(url)?.connect().await
}

/// The Redis driver, for `lockkit::connect` and `lockkit::Registry`.
pub const DRIVER: Driver = Driver::new(
    "redis",
    &["redis", "rediss", "redis+cluster", "redis+sentinel"],
    |url| boxed_connect(connect(url)),
)
.with_feature("redis");
