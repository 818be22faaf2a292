//! What a dialect's `open()` gives [`SqlLock`](crate::SqlLock): its schema
//! and its lock, built the same way on every database.

use lockkit_core::{DistributedLock, Result};

#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::lease::{LeaseDialect, LeaseRows};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::session::{RowLocking, RowSession, SessionDb};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::settings::Mode;
use crate::settings::Settings;

/// A database's schema: what `migrate` creates, on a connection of its
/// own (so that it never waits for one of the pool's).
#[lockkit_core::async_trait]
pub(crate) trait Migrator: Send + Sync {
    /// Creates the lock table (and the fencing counter) if missing.
    async fn migrate(&self, settings: &Settings) -> Result<()>;
}

/// A client a dialect opened: its schema and its lock.
pub(crate) struct Opened {
    pub(crate) migrator: Box<dyn Migrator>,
    pub(crate) lock: Box<dyn DistributedLock>,
}

/// A client of a database with session modes (its own, and `row`): in
/// `mode`, its lock runs `lease` mode on `lease` rows or a session mode on
/// `session`'s connections (which record holder identities in `lease`
/// rows), each on connections of `pool`; `migrator` creates its schema.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn with_sessions<L, S, M>(
    mode: Mode,
    settings: &Settings,
    pool: sqlx::Pool<L::Db>,
    (lease, session, migrator): (L, S, M),
) -> Opened
where
    L: LeaseDialect,
    S: RowLocking,
    RowSession<S>: SessionDb,
    M: Migrator + 'static,
{
    use crate::pool::KeptPool;
    use crate::session::SessionLock;
    use lockkit_core::backend::{LeaseLock, QueuedLock};
    use std::sync::Arc;
    let rows = LeaseRows::new(lease, KeptPool::new(pool), settings.clone());
    let lock: Box<dyn DistributedLock> = match mode {
        Mode::Lease => Box::new(LeaseLock::new(rows)),
        Mode::Row => Box::new(QueuedLock::new(SessionLock::new(
            RowSession(session),
            Arc::new(rows),
        ))),
        _ => Box::new(QueuedLock::new(SessionLock::new(session, Arc::new(rows)))),
    };
    Opened {
        migrator: Box::new(migrator),
        lock,
    }
}

/// Closes a connection politely, without waiting long for the server.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn close(conn: impl sqlx::Connection) {
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), conn.close()).await;
}
