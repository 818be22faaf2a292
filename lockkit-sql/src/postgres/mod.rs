//! PostgreSQL: lease rows woken by bells and `LISTEN/NOTIFY`, `SELECT … FOR
//! UPDATE` row locks, and `pg_advisory_lock` session locks.
//!
//! [`open`] connects a client; [`statements`] holds every SQL text of a lock
//! table, [`migration`] creates it, [`lease`] runs `lease` mode on it,
//! [`notify`] and [`bell`] wake its waiters, and [`session`] holds the
//! session modes.

mod bell;
mod lease;
mod migration;
mod notify;
mod row;
mod session;
mod statements;

use std::str::FromStr;
use std::sync::Arc;

use lockkit_core::Result;
use sqlx::ConnectOptions as _;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::open::{Opened, close, with_sessions};
use crate::settings::{Settings, SqlConfig};
use lease::{LinesSeen, PgLease};
use migration::PgMigrator;
use notify::PgNotifications;
use session::PgSession;
use statements::PgSql;

/// The upsert and release of `lease` mode on `table` (see
/// [`lease_statements`](crate::lease_statements)).
pub(crate) fn lease_statements(table: &str) -> (Arc<str>, Arc<str>) {
    let sql = PgSql::new(table, true);
    (sql.lease.acquire.text, sql.lease.release[0].text.clone())
}

/// Connects a client to the database of `config`, in its mode.
pub(crate) async fn open(config: &SqlConfig, settings: &Settings) -> Result<Opened> {
    let options = PgConnectOptions::from_str(&config.driver_url)
        .map_err(|e| config.invalid_url(e))?
        .application_name("lockkit");
    let pool = PgPoolOptions::new()
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
    let sql = Arc::new(PgSql::new(&config.table, config.fencing));
    let lease = PgLease {
        sql: sql.clone(),
        notifications: PgNotifications::new(options.clone(), pool.clone(), sql.clone(), settings),
        lines: LinesSeen::default(),
    };
    let session = PgSession::new(options.clone(), pool.clone(), sql.clone(), settings);
    let migrator = PgMigrator { options, sql };
    let parts = (lease, session, migrator);
    Ok(with_sessions(config.mode, settings, pool, parts))
}
