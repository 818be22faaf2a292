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

use std::ops::{Deref, DerefMut};
use std::sync::Mutex;
use std::time::Duration;

use lockkit_core::Result;
use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};
use tokio::time::Instant;

use crate::config::Settings;

/// How long a kept connection may sit unused before it goes back to sqlx's
/// pool (which tests it, and closes it after its idle timeout or lifetime).
const KEEP_IDLE: Duration = Duration::from_secs(30);

/// A sqlx pool and the connections lockkit keeps checked out of it.
#[derive(Debug)]
pub(crate) struct KeptPool<DB: Database> {
    pool: Pool<DB>,
    kept: Mutex<Vec<(PoolConnection<DB>, Instant)>>,
}

impl<DB: Database> KeptPool<DB> {
    pub(crate) fn new(pool: Pool<DB>) -> Self {
        KeptPool {
            pool,
            kept: Mutex::new(Vec::new()),
        }
    }

    /// The most recently used kept connection, or one from sqlx's pool
    /// (bounded by the connect timeout).
    pub(crate) async fn lend(&self, settings: &Settings) -> Result<Loan<'_, DB>> {
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
        })
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

/// A connection lent out by a [`KeptPool`]. Dropped without
/// [`settle`](Loan::settle) (its statement was cancelled midway), it goes back
/// to sqlx's pool, which waits for the statement's answer and tests it.
#[derive(Debug)]
pub(crate) struct Loan<'a, DB: Database> {
    kept: &'a KeptPool<DB>,
    conn: Option<PoolConnection<DB>>,
}

impl<DB: Database> Loan<'_, DB> {
    /// Ends the loan after its statement answered `outcome` (`Err(_)`: no
    /// answer within the command timeout) and maps a failure to a
    /// [`LockError`](lockkit_core::LockError) about `what`. The connection
    /// is kept for the next statement unless it is in doubt: no answer, or a
    /// failure of the connection itself (then every kept connection goes back
    /// to sqlx's pool, as the others may be dead too).
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
                // sqlx's pool waits for the late answer before reusing it.
                drop(conn);
                Err(settings.timed_out(what))
            }
        }
    }
}

/// Runs one statement on a connection of a [`KeptPool`], bounded by the
/// command timeout: `kept!(pool, settings, "what", |conn| statement)`, where
/// `statement` is a sqlx future on `conn` (a `&mut` connection). Evaluates to
/// a `Result` (the `LockError` names `what`); `?` on the loan itself.
macro_rules! kept {
    ($kept:expr, $settings:expr, $what:expr, |$conn:ident| $statement:expr) => {{
        let settings: &$crate::config::Settings = $settings;
        let mut loan = $kept.lend(settings).await?;
        let outcome = {
            let $conn = &mut *loan;
            tokio::time::timeout(settings.command_timeout, $statement).await
        };
        loan.finish(settings, $what, outcome)
    }};
}
pub(crate) use kept;

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
