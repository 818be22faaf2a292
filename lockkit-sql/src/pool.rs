//! Connections kept out of sqlx's pool between statements.
//!
//! sqlx tests every connection that goes back to its pool with a ping, a
//! round trip of its own. For a lock, whose every operation is a single short
//! statement, that doubles the traffic and keeps the next statement waiting
//! for a connection that is still being pinged. [`KeptPool`] therefore keeps
//! the connections it has used (still counted against the pool's
//! `max_connections`) and lends them out again directly. A connection goes
//! back to sqlx, and gets its ping, only when it is in doubt: its statement
//! was cancelled or failed on the connection itself, or it sat unused for
//! [`KEEP_IDLE`].
//!
//! A statement runs on a [`Loan`]: `pool.lend(settings)`, the statement on
//! the loan's connection bounded by [`Settings::timed`], then
//! [`Loan::finish`] with its answer. A statement that takes something (a
//! lease upsert) can carry an [`Undo`]:
//! if the statement is abandoned before it answers (the caller's future was
//! dropped, or the command timeout ran out), the undo runs on the *same*
//! connection, after the abandoned statement, so it sees whatever that
//! statement did. A cleanup sent on another connection could overtake it.
//!
//! Otherwise a connection whose statement was given up midway is closed,
//! never lent again, and so is one whose undo did not succeed: a driver
//! cannot always find its place in the answers after a statement it gave
//! up. sqlx-mysql, given up while it prepares a statement, leaves the
//! prepare's answer unread, and sqlx's test of a returned connection (a
//! ping) can take that answer's first packet for its own; the next
//! statement then reads the rest as its answer. (A statement with an undo
//! is therefore prepared before its undo is armed: see
//! `LeaseDialect::ready_acquire`.)

use std::fmt;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockkit_core::Result;
use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::settings::Settings;

/// How long a kept connection may sit unused before it goes back to sqlx's
/// pool (which tests it, and closes it after its idle timeout or lifetime).
const KEEP_IDLE: Duration = Duration::from_secs(30);

/// A sqlx pool and the connections lockkit keeps checked out of it.
///
/// Lenders queue on a semaphore with one permit per connection the pool may
/// open: a connection that comes back to `kept` goes to the next lender in
/// line. (Waiting in sqlx's own pool instead would starve: connections come
/// back here, not there, so a task queued in sqlx's pool would wait out its
/// timeout while others were served.)
#[derive(Debug)]
pub(crate) struct KeptPool<DB: Database> {
    pool: Pool<DB>,
    kept: Mutex<Vec<(PoolConnection<DB>, Instant)>>,
    permits: Arc<Semaphore>,
}

impl<DB: Database> KeptPool<DB> {
    pub(crate) fn new(pool: Pool<DB>) -> Self {
        let size = pool.options().get_max_connections() as usize;
        KeptPool {
            pool,
            kept: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(size.max(1))),
        }
    }

    /// The most recently used kept connection, or one from sqlx's pool; the
    /// wait for a free one is bounded by the connect timeout.
    pub(crate) async fn lend(&self, settings: &Settings) -> Result<Loan<'_, DB>> {
        let permit = match tokio::time::timeout(
            settings.connect_timeout,
            self.permits.clone().acquire_owned(),
        )
        .await
        {
            Ok(Ok(permit)) => permit,
            // The semaphore is never closed.
            Ok(Err(_)) | Err(_) => return Err(settings.pool_exhausted(self.permits_total())),
        };
        let now = Instant::now();
        let kept = {
            let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
            // Long unused connections go back to sqlx, which tests them.
            kept.retain(|(_, since)| now.duration_since(*since) < KEEP_IDLE);
            kept.pop()
        };
        let conn = match kept {
            Some((conn, _)) => conn,
            None => settings.connecting("connect", self.pool.acquire()).await?,
        };
        Ok(Loan {
            kept: self,
            conn: Some(conn),
            undo: None,
            permit: Some(permit),
        })
    }

    fn permits_total(&self) -> usize {
        self.pool.options().get_max_connections() as usize
    }

    /// Gives every kept connection back to sqlx's pool (which tests them):
    /// after one connection failed, the others may be dead too.
    fn release_all(&self) {
        self.kept.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

impl<DB: Database> Drop for KeptPool<DB> {
    /// Outside a runtime (a client dropped after its runtime, or in sync
    /// code) sqlx cannot spawn the task that takes a connection back, so the
    /// kept connections are detached from the pool and closed here. (The
    /// pools lockkit builds keep no minimum of connections, which would need
    /// that task too.)
    fn drop(&mut self) {
        let kept = std::mem::take(&mut *self.kept.lock().unwrap_or_else(|p| p.into_inner()));
        if tokio::runtime::Handle::try_current().is_err() {
            for (conn, _) in kept {
                drop(conn.detach());
            }
        }
    }
}

/// The future of an [`Undo`], on the connection it borrows.
pub(crate) type UndoFuture<'c> = Pin<Box<dyn Future<Output = sqlx::Result<()>> + Send + 'c>>;

/// What an [`Undo`] runs, given the connection and the lock's name.
type UndoRun<DB> =
    Box<dyn for<'c> FnOnce(&'c mut PoolConnection<DB>, String) -> UndoFuture<'c> + Send>;

