#![doc = include_str!("../README.md")]

mod connect;

pub use connect::{Registry, connect, known_schemes};
pub use lockkit_core::backend::redact_url;
pub use lockkit_core::{
    Backoff, BoxError, Capabilities, DistributedLock, DynDistributedLock, Election, FencingToken,
    Leadership, LockError, LockGuard, LockKind, LockOptions, LockStatus, LostReason, MemoryLock,
    MemoryStore, ReleaseOnCrash, Result, Wait, acquire_all,
};

/// The core crate, for backend implementors: [`LeaseBackend`](lockkit_core::backend::LeaseBackend),
/// [`Waiter`](lockkit_core::backend::Waiter), [`Lease`](lockkit_core::backend::Lease) and friends.
pub use lockkit_core as core;

/// The metric names lockkit emits through the `metrics` facade (with the
/// cargo feature `metrics`).
pub use lockkit_core::metrics;

/// The Redis backend (one server, Redis Cluster, or a Sentinel-monitored
/// master), for options a URL cannot express.
#[cfg(feature = "redis")]
pub use lockkit_redis as redis;

/// The Redlock backend, for options a URL cannot express.
#[cfg(feature = "redlock")]
pub use lockkit_redlock as redlock;

/// The ZooKeeper backend, for options a URL cannot express.
#[cfg(feature = "zk")]
pub use lockkit_zk as zk;

/// The etcd backend, for options a URL cannot express.
#[cfg(feature = "etcd")]
pub use lockkit_etcd as etcd;

/// The SQL backends (Postgres, MySQL/MariaDB, SQLite), for options a URL
/// cannot express.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use lockkit_sql as sql;
