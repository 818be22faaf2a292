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
//! [`Loan::finish`] with its answer.
//!
//! A connection whose statement was given up midway (its future dropped, or
//! the command timeout ran out) is closed and never lent again, and so is one
//! whose statement failed on the connection itself: a driver cannot always
//! find its place in the answers after a statement it gave up. (sqlx-mysql,
//! given up after reading part of an answer or while it prepares a
//! statement, takes the rest of that answer for the next one's and can
//! panic decoding it.)
//!
//! A statement that takes something (a lease upsert) carries an [`Undo`]
//! that runs in a task of its own if the statement is given up. On MySQL
//! and MariaDB it runs on a *fresh* connection, after it has ended the
//! given-up connection's session on the server and seen it gone
//! ([`SessionId`]): whatever the given-up statement did is then done, and
//! the undo cannot overtake it; it is retried (backing off) while the
//! server does not answer, for as long as the lease it undoes could last.
//! On PostgreSQL and SQLite, whose drivers keep their place in the answers
//! after a statement given up (sqlx-postgres reads up to the next
//! `ReadyForQuery`; SQLite runs statements in this process, in order, on a
//! worker thread that a dropped future does not stop), the undo queues
//! behind the given-up statement on its own connection, which is then
//! closed all the same. (A fresh-connection undo on PostgreSQL, after
//! `pg_terminate_backend`, left leases behind under load in the
//! conformance suite's cancellation cases; the cause was not found.)

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockkit_core::Result;
use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::settings::Settings;
use crate::statement::Answer;

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
    kept: Shelf<DB>,
    permits: Arc<Semaphore>,
}

/// The connections a [`KeptPool`] keeps, shared with the [`Undo`]s it
/// spawns (which take one before they open a new one: a kept connection
/// still counts against sqlx's pool).
type Shelf<DB> = Arc<Mutex<Vec<Kept<DB>>>>;

/// A connection lockkit keeps: since when it is unused, and its session on
/// the server once a statement asked for it.
#[derive(Debug)]
struct Kept<DB: Database> {
    conn: PoolConnection<DB>,
    since: Instant,
    session: Option<SessionId>,
}

impl<DB: Database> KeptPool<DB> {
    pub(crate) fn new(pool: Pool<DB>) -> Self {
        let size = pool.options().get_max_connections() as usize;
        KeptPool {
            pool,
            kept: Arc::new(Mutex::new(Vec::new())),
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
            kept.retain(|kept| now.duration_since(kept.since) < KEEP_IDLE);
            kept.pop()
        };
        let (conn, session) = match kept {
            Some(kept) => (kept.conn, kept.session),
            // Boxed: sqlx's acquire is a future of kilobytes, which would
            // otherwise make every statement's future (that holds this one)
            // as large, to be copied on each lease statement.
            None => (
                settings
                    .connecting("connect", Box::pin(self.pool.acquire()))
                    .await?,
                None,
            ),
        };
        Ok(Loan {
            kept: self,
            conn: Some(conn),
            session,
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
            for kept in kept {
                drop(kept.conn.detach());
            }
        }
    }
}

/// A connection's session on the server, as its dialect reads it once per
/// connection (MySQL's and MariaDB's connection id, which the server never
/// gives another connection while it runs); what an [`Undo`] ends before it
/// runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SessionId(pub(crate) i64);

/// What an [`Undo`] runs, given a connection, the lock's name and the
/// session to end first (`None`: the connection is the given-up one).
type UndoRun<DB> = Arc<
    dyn for<'c> Fn(&'c mut PoolConnection<DB>, String, Option<SessionId>) -> Answer<'c, ()>
        + Send
        + Sync,
>;

/// How long an undo waits before it tries again, at first and at most.
const UNDO_BACKOFF: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(1));

