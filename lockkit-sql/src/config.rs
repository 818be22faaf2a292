//! SQL URLs and the builder.

use std::time::Duration;

use lockkit_core::backend::{bool_param, check_timeout, redact_url, timeout_param};
use lockkit_core::{LockError, Result};

use crate::lock::SqlLock;
use crate::names::DEFAULT_TABLE;
use crate::settings::{
    DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_LIVENESS_INTERVAL,
    DEFAULT_MAX_CONNECTIONS, Database, Mode, SqlConfig,
};

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
/// | `connect_timeout` | to open a connection; apart, to check or create the lock table | 5 s |
/// | `command_timeout` | per statement that does not wait for a lock | 5 s |
/// | `liveness` | how often a session lock's connection is checked | 1 s |
/// | `max_connections` | size of the shared pool | 10 |
/// | `fencing` | `false`: the session modes' grants carry no fencing token, and spare the sequence draw that makes one ([`fencing`](SqlLockBuilder::fencing)) | `true` |
///
/// Other parameters go to the database driver (e.g. `sslmode=require`).
///
/// ```
/// use lockkit_sql::{Database, Mode, SqlLockBuilder};
///
/// let builder = SqlLockBuilder::from_url("postgres://app:s3cret@db.internal/jobs?mode=advisory&sslmode=require")?;
/// assert_eq!(builder.database(), Database::Postgres);
/// assert_eq!(builder.selected_mode(), Mode::Advisory);
/// assert!(!format!("{builder:?}").contains("s3cret"));
/// # Ok::<(), lockkit_core::LockError>(())
/// ```
#[derive(Clone, Debug)]
pub struct SqlLockBuilder {
    config: SqlConfig,
}

impl SqlLockBuilder {
    /// Parses a URL (see the type docs).
    pub fn from_url(url: &str) -> Result<SqlLockBuilder> {
        let redacted_url = redact_url(url);
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
        let mut builder = SqlConfig {
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
            fencing: true,
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
                "migrate" => builder.migrate = bool_param(&key, &value).map_err(bad)?,
                "fencing" => builder.fencing = bool_param(&key, &value).map_err(bad)?,
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
        Ok(SqlLockBuilder { config: builder })
    }

    /// The database of the URL.
    pub fn database(&self) -> Database {
        self.config.database
    }

    /// Sets the mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.config.mode = mode;
        self
    }

    /// The mode chosen so far.
    pub fn selected_mode(&self) -> Mode {
        self.config.mode
    }

    /// Sets the lock table (checked by [`connect`](Self::connect)).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.config.table = table.into();
        self
    }

    /// Whether [`connect`](Self::connect) creates the table (default true).
    pub fn migrate(mut self, on: bool) -> Self {
        self.config.migrate = on;
        self
    }

    lockkit_core::timeout_setters!(
        config,
        connect: "How long to wait for a connection (default 5 s).",
        command: "How long a statement that does not wait for a lock may take (default 5 s).",
    );

    /// Sets how often a session lock's connection is checked.
    pub fn liveness_interval(mut self, interval: Duration) -> Self {
        self.config.liveness_interval = interval;
        self
    }

    /// Sets the size of the shared connection pool.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.config.max_connections = n;
        self
    }

    /// Whether the grants of the session modes (`row`, `advisory`,
    /// `named`) carry fencing tokens (default true; `fencing=false` in the
    /// URL). Without, a grant spares the draw from the lock table's
    /// sequence (on MariaDB, `NEXTVAL` in the lock statement; on MySQL, a
    /// statement of its own), the guards'
    /// [`fencing_token`](lockkit_core::LockGuard::fencing_token) is `None`
    /// and [`capabilities().fencing`](lockkit_core::Capabilities::fencing)
    /// is false. For clients that fence nothing, as a lock without tokens
    /// (`distributed-lock`'s) is used. `lease` mode refuses it: its token is
    /// the lease row's own, written with the grant, and other clients of
    /// the name read it.
    ///
    /// ```
    /// use lockkit_sql::SqlLockBuilder;
    ///
    /// let builder = SqlLockBuilder::from_url("mysql://app@db.internal/jobs?mode=named")?
    ///     .fencing(false);
    /// # drop(builder);
    /// assert!(SqlLockBuilder::from_url("mysql://db.internal/jobs?fencing=false").is_err());
    /// # Ok::<(), lockkit_core::LockError>(())
    /// ```
    pub fn fencing(mut self, on: bool) -> Self {
        self.config.fencing = on;
        self
    }

    /// MySQL/MariaDB `row` and `named` modes: draw fencing tokens from the
    /// counter table, as on MySQL, even on a MariaDB server that has
    /// sequences. For tests of MySQL's path on MariaDB; not part of the API.
    /// Every client of one database must use the same source.
    #[doc(hidden)]
    pub fn mysql_counter_fencing(mut self, on: bool) -> Self {
        self.config.mysql_counter_fencing = on;
        self
    }

    /// Connects eagerly (a database that does not accept connections yet is
    /// tried again with backoff until the connect timeout, then gives
    /// `Unavailable`) and, unless turned off, creates the table.
    pub async fn connect(self) -> Result<SqlLock> {
        let config = self.config;
        config.check()?;
        check_timeout("connect_timeout", config.connect_timeout)?;
        check_timeout("command_timeout", config.command_timeout)?;
        check_timeout("liveness", config.liveness_interval)?;
        if !(1..=1000).contains(&config.max_connections) {
            return Err(LockError::invalid_options(format!(
                "max_connections of {} must be from 1 to 1000",
                config.max_connections
            )));
        }
        SqlLock::open(config).await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_our_parameters_and_passes_the_rest_on() {
        let b = SqlLockBuilder::from_url(
            "postgres://u:p%40ss@127.0.0.1:5432/db?mode=row&table=my_locks&migrate=false&connect_timeout=1s&sslmode=disable",
        )
        .unwrap();
        assert_eq!(b.config.database, Database::Postgres);
        assert_eq!(b.config.mode, Mode::Row);
        assert_eq!(b.config.table, "my_locks");
        assert!(!b.config.migrate);
        assert_eq!(b.config.connect_timeout, Duration::from_secs(1));
        assert_eq!(
            b.config.driver_url,
            "postgres://u:p%40ss@127.0.0.1:5432/db?sslmode=disable"
        );
        assert_eq!(b.config.address, "127.0.0.1:5432/db");
        let debug = format!("{b:?}");
        assert!(
            !debug.contains("p%40ss") && !debug.contains("p@ss"),
            "{debug}"
        );
    }

    #[test]
    fn sqlite_paths() {
        let b = SqlLockBuilder::from_url("sqlite://lockkit.db").unwrap();
        assert_eq!(b.config.driver_url, "sqlite://lockkit.db");
        let b = SqlLockBuilder::from_url("sqlite:///tmp/x.db?table=t").unwrap();
        assert_eq!(b.config.driver_url, "sqlite:///tmp/x.db");
        assert_eq!(b.config.table, "t");
        let b = SqlLockBuilder::from_url("sqlite::memory:").unwrap();
        assert_eq!(b.config.driver_url, "sqlite://:memory:");
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
            ("mysql://h/db?mode=named&fencing=maybe", "fencing"),
            (
                "postgres://h/db?fencing=false",
                "lease mode draws its token",
            ),
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
            redact_url("postgres://h/db?user=u&password=hunter2&mode=row"),
            "postgres://h/db?user=u&password=***&mode=row"
        );
        assert_eq!(redact_url("mysql://u:pw@h/db"), "mysql://u:***@h/db");
    }
}
