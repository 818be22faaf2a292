//! What the builder resolved, and what every statement needs: the
//! database, the mode, where, and how long. The lock and the database layers
//! read these; none of them reads the URL or the builder.

use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use futures_util::FutureExt as _;

use lockkit_core::backend::connect_retrying;
use lockkit_core::{Capabilities, LockError, ReleaseOnCrash, Result};

use crate::error::{is_auth_error, map_error, timed_out};

/// Default time to open a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default time to wait for the answer to a statement that does not wait for
/// a lock.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// Default period of the liveness query on a session lock's connection.
pub const DEFAULT_LIVENESS_INTERVAL: Duration = Duration::from_secs(1);
/// Default size of the connection pool used by `lease` mode and by helper
/// statements of the session modes.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;

/// Which database a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Database {
    /// PostgreSQL (`postgres://`, `postgresql://`).
    Postgres,
    /// MySQL or MariaDB (`mysql://`, `mariadb://`).
    MySql,
    /// SQLite (`sqlite://path`, `sqlite::memory:`).
    Sqlite,
}

impl Database {
    /// The backend name in logs and errors: `postgres`, `mysql` or `sqlite`.
    pub fn name(self) -> &'static str {
        match self {
            Database::Postgres => "postgres",
            Database::MySql => "mysql",
            Database::Sqlite => "sqlite",
        }
    }

    /// The cargo feature of `lockkit-sql` (and of `lockkit`) that provides it.
    pub fn feature(self) -> &'static str {
        match self {
            Database::Postgres => "postgres",
            Database::MySql => "mysql",
            Database::Sqlite => "sqlite",
        }
    }

    /// The modes this database supports; the first is the default.
    pub fn modes(self) -> &'static [Mode] {
        match self {
            Database::Postgres => &[Mode::Lease, Mode::Row, Mode::Advisory],
            Database::MySql => &[Mode::Lease, Mode::Row, Mode::Named],
            Database::Sqlite => &[Mode::Lease],
        }
    }

    pub(crate) fn compiled(self) -> bool {
        match self {
            Database::Postgres => cfg!(feature = "postgres"),
            Database::MySql => cfg!(feature = "mysql"),
            Database::Sqlite => cfg!(feature = "sqlite"),
        }
    }

    pub(crate) fn from_scheme(scheme: &str) -> Option<Database> {
        match scheme {
            "postgres" | "postgresql" => Some(Database::Postgres),
            "mysql" | "mariadb" => Some(Database::MySql),
            "sqlite" => Some(Database::Sqlite),
            _ => None,
        }
    }
}

impl fmt::Display for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a lock is held; see the crate docs for the trade-offs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// A row with an owner and an expiry decided by the server's clock.
    #[default]
    Lease,
    /// `SELECT … FOR UPDATE` on the name's row, in a transaction held open on
    /// a dedicated connection (Postgres, MySQL/MariaDB).
    Row,
    /// `pg_advisory_lock` on a dedicated connection (Postgres).
    Advisory,
    /// `GET_LOCK` on a dedicated connection (MySQL/MariaDB).
    Named,
}

impl Mode {
    /// The mode's name in URLs.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Lease => "lease",
            Mode::Row => "row",
            Mode::Advisory => "advisory",
            Mode::Named => "named",
        }
    }

    /// Whether the lock lives with a connection (rather than a lease row).
    pub fn is_session(self) -> bool {
        self != Mode::Lease
    }
}

/// What a session mode (`row`, `advisory`, `named`) guarantees: the server
/// queues the waiters and frees the lock with the holder's connection.
/// Holder identities go into an identity row of the lock table.
pub const SESSION_CAPABILITIES: Capabilities = Capabilities::new(ReleaseOnCrash::Connection)
    .with_fencing(true)
    .with_notified_wait(true)
    .with_fifo(true)
    .with_holder(true);

