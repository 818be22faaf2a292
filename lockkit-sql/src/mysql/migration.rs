//! The lock table's schema on MySQL and MariaDB.

use std::sync::Arc;

use lockkit_core::Result;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{AssertSqlSafe, ConnectOptions as _};

use super::statements::MySql;
use crate::open::Migrator;
use crate::settings::Settings;

/// Where `migrate` connects, and what it runs.
pub(super) struct MyMigrator {
    pub(super) options: MySqlConnectOptions,
    pub(super) sql: Arc<MySql>,
}

#[lockkit_core::async_trait]
impl Migrator for MyMigrator {
    /// Creates the lock table and the fencing counter if they are missing, on a
    /// connection of its own. When they are all there it only reads: creating
    /// them again, even `IF NOT EXISTS`, would wait for the holders of row locks.
    async fn migrate(&self, settings: &Settings) -> Result<()> {
        let sql = &self.sql;
        let mut conn = settings
            .connecting("connect", self.options.connect())
            .await?;
        settings
            .migrating(async {
                let mut in_place = true;
                for probe in &sql.migrated {
                    let answer = sqlx::query(AssertSqlSafe(probe.as_str()))
                        .fetch_optional(&mut conn)
                        .await;
                    if !matches!(answer, Ok(Some(_))) {
                        in_place = false;
                        break;
                    }
                }
                if in_place {
                    return Ok(());
                }
                for statement in &sql.migrate {
                    sqlx::query(AssertSqlSafe(statement.as_str()))
                        .execute(&mut conn)
                        .await?;
                }
                if let Some((highest, seq)) = &sql.sequence_floor {
                    let highest: i64 = sqlx::query_scalar(AssertSqlSafe(highest.as_str()))
                        .fetch_one(&mut conn)
                        .await?;
                    // SETVAL takes a literal, and never lowers a sequence.
                    if highest > 0 {
                        sqlx::query(AssertSqlSafe(format!("SELECT SETVAL({seq}, {highest})")))
                            .execute(&mut conn)
                            .await?;
                    }
                }
                Ok(())
            })
            .await
    }
}
