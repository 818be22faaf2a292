//! The lock table's schema on SQLite.

use std::sync::Arc;

use lockkit_core::Result;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{AssertSqlSafe, ConnectOptions as _};

use super::statements::SqliteSql;
use crate::open::Migrator;
use crate::settings::Settings;

/// Where `migrate` connects, and what it runs.
pub(super) struct SqliteMigrator {
    pub(super) options: SqliteConnectOptions,
    pub(super) sql: Arc<SqliteSql>,
    /// Holds an in-memory database open for the client's lifetime.
    #[allow(dead_code, reason = "held, never read")]
    pub(super) keeper: Option<SqliteConnection>,
}

#[lockkit_core::async_trait]
impl Migrator for SqliteMigrator {
    /// Creates the lock table if it is missing, on a connection of its own.
    async fn migrate(&self, settings: &Settings) -> Result<()> {
        let mut conn = settings
            .connecting("open the database", self.options.connect())
            .await?;
        settings
            .migrating(sqlx::raw_sql(AssertSqlSafe(self.sql.migrate.as_str())).execute(&mut conn))
            .await
            .map(|_| ())
    }
}
