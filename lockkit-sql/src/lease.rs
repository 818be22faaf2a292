//! `lease` mode: a row per lock with an owner and an expiry decided by the
//! server's clock, on every database.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{
    Attempt, Capabilities, FencingToken, LeaseBackend, OwnerToken, ReleaseWatch, Result,
    validate_name,
};

use crate::config::Settings;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use crate::pool::KeptPool;

#[cfg(feature = "postgres")]
use crate::config::NOTIFIED_LEASE_CAPABILITIES;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use crate::config::POLLED_LEASE_CAPABILITIES;

/// The database behind the lease rows.
#[derive(Debug)]
pub(crate) enum Rows {
    #[cfg(feature = "postgres")]
    Postgres {
        pool: KeptPool<sqlx::Postgres>,
        sql: Arc<crate::postgres::PgSql>,
        notifications: Box<crate::postgres::PgNotifications>,
    },
    #[cfg(feature = "mysql")]
    MySql {
        pool: KeptPool<sqlx::MySql>,
        sql: Arc<crate::mysql::MySql>,
    },
    #[cfg(feature = "sqlite")]
    Sqlite {
        pool: KeptPool<sqlx::Sqlite>,
        sql: Arc<crate::sqlite::SqliteSql>,
    },
}

/// The [`LeaseBackend`] of `lease` mode.
#[derive(Debug)]
pub(crate) struct LeaseRows {
    rows: Rows,
    settings: Settings,
}

impl LeaseRows {
    pub(crate) fn new(rows: Rows, settings: Settings) -> Self {
        LeaseRows { rows, settings }
    }
}

#[lockkit_core::async_trait]
impl LeaseBackend for LeaseRows {
    type Key = String;

    fn backend_name(&self) -> &'static str {
        self.settings.backend
    }

    fn capabilities(&self) -> Capabilities {
        match &self.rows {
            #[cfg(feature = "postgres")]
            Rows::Postgres { .. } => NOTIFIED_LEASE_CAPABILITIES,
            #[cfg(feature = "mysql")]
            Rows::MySql { .. } => POLLED_LEASE_CAPABILITIES,
            #[cfg(feature = "sqlite")]
            Rows::Sqlite { .. } => POLLED_LEASE_CAPABILITIES,
        }
    }

    /// Names are stored as they are (bound parameters; byte-wise comparison).
    fn key(&self, name: &str) -> Result<String> {
        validate_name(name)?;
        Ok(name.to_owned())
    }

    /// Cancellation-safe without a task per attempt: if the upsert is
    /// abandoned before it answers, a release runs after it on the same
    /// connection (see [`Undo`](crate::pool::Undo)), so it cannot overtake
    /// a statement that may still take the lease. (SQLite's statements run
    /// on a worker thread that a dropped future does not stop; the release
    /// queues behind it there too.)
    async fn try_lock(
        &self,
        name: &String,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let s = &self.settings;
        let owner = owner.as_str();
        match &self.rows {
            #[cfg(feature = "postgres")]
            Rows::Postgres { pool, sql, .. } => {
                crate::postgres::try_lock(pool, sql, s, name, owner, ttl).await
            }
            #[cfg(feature = "mysql")]
            Rows::MySql { pool, sql } => {
                crate::mysql::try_lock(pool, sql, s, name, owner, ttl).await
            }
            #[cfg(feature = "sqlite")]
            Rows::Sqlite { pool, sql } => {
                crate::sqlite::try_lock(pool, sql, s, name, owner, ttl).await
            }
        }
    }

    async fn extend(&self, name: &String, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        let s = &self.settings;
        let owner = owner.as_str();
        match &self.rows {
            #[cfg(feature = "postgres")]
            Rows::Postgres { pool, sql, .. } => {
                crate::postgres::extend(pool, sql, s, name, owner, ttl).await
            }
            #[cfg(feature = "mysql")]
            Rows::MySql { pool, sql } => crate::mysql::extend(pool, sql, s, name, owner, ttl).await,
            #[cfg(feature = "sqlite")]
            Rows::Sqlite { pool, sql } => {
                crate::sqlite::extend(pool, sql, s, name, owner, ttl).await
            }
        }
    }

    async fn release(&self, name: &String, owner: &OwnerToken) -> Result<bool> {
        let s = &self.settings;
        let owner = owner.as_str();
        match &self.rows {
            #[cfg(feature = "postgres")]
            Rows::Postgres { pool, sql, .. } => {
                crate::postgres::release(pool, sql, s, name, owner).await
            }
            #[cfg(feature = "mysql")]
            Rows::MySql { pool, sql } => crate::mysql::release(pool, sql, s, name, owner).await,
            #[cfg(feature = "sqlite")]
            Rows::Sqlite { pool, sql } => crate::sqlite::release(pool, sql, s, name, owner).await,
        }
    }

    /// Postgres: `LISTEN` for the release's `NOTIFY`. Elsewhere none: waiters
    /// back off, never past the holder's expiry.
    async fn watch(&self, name: &String) -> Result<ReleaseWatch> {
        match &self.rows {
            #[cfg(feature = "postgres")]
            Rows::Postgres {
                sql, notifications, ..
            } => Ok(notifications
                .watch(sql.channel(), &self.settings, name)
                .await),
            #[allow(unreachable_patterns)]
            _ => {
                let _ = name;
                Ok(ReleaseWatch::none())
            }
        }
    }
}