/// What undoes a statement that was abandoned before it answered; it runs on
/// the statement's own connection, after it (see the module docs).
pub(crate) struct Undo<DB: Database> {
    run: UndoRun<DB>,
    timeout: Duration,
    lock: String,
}

impl<DB: Database> fmt::Debug for Undo<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Undo")
            .field("lock", &self.lock)
            .finish_non_exhaustive()
    }
}

impl<DB: Database> Undo<DB> {
    /// `run` undoes the statement about lock `lock`, given the connection
    /// and that name; bounded by the command timeout.
    pub(crate) fn new(
        settings: &Settings,
        lock: &str,
        run: impl for<'c> FnOnce(&'c mut PoolConnection<DB>, String) -> UndoFuture<'c> + Send + 'static,
    ) -> Self {
        Undo {
            run: Box::new(run),
            timeout: settings.command_timeout,
            lock: lock.to_owned(),
        }
    }

    /// Runs in a task of its own on `conn`, which then goes back to sqlx's
    /// pool if the undo succeeded and is closed if not (it may be out of
    /// step). Outside a runtime nothing can run: the connection is closed,
    /// and whatever the statement took ends with its TTL.
    fn spawn(self, conn: PoolConnection<DB>, permit: Option<OwnedSemaphorePermit>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            close_abandoned(conn);
            tracing::warn!(lock.name = %self.lock, "an abandoned acquire cannot be undone outside a runtime; its lease ends with its TTL");
            return;
        };
        runtime.spawn(async move {
            // The connection is still this loan's until the undo is done.
            let _permit = permit;
            let (lock, mut conn) = (self.lock, conn);
            let undone =
                tokio::time::timeout(self.timeout, (self.run)(&mut conn, lock.clone())).await;
            match undone {
                Ok(Ok(())) => {
                    tracing::debug!(lock.name = %lock, "undid an abandoned acquire");
                    return;
                }
                Ok(Err(error)) => tracing::warn!(lock.name = %lock, %error, "could not undo an abandoned acquire; its lease ends with its TTL"),
                Err(_) => tracing::warn!(lock.name = %lock, "undoing an abandoned acquire timed out; its lease ends with its TTL"),
            }
            close_abandoned(conn);
        });
    }
}

/// Closes a connection whose statement was given up midway, without
/// giving it back to sqlx's pool (see the module docs); the pool may open
/// another in its place.
fn close_abandoned<DB: Database>(conn: PoolConnection<DB>) {
    drop(conn.detach());
}

/// A connection lent out by a [`KeptPool`]. Dropped without
/// [`finish`](Loan::finish) (its statement was cancelled midway), it runs its
/// [`Undo`] if it has one, and is closed if not.
#[derive(Debug)]
pub(crate) struct Loan<'a, DB: Database> {
    kept: &'a KeptPool<DB>,
    conn: Option<PoolConnection<DB>>,
    undo: Option<Undo<DB>>,
    /// This loan's place among the pool's connections.
    permit: Option<OwnedSemaphorePermit>,
}

impl<DB: Database> Drop for Loan<'_, DB> {
    fn drop(&mut self) {
        let conn = self.conn.take();
        self.give_up(conn);
    }
}

impl<DB: Database> Loan<'_, DB> {
    /// The loan's statement was given up before it answered: its undo runs
    /// on `conn` if it has one, and `conn` is closed if not.
    fn give_up(&mut self, conn: Option<PoolConnection<DB>>) {
        match (conn, self.undo.take()) {
            (Some(conn), Some(undo)) => undo.spawn(conn, self.permit.take()),
            (Some(conn), None) => close_abandoned(conn),
            (None, _) => {}
        }
    }

    /// Sets what undoes this loan's statement if it is abandoned.
    pub(crate) fn undo_with(&mut self, undo: Undo<DB>) {
        self.undo = Some(undo);
    }

    /// Ends the loan after its statement answered `outcome` (`Err(_)`: no
    /// answer within the command timeout) and maps a failure to a
    /// [`LockError`](lockkit_core::LockError) about `what`. The connection
    /// is kept for the next statement unless it is in doubt: no answer (then
    /// the [`Undo`] runs), or a failure of the connection itself (then every
    /// kept connection goes back to sqlx's pool, as the others may be dead
    /// too).
    pub(crate) fn finish<T>(
        mut self,
        settings: &Settings,
        what: &str,
        outcome: std::result::Result<sqlx::Result<T>, tokio::time::error::Elapsed>,
    ) -> Result<T> {
        let conn = self.conn.take();
        match outcome {
            Ok(answer @ (Ok(_) | Err(sqlx::Error::Database(_) | sqlx::Error::RowNotFound))) => {
                if let Some(conn) = conn {
                    self.kept
                        .kept
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((conn, Instant::now()));
                }
                answer.map_err(|error| settings.error(what, error))
            }
            Ok(Err(error)) => {
                drop(conn);
                self.kept.release_all();
                Err(settings.error(what, error))
            }
            Err(_) => {
                // The undo waits for the late answer.
                self.give_up(conn);
                Err(settings.timed_out(what))
            }
        }
    }
}

impl<DB: Database> Deref for Loan<'_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.conn.as_ref().expect("a loan holds its connection")
    }
}

impl<DB: Database> DerefMut for Loan<'_, DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.conn.as_mut().expect("a loan holds its connection")
    }
}
