//! SQLite: lease rows in a database file shared by the processes of one host.
//!
//! [`open`] connects a client; [`statements`] holds every SQL text of a lock
//! table, [`migration`] creates it, [`lease`] runs `lease` mode on it, and
//! [`bells`] wakes the waiters of other processes.

pub(crate) mod bells;
mod lease;
mod migration;
mod statements;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use lockkit_core::Result;
use lockkit_core::backend::LeaseLock;
use sqlx::ConnectOptions as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use crate::lease::{LeaseRows, Line, Places};
use crate::open::Opened;
use crate::pool::KeptPool;
use crate::settings::{Settings, SqlConfig};
use bells::Bells;
use lease::SqliteLease;
use migration::SqliteMigrator;
use statements::SqliteSql;

/// The upsert and release of `lease` mode on `table` (see
/// [`lease_statements`](crate::lease_statements)).
pub(crate) fn lease_statements(table: &str) -> (Arc<str>, Arc<str>) {
    let sql = SqliteSql::new(table);
    (sql.lease.acquire.text, sql.lease.release[0].text.clone())
}

/// Connects a client to the database of `config` (`lease` mode).
pub(crate) async fn open(config: &SqlConfig, settings: &Settings) -> Result<Opened> {
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
        .idle_timeout(Some(Duration::from_secs(600)))
        .max_lifetime(Some(Duration::from_secs(1800)))
        .connect_lazy_with(options.clone());
    drop(
        settings
            .first_connection("open the database", || pool.acquire())
            .await?,
    );
    let sql = Arc::new(SqliteSql::new(&config.table));
    let places = Places {
        pool: pool.clone(),
        sql: sql.places.clone(),
        client: sql.lease.client.clone(),
        settings: settings.clone(),
    };
    // Waiters in line sleep until their turn: a renewal wakes them too.
    let line = (!in_memory).then(|| Line::new(places, true));
    let bells = Bells::new(
        (!in_memory).then(|| options.get_filename()),
        &sql.lease.client,
        line.as_ref().map(|line| line.turns().clone()),
    );
    let lock = LeaseLock::new(LeaseRows::new(
        SqliteLease {
            sql: sql.clone(),
            bells,
            line,
        },
        KeptPool::new(pool),
        settings.clone(),
    ));
    Ok(Opened {
        migrator: Box::new(SqliteMigrator {
            options,
            sql,
            keeper,
        }),
        lock: Box::new(lock),
    })
}
