//! `SqlLock`: one client of one database in one mode.

use std::fmt;

use lockkit_core::backend::{Attempt, ReleaseWatch};
use lockkit_core::{
    Capabilities, DistributedLock, LockError, LockGuard, LockKind, LockOptions, LockStatus, Result,
};

use crate::open::{Migrator, Opened};
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
    migrator: Box<dyn Migrator>,
    inner: Box<dyn DistributedLock>,
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
        self.migrator.migrate(&self.settings).await
    }

    // Without any database feature, everything after the match is unreachable.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
        allow(unreachable_code, unused_variables)
    )]
    pub(crate) async fn open(config: SqlConfig) -> Result<SqlLock> {
        let settings = config.settings();
        let opened: Opened = match config.database {
            #[cfg(feature = "postgres")]
            Database::Postgres => crate::postgres::open(&config, &settings).await?,
            #[cfg(feature = "mysql")]
            Database::MySql => crate::mysql::open(&config, &settings).await?,
            #[cfg(feature = "sqlite")]
            Database::Sqlite => crate::sqlite::open(&config, &settings).await?,
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
            migrator: opened.migrator,
            inner: opened.lock,
        };
        if config.migrate {
            lock.migrate().await?;
        }
        tracing::debug!(url = %lock.redacted_url, mode = %lock.mode, "connected");
        Ok(lock)
    }
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