/// What Postgres `advisory` mode guarantees: a session mode with shared
/// holdings (`pg_advisory_lock_shared`, queued behind a waiting writer by
/// the server) and semaphores (one advisory key per permit slot).
pub const ADVISORY_CAPABILITIES: Capabilities =
    SESSION_CAPABILITIES.with_shared(true).with_semaphore(true);

/// What MySQL/MariaDB `named` mode guarantees: a session mode with
/// semaphores (one `GET_LOCK` name per permit slot). `GET_LOCK` has no
/// shared mode, so no shared holdings.
pub const NAMED_CAPABILITIES: Capabilities = SESSION_CAPABILITIES.with_semaphore(true);

/// What MySQL/MariaDB `row` mode guarantees: a session mode with shared
/// holdings (the share-mode lock of the name's row; InnoDB queues a new
/// share lock behind a waiting exclusive one) and semaphores (one row per
/// permit slot, taken `FOR UPDATE SKIP LOCKED`).
pub const MYSQL_ROW_CAPABILITIES: Capabilities =
    SESSION_CAPABILITIES.with_shared(true).with_semaphore(true);

/// What Postgres `row` mode guarantees: a session mode with shared holdings
/// (`FOR SHARE` of the name's row, behind a transaction-scoped advisory
/// *gate* that queues new readers behind a waiting writer) and semaphores
/// (one row per permit slot, taken `FOR UPDATE SKIP LOCKED`).
pub const PG_ROW_CAPABILITIES: Capabilities =
    SESSION_CAPABILITIES.with_shared(true).with_semaphore(true);

/// What `lease` mode guarantees on Postgres and MySQL/MariaDB: waiters are
/// woken by `LISTEN/NOTIFY` on Postgres, by release bells (a parked `SLEEP`
/// that a release ends with `KILL QUERY`) on MySQL/MariaDB. Holder identities are stored with the owner token. Shared holdings: a reader group holding the lock's row
/// (see the `lease` module). Semaphores: one lease row per permit slot.
pub const NOTIFIED_LEASE_CAPABILITIES: Capabilities = Capabilities::new(ReleaseOnCrash::Ttl)
    .with_server_bounds(true)
    .with_shared(true)
    .with_holder(true)
    .with_fencing(true)
    .with_notified_wait(true)
    .with_semaphore(true);

/// What `lease` mode guarantees on Postgres: as on MySQL/MariaDB, and the
/// waiting clients take turns in the order they came (a line of them per
/// name, kept in the lock table; see the SQL backend's guide).
pub const PG_LEASE_CAPABILITIES: Capabilities = NOTIFIED_LEASE_CAPABILITIES.with_fifo(true);

/// What `lease` mode guarantees on SQLite off Linux: waiters back off with
/// jitter, never sleeping past the holder's expiry. Shared holdings and
/// semaphores as on Postgres.
pub const POLLED_LEASE_CAPABILITIES: Capabilities = Capabilities::new(ReleaseOnCrash::Ttl)
    .with_server_bounds(true)
    .with_shared(true)
    .with_holder(true)
    .with_fencing(true)
    .with_semaphore(true);

/// What `lease` mode guarantees on SQLite: on Linux a release rings a bell
/// file that wakes the waiters of other processes (inotify), and the
/// waiting clients take turns in the order they came, as on Postgres;
/// elsewhere they back off as on MySQL.
pub const SQLITE_LEASE_CAPABILITIES: Capabilities = if cfg!(target_os = "linux") {
    NOTIFIED_LEASE_CAPABILITIES.with_fifo(true)
} else {
    POLLED_LEASE_CAPABILITIES
};