/// What undoes a statement that was given up before it answered (see the
/// module docs).
pub(crate) struct Undo<DB: Database> {
    run: UndoRun<DB>,
    /// One try: a fresh connection, the session ended, the undo.
    try_timeout: Duration,
    connect_timeout: Duration,
    /// How long to keep trying: what the statement took cannot outlast it.
    retry_for: Duration,
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
    /// `run` undoes the statement about lock `lock`, given a connection,
    /// that name, and the given-up session (which it ends first, if any);
    /// each try is bounded by the command timeout (twice: the end of the
    /// session, then the undo), and the tries by `retry_for`.
    pub(crate) fn new(
        settings: &Settings,
        lock: &str,
        retry_for: Duration,
        run: impl for<'c> Fn(&'c mut PoolConnection<DB>, String, Option<SessionId>) -> Answer<'c, ()>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Undo {
            run: Arc::new(run),
            try_timeout: settings.command_timeout * 2,
            connect_timeout: settings.connect_timeout,
            retry_for,
            lock: lock.to_owned(),
        }
    }

    /// Runs in a task of its own: on a fresh connection from `pool` once
    /// `session` (the given-up connection's) is ended, or, without one, on
    /// `conn` itself. `conn` is closed either way. Outside a runtime nothing
    /// can run: whatever the statement took ends with its TTL.
    fn spawn(
        self,
        conn: PoolConnection<DB>,
        session: Option<SessionId>,
        (pool, shelf): (Pool<DB>, Shelf<DB>),
        permit: Option<OwnedSemaphorePermit>,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            close_abandoned(conn);
            tracing::warn!(lock.name = %self.lock, "an abandoned acquire cannot be undone outside a runtime; its lease ends with its TTL");
            return;
        };
        runtime.spawn(async move {
            let undone = match session {
                Some(session) => {
                    // The given-up connection goes at once, and so does its
                    // place among the loans: the undo takes a kept
                    // connection or one of sqlx's, which sqlx's own bound
                    // counts, and holds no lender back while it retries.
                    close_abandoned(conn);
                    drop(permit);
                    self.on_fresh_connections(&pool, &shelf, session).await
                }
                None => {
                    // Its connection counts as this loan's until it is done.
                    let _permit = permit;
                    let mut conn = conn;
                    let undone = self.try_on(&mut conn, None).await;
                    close_abandoned(conn);
                    undone
                }
            };
            match undone {
                Ok(()) => tracing::debug!(lock.name = %self.lock, "undid an abandoned acquire"),
                Err(error) => {
                    tracing::warn!(lock.name = %self.lock, %error, "could not undo an abandoned acquire; its lease ends with its TTL");
                }
            }
        });
    }

    /// Tries on other connections (a kept one, else one from sqlx's pool:
    /// kept connections fill sqlx's pool too), backing off, until one try
    /// succeeds or the lease it undoes could no longer be live.
    async fn on_fresh_connections(
        &self,
        pool: &Pool<DB>,
        shelf: &Shelf<DB>,
        session: SessionId,
    ) -> Result<(), String> {
        let deadline = Instant::now() + self.retry_for;
        let mut backoff = UNDO_BACKOFF.0;
        loop {
            let kept = shelf.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let fresh = match kept {
                Some(kept) => Ok(kept.conn),
                None => match tokio::time::timeout(self.connect_timeout, pool.acquire()).await {
                    Ok(Ok(conn)) => Ok(conn),
                    Ok(Err(error)) => Err(format!("no connection: {error}")),
                    Err(_) => Err(format!("no connection within {:?}", self.connect_timeout)),
                },
            };
            let tried = match fresh {
                Ok(mut fresh) => self.try_on(&mut fresh, Some(session)).await,
                Err(error) => Err(error),
            };
            match tried {
                Ok(()) => return Ok(()),
                Err(error) if Instant::now() + backoff >= deadline => return Err(error),
                Err(error) => {
                    tracing::debug!(lock.name = %self.lock, %error, "undo of an abandoned acquire failed; trying again");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(UNDO_BACKOFF.1);
                }
            }
        }
    }

    /// One try on `conn`, bounded. A connection whose try did not answer is
    /// given up in turn.
    async fn try_on(
        &self,
        conn: &mut PoolConnection<DB>,
        session: Option<SessionId>,
    ) -> Result<(), String> {
        match tokio::time::timeout(
            self.try_timeout,
            (self.run)(conn, self.lock.clone(), session),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => {
                conn.close_on_drop();
                Err(format!("no answer within {:?}", self.try_timeout))
            }
        }
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
    /// The connection's session on the server, once read.
    session: Option<SessionId>,
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
    /// The loan's statement was given up before it answered: `conn` is
    /// closed, after its undo if it has one (see the module docs).
    fn give_up(&mut self, conn: Option<PoolConnection<DB>>) {
        match (conn, self.undo.take()) {
            (Some(conn), Some(undo)) => {
                undo.spawn(
                    conn,
                    self.session,
                    (self.kept.pool.clone(), self.kept.kept.clone()),
                    self.permit.take(),
                );
            }
            (Some(conn), None) => close_abandoned(conn),
            (None, _) => {}
        }
    }

    /// The connection's session on the server, read by `read` the first
    /// time a loan of this connection asks (an [`Undo`] ends it).
    pub(crate) async fn session<F>(&mut self, read: F) -> sqlx::Result<Option<SessionId>>
    where
        F: for<'c> FnOnce(&'c mut DB::Connection) -> Answer<'c, Option<SessionId>>,
    {
        if self.session.is_none() {
            let conn = self.conn.as_mut().expect("a loan holds its connection");
            self.session = read(conn).await?;
        }
        Ok(self.session)
    }

    /// Sets what undoes this loan's statement if it is given up.
    pub(crate) fn undo_with(&mut self, undo: Undo<DB>) {
        self.undo = Some(undo);
    }

    /// Ends the loan after its statement answered `outcome` (`Err(_)`: no
    /// answer within the command timeout) and maps a failure to a
    /// [`LockError`](lockkit_core::LockError) about `what`. The connection
    /// is kept for the next statement unless it is in doubt, and then closed:
    /// no answer (after the [`Undo`], if any), or a failure of the connection
    /// itself (then every kept connection also goes back to sqlx's pool,
    /// which tests them, as the others may be dead too).
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
                        .push(Kept {
                            conn,
                            since: Instant::now(),
                            session: self.session,
                        });
                }
                answer.map_err(|error| settings.error(what, error))
            }
            Ok(Err(error)) => {
                if let Some(conn) = conn {
                    close_abandoned(conn);
                }
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

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use std::time::Duration;

    use super::KeptPool;
    use crate::settings::Settings;

    /// Every lease statement's future holds `lend`'s, and is copied whole
    /// into its box on each call: sqlx's acquire (kilobytes) must stay boxed
    /// inside it. Unboxed, `lend` took 17 KB in a release build.
    #[tokio::test]
    async fn a_loan_is_a_small_future() {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://127.0.0.1:1/none")
            .expect("a lazy pool");
        let kept = KeptPool::new(pool);
        let settings = Settings {
            backend: "postgres",
            address: "127.0.0.1:1".into(),
            connect_timeout: Duration::from_secs(1),
            command_timeout: Duration::from_secs(1),
            liveness_interval: Duration::from_secs(1),
            fencing: true,
        };
        let lend = kept.lend(&settings);
        let size = size_of_val(&lend);
        assert!(size <= 2048, "lend's future takes {size} bytes");
    }
}
