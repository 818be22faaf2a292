//! `lease` mode: a row per lock with an owner and an expiry decided by the
//! server's clock, on every database.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;

use lockkit_core::backend::{
    Attempt, Handover, Intent, LeaseBackend, OwnerToken, ReleaseWatch, validate_name,
};
use lockkit_core::{Capabilities, FencingToken, LockKind, LockStatus, Result};

use crate::names::check_slot_permits;
use crate::pool::{KeptPool, Undo};
use crate::settings::Settings;
use crate::slots::SlotPlan;

/// A database connection of dialect `D`.
pub(crate) type Conn<D> = <<D as LeaseDialect>::Db as sqlx::Database>::Connection;

/// The answer of one statement on one connection.
pub(crate) type Answer<'c, T> = BoxFuture<'c, sqlx::Result<T>>;

/// One database's lease statements: their SQL text, binds and how their
/// answers read, each run on the connection it is given. [`LeaseRows`] does
/// the rest, the same on every database: kept connections, the command
/// timeout, errors, and undoing an acquire that was abandoned.
pub(crate) trait LeaseDialect: Send + Sync + fmt::Debug + 'static {
    /// The sqlx database.
    type Db: sqlx::Database;
    /// What `lease` mode guarantees on this database.
    const CAPABILITIES: Capabilities;

    /// The lease upsert: the new fence when taken, the holder's remaining
    /// lease when not.
    fn acquire<'c>(
        &'c self,
        conn: &'c mut Conn<Self>,
        name: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Attempt<Option<FencingToken>>>;

    /// Owner-conditional extension; `false`: not `owner`'s.
    fn extend<'c>(
        &'c self,
        conn: &'c mut Conn<Self>,
        name: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, bool>;

    /// Owner-conditional release; `false`: not `owner`'s.
    fn release<'c>(
        &'c self,
        conn: &'c mut Conn<Self>,
        name: &'c str,
        owner: &'c str,
    ) -> Answer<'c, bool>;

    /// Owner-conditional pass of the live lease from `from` to `to` for
    /// `ttl`, with the fence bumped: the new fence, or `None` when the lease
    /// was not `from`'s.
    fn hand_over<'c>(
        &'c self,
        conn: &'c mut Conn<Self>,
        name: &'c str,
        from: &'c str,
        to: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Option<i64>>;

    /// The live lease on `name`, if any: its fence and remaining milliseconds.
    fn status<'c>(
        &'c self,
        conn: &'c mut Conn<Self>,
        name: &'c str,
    ) -> Answer<'c, Option<(i64, i64)>>;

    /// Release notifications of `name`; none by default (waiters back off,
    /// never past the holder's expiry).
    fn watch<'a>(&'a self, settings: &'a Settings, name: &'a str) -> BoxFuture<'a, ReleaseWatch> {
        let _ = (settings, name);
        Box::pin(std::future::ready(ReleaseWatch::none()))
    }
}

/// The [`LeaseBackend`] of `lease` mode on dialect `D`.
#[derive(Debug)]
pub(crate) struct LeaseRows<D: LeaseDialect> {
    dialect: Arc<D>,
    pool: KeptPool<D::Db>,
    settings: Settings,
}

impl<D: LeaseDialect> LeaseRows<D> {
    pub(crate) fn new(dialect: D, pool: KeptPool<D::Db>, settings: Settings) -> Self {
        LeaseRows {
            dialect: Arc::new(dialect),
            pool,
            settings,
        }
    }

    /// What releases the lease if an acquire by `owner` is abandoned before
    /// its answer: the dialect's release, on the acquire's own connection.
    fn undo_acquire(&self, name: &str, owner: &str) -> Undo<D::Db> {
        let (dialect, owner) = (self.dialect.clone(), owner.to_owned());
        Undo::new(&self.settings, name, move |mut conn, name| async move {
            dialect.release(&mut conn, &name, &owner).await.map(drop)
        })
    }
}