impl Mode {
    /// What this mode guarantees on `database`; `None` where it is not
    /// available.
    pub fn capabilities(self, database: Database) -> Option<Capabilities> {
        if !database.modes().contains(&self) {
            return None;
        }
        Some(match (self, database) {
            (Mode::Lease, Database::Postgres) => PG_LEASE_CAPABILITIES,
            (Mode::Lease, Database::MySql) => NOTIFIED_LEASE_CAPABILITIES,
            (Mode::Lease, Database::Sqlite) => SQLITE_LEASE_CAPABILITIES,
            (Mode::Advisory, Database::Postgres) => ADVISORY_CAPABILITIES,
            (Mode::Named, Database::MySql) => NAMED_CAPABILITIES,
            (Mode::Row, Database::MySql) => MYSQL_ROW_CAPABILITIES,
            (Mode::Row, Database::Postgres) => PG_ROW_CAPABILITIES,
            _ => SESSION_CAPABILITIES,
        })
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = LockError;

    fn from_str(s: &str) -> Result<Mode> {
        match s {
            "lease" => Ok(Mode::Lease),
            "row" => Ok(Mode::Row),
            "advisory" => Ok(Mode::Advisory),
            "named" => Ok(Mode::Named),
            other => Err(LockError::invalid_options(format!(
                "unknown SQL lock mode {other:?}; expected lease, row, advisory or named"
            ))),
        }
    }
}

/// Everything a [`SqlLockBuilder`](crate::SqlLockBuilder) resolved: what
/// [`SqlLock`](crate::SqlLock) opens. Holds secrets (`driver_url`).
#[derive(Clone)]
pub(crate) struct SqlConfig {
    pub(crate) database: Database,
    /// The driver's URL: ours without lockkit's parameters. Holds secrets.
    pub(crate) driver_url: String,
    pub(crate) redacted_url: String,
    pub(crate) address: String,
    pub(crate) mode: Mode,
    pub(crate) table: String,
    pub(crate) migrate: bool,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) liveness_interval: Duration,
    pub(crate) max_connections: u32,
    /// Whether session-mode grants draw fencing tokens.
    pub(crate) fencing: bool,
    /// MySQL/MariaDB: draw session-mode tokens from the counter table even
    /// where sequences exist (tests of MySQL's path on MariaDB).
    pub(crate) mysql_counter_fencing: bool,
}

impl fmt::Debug for SqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlConfig")
            .field("url", &self.redacted_url)
            .field("database", &self.database)
            .field("mode", &self.mode)
            .field("table", &self.table)
            .field("migrate", &self.migrate)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("liveness_interval", &self.liveness_interval)
            .field("max_connections", &self.max_connections)
            .field("fencing", &self.fencing)
            .finish()
    }
}

