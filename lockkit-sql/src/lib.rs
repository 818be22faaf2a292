#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
// Without a database feature the crate only parses URLs (and answers
// `BackendNotCompiled`); the statement plumbing is then unused.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use lockkit_core::backend::{Driver, boxed_connect};

mod config;
mod error;
mod finishing;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod lease;
mod lock;
#[cfg(feature = "mysql")]
mod mysql;
mod names;
mod open;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod pool;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod session;
mod settings;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod slots;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod statement;

pub use config::SqlLockBuilder;
pub use lock::SqlLock;
pub use names::{
    DEFAULT_TABLE, MAX_SLOT_PERMITS, MAX_TABLE_LEN, advisory_key, named_lock_name,
    semaphore_slot_key, semaphore_slot_name, validate_table,
};
pub use settings::{
    ADVISORY_CAPABILITIES, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_LIVENESS_INTERVAL, DEFAULT_MAX_CONNECTIONS, Database, MYSQL_ROW_CAPABILITIES, Mode,
    NAMED_CAPABILITIES, NOTIFIED_LEASE_CAPABILITIES, PG_LEASE_CAPABILITIES, PG_ROW_CAPABILITIES,
    POLLED_LEASE_CAPABILITIES, SESSION_CAPABILITIES, SQLITE_LEASE_CAPABILITIES,
};

/// The two statements of a `lease` cycle on a lock table, as `lease` mode
/// sends them.
///
/// For benchmarks that send lockkit's own statements by hand, to measure
/// what the engine adds; not part of the stable API. On MySQL/MariaDB, the
/// texts of MariaDB 10.3 and later (tokens from a `SEQUENCE`).
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct LeaseStatements {
    /// The upsert (binds as `lease` mode binds it: on Postgres and SQLite
    /// the name, the owner, the lease in milliseconds and the client, as
    /// the lines of waiting clients name it).
    pub acquire: String,
    /// The owner-conditional release (on SQLite it binds the name, the
    /// owner and the client, and releases only while no other client
    /// waits in the name's line).
    pub release: String,
}

/// The [`LeaseStatements`] of `table` on `database`.
#[doc(hidden)]
// Without any database feature, everything after the match is unreachable.
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unreachable_code)
)]
pub fn lease_statements(database: Database, table: &str) -> lockkit_core::Result<LeaseStatements> {
    validate_table(table)?;
    let (acquire, release): (std::sync::Arc<str>, std::sync::Arc<str>) = match database {
        #[cfg(feature = "postgres")]
        Database::Postgres => postgres::lease_statements(table),
        #[cfg(feature = "mysql")]
        Database::MySql => mysql::lease_statements(table),
        #[cfg(feature = "sqlite")]
        Database::Sqlite => sqlite::lease_statements(table),
        #[allow(unreachable_patterns)]
        other => {
            return Err(lockkit_core::LockError::BackendNotCompiled {
                scheme: other.to_string(),
                feature: other.feature(),
            });
        }
    };
    Ok(LeaseStatements {
        acquire: acquire.to_string(),
        release: release.to_string(),
    })
}

/// The directory of the release bells of the SQLite database file at
/// `database` (`<database>-lockkit-bells`, as the SQL backend guide
/// describes), for benchmarks that ring a bell by hand; not part of the
/// stable API.
#[doc(hidden)]
#[cfg(feature = "sqlite")]
pub fn sqlite_bells_dir(database: &std::path::Path) -> std::path::PathBuf {
    sqlite::bells::bells_dir(database)
}

/// Connects to the database of a SQL URL; see [`SqlLockBuilder`] for the
/// forms and parameters.
pub async fn connect(url: &str) -> lockkit_core::Result<SqlLock> {
    SqlLock::connect(url).await
}

/// The PostgreSQL driver, for `lockkit::connect` and `lockkit::Registry`.
#[cfg(feature = "postgres")]
pub const POSTGRES_DRIVER: Driver = Driver::new("postgres", &["postgres", "postgresql"], |url| {
    boxed_connect(connect(url))
})
.with_feature("postgres");

/// The MySQL/MariaDB driver, for `lockkit::connect` and `lockkit::Registry`.
#[cfg(feature = "mysql")]
pub const MYSQL_DRIVER: Driver = Driver::new("mysql", &["mysql", "mariadb"], |url| {
    boxed_connect(connect(url))
})
.with_feature("mysql");

/// The SQLite driver, for `lockkit::connect` and `lockkit::Registry`.
#[cfg(feature = "sqlite")]
pub const SQLITE_DRIVER: Driver =
    Driver::new("sqlite", &["sqlite"], |url| boxed_connect(connect(url))).with_feature("sqlite");
