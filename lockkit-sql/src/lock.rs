//! `SqlLock`: one client of one database in one mode.

use std::fmt;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use std::str::FromStr;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use std::sync::Arc;

use lockkit_core::backend::{Attempt, ReleaseWatch};
use lockkit_core::{
    Capabilities, DistributedLock, LockError, LockGuard, LockKind, LockOptions, LockStatus, Result,
};

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use crate::pool::KeptPool;
use crate::settings::{Database, Mode, Settings, SqlConfig};

/// A lock client on one SQL database, in one [`Mode`].
///
/// Build it with [`SqlLock::connect`] (a URL) or [`SqlLockBuilder`](crate::SqlLockBuilder); use it
/// through [`DistributedLock`]. `Debug` never shows credentials.
pub struct SqlLock {
    database: Database,
    mode: Mode,
    table: String,
    redacted_url: String,
    settings: Settings,
    admin: Admin,
    inner: Box<dyn DistributedLock>,
}

/// Where `migrate` connects (on a connection of its own, so that it never
/// waits for one of the pool's).
enum Admin {
    #[cfg(feature = "postgres")]
    Postgres(
        Box<sqlx::postgres::PgConnectOptions>,
        Arc<crate::postgres::PgSql>,
    ),
    #[cfg(feature = "mysql")]
    MySql(
        Box<sqlx::mysql::MySqlConnectOptions>,
        Arc<crate::mysql::MySql>,
    ),
    #[cfg(feature = "sqlite")]
    Sqlite(
        Box<sqlx::sqlite::SqliteConnectOptions>,
        Arc<crate::sqlite::SqliteSql>,
        /// Holds an in-memory database open.
        #[allow(dead_code, reason = "held, never read")]
        Option<sqlx::SqliteConnection>,
    ),
    /// Never built: keeps the enum inhabited-looking without any feature.
    #[allow(dead_code)]
    None,
}

impl fmt::Debug for SqlLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlLock")
            .field("url", &self.redacted_url)
            .field("database", &self.database)
            .field("mode", &self.mode)
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl SqlLock {
    /// Connects to the database of a `postgres://`, `postgresql://`,
    /// `mysql://`, `mariadb://` or `sqlite:` URL; see [`SqlLockBuilder`](crate::SqlLockBuilder) for
    /// the parameters.
    pub async fn connect(url: &str) -> Result<SqlLock> {
        crate::SqlLockBuilder::from_url(url)?.connect().await
    }

    /// The database.
    pub fn database(&self) -> Database {
        self.database
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The lock table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the lock table (and the fencing counter) if missing.
    /// Idempotent, and safe to run from many clients at once. `connect` runs
    /// it unless the URL says `migrate=false`.
    pub async fn migrate(&self) -> Result<()> {
        let s = &self.settings;
        match &self.admin {
            #[cfg(feature = "postgres")]
            Admin::Postgres(options, sql) => crate::postgres::migrate(options, sql, s).await,
            #[cfg(feature = "mysql")]
            Admin::MySql(options, sql) => crate::mysql::migrate(options, sql, s).await,
            #[cfg(feature = "sqlite")]
            Admin::Sqlite(options, sql, _) => crate::sqlite::migrate(options, sql, s).await,
            Admin::None => {
                let _ = s;
                Ok(())
            }
        }
    }

    // Without any database feature, everything after the match is unreachable.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
        allow(unreachable_code, unused_variables)
    )]
    pub(crate) async fn open(config: SqlConfig) -> Result<SqlLock> {
        let settings = config.settings();
        let (admin, inner) = match config.database {
            #[cfg(feature = "postgres")]
            Database::Postgres => open_postgres(&config, &settings).await?,
            #[cfg(feature = "mysql")]
            Database::MySql => open_mysql(&config, &settings).await?,
            #[cfg(feature = "sqlite")]
            Database::Sqlite => open_sqlite(&config, &settings).await?,
            #[allow(unreachable_patterns)]
            other => {
                return Err(LockError::BackendNotCompiled {
                    scheme: other.to_string(),
                    feature: other.feature(),
                });
            }
        };
        let lock = SqlLock {
            database: config.database,
            mode: config.mode,
            table: config.table.clone(),
            redacted_url: config.redacted_url.clone(),
            settings,
            admin,
            inner,
        };
        if config.migrate {
            lock.migrate().await?;
        }
        tracing::debug!(url = %lock.redacted_url, mode = %lock.mode, "connected");
        Ok(lock)
    }
}

#[cfg(feature = "postgres")]
async fn open_postgres(
    config: &SqlConfig,
    settings: &Settings,
) -> Result<(Admin, Box<dyn DistributedLock>)> {
    use crate::postgres::{PgNotifications, PgSession, PgSessionMode, PgSql};
    use sqlx::ConnectOptions as _;
    let options = sqlx::postgres::PgConnectOptions::from_str(&config.driver_url)
        .map_err(|e| config.invalid_url(e))?
        .application_name("lockkit");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(config.max_connections)
        .acquire_timeout(config.connect_timeout)
        .test_before_acquire(false)
        .connect_lazy_with(options.clone());
    // Eager, on a connection of its own: sqlx's pool would retry a refused
    // connection until its timeout and then report only that it timed out.
    close(
        settings
            .first_connection("connect", || options.connect())
            .await?,
    )
    .await;
    let sql = Arc::new(PgSql::new(&config.table));
    let admin = Admin::Postgres(Box::new(options.clone()), sql.clone());
    let inner: Box<dyn DistributedLock> = match config.mode {
        Mode::Lease => Box::new(lockkit_core::backend::LeaseLock::new(
            crate::lease::LeaseRows::new(
                crate::postgres::PgLease {
                    sql,
                    notifications: PgNotifications::new(options),
                },
                KeptPool::new(pool),
                settings.clone(),
            ),
        )),
        mode => {
            // Identity records are lease rows; no one waits for them.
            let records = Arc::new(crate::lease::LeaseRows::new(
                crate::postgres::PgLease {
                    sql: sql.clone(),
                    notifications: PgNotifications::new(options.clone()),
                },
                KeptPool::new(pool.clone()),
                settings.clone(),
            ));
            Box::new(lockkit_core::backend::QueuedLock::new(
                crate::session::SessionLock::new(
                    PgSession {
                        options,
                        pool,
                        sql,
                        mode: if mode == Mode::Row {
                            PgSessionMode::Row
                        } else {
                            PgSessionMode::Advisory
                        },
                        settings: settings.clone(),
                    },
                    records,
                ),
            ))
        }
    };
    Ok((admin, inner))
}

