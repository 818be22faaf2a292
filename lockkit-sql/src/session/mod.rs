//! Session locks (`row`, `advisory`, `named`): the lock lives as long as one
//! dedicated connection holds it, and the server queues the waiters.
//!
//! [`SessionLock`] is the engine shared by the Postgres and MySQL/MariaDB
//! modes; each implements [`SessionDb`] with its statements. The engine adds
//! what every mode needs: the shared wait semantics (server-side waits bounded
//! by the caller's deadline), a per-name local FIFO, a pool of idle dedicated
//! connections, cancellation safety (a connection whose statement was
//! abandoned is closed, and the database stops its wait; a wait the server
//! would keep past the caller's deadline is stopped, and what it took let
//! go, before the caller hears `Timeout`), a periodic liveness
//! query that marks the guard lost when the connection dies, the
//! client-side TTL of the design contract, and holder identities (a session
//! lock has no place for one: it is written into an identity record, see
//! [`IdentityRecords`], renewed with the holding and deleted at its
//! release; a mode whose statements can carry the record (see
//! [`SessionDb::carries_records`]) writes it in the lock statement that is
//! granted and deletes it in the unlock statement, with no statement of
//! its own).

mod holding;
mod row;

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use lockkit_core::backend::{
    DEADLINE_GRACE, Intent, OwnerToken, QueueBackend, Request, Waiter, stored_owner,
};
use lockkit_core::{
    Capabilities, FencingToken, LockError, LockGuard, LockKind, LockStatus, Result,
};
use tokio::time::Instant;

use crate::finishing::Finishing;
use crate::lease::{IdentityRecords, holder_row_name};
use crate::settings::{SESSION_CAPABILITIES, Settings};
use crate::slots::SlotPlan;
use crate::statement::Answer;
use holding::{Identity, SessionLease, schedule_liveness};
pub(crate) use row::{RowLocking, RowSession};

/// How long the server may wait for a lock in one statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ServerWait {
    /// Answer at once.
    NoWait,
    /// Wait at most this long.
    For(Duration),
    /// Wait until granted.
    Forever,
}

/// How long one wait in the server's queue of a single permit slot lasts
/// before all slots are tried again (a permit may come free on another).
const SLOT_WAIT: Duration = Duration::from_millis(100);

impl ServerWait {
    /// Whether the statement may wait at all.
    pub(crate) fn intent(self) -> Intent {
        match self {
            ServerWait::NoWait => Intent::Try,
            ServerWait::For(_) | ServerWait::Forever => Intent::Wait,
        }
    }

    /// The wait on one permit slot within this one: at most [`SLOT_WAIT`];
    /// `None` when the caller does not wait.
    pub(crate) fn slice(self) -> Option<ServerWait> {
        match self {
            ServerWait::NoWait => None,
            ServerWait::For(left) => Some(ServerWait::For(left.min(SLOT_WAIT))),
            ServerWait::Forever => Some(ServerWait::For(SLOT_WAIT)),
        }
    }
}

/// A session mode whose semaphore is permit slots the server locks one by
/// one (advisory keys, `GET_LOCK` names).
pub(crate) trait SlotLocks: SessionDb {
    /// A permit slot's lock.
    type Slot: Sync;

    /// Locks `slot` on `conn`, waiting as `wait` says: the fencing token
    /// when granted, `None` when busy.
    fn lock_slot<'c>(
        &'c self,
        conn: &'c mut Self::Conn,
        slot: &'c Self::Slot,
        wait: ServerWait,
    ) -> Answer<'c, Option<u64>>;
}

/// A permit: each of `slots` tried once without waiting, as a [`SlotPlan`]
/// orders them, then one wait of a [`ServerWait::slice`] on the first. The
/// slot granted goes into `taken`.
pub(crate) async fn lock_any_slot<D: SlotLocks>(
    db: &D,
    conn: &mut D::Conn,
    slots: &[D::Slot],
    taken: &AtomicUsize,
    wait: ServerWait,
) -> sqlx::Result<Option<u64>> {
    let plan = SlotPlan::new(slots.len());
    for slot in plan.order() {
        if let Some(token) = db.lock_slot(conn, &slots[slot], ServerWait::NoWait).await? {
            taken.store(slot, Ordering::SeqCst);
            return Ok(Some(token));
        }
    }
    let (slot, Some(slice)) = (plan.first(), wait.slice()) else {
        return Ok(None);
    };
    let token = db.lock_slot(conn, &slots[slot], slice).await?;
    if token.is_some() {
        taken.store(slot, Ordering::SeqCst);
    }
    Ok(token)
}

