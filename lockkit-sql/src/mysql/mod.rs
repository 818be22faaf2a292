//! MySQL and MariaDB: lease rows, `SELECT … FOR UPDATE` row locks, and
//! `GET_LOCK` named locks.
//!
//! [`open`] connects a client; [`statements`] holds every SQL text of a lock
//! table, [`migration`] creates it, [`lease`] runs `lease` mode on it, and
//! [`session`] and [`row`] the session modes, which send some statements
//! together ([`batch`]); [`bells`] wakes the waiters of other clients in
//! `lease` mode.

mod batch;
mod bells;
mod lease;
mod migration;
mod row;
mod session;
mod statements;

use std::str::FromStr;
use std::sync::Arc;

use lockkit_core::Result;
use sqlx::ConnectOptions as _;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};

use crate::open::{Opened, close, with_sessions};
use crate::settings::{Settings, SqlConfig};
use bells::Bells;
use lease::MyLease;
use migration::MyMigrator;
use session::MySqlSession;
use statements::{FenceSource, MySql};

/// The upsert and release of `lease` mode on `table` (see
/// [`lease_statements`](crate::lease_statements)).
pub(crate) fn lease_statements(table: &str) -> (Arc<str>, Arc<str>) {
    let sql = MySql::new(table, FenceSource::Sequence, true);
    (sql.lease.acquire.text, sql.lease.release[0].text.clone())
}

/// Connects a client to the database of `config`, in its mode.
pub(crate) async fn open(config: &SqlConfig, settings: &Settings) -> Result<Opened> {
    let options =
        MySqlConnectOptions::from_str(&config.driver_url).map_err(|e| config.invalid_url(e))?;
    let pool = MySqlPoolOptions::new()
        .max_connections(config.max_connections)
        .acquire_timeout(config.connect_timeout)
        .test_before_acquire(false)
        .after_connect(|conn, _| Box::pin(read_committed(conn)))
        .connect_lazy_with(options.clone());
    // Eager, on a connection of its own (see the Postgres `open`).
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
    let sql = Arc::new(MySql::new(&config.table, fence_source, config.fencing));
    let bells = Bells::new(options.clone(), sql.clone(), settings, &config.table);
    let lease = MyLease {
        sql: sql.clone(),
        bells,
    };
    let session = MySqlSession::new(options.clone(), pool.clone(), sql.clone(), settings);
    let migrator = MyMigrator { options, sql };
    let parts = (lease, session, migrator);
    Ok(with_sessions(config.mode, settings, pool, parts))
}

/// Puts a connection under `READ COMMITTED`: row locks only, no gap locks.
///
/// Pooled connections: under InnoDB's default `REPEATABLE READ`, the read of
/// the waiting record inside a reader's `INSERT … SELECT` locks the gap
/// where that row would be, so readers that share a name's first grant
/// lock the same gap and then each wait for the others to insert into it:
/// a deadlock, with all but one of them chosen as victims. Dedicated
/// connections: the scan of a semaphore's slot rows (`SKIP LOCKED`) would
/// lock the gaps around them for as long as a permit is held, and an
/// insert of another name's row into such a gap (a lock's first use) would
/// wait for the permit.
async fn read_committed(conn: &mut sqlx::MySqlConnection) -> sqlx::Result<()> {
    sqlx::raw_sql("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(conn)
        .await
        .map(drop)
}
