#![doc = include_str!("../README.md")]
// Without a database feature the crate only parses URLs (and answers
// `BackendNotCompiled`); the statement plumbing is then unused.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]

mod config;
mod error;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod lease;
mod lock;
#[cfg(feature = "mysql")]
mod mysql;
mod names;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod pool;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod session;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod statement;

pub use config::{
    DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_LIVENESS_INTERVAL,
    DEFAULT_MAX_CONNECTIONS, Database, Mode, NOTIFIED_LEASE_CAPABILITIES,
    POLLED_LEASE_CAPABILITIES, SESSION_CAPABILITIES, SqlLockBuilder,
};
pub use lock::SqlLock;
pub use names::{DEFAULT_TABLE, MAX_TABLE_LEN, advisory_key, named_lock_name, validate_table};

/// Connects to the database of a SQL URL; see [`SqlLockBuilder`] for the
/// forms and parameters.
pub async fn connect(url: &str) -> lockkit_core::Result<SqlLock> {
    SqlLock::connect(url).await
}
