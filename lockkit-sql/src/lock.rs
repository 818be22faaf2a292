//! `SqlLock`: one client of one database in one mode.

use std::fmt;

use futures_util::future::BoxFuture;

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

/// Every method hands back the mode's own future, as `async_trait` spells
/// the signature: an `async fn` awaiting it would box one more future on
/// every call.
#[lockkit_core::async_trait]
impl DistributedLock for SqlLock {
    fn try_acquire<'s, 'n, 'o, 'f>(
        &'s self,
        name: &'n str,
        opts: &'o LockOptions,
    ) -> BoxFuture<'f, Result<Option<LockGuard>>>
    where
        's: 'f,
        'n: 'f,
        'o: 'f,
        Self: 'f,
    {
        self.inner.try_acquire(name, opts)
    }

    fn acquire<'s, 'n, 'o, 'f>(
        &'s self,
        name: &'n str,
        opts: &'o LockOptions,
    ) -> BoxFuture<'f, Result<LockGuard>>
    where
        's: 'f,
        'n: 'f,
        'o: 'f,
        Self: 'f,
    {
        self.inner.acquire(name, opts)
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn attempt<'s, 'n, 'o, 'f>(
        &'s self,
        name: &'n str,
        opts: &'o LockOptions,
    ) -> BoxFuture<'f, Result<Attempt<LockGuard>>>
    where
        's: 'f,
        'n: 'f,
        'o: 'f,
        Self: 'f,
    {
        self.inner.attempt(name, opts)
    }

    fn watch_releases<'s, 'n, 'f>(&'s self, name: &'n str) -> BoxFuture<'f, Result<ReleaseWatch>>
    where
        's: 'f,
        'n: 'f,
        Self: 'f,
    {
        self.inner.watch_releases(name)
    }

    fn status<'s, 'n, 'f>(&'s self, name: &'n str) -> BoxFuture<'f, Result<LockStatus>>
    where
        's: 'f,
        'n: 'f,
        Self: 'f,
    {
        self.inner.status(name)
    }

    fn status_of<'s, 'n, 'f>(
        &'s self,
        name: &'n str,
        kind: LockKind,
    ) -> BoxFuture<'f, Result<LockStatus>>
    where
        's: 'f,
        'n: 'f,
        Self: 'f,
    {
        self.inner.status_of(name, kind)
    }
}