#[cfg(feature = "mysql")]
async fn open_mysql(
    config: &SqlConfig,
    settings: &Settings,
) -> Result<(Admin, Box<dyn DistributedLock>)> {
    use crate::mysql::{FenceSource, MySql, MySqlSession, MySqlSessionMode};
    use sqlx::ConnectOptions as _;
    let options = sqlx::mysql::MySqlConnectOptions::from_str(&config.driver_url)
        .map_err(|e| config.invalid_url(e))?;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(config.max_connections)
        .acquire_timeout(config.connect_timeout)
        .test_before_acquire(false)
        .connect_lazy_with(options.clone());
    // Eager, on a connection of its own (see `open_postgres`).
    let mut conn = settings
        .first_connection("connect", || options.connect())
        .await?;
    let version: String = settings
        .bounded(
            "read the server version",
            sqlx::query_scalar("SELECT VERSION()").fetch_one(&mut conn),
        )
        .await?;
    close(conn).await;
    let fence_source = match config.mysql_counter_fencing {
        true => FenceSource::Counter,
        false => FenceSource::for_version(&version),
    };
    tracing::debug!(%version, ?fence_source, "MySQL/MariaDB server");
    let sql = Arc::new(MySql::new(&config.table, fence_source));
    let admin = Admin::MySql(Box::new(options.clone()), sql.clone());
    let inner: Box<dyn DistributedLock> = match config.mode {
        Mode::Lease => Box::new(lockkit_core::backend::LeaseLock::new(
            crate::lease::LeaseRows::new(
                crate::mysql::MyLease { sql },
                KeptPool::new(pool),
                settings.clone(),
            ),
        )),
        mode => {
            let records = Arc::new(crate::lease::LeaseRows::new(
                crate::mysql::MyLease { sql: sql.clone() },
                KeptPool::new(pool.clone()),
                settings.clone(),
            ));
            Box::new(lockkit_core::backend::QueuedLock::new(
                crate::session::SessionLock::new(
                    MySqlSession {
                        options,
                        pool,
                        sql,
                        mode: if mode == Mode::Row {
                            MySqlSessionMode::Row
                        } else {
                            MySqlSessionMode::Named
                        },
                        settings: settings.clone(),
                    },
                    records,
                ),
            ))
        }
    };
    Ok((admin, inner))
}

/// Closes a connection politely, without waiting long for the server.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn close(conn: impl sqlx::Connection) {
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), conn.close()).await;
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(
    config: &SqlConfig,
    settings: &Settings,
) -> Result<(Admin, Box<dyn DistributedLock>)> {
    use sqlx::ConnectOptions as _;
    use sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
    };
    let in_memory = config.driver_url == "sqlite://:memory:";
    let mut options = SqliteConnectOptions::from_str(&config.driver_url)
        .map_err(|e| config.invalid_url(e))?
        .create_if_missing(true)
        .busy_timeout(config.command_timeout);
    if !in_memory {
        options = options
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal);
    }
    // An in-memory database lives as long as one of its connections: the
    // keeper holds it open for the client's lifetime. (Not a pool minimum:
    // that needs a runtime to drop the client.)
    let keeper = if in_memory {
        Some(
            settings
                .first_connection("open the database", || options.connect())
                .await?,
        )
    } else {
        None
    };
    let pool = SqlitePoolOptions::new()
        .max_connections(config.max_connections)
        .acquire_timeout(config.connect_timeout)
        .test_before_acquire(false)
        .min_connections(0)
        .idle_timeout(Some(std::time::Duration::from_secs(600)))
        .max_lifetime(Some(std::time::Duration::from_secs(1800)))
        .connect_lazy_with(options.clone());
    drop(
        settings
            .first_connection("open the database", || pool.acquire())
            .await?,
    );
    let sql = Arc::new(crate::sqlite::SqliteSql::new(&config.table));
    let admin = Admin::Sqlite(Box::new(options), sql.clone(), keeper);
    let inner = Box::new(lockkit_core::backend::LeaseLock::new(
        crate::lease::LeaseRows::new(
            crate::sqlite::SqliteLease { sql },
            KeptPool::new(pool),
            settings.clone(),
        ),
    ));
    Ok((admin, inner))
}

#[lockkit_core::async_trait]
impl DistributedLock for SqlLock {
    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<LockGuard>> {
        self.inner.try_acquire(name, opts).await
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard> {
        self.inner.acquire(name, opts).await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn attempt(&self, name: &str, opts: &LockOptions) -> Result<Attempt<LockGuard>> {
        self.inner.attempt(name, opts).await
    }

    async fn watch_releases(&self, name: &str) -> Result<ReleaseWatch> {
        self.inner.watch_releases(name).await
    }

    async fn status(&self, name: &str) -> Result<LockStatus> {
        self.inner.status(name).await
    }

    async fn status_of(&self, name: &str, kind: LockKind) -> Result<LockStatus> {
        self.inner.status_of(name, kind).await
    }
}