/// A locking statement in its four forms: exclusive or shared, waiting
/// or one try.
#[derive(Debug)]
pub(crate) struct LockingSql {
    exclusive: [Arc<str>; 2],
    shared: [Arc<str>; 2],
}

impl LockingSql {
    /// The four forms, each written by `text(shared, intent)`.
    pub(crate) fn of(text: impl Fn(bool, Intent) -> String) -> Self {
        let forms = |shared| [Intent::Wait, Intent::Try].map(|intent| text(shared, intent).into());
        LockingSql {
            exclusive: forms(false),
            shared: forms(true),
        }
    }

    /// The form for a `shared` holding (or not), with `intent`.
    pub(crate) fn form(&self, shared: bool, intent: Intent) -> &Arc<str> {
        let forms = if shared {
            &self.shared
        } else {
            &self.exclusive
        };
        &forms[usize::from(intent == Intent::Try)]
    }
}

/// A holder identity's record as a lock or unlock statement carries it
/// (see [`SessionDb::carries_records`]): the record's row, its stored
/// owner, and its lease.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Record<'a> {
    pub(crate) row: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) ttl: Duration,
}

/// What the answer of a lock statement says.
#[derive(Debug)]
pub(crate) enum Locked {
    /// Granted, with the fencing token drawn (none where
    /// [`Settings::fencing`] is off: the statement's answer is then only a
    /// grant), and whether the statement also wrote the identity record it
    /// was given.
    Granted {
        fence: Option<FencingToken>,
        recorded: bool,
    },
    /// Still held by someone else when the server's wait ended.
    Busy,
}

impl Locked {
    /// What a lock statement answered: when granted, the number it drew
    /// (the fencing token, where [`Settings::fencing`] is on; otherwise
    /// only a grant) and whether it wrote the identity record; `None` when
    /// busy.
    pub(crate) fn of(
        settings: &Settings,
        answer: sqlx::Result<Option<(u64, bool)>>,
    ) -> Result<Self> {
        match answer {
            Ok(Some((drawn, recorded))) => Ok(Locked::Granted {
                fence: settings.fencing.then(|| FencingToken::new(drawn)),
                recorded,
            }),
            Ok(None) => Ok(Locked::Busy),
            Err(error) => Err(settings.error("lock", error)),
        }
    }
}

