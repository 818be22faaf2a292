//! SQL URLs, the builder, and the settings shared by every statement.

use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use lockkit_core::backend::{redact_url, timeout_param};
use lockkit_core::{Capabilities, LockError, ReleaseOnCrash, Result};

use crate::error::{map_error, timed_out};
use crate::lock::SqlLock;
use crate::names::DEFAULT_TABLE;

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

    fn compiled(self) -> bool {
        match self {
            Database::Postgres => cfg!(feature = "postgres"),
            Database::MySql => cfg!(feature = "mysql"),
            Database::Sqlite => cfg!(feature = "sqlite"),
        }
    }

    fn from_scheme(scheme: &str) -> Option<Database> {
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
pub const SESSION_CAPABILITIES: Capabilities = Capabilities::new(ReleaseOnCrash::Connection)
    .with_fencing(true)
    .with_notified_wait(true)
    .with_fifo(true);

/// What `lease` mode guarantees on Postgres: waiters are woken by
/// `LISTEN/NOTIFY`.
pub const NOTIFIED_LEASE_CAPABILITIES: Capabilities = Capabilities::new(ReleaseOnCrash::Ttl)
    .with_fencing(true)
    .with_notified_wait(true);

/// What `lease` mode guarantees on MySQL and SQLite: waiters back off with
/// jitter, never sleeping past the holder's expiry.
pub const POLLED_LEASE_CAPABILITIES: Capabilities =
    Capabilities::new(ReleaseOnCrash::Ttl).with_fencing(true);

impl Mode {
    /// What this mode guarantees on `database`; `None` where it is not
    /// available.
    pub fn capabilities(self, database: Database) -> Option<Capabilities> {
        if !database.modes().contains(&self) {
            return None;
        }
        Some(match (self, database) {
            (Mode::Lease, Database::Postgres) => NOTIFIED_LEASE_CAPABILITIES,
            (Mode::Lease, _) => POLLED_LEASE_CAPABILITIES,
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

/// Builds a [`SqlLock`].
///
/// URL forms (parameters after `?`, percent-decoded):
///
/// * `postgres://user:password@host:port/database` (also `postgresql://`)
/// * `mysql://user:password@host:port/database` (also `mariadb://`)
/// * `sqlite://path` (relative to the working directory), `sqlite:///absolute/path`,
///   `sqlite::memory:`
///
/// | parameter | meaning | default |
/// | --- | --- | --- |
/// | `mode` | `lease`, `row` (Postgres, MySQL), `advisory` (Postgres), `named` (MySQL) | `lease` |
/// | `table` | the lock table (a plain identifier) | `lockkit_locks` |
/// | `migrate` | create the table on connect (`true`/`false`) | `true` |
/// | `connect_timeout` | to open a connection | 5 s |
/// | `command_timeout` | per statement that does not wait for a lock | 5 s |
/// | `liveness` | how often a session lock's connection is checked | 1 s |
/// | `max_connections` | size of the shared pool | 10 |
///
/// Other parameters go to the database driver (e.g. `sslmode=require`).
///
/// ```
/// use lockkit_sql::{Database, Mode, SqlLockBuilder};
///
/// let builder = SqlLockBuilder::from_url("postgres://app:s3cret@db.internal/jobs?mode=advisory&sslmode=require")?;
/// assert_eq!(builder.database(), Database::Postgres);
/// assert_eq!(builder.get_mode(), Mode::Advisory);
/// assert!(!format!("{builder:?}").contains("s3cret"));
/// # Ok::<(), lockkit_core::LockError>(())
/// ```
#[derive(Clone)]
pub struct SqlLockBuilder {
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
    /// MySQL/MariaDB: draw session-mode tokens from the counter table even
    /// where sequences exist (tests of MySQL's path on MariaDB).
    pub(crate) mysql_counter_fencing: bool,
}

impl fmt::Debug for SqlLockBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlLockBuilder")
            .field("url", &self.redacted_url)
            .field("database", &self.database)
            .field("mode", &self.mode)
            .field("table", &self.table)
            .field("migrate", &self.migrate)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("liveness_interval", &self.liveness_interval)
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

/// Removes the values of password parameters, for messages.
fn redact(url: &str) -> String {
    let redacted = redact_url(url);
    match redacted.split_once('?') {
        Some((base, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if key.eq_ignore_ascii_case("password") => {
                        format!("{key}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{base}?{}", query.join("&"))
        }
        None => redacted,
    }
}

impl SqlLockBuilder {
    /// Parses a URL (see the type docs).
    pub fn from_url(url: &str) -> Result<SqlLockBuilder> {
        let redacted_url = redact(url);
        let bad = |reason: String| LockError::InvalidUrl {
            url: redacted_url.clone(),
            reason,
        };
        let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
        let database = Database::from_scheme(&scheme.to_ascii_lowercase())
            .ok_or_else(|| bad(format!("{scheme:?} is not a SQL URL scheme")))?;
        if !database.compiled() {
            return Err(LockError::BackendNotCompiled {
                scheme: scheme.to_owned(),
                feature: database.feature(),
            });
        }
        let (driver_base, address, query) = match database {
            Database::Sqlite => split_sqlite(url).map_err(bad)?,
            _ => split_server(url).map_err(bad)?,
        };
        let mut builder = SqlLockBuilder {
            database,
            driver_url: String::new(),
            redacted_url: redacted_url.clone(),
            address,
            mode: Mode::Lease,
            table: DEFAULT_TABLE.to_owned(),
            migrate: true,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            liveness_interval: DEFAULT_LIVENESS_INTERVAL,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            mysql_counter_fencing: false,
        };
        let mut passed_on = url::form_urlencoded::Serializer::new(String::new());
        let mut any_passed_on = false;
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            match &*key {
                "mode" => {
                    builder.mode = value.parse().map_err(|e: LockError| bad(reason(e)))?;
                }
                "table" => builder.table = value.into_owned(),
                "migrate" => {
                    builder.migrate = match &*value {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        other => {
                            return Err(bad(format!("migrate={other:?} must be true or false")));
                        }
                    }
                }
                "connect_timeout" => {
                    builder.connect_timeout = timeout_param(&key, &value).map_err(bad)?
                }
                "command_timeout" => {
                    builder.command_timeout = timeout_param(&key, &value).map_err(bad)?
                }
                "liveness" => {
                    builder.liveness_interval = timeout_param(&key, &value).map_err(bad)?
                }
                "max_connections" => {
                    builder.max_connections = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=1000).contains(n))
                        .ok_or_else(|| {
                            bad(format!(
                                "max_connections={value:?} must be a number from 1 to 1000"
                            ))
                        })?;
                }
                _ => {
                    passed_on.append_pair(&key, &value);
                    any_passed_on = true;
                }
            }
        }
        builder.driver_url = if any_passed_on {
            format!("{driver_base}?{}", passed_on.finish())
        } else {
            driver_base
        };
        builder.check().map_err(|e| bad(reason(e)))?;
        Ok(builder)
    }

    fn check(&self) -> Result<()> {
        crate::names::validate_table(&self.table)?;
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

    /// The database of the URL.
    pub fn database(&self) -> Database {
        self.database
    }

    /// Sets the mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The mode.
    pub fn get_mode(&self) -> Mode {
        self.mode
    }

    /// Sets the lock table (checked by [`connect`](Self::connect)).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Whether [`connect`](Self::connect) creates the table (default true).
    pub fn migrate(mut self, on: bool) -> Self {
        self.migrate = on;
        self
    }

    /// Sets the connect timeout.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the timeout of statements that do not wait for a lock.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Sets how often a session lock's connection is checked.
    pub fn liveness_interval(mut self, interval: Duration) -> Self {
        self.liveness_interval = interval;
        self
    }

    /// Sets the size of the shared connection pool.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// MySQL/MariaDB `row` and `named` modes: draw fencing tokens from the
    /// counter table, as on MySQL, even on a MariaDB server that has
    /// sequences. For tests of MySQL's path on MariaDB; not part of the API.
    /// Every client of one database must use the same source.
    #[doc(hidden)]
    pub fn mysql_counter_fencing(mut self, on: bool) -> Self {
        self.mysql_counter_fencing = on;
        self
    }

    /// Connects (eagerly: `Unavailable` when the database cannot be reached
    /// within the connect timeout) and, unless turned off, creates the table.
    pub async fn connect(self) -> Result<SqlLock> {
        self.check()?;
        for (what, d) in [
            ("connect_timeout", self.connect_timeout),
            ("command_timeout", self.command_timeout),
            ("liveness", self.liveness_interval),
        ] {
            if d.is_zero() || d > lockkit_core::backend::MAX_TIMEOUT_PARAM {
                return Err(LockError::invalid_options(format!(
                    "{what} of {d:?} must be positive and at most one hour"
                )));
            }
        }
        if !(1..=1000).contains(&self.max_connections) {
            return Err(LockError::invalid_options(format!(
                "max_connections of {} must be from 1 to 1000",
                self.max_connections
            )));
        }
        SqlLock::open(self).await
    }

    pub(crate) fn settings(&self) -> Settings {
        Settings {
            backend: self.database.name(),
            address: self.address.clone(),
            connect_timeout: self.connect_timeout,
            command_timeout: self.command_timeout,
            liveness_interval: self.liveness_interval,
        }
    }

    pub(crate) fn invalid_url(&self, reason: impl fmt::Display) -> LockError {
        LockError::InvalidUrl {
            url: self.redacted_url.clone(),
            reason: reason.to_string(),
        }
    }
}

fn reason(error: LockError) -> String {
    match error {
        LockError::InvalidOptions { reason } => reason,
        other => other.to_string(),
    }
}

/// Splits a server URL into the driver's URL without the query, the
/// address for messages (`host:port/database`) and the query.
fn split_server(url: &str) -> std::result::Result<(String, String, String), String> {
    let mut parsed = url::Url::parse(url).map_err(|e| format!("not a valid URL: {e}"))?;
    let host = parsed
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| "the URL has no host".to_owned())?
        .to_owned();
    if parsed.port() == Some(0) {
        return Err("port 0 is not a server's port".to_owned());
    }
    let query = parsed.query().unwrap_or("").to_owned();
    parsed.set_query(None);
    parsed.set_fragment(None);
    let address = match parsed.port() {
        Some(port) => format!("{host}:{port}{}", parsed.path()),
        None => format!("{host}{}", parsed.path()),
    };
    Ok((parsed.to_string(), address, query))
}

/// Splits `sqlite://path?query`, `sqlite:path` or `sqlite::memory:`.
fn split_sqlite(url: &str) -> std::result::Result<(String, String, String), String> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| "a SQLite URL starts with sqlite://".to_owned())?;
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path.is_empty() {
        return Err("the URL has no database path (e.g. sqlite://lockkit.db)".to_owned());
    }
    Ok((
        format!("sqlite://{path}"),
        path.to_owned(),
        query.to_owned(),
    ))
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
}

impl Settings {
    /// Runs a statement bounded by the command timeout.
    pub(crate) async fn bounded<T>(
        &self,
        what: &str,
        statement: impl Future<Output = sqlx::Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.command_timeout, statement).await {
            Ok(result) => result.map_err(|e| self.error(what, e)),
            Err(_) => Err(self.timed_out(what)),
        }
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
    pub(crate) async fn connecting<T>(
        &self,
        what: &str,
        connect: impl Future<Output = sqlx::Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(error)) => Err(match self.error(what, error) {
                // Any failure to connect means the database cannot serve.
                LockError::Backend {
                    backend,
                    message,
                    source,
                } if !message.contains("authentication failed") => LockError::Unavailable {
                    backend,
                    message,
                    source,
                },
                other => other,
            }),
            Err(_) => Err(timed_out(
                self.backend,
                &self.address,
                what,
                self.connect_timeout,
            )),
        }
    }

    pub(crate) fn error(&self, what: &str, error: sqlx::Error) -> LockError {
        map_error(self.backend, &self.address, what, error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_our_parameters_and_passes_the_rest_on() {
        let b = SqlLockBuilder::from_url(
            "postgres://u:p%40ss@127.0.0.1:5432/db?mode=row&table=my_locks&migrate=false&connect_timeout=1s&sslmode=disable",
        )
        .unwrap();
        assert_eq!(b.database, Database::Postgres);
        assert_eq!(b.mode, Mode::Row);
        assert_eq!(b.table, "my_locks");
        assert!(!b.migrate);
        assert_eq!(b.connect_timeout, Duration::from_secs(1));
        assert_eq!(
            b.driver_url,
            "postgres://u:p%40ss@127.0.0.1:5432/db?sslmode=disable"
        );
        assert_eq!(b.address, "127.0.0.1:5432/db");
        let debug = format!("{b:?}");
        assert!(
            !debug.contains("p%40ss") && !debug.contains("p@ss"),
            "{debug}"
        );
    }

    #[test]
    fn sqlite_paths() {
        let b = SqlLockBuilder::from_url("sqlite://lockkit.db").unwrap();
        assert_eq!(b.driver_url, "sqlite://lockkit.db");
        let b = SqlLockBuilder::from_url("sqlite:///tmp/x.db?table=t").unwrap();
        assert_eq!(b.driver_url, "sqlite:///tmp/x.db");
        assert_eq!(b.table, "t");
        let b = SqlLockBuilder::from_url("sqlite::memory:").unwrap();
        assert_eq!(b.driver_url, "sqlite://:memory:");
    }

    #[test]
    fn rejects_bad_urls() {
        for (url, needle) in [
            (
                "postgres://u:pw@h/db?mode=named",
                "not available on postgres",
            ),
            ("mysql://h/db?mode=advisory", "not available on mysql"),
            ("sqlite://x.db?mode=row", "not available on sqlite"),
            ("postgres://h/db?mode=fast", "unknown SQL lock mode"),
            ("postgres://h/db?table=a;b", "plain SQL identifier"),
            ("postgres:///db", "no host"),
            ("mysql://h:0/db", "port 0"),
            ("postgres://h:99999/db", "not a valid URL"),
            ("mysql://h/db?connect_timeout=0s", "connect_timeout"),
            ("mysql://h/db?migrate=maybe", "migrate"),
            ("mysql://h/db?max_connections=0", "max_connections"),
            ("sqlite://", "no database path"),
            ("oracle://h/db", "not a SQL URL scheme"),
        ] {
            match SqlLockBuilder::from_url(url) {
                Err(LockError::InvalidUrl { reason, url: shown }) => {
                    assert!(reason.contains(needle), "{url}: {reason}");
                    assert!(!shown.contains("pw"), "{shown}");
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn password_parameters_are_redacted() {
        assert_eq!(
            redact("postgres://h/db?user=u&password=hunter2&mode=row"),
            "postgres://h/db?user=u&password=***&mode=row"
        );
        assert_eq!(redact("mysql://u:pw@h/db"), "mysql://u:***@h/db");
    }
}