impl SqlConfig {
    pub(crate) fn check(&self) -> Result<()> {
        crate::names::validate_table(&self.table)?;
        if !self.fencing && !self.mode.is_session() {
            return Err(LockError::invalid_options(
                "fencing=false is an option of the session modes (row, advisory, named): \
                 lease mode draws its token with the lease row's own write, and other clients \
                 of the name read it",
            ));
        }
        if !self.database.modes().contains(&self.mode) {
            return Err(LockError::invalid_options(format!(
                "mode {} is not available on {}; it has {}",
                self.mode,
                self.database,
                self.database
                    .modes()
                    .iter()
                    .map(|m| m.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(())
    }

    pub(crate) fn settings(&self) -> Settings {
        Settings {
            backend: self.database.name(),
            address: self.address.clone(),
            connect_timeout: self.connect_timeout,
            command_timeout: self.command_timeout,
            liveness_interval: self.liveness_interval,
            fencing: self.fencing,
        }
    }

    pub(crate) fn invalid_url(&self, reason: impl fmt::Display) -> LockError {
        LockError::InvalidUrl {
            url: self.redacted_url.clone(),
            reason: reason.to_string(),
        }
    }
}

/// What every statement needs: where, how long, and how to name failures.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) backend: &'static str,
    pub(crate) address: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) liveness_interval: Duration,
    /// Whether session-mode grants draw fencing tokens (see
    /// [`SqlLockBuilder::fencing`](crate::SqlLockBuilder::fencing)).
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fencing: bool,
}

impl Settings {
    /// A statement's answer, or `Err(Elapsed)` when none came within the
    /// command timeout (for [`Loan::finish`](crate::pool::Loan::finish)).
    /// Not an `async fn`, which would hold the statement twice (as its
    /// argument and inside the timeout) in every statement's future.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub(crate) fn timed<T, F>(&self, statement: F) -> tokio::time::Timeout<F>
    where
        F: Future<Output = sqlx::Result<T>>,
    {
        tokio::time::timeout(self.command_timeout, statement)
    }

    /// Runs a statement bounded by the command timeout.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub(crate) fn bounded<T>(
        &self,
        what: &str,
        statement: impl Future<Output = sqlx::Result<T>>,
    ) -> impl Future<Output = Result<T>> {
        self.within(self.command_timeout, what, statement)
    }

    /// Runs the statements that check or create the lock table, part of
    /// `connect`, bounded by the connect timeout: on a fresh database they
    /// create tables, which syncs files, so they may take far longer than
    /// a lock's statement (the command timeout is often set short, to
    /// notice an outage well inside a lease).
    ///
    /// Not an `async fn`, for the reason [`timed`](Self::timed) gives.
    pub(crate) fn migrating<T>(
        &self,
        statements: impl Future<Output = sqlx::Result<T>>,
    ) -> impl Future<Output = Result<T>> {
        self.within(self.connect_timeout, "create the lock table", statements)
    }

    /// Not an `async fn`, for the reason [`timed`](Self::timed) gives.
    fn within<T>(
        &self,
        limit: Duration,
        what: &str,
        statement: impl Future<Output = sqlx::Result<T>>,
    ) -> impl Future<Output = Result<T>> {
        tokio::time::timeout(limit, statement).map(move |answer| match answer {
            Ok(result) => result.map_err(|e| self.error(what, e)),
            Err(_) => Err(timed_out(self.backend, &self.address, what, limit)),
        })
    }

    /// The error of a statement about `what` that got no answer within the
    /// command timeout.
    pub(crate) fn timed_out(&self, what: &str) -> LockError {
        timed_out(self.backend, &self.address, what, self.command_timeout)
    }

    /// No connection of the pool came free within the connect timeout.
    pub(crate) fn pool_exhausted(&self, size: usize) -> LockError {
        LockError::unavailable(
            self.backend,
            format!(
                "connect on {}: all {size} connections stayed busy for {:?} (raise max_connections?)",
                self.address, self.connect_timeout
            ),
        )
    }

    /// Opens a connection bounded by the connect timeout.
    ///
    /// Not an `async fn`, for the reason [`timed`](Self::timed) gives.
    pub(crate) fn connecting<T>(
        &self,
        what: &str,
        connect: impl Future<Output = sqlx::Result<T>>,
    ) -> impl Future<Output = Result<T>> {
        tokio::time::timeout(self.connect_timeout, connect).map(move |answer| match answer {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(error)) => {
                // A wrong password stays what it is; any other failure to
                // connect means the database cannot serve.
                let refused = is_auth_error(&error);
                Err(match self.error(what, error) {
                    LockError::Backend {
                        backend,
                        message,
                        source,
                    } if !refused => LockError::Unavailable {
                        backend,
                        message,
                        source,
                    },
                    other => other,
                })
            }
            Err(_) => Err(timed_out(
                self.backend,
                &self.address,
                what,
                self.connect_timeout,
            )),
        })
    }

    /// Opens a client's first connection: like
    /// [`connecting`](Self::connecting), tried again within the connect
    /// timeout while the database is not up yet (refused, or "starting up").
    pub(crate) async fn first_connection<T, Fut>(
        &self,
        what: &str,
        mut connect: impl FnMut() -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = sqlx::Result<T>>,
    {
        let whole = format!("{what} on {}", self.address);
        connect_retrying(self.backend, &whole, self.connect_timeout, |_| {
            self.connecting(what, connect())
        })
        .await
    }

    pub(crate) fn error(&self, what: &str, error: sqlx::Error) -> LockError {
        map_error(self.backend, &self.address, what, error)
    }
}