/// One database's session-lock statements.
#[lockkit_core::async_trait]
pub(crate) trait SessionDb: Send + Sync + fmt::Debug + 'static {
    /// A dedicated connection (with whatever per-connection state it needs).
    type Conn: Send + 'static;
    /// A lock name in the database's keyspace.
    type Key: Send + Sync + fmt::Debug + 'static;

    /// Where the database is, its timeouts and the liveness period.
    fn settings(&self) -> &Settings;
    /// What this mode guarantees (which kinds of holding it has among them).
    fn capabilities(&self) -> Capabilities {
        SESSION_CAPABILITIES
    }
    /// Maps a validated name and a kind of holding the capabilities claim
    /// (`Unsupported` for one the mode cannot hold after all, e.g. too many
    /// permit slots). A key is made for each acquisition, and may note what
    /// it took (e.g. which permit slot).
    fn key(&self, name: &str, kind: LockKind) -> Result<Self::Key>;

    /// The backend name for logs and errors.
    fn backend_name(&self) -> &'static str {
        self.settings().backend
    }

    /// Whether the statements of a holding of `key` carry its identity
    /// record: [`lock`](Self::lock) may write it with the grant (it says
    /// whether it did) and [`unlock`](Self::unlock) deletes it with the
    /// release. Elsewhere the record is written and deleted by statements
    /// of its own, on a pooled connection.
    fn carries_records(&self, _key: &Self::Key) -> bool {
        false
    }

    /// Opens a new dedicated connection (bounded by the connect timeout).
    async fn connect(&self) -> Result<Self::Conn>;
    /// One lock statement; with `record` (only where
    /// [`carries_records`](Self::carries_records)), one that may also write
    /// it when granted. On `Busy` the connection must be left clean (no
    /// open transaction, no lock), ready for reuse; a statement that fails
    /// once its lock may have been granted must answer an error (the
    /// connection is then closed, which frees the lock).
    async fn lock(
        &self,
        conn: &mut Self::Conn,
        key: &Self::Key,
        wait: ServerWait,
        record: Option<Record<'_>>,
    ) -> Result<Locked>;
    /// Releases the lock held on `conn`, and deletes `record` (given only
    /// where [`carries_records`](Self::carries_records)) if it is still its
    /// owner's; `Ok(false)` if the lock was not held.
    async fn unlock(
        &self,
        conn: &mut Self::Conn,
        key: &Self::Key,
        record: Option<Record<'_>>,
    ) -> Result<bool>;
    /// Whether `conn` still holds the lock (a cheap liveness query).
    async fn ping(&self, conn: &mut Self::Conn, key: &Self::Key) -> Result<bool>;
    /// Whether the lock is held (and by how many it is awaited, where the
    /// server can tell), asked on a pooled connection: no dedicated
    /// connection, and never a wait.
    async fn status(&self, key: &Self::Key) -> Result<LockStatus>;
    /// Gives up a connection whose statement was abandoned mid-flight or whose
    /// state is unknown: closes it and makes sure no wait is left behind on
    /// the server that could be granted later. Must not block.
    fn abandon(&self, conn: Self::Conn);

    /// The server's id of `conn`'s session, for [`interrupt`](Self::interrupt);
    /// `None` (the default) where every wait of a lock statement ends on the
    /// server by itself at its deadline.
    fn session_id(&self, _conn: &Self::Conn) -> Option<u64> {
        None
    }

    /// Stops the statement that session `id` runs, from another connection:
    /// once this returns, a lock wait there ends without the lock (or the
    /// statement had ended before). Default: nothing to do.
    async fn interrupt(&self, _id: u64) -> Result<()> {
        Ok(())
    }
}

/// Dedicated connections: the database, and the idle ones kept for reuse.
struct Connections<D: SessionDb> {
    db: D,
    idle: Mutex<Vec<D::Conn>>,
    max_idle: usize,
}

impl<D: SessionDb> Connections<D> {
    fn take_idle(&self) -> Option<D::Conn> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    fn put_back(&self, conn: D::Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.max_idle {
            idle.push(conn);
        }
    }
}

/// A connection in use. Dropped without [`Checkout::finish`] — the caller's
/// future was cancelled or timed out in the middle of a statement — it is
/// abandoned, so the server drops whatever the statement was doing.
struct Checkout<D: SessionDb> {
    conns: Arc<Connections<D>>,
    conn: Option<D::Conn>,
}

impl<D: SessionDb> Checkout<D> {
    fn new(conns: &Arc<Connections<D>>, conn: D::Conn) -> Self {
        Checkout {
            conns: conns.clone(),
            conn: Some(conn),
        }
    }

    fn conn(&mut self) -> &mut D::Conn {
        self.conn
            .as_mut()
            .expect("a checkout holds its connection until finished")
    }

    /// Hands the connection back, clean.
    fn finish(mut self) -> D::Conn {
        self.conn.take().expect("a checkout is finished once")
    }

    /// Hands the connection, clean, back to the idle ones now.
    fn put_back(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.conns.put_back(conn);
        }
    }

    /// Closes a connection that is known to be idle on the server side (its
    /// last statement failed or finished): nothing to stop there.
    fn close(mut self) {
        drop(self.conn.take());
    }
}

impl<D: SessionDb> Drop for Checkout<D> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.conns.db.abandon(conn);
        }
    }
}

/// The session locks of one database, as the [`QueueBackend`] of a
/// [`QueuedLock`](lockkit_core::backend::QueuedLock).
pub(crate) struct SessionLock<D: SessionDb> {
    conns: Arc<Connections<D>>,
    records: Arc<dyn IdentityRecords>,
}

impl<D: SessionDb> fmt::Debug for SessionLock<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionLock")
            .field("db", &self.conns.db)
            .finish_non_exhaustive()
    }
}

/// Idle dedicated connections kept per client.
const MAX_IDLE: usize = 8;

