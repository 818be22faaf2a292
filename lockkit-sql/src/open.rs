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

/// The lock of `mode` on a database whose `lease` mode runs on `rows` and
/// whose session modes (its own, and `row`) on `session`'s connections;
/// the session modes record holder identities in `rows`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn session_or_lease<L, S>(
    mode: Mode,
    rows: LeaseRows<L>,
    session: S,
) -> Box<dyn DistributedLock>
where
    L: LeaseDialect,
    S: RowLocking,
    RowSession<S>: SessionDb,
{
    use crate::session::SessionLock;
    use lockkit_core::backend::{LeaseLock, QueuedLock};
    use std::sync::Arc;
    match mode {
        Mode::Lease => Box::new(LeaseLock::new(rows)),
        Mode::Row => Box::new(QueuedLock::new(SessionLock::new(
            RowSession(session),
            Arc::new(rows),
        ))),
        _ => Box::new(QueuedLock::new(SessionLock::new(session, Arc::new(rows)))),
    }
}

/// Closes a connection politely, without waiting long for the server.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn close(conn: impl sqlx::Connection) {
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), conn.close()).await;
}