impl<D: LeaseDialect> LeaseRows<D> {
    /// Cancellation-safe without a task per attempt: if the upsert is
    /// abandoned before it answers, a release runs after it on the same
    /// connection (see [`Undo`]), so it cannot overtake a statement that may
    /// still take the lease. (SQLite's statements run on a worker thread
    /// that a dropped future does not stop; the release queues behind it
    /// there too.)
    async fn acquire_row(
        &self,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let mut loan = self.pool.lend(&self.settings).await?;
        loan.undo_with(self.undo_acquire(name, owner.as_str()));
        let answer = self
            .settings
            .timed(self.dialect.acquire(&mut loan, name, owner.as_str(), ttl))
            .await;
        loan.finish(&self.settings, "acquire", answer)
    }

    async fn extend_row(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        let mut loan = self.pool.lend(&self.settings).await?;
        let answer = self
            .settings
            .timed(self.dialect.extend(&mut loan, name, owner.as_str(), ttl))
            .await;
        loan.finish(&self.settings, "extend", answer)
    }

    async fn release_row(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        let mut loan = self.pool.lend(&self.settings).await?;
        let answer = self
            .settings
            .timed(self.dialect.release(&mut loan, name, owner.as_str()))
            .await;
        loan.finish(&self.settings, "release", answer)
    }

    /// The live lease on row `name`: its fence and remaining milliseconds.
    async fn row_status(&self, name: &str) -> Result<Option<(i64, i64)>> {
        let mut loan = self.pool.lend(&self.settings).await?;
        let answer = self
            .settings
            .timed(self.dialect.status(&mut loan, name))
            .await;
        loan.finish(&self.settings, "read the lock's status", answer)
    }

    /// A permit: each slot's row tried once, as [`SlotPlan`] orders them,
    /// with the lease upsert; busy, with the soonest expiry, when all are
    /// held.
    async fn acquire_permit(
        &self,
        slots: &[String],
        taken: &AtomicUsize,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let mut soonest: Option<Duration> = None;
        for slot in SlotPlan::new(slots.len()).order() {
            match self.acquire_row(&slots[slot], owner, ttl).await? {
                Attempt::Acquired(fence) => {
                    taken.store(slot, Ordering::SeqCst);
                    return Ok(Attempt::Acquired(fence));
                }
                Attempt::Busy { retry_after } => {
                    soonest = match (soonest, retry_after) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
            }
        }
        Ok(Attempt::Busy {
            retry_after: soonest,
        })
    }
}

/// A holding's rows in `lease` mode.
#[derive(Debug)]
pub(crate) enum LeaseKey {
    /// The lock's row: the name itself.
    Lock(String),
    /// The rows of a semaphore's permit slots (see [`permit_row_name`]),
    /// and the slot taken, once granted.
    Permit {
        slots: Vec<String>,
        taken: AtomicUsize,
    },
}

impl LeaseKey {
    /// The row this holding holds: the lock's, or the permit slot taken.
    fn row(&self) -> Option<&str> {
        match self {
            LeaseKey::Lock(name) => Some(name),
            LeaseKey::Permit { slots, taken } => {
                slots.get(taken.load(Ordering::SeqCst)).map(String::as_str)
            }
        }
    }
}

/// The lease row of permit slot `slot` (0-based) of the semaphore `name`:
/// `\x01permit:`, 40 hex digits of the SHA-256 of the name, `:` and the
/// slot. Lock names cannot contain `\x01`, so these rows are apart from
/// every lock's row, and they fit every database's name column.
pub(crate) fn permit_row_name(name: &str, slot: u32) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(name.as_bytes());
    let hex: String = digest[..20].iter().map(|b| format!("{b:02x}")).collect();
    format!("\u{1}permit:{hex}:{slot}")
}

#[lockkit_core::async_trait]
impl<D: LeaseDialect> LeaseBackend for LeaseRows<D> {
    type Key = LeaseKey;