impl<D: SessionDb> SessionLock<D> {
    /// `records` keeps the holder identities (rows of the lock table).
    pub(crate) fn new(db: D, records: Arc<dyn IdentityRecords>) -> Self {
        SessionLock {
            conns: Arc::new(Connections {
                db,
                idle: Mutex::new(Vec::new()),
                max_idle: MAX_IDLE,
            }),
            records,
        }
    }

    /// How long the server may wait in the next statement.
    fn server_wait(waiter: &Waiter<'_>, intent: Intent) -> ServerWait {
        if intent == Intent::Try {
            return ServerWait::NoWait;
        }
        match waiter.deadline() {
            None => ServerWait::Forever,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    ServerWait::NoWait
                } else {
                    ServerWait::For(left)
                }
            }
        }
    }

    /// Runs one lock statement, cut off shortly after the deadline if the
    /// server's wait outlasts it, and then stopped (see [`clear`](Self::clear)).
    async fn lock_once(
        &self,
        checkout: &mut Checkout<D>,
        key: &D::Key,
        waiter: &Waiter<'_>,
        intent: Intent,
        record: Option<Record<'_>>,
    ) -> Result<Locked> {
        let db = &self.conns.db;
        let wait = Self::server_wait(waiter, intent);
        let (ServerWait::For(_), Some(deadline)) = (wait, waiter.deadline()) else {
            return db.lock(checkout.conn(), key, wait, record).await;
        };
        let session = db.session_id(checkout.conn());
        let mut statement = db.lock(checkout.conn(), key, wait, record);
        if let Ok(result) = tokio::time::timeout_at(deadline + DEADLINE_GRACE, &mut statement).await
        {
            return result;
        }
        let stop_by = Instant::now() + db.settings().command_timeout;
        let ended = tokio::time::timeout_at(stop_by, async move {
            if let Some(id) = session {
                db.interrupt(id).await?;
            }
            Ok::<_, LockError>(statement.await)
        })
        .await;
        match ended {
            // Busy: the connection is clean (see `SessionDb::lock`).
            Ok(Ok(Ok(Locked::Busy))) => {
                checkout.put_back();
            }
            // Granted after all, or failed: whatever it took is let go.
            Ok(Ok(_)) => self.clear(checkout, key, record, stop_by).await,
            Ok(Err(error)) => {
                tracing::debug!(%error, "could not interrupt a lock wait cut off at its deadline; its connection is abandoned");
            }
            Err(_) => {
                tracing::debug!(
                    "a lock wait cut off at its deadline did not end in time; its connection is abandoned"
                );
            }
        }
        Err(waiter.timeout_error())
    }

    /// After a lock statement cut off at its deadline has been stopped and
    /// answered a grant or an error (see [`lock_once`](Self::lock_once)):
    /// releases whatever it took before the caller is told it timed out,
    /// and puts the connection, clean, back with the idle ones; if that
    /// fails or does not finish by `stop_by`, the connection stays in
    /// `checkout`, to be abandoned (closed, its wait killed).
    ///
    /// The server may wait longer than the caller (MySQL's lock waits last
    /// whole seconds). A wait it granted after the caller was told it timed
    /// out would hold the lock against the next one to ask until the
    /// connection's close reached the server: so the statement is
    /// interrupted ([`SessionDb::interrupt`]) and its end heard first.
    async fn clear(
        &self,
        checkout: &mut Checkout<D>,
        key: &D::Key,
        record: Option<Record<'_>>,
        stop_by: Instant,
    ) {
        let unlocked =
            tokio::time::timeout_at(stop_by, self.conns.db.unlock(checkout.conn(), key, record))
                .await;
        match unlocked {
            Ok(Ok(_)) => {
                checkout.put_back();
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, "could not release what a lock wait cut off at its deadline took; its connection is abandoned");
            }
            Err(_) => {
                tracing::debug!(
                    "the release of a lock wait cut off at its deadline did not finish in time; its connection is abandoned"
                );
            }
        }
    }
}

