//! The lock table's schema on PostgreSQL.

use std::sync::Arc;

use lockkit_core::Result;
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, ConnectOptions as _, Connection as _};

use super::statements::PgSql;
use crate::names::advisory_key;
use crate::open::Migrator;
use crate::settings::Settings;

/// Where `migrate` connects, and what it runs.
pub(super) struct PgMigrator {
    pub(super) options: PgConnectOptions,
    pub(super) sql: Arc<PgSql>,
}

#[lockkit_core::async_trait]
impl Migrator for PgMigrator {
    /// Creates the table and the fencing sequence if they are missing, on a
    /// connection of its own. Concurrent migrations are serialised by a
    /// transaction-scoped advisory lock, as `CREATE … IF NOT EXISTS` alone can
    /// race in Postgres.
    async fn migrate(&self, settings: &Settings) -> Result<()> {
        let mut conn = settings
            .connecting("connect", self.options.connect())
            .await?;
        settings
            .migrating(async {
                let mut tx = conn.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(advisory_key("lockkit migrate"))
                    .execute(&mut *tx)
                    .await?;
                for statement in &self.sql.migrate {
                    sqlx::query(AssertSqlSafe(statement.as_str()))
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await
            })
            .await
    }
}