    fn backend_name(&self) -> &'static str {
        self.settings.backend
    }

    fn capabilities(&self) -> Capabilities {
        D::CAPABILITIES
    }

    /// Names are stored as they are (bound parameters; byte-wise
    /// comparison). A semaphore is one row per permit slot.
    fn key(&self, name: &str, kind: LockKind) -> Result<LeaseKey> {
        validate_name(name)?;
        if let LockKind::Semaphore { permits } = kind {
            check_slot_permits(self.settings.backend, permits)?;
        }
        Ok(match kind {
            LockKind::Semaphore { permits } => LeaseKey::Permit {
                slots: (0..permits)
                    .map(|slot| permit_row_name(name, slot))
                    .collect(),
                taken: AtomicUsize::new(usize::MAX),
            },
            _ => LeaseKey::Lock(name.to_owned()),
        })
    }

    async fn try_lock(
        &self,
        key: &LeaseKey,
        owner: &OwnerToken,
        ttl: Duration,
        _intent: Intent,
    ) -> Result<Attempt<Option<FencingToken>>> {
        match key {
            LeaseKey::Lock(name) => self.acquire_row(name, owner, ttl).await,
            LeaseKey::Permit { slots, taken } => {
                self.acquire_permit(slots, taken, owner, ttl).await
            }
        }
    }

    async fn extend(&self, key: &LeaseKey, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        match key.row() {
            Some(row) => self.extend_row(row, owner, ttl).await,
            None => Ok(false),
        }
    }

    /// A permit whose slot is unknown was never granted (an abandoned
    /// attempt's own connection undoes its upsert).
    async fn release(&self, key: &LeaseKey, owner: &OwnerToken) -> Result<bool> {
        match key.row() {
            Some(row) => self.release_row(row, owner).await,
            None => Ok(false),
        }
    }

    fn can_hand_over(&self) -> bool {
        true
    }

    /// One conditional `UPDATE`: new owner, new expiry, fence + 1.
    async fn hand_over(
        &self,
        key: &LeaseKey,
        from: &OwnerToken,
        to: &OwnerToken,
        ttl: Duration,
    ) -> Result<Handover> {
        let LeaseKey::Lock(name) = key else {
            return Ok(Handover::NotOurs);
        };
        let mut loan = self.pool.lend(&self.settings).await?;
        let answer = self
            .settings
            .timed(
                self.dialect
                    .hand_over(&mut loan, name, from.as_str(), to.as_str(), ttl),
            )
            .await;
        Ok(
            match loan.finish(&self.settings, "hand the lease over", answer)? {
                Some(fence) => Handover::Passed(Some(FencingToken::new(fence.max(0) as u64))),
                None => Handover::NotOurs,
            },
        )
    }

    /// The live lease row, if any: held, with its fence and the remaining
    /// lease by the server's clock. A semaphore: the live rows of its slots.
    async fn status(&self, key: &LeaseKey) -> Result<LockStatus> {
        let rows: &[String] = match key {
            LeaseKey::Lock(name) => std::slice::from_ref(name),
            LeaseKey::Permit { slots, .. } => slots,
        };
        let (mut holders, mut last) = (0, None::<(i64, i64)>);
        for row in rows {
            if let Some((fence, left_ms)) = self.row_status(row).await? {
                holders += 1;
                last = Some(last.map_or((fence, left_ms), |(f, l)| (f.max(fence), l.max(left_ms))));
            }
        }
        Ok(match last {
            Some((fence, left_ms)) => {
                let status = LockStatus::held()
                    .with_remaining(Some(Duration::from_millis(left_ms.max(0) as u64)))
                    .with_holders(Some(holders));
                match key {
                    // Slots count their own tokens: none stands for the semaphore.
                    LeaseKey::Permit { .. } => status,
                    LeaseKey::Lock(_) => {
                        status.with_fencing_token(Some(FencingToken::new(fence.max(0) as u64)))
                    }
                }
            }
            None => LockStatus::free(),
        })
    }

    /// Postgres: `LISTEN` for the release's `NOTIFY` (of every permit slot,
    /// for a semaphore). Elsewhere none: waiters back off, never past the
    /// holder's expiry.
    async fn watch(&self, key: &LeaseKey) -> Result<ReleaseWatch> {
        Ok(match key {
            LeaseKey::Lock(name) => self.dialect.watch(&self.settings, name).await,
            LeaseKey::Permit { slots, .. } => {
                let mut watches = Vec::with_capacity(slots.len());
                for slot in slots {
                    watches.push(self.dialect.watch(&self.settings, slot).await);
                }
                ReleaseWatch::merge(watches)
            }
        })
    }
}