#[lockkit_core::async_trait]
impl<D: SessionDb> QueueBackend for SessionLock<D> {
    fn backend_name(&self) -> &'static str {
        self.conns.db.backend_name()
    }

    fn capabilities(&self) -> Capabilities {
        let db = &self.conns.db;
        db.capabilities().with_fencing(db.settings().fencing)
    }

    /// The server queues the waiters (`pg_advisory_lock`, `SELECT … FOR
    /// UPDATE`, `GET_LOCK`); each statement's server-side wait is bounded by
    /// the caller's deadline.
    async fn lock(&self, request: Request<'_, '_>) -> Result<Option<LockGuard>> {
        let (name, opts, intent) = (request.name, request.opts, request.intent);
        let waiter = request.waiter;
        let db = &self.conns.db;
        let key = db.key(name, opts.kind())?;
        // Opening a connection is bounded by the connect timeout, not by the
        // wait: like every first attempt, it runs to completion.
        let identity = opts.holder_identity().map(|holder| Identity {
            row: holder_row_name(name, opts.kind()),
            owner: stored_owner(OwnerToken::new().as_str(), Some(holder)).into_owned(),
        });
        let record = identity
            .as_ref()
            .filter(|_| db.carries_records(&key))
            .map(|identity| identity.record(opts.lease_ttl()));
        let (mut checkout, mut reused) = match self.conns.take_idle() {
            Some(conn) => (Checkout::new(&self.conns, conn), true),
            None => (Checkout::new(&self.conns, db.connect().await?), false),
        };
        let (fencing, recorded) = loop {
            match self
                .lock_once(&mut checkout, &key, waiter, intent, record)
                .await
            {
                Ok(Locked::Granted { fence, recorded }) => break (fence, recorded),
                Ok(Locked::Busy) if intent == Intent::Try || waiter.is_over() => {
                    self.conns.put_back(checkout.finish());
                    return Ok(None);
                }
                Ok(Locked::Busy) => continue,
                // An idle connection may have died since its last use (a
                // server restart): try once more on a fresh one.
                Err(LockError::Unavailable { .. }) if reused => {
                    drop(checkout);
                    reused = false;
                    checkout = Checkout::new(&self.conns, db.connect().await?);
                }
                Err(error) => return Err(error),
            }
        };
        let granted_at = Instant::now();
        let identity = match identity {
            Some(identity) if !recorded => Some(
                self.record(identity, opts.lease_ttl(), &mut checkout)
                    .await?,
            ),
            identity => identity,
        };
        let lease = Arc::new_cyclic(|this| SessionLease {
            this: this.clone(),
            conns: self.conns.clone(),
            records: self.records.clone(),
            identity,
            key,
            conn: tokio::sync::Mutex::new(Some(checkout.finish())),
            notifier: OnceLock::new(),
            ttl: opts.lease_ttl(),
            liveness: Mutex::new(None),
        });
        let guard = LockGuard::granted(name, lease.clone(), fencing, granted_at, opts);
        let _ = lease.notifier.set(guard.loss_notifier());
        schedule_liveness(
            &lease,
            db.settings().liveness_interval.min(opts.lease_ttl() / 3),
        );
        Ok(Some(guard))
    }

    /// The server's answer, and the identity record's holder while held.
    async fn status(&self, name: &str, kind: LockKind) -> Result<LockStatus> {
        let db = &self.conns.db;
        let status = db.status(&db.key(name, kind)?).await?;
        if !status.held {
            return Ok(status);
        }
        let holder = self.records.read(&holder_row_name(name, kind)).await?;
        Ok(status.with_holder(holder))
    }
}

impl<D: SessionDb> SessionLock<D> {
    /// Writes the identity record of a holding just granted on `checkout`.
    /// The write is never cut off half-way: if the caller gives up
    /// meanwhile, it finishes in a task of its own, the checkout is
    /// abandoned (the server frees the lock) and the record ends with its
    /// TTL or with the next holder's.
    async fn record(
        &self,
        identity: Identity,
        ttl: Duration,
        checkout: &mut Checkout<D>,
    ) -> Result<Identity> {
        let (records, row, owner) = (
            self.records.clone(),
            identity.row.clone(),
            identity.owner.clone(),
        );
        let written = Finishing::new(async move { records.record(&row, &owner, ttl).await }).await;
        match written {
            Ok(()) => Ok(identity),
            Err(error) => {
                self.give_up(checkout);
                Err(error)
            }
        }
    }

    /// Gives up a lock just granted on `checkout` when its holding cannot
    /// be completed: closing the connection releases every lock it holds.
    fn give_up(&self, checkout: &mut Checkout<D>) {
        if let Some(conn) = checkout.conn.take() {
            self.conns.db.abandon(conn);
        }
    }
}
