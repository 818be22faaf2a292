//! `lease` mode: a row per lock with an owner and an expiry decided by the
//! server's clock, on every database.
//!
//! Readers share the lock's row: a *reader group* holds it as a writer
//! would, under the owner `\x01r<epoch>:<count>`, where `epoch` is the fence
//! the group started with and `count` the readers that joined and have not
//! left. Every reader draws a new token (so a later writer's token exceeds
//! every reader's), and the group's expiry is the latest of
//! its readers' leases. A reader extends and leaves by its token: it is in
//! the live group that started at or before its token, as any later group
//! started (after a writer, or after the group expired) with a higher fence.
//! A crashed reader stays counted until the group expires. The last reader
//! to leave deletes the row, as a writer's release does: tokens come from a
//! source shared by every name (see the dialects), not from the row. A writer that
//! waits records itself in the row `\x01waiting:<hash>` (see
//! [`waiting_row_name`]) for its ttl; readers do not join while that record
//! is live, and the writer deletes it once granted or when it gives up.
//! Every decision is one statement on one row, so the database's row lock
//! orders the readers and writers of a name.
//!
//! A holder identity is stored in the owner column after the owner token
//! (see [`stored_owner`]): the same statements, no extra write. A reader
//! group has no owner token to store it with, so a reader that records an
//! identity also takes the lease row `\x01holder:<hash>` (see
//! [`holder_row_name`]) if no live reader has it, and gives it up when it
//! leaves: the group shows one of its readers' identities.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;

use lockkit_core::backend::{
    Attempt, Handover, Intent, LeaseBackend, OwnerToken, ReleaseWatch, holder_of, stored_owner,
    validate_name,
};
use lockkit_core::{Capabilities, FencingToken, LockError, LockKind, LockStatus, Result};
use tokio::sync::oneshot;

use crate::error::is_deadlock;
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

    /// Readies `conn` for [`acquire`](Self::acquire) without taking
    /// anything. It runs before the upsert's undo is armed, so that an
    /// upsert given up midway was being executed, never prepared: an undo
    /// that runs after a prepare given up midway would read that prepare's
    /// answer as its own. Nothing by default (sqlx's Postgres and SQLite
    /// drivers keep their place after a prepare given up).
    fn ready_acquire<'c>(&'c self, _conn: &'c mut Conn<Self>) -> Answer<'c, ()> {
        Box::pin(std::future::ready(Ok(())))
    }

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

    /// The live lease on `name`, if any: its fence, remaining milliseconds
    /// and owner (a writer's token, or a reader group, see [`group_size`]).
    fn status<'c>(&'c self, conn: &'c mut Conn<Self>, name: &'c str)
    -> Answer<'c, Option<LiveRow>>;

    /// A reader joins the group holding `name`'s row, or starts one on a
    /// free row, unless a writer holds it or the record `waiting` (see
    /// [`waiting_row_name`]) is live: the reader's own token (the row's
    /// fence, bumped), or the longer of the row's and the record's remaining
    /// lease. The group's expiry becomes the later of its own and `ttl`.
    fn share<'c>(
        &'c self,
        conn: &'c mut Conn<Self>,
        name: &'c str,
        waiting: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Attempt<Option<FencingToken>>>;

    /// Moves the group's expiry to at least `ttl` from now if the reader
    /// with `token` is still in it (the live group started at or before
    /// `token`); `false` otherwise.
    fn extend_share<'c>(
        &'c self,
        conn: &'c mut Conn<Self>,
        name: &'c str,
        token: i64,
        ttl: Duration,
    ) -> Answer<'c, bool>;

    /// The reader with `token` leaves its group; the last one out frees the
    /// row (and, on Postgres, wakes its waiters). `false`: not in the live
    /// group.
    fn leave<'c>(&'c self, conn: &'c mut Conn<Self>, name: &'c str, token: i64)
    -> Answer<'c, bool>;

    /// Records `owner` as the writer waiting for `name` in the row
    /// `waiting`, for `ttl`, in place of any earlier record.
    fn mark_waiting<'c>(
        &'c self,
        conn: &'c mut Conn<Self>,
        waiting: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, ()>;

    /// Deletes the record in the row `waiting` if it is `owner`'s (any
    /// writer's with `None`), and, on Postgres, wakes the readers waiting
    /// for `name`.
    fn unmark_waiting<'c>(
        &'c self,
        conn: &'c mut Conn<Self>,
        name: &'c str,
        waiting: &'c str,
        owner: Option<&'c str>,
    ) -> Answer<'c, ()>;

    /// Release notifications of `name`; none by default (waiters back off,
    /// never past the holder's expiry).
    fn watch<'a>(&'a self, settings: &'a Settings, name: &'a str) -> BoxFuture<'a, ReleaseWatch> {
        let _ = (settings, name);
        Box::pin(std::future::ready(ReleaseWatch::none()))
    }
}

/// A live lease row: its fence, remaining milliseconds and owner.
pub(crate) type LiveRow = (i64, i64, Option<String>);

/// The number of readers in the group that a row's `owner` stands for
/// (`\x01r<epoch>:<count>`); `None` for a writer's token.
pub(crate) fn group_size(owner: &str) -> Option<usize> {
    let (_, count) = owner.strip_prefix("\u{1}r")?.split_once(':')?;
    count.parse().ok()
}

/// The [`LeaseBackend`] of `lease` mode on dialect `D`.
#[derive(Debug)]
pub(crate) struct LeaseRows<D: LeaseDialect> {
    rows: Arc<Rows<D>>,
}

impl<D: LeaseDialect> LeaseRows<D> {
    pub(crate) fn new(dialect: D, pool: KeptPool<D::Db>, settings: Settings) -> Self {
        LeaseRows {
            rows: Arc::new(Rows {
                dialect: Arc::new(dialect),
                pool,
                settings,
            }),
        }
    }
}

/// The statements of `lease` mode, each on a kept connection under the
/// command timeout.
#[derive(Debug)]
struct Rows<D: LeaseDialect> {
    dialect: Arc<D>,
    pool: KeptPool<D::Db>,
    settings: Settings,
}

impl<D: LeaseDialect> Rows<D> {
    /// What releases the lease if an acquire by `owner` is abandoned before
    /// its answer: the dialect's release, on the acquire's own connection.
    fn undo_acquire(&self, name: &str, owner: &str) -> Undo<D::Db> {
        let (dialect, owner) = (self.dialect.clone(), owner.to_owned());
        Undo::new(&self.settings, name, move |conn, name| {
            Box::pin(async move { dialect.release(conn, &name, &owner).await.map(drop) })
        })
    }

    /// Cancellation-safe without a task per attempt: if the upsert is
    /// abandoned before it answers, a release runs after it on the same
    /// connection (see [`Undo`]), so it cannot overtake a statement that may
    /// still take the lease. (SQLite's statements run on a worker thread
    /// that a dropped future does not stop; the release queues behind it
    /// there too.)
    async fn acquire_row(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let mut loan = self.pool.lend(&self.settings).await?;
        let undo = self.undo_acquire(name, owner);
        let answer = self
            .settings
            .timed(async {
                self.dialect.ready_acquire(&mut loan).await?;
                loan.undo_with(undo);
                self.dialect.acquire(&mut loan, name, owner, ttl).await
            })
            .await;
        loan.finish(&self.settings, "acquire", answer)
    }

    async fn extend_row(&self, name: &str, owner: &str, ttl: Duration) -> Result<bool> {
        let mut loan = self.pool.lend(&self.settings).await?;
        let answer = self
            .settings
            .timed(self.dialect.extend(&mut loan, name, owner, ttl))
            .await;
        loan.finish(&self.settings, "extend", answer)
    }

    async fn release_row(&self, name: &str, owner: &str) -> Result<bool> {
        let mut loan = self.pool.lend(&self.settings).await?;
        let answer = self
            .settings
            .timed(self.dialect.release(&mut loan, name, owner))
            .await;
        loan.finish(&self.settings, "release", answer)
    }

    /// The live lease on row `name`.
    async fn row_status(&self, name: &str) -> Result<Option<LiveRow>> {
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
        owner: &str,
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

    /// A writer's attempt: the lease upsert. Busy while waiting, it records
    /// the writer as waiting (so that new readers hold back) and tries again
    /// within `ttl / 2`, before the record runs out; granted, it deletes the
    /// record (each attempt has an owner of its own, so whoever's it is, as
    /// a writer's grant does on Redis).
    async fn acquire_writer(
        &self,
        name: &str,
        waiting: &AtomicBool,
        owner: &str,
        ttl: Duration,
        intent: Intent,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let answer = self.acquire_row(name, owner, ttl).await?;
        match answer {
            Attempt::Busy { retry_after } if intent == Intent::Wait => {
                // Set first: a record made by an abandoned attempt is withdrawn too.
                waiting.store(true, Ordering::SeqCst);
                self.mark_waiting(name, owner, ttl).await?;
                let half = ttl / 2;
                Ok(Attempt::Busy {
                    retry_after: Some(retry_after.map_or(half, |r| r.min(half))),
                })
            }
            Attempt::Acquired(_) if waiting.swap(false, Ordering::SeqCst) => {
                if let Err(error) = self.unmark_waiting(name, None).await {
                    tracing::warn!(lock.name = %name, %error, "could not withdraw a granted writer's waiting record; it ends with its TTL");
                }
                Ok(answer)
            }
            answer => Ok(answer),
        }
    }

    async fn mark_waiting(&self, name: &str, owner: &str, ttl: Duration) -> Result<()> {
        self.write_record(
            &waiting_row_name(name),
            owner,
            ttl,
            "record a waiting writer",
        )
        .await
    }

    async fn unmark_waiting(&self, name: &str, owner: Option<&str>) -> Result<()> {
        let waiting = waiting_row_name(name);
        self.delete_record(name, &waiting, owner, "withdraw a waiting writer")
            .await
    }

    /// Writes `owner` into the record row `row` for `ttl`, in place of any
    /// earlier one (a waiting writer's record, or a holder's identity).
    async fn write_record(&self, row: &str, owner: &str, ttl: Duration, what: &str) -> Result<()> {
        let mut loan = self.pool.lend(&self.settings).await?;
        let answer = self
            .settings
            .timed(self.dialect.mark_waiting(&mut loan, row, owner, ttl))
            .await;
        loan.finish(&self.settings, what, answer)
    }

    /// Deletes the record row `row` if it is `owner`'s (anyone's with
    /// `None`); on Postgres, wakes the waiters of `name`.
    async fn delete_record(
        &self,
        name: &str,
        row: &str,
        owner: Option<&str>,
        what: &str,
    ) -> Result<()> {
        let mut loan = self.pool.lend(&self.settings).await?;
        let answer = self
            .settings
            .timed(self.dialect.unmark_waiting(&mut loan, name, row, owner))
            .await;
        loan.finish(&self.settings, what, answer)
    }

    /// One reader's attempt, as its own statement. A deadlock victim's
    /// statement did nothing (the server rolled it back): it runs again, up
    /// to three times in all (InnoDB picks victims among readers that race
    /// for the same rows).
    async fn share_row(
        &self,
        name: &str,
        waiting: &str,
        ttl: Duration,
    ) -> Result<Attempt<Option<FencingToken>>> {
        const WHAT: &str = "acquire a shared lease";
        let mut tries = 0;
        loop {
            tries += 1;
            let mut loan = self.pool.lend(&self.settings).await?;
            let answer = self
                .settings
                .timed(self.dialect.share(&mut loan, name, waiting, ttl))
                .await;
            if tries < 3 && matches!(&answer, Ok(Err(error)) if is_deadlock(error)) {
                tracing::debug!(lock.name = %name, "shared lease attempt chosen as a deadlock victim; running it again");
                let _ = loan.finish(&self.settings, WHAT, answer);
                continue;
            }
            return loan.finish(&self.settings, WHAT, answer);
        }
    }

    async fn extend_share(&self, name: &str, token: i64, ttl: Duration) -> Result<bool> {
        let mut loan = self.pool.lend(&self.settings).await?;
        let answer = self
            .settings
            .timed(self.dialect.extend_share(&mut loan, name, token, ttl))
            .await;
        loan.finish(&self.settings, "extend a shared lease", answer)
    }

    async fn leave(&self, name: &str, token: i64) -> Result<bool> {
        let mut loan = self.pool.lend(&self.settings).await?;
        let answer = self
            .settings
            .timed(self.dialect.leave(&mut loan, name, token))
            .await;
        loan.finish(&self.settings, "release a shared lease", answer)
    }
}

/// Identity records: lease rows that say who holds a lock whose holding has
/// no place for it (a session lock; see [`holder_row_name`]). The record's
/// owner is [`stored_owner`]'s value; its lease follows the holding's.
#[lockkit_core::async_trait]
// Only the session modes write records; SQLite alone reads them.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) trait IdentityRecords: Send + Sync + fmt::Debug + 'static {
    /// Writes `owner` into the record `row` for `ttl`, in place of any
    /// earlier record (a crashed holder's, whose lease may still run).
    async fn record(&self, row: &str, owner: &str, ttl: Duration) -> Result<()>;
    /// Deletes the record `row` if it is still `owner`'s.
    async fn forget(&self, row: &str, owner: &str) -> Result<()>;
    /// The holder identity in the live record `row`, if any.
    async fn read(&self, row: &str) -> Result<Option<String>>;
}

/// The same upsert and conditional delete as a waiting writer's record,
/// on a row of its own.
#[lockkit_core::async_trait]
impl<D: LeaseDialect> IdentityRecords for LeaseRows<D> {
    async fn record(&self, row: &str, owner: &str, ttl: Duration) -> Result<()> {
        self.rows
            .write_record(row, owner, ttl, "record the holder's identity")
            .await
    }

    async fn forget(&self, row: &str, owner: &str) -> Result<()> {
        self.rows
            .delete_record(row, row, Some(owner), "delete the holder's identity")
            .await
    }

    async fn read(&self, row: &str) -> Result<Option<String>> {
        let record = self.rows.row_status(row).await?;
        Ok(record.and_then(|(_, _, owner)| holder_of(&owner?).map(str::to_owned)))
    }
}

/// A reader's token that no caller has taken yet: dropped, the reader
/// leaves its group (and gives up the identity record it took, if any).
struct Joined<D: LeaseDialect> {
    rows: Arc<Rows<D>>,
    name: String,
    token: Option<i64>,
    /// The identity record's row and stored owner, if this reader took it.
    record: Option<(String, String)>,
}

impl<D: LeaseDialect> Joined<D> {
    fn take(mut self) -> (i64, bool) {
        (
            self.token.take().unwrap_or_default(),
            self.record.take().is_some(),
        )
    }
}

impl<D: LeaseDialect> Drop for Joined<D> {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        let (rows, name) = (self.rows.clone(), std::mem::take(&mut self.name));
        let record = self.record.take();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(lock.name = %name, "an abandoned shared acquire cannot be undone outside a runtime; its group ends with its TTL");
            return;
        };
        runtime.spawn(async move {
            if let Some((row, owner)) = record {
                let _ = rows.release_row(&row, &owner).await;
            }
            match rows.leave(&name, token).await {
                Ok(_) => tracing::debug!(lock.name = %name, "undid an abandoned shared acquire"),
                Err(error) => tracing::warn!(lock.name = %name, %error, "could not undo an abandoned shared acquire; its group ends with its TTL"),
            }
        });
    }
}

/// What a reader's attempt answers its caller.
enum Shared<D: LeaseDialect> {
    Joined(Joined<D>),
    Busy(Option<Duration>),
}

impl<D: LeaseDialect> LeaseRows<D> {
    /// A reader's attempt, cancellation-safe: the statement runs in a task
    /// of its own, and a token its caller no longer takes leaves the group
    /// (a reader has no owner of its own in the row to undo by).
    /// A reader that records an identity (`record`: the record's row and
    /// the stored owner) then takes the record if no live reader has it.
    async fn acquire_reader(
        &self,
        name: &str,
        waiting: &str,
        slot: &AtomicU64,
        ttl: Duration,
        record: Option<(&str, &str)>,
        recorded: &AtomicBool,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let (tx, rx) = oneshot::channel();
        let (rows, name, waiting) = (self.rows.clone(), name.to_owned(), waiting.to_owned());
        let record = record.map(|(row, owner)| (row.to_owned(), owner.to_owned()));
        tokio::spawn(async move {
            let answer = match rows.share_row(&name, &waiting, ttl).await {
                Ok(Attempt::Acquired(token)) => {
                    let mut joined = Joined {
                        rows: rows.clone(),
                        name,
                        token: Some(token.map_or(0, |t| t.get() as i64)),
                        record: None,
                    };
                    match record {
                        Some((row, owner)) => match rows.acquire_row(&row, &owner, ttl).await {
                            Ok(taken) => {
                                if matches!(taken, Attempt::Acquired(_)) {
                                    joined.record = Some((row, owner));
                                }
                                Ok(Shared::Joined(joined))
                            }
                            // Dropped, `joined` leaves the group.
                            Err(error) => Err(error),
                        },
                        None => Ok(Shared::Joined(joined)),
                    }
                }
                Ok(Attempt::Busy { retry_after }) => Ok(Shared::Busy(retry_after)),
                Err(error) => Err(error),
            };
            // Undelivered, a `Joined` drops here or in the channel and leaves.
            let _ = tx.send(answer);
        });
        let answer = rx.await.map_err(|_| {
            LockError::backend(
                self.rows.settings.backend,
                "a shared acquire's statement task ended without an answer",
            )
        })??;
        Ok(match answer {
            Shared::Joined(joined) => {
                let (token, took_record) = joined.take();
                recorded.store(took_record, Ordering::SeqCst);
                slot.store(token as u64, Ordering::SeqCst);
                Attempt::Acquired(Some(FencingToken::new(token as u64)))
            }
            Shared::Busy(retry_after) => Attempt::Busy { retry_after },
        })
    }
}

/// A holding's rows in `lease` mode, and the holder identity it records.
#[derive(Debug)]
pub(crate) struct LeaseKey {
    holding: Holding,
    holder: Option<Box<str>>,
}

impl LeaseKey {
    /// What is stored as `owner`'s owner (see [`stored_owner`]).
    fn owner<'a>(&self, owner: &'a OwnerToken) -> std::borrow::Cow<'a, str> {
        stored_owner(owner.as_str(), self.holder.as_deref())
    }
}

/// The rows of one kind of holding.
#[derive(Debug)]
enum Holding {
    /// A writer's holding of the lock's row (the name itself); `waiting`:
    /// whether it may have recorded itself as a waiting writer.
    Lock { name: String, waiting: AtomicBool },
    /// A reader's holding in the lock's row, the writers' waiting record
    /// (see [`waiting_row_name`]), and the reader's token once it joined
    /// (0 before); `recorded`: whether it took the identity record (see
    /// [`holder_row_name`]).
    Shared {
        name: String,
        waiting: String,
        token: AtomicU64,
        recorded: AtomicBool,
    },
    /// The rows of a semaphore's permit slots (see [`permit_row_name`]),
    /// and the slot taken, once granted.
    Permit {
        slots: Vec<String>,
        taken: AtomicUsize,
    },
}

impl Holding {
    /// The row this holding holds: the lock's, or the permit slot taken.
    fn row(&self) -> Option<&str> {
        match self {
            Holding::Lock { name, .. } | Holding::Shared { name, .. } => Some(name),
            Holding::Permit { slots, taken } => {
                slots.get(taken.load(Ordering::SeqCst)).map(String::as_str)
            }
        }
    }
}

/// A row beside the lock's own for `name`: `\x01<role>:` and 40 hex digits
/// of the SHA-256 of the name. Lock names cannot contain `\x01`, so these
/// rows are apart from every lock's row, and they fit every database's
/// name column.
fn side_row_name(role: &str, name: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(name.as_bytes());
    let hex: String = digest[..20].iter().map(|b| format!("{b:02x}")).collect();
    format!("\u{1}{role}:{hex}")
}

/// The lease row of permit slot `slot` (0-based) of the semaphore `name`:
/// `\x01permit:<hash>:<slot>` (see [`side_row_name`]).
pub(crate) fn permit_row_name(name: &str, slot: u32) -> String {
    format!("{}:{slot}", side_row_name("permit", name))
}

/// The row where a writer waiting for `name` records itself:
/// `\x01waiting:<hash>`.
pub(crate) fn waiting_row_name(name: &str) -> String {
    side_row_name("waiting", name)
}

/// The row that records the identity of a holder of `name` where the
/// holding itself has no place for it (a reader group in `lease` mode, a
/// session lock): `\x01holder:<hash>`, or `\x01holders:<hash>` for the
/// semaphore `name`.
pub(crate) fn holder_row_name(name: &str, kind: LockKind) -> String {
    match kind {
        LockKind::Semaphore { .. } => side_row_name("holders", name),
        _ => side_row_name("holder", name),
    }
}

#[lockkit_core::async_trait]
impl<D: LeaseDialect> LeaseBackend for LeaseRows<D> {
    type Key = LeaseKey;

    fn backend_name(&self) -> &'static str {
        self.rows.settings.backend
    }

    fn capabilities(&self) -> Capabilities {
        D::CAPABILITIES
    }

    /// Names are stored as they are (bound parameters; byte-wise
    /// comparison). A semaphore is one row per permit slot.
    fn key(&self, name: &str, kind: LockKind) -> Result<LeaseKey> {
        validate_name(name)?;
        let holding = match kind {
            LockKind::Semaphore { permits } => {
                check_slot_permits(self.rows.settings.backend, permits)?;
                Holding::Permit {
                    slots: (0..permits)
                        .map(|slot| permit_row_name(name, slot))
                        .collect(),
                    taken: AtomicUsize::new(usize::MAX),
                }
            }
            LockKind::Shared => Holding::Shared {
                name: name.to_owned(),
                waiting: waiting_row_name(name),
                token: AtomicU64::new(0),
                recorded: AtomicBool::new(false),
            },
            _ => Holding::Lock {
                name: name.to_owned(),
                waiting: AtomicBool::new(false),
            },
        };
        Ok(LeaseKey {
            holding,
            holder: None,
        })
    }

    /// Stored with the owner token in the owner column; a reader also takes
    /// the name's identity record (see the module docs).
    fn with_holder(&self, key: LeaseKey, holder: &str) -> LeaseKey {
        LeaseKey {
            holder: Some(holder.into()),
            ..key
        }
    }

    async fn try_lock(
        &self,
        key: &LeaseKey,
        owner: &OwnerToken,
        ttl: Duration,
        intent: Intent,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let owner = key.owner(owner);
        match &key.holding {
            Holding::Lock { name, waiting } => {
                self.rows
                    .acquire_writer(name, waiting, &owner, ttl, intent)
                    .await
            }
            Holding::Shared {
                name,
                waiting,
                token,
                recorded,
            } => {
                let record = key.holder.as_ref().map(|_| {
                    (
                        holder_row_name(name, LockKind::Shared),
                        owner.clone().into_owned(),
                    )
                });
                let record = record.as_ref().map(|(row, o)| (row.as_str(), o.as_str()));
                self.acquire_reader(name, waiting, token, ttl, record, recorded)
                    .await
            }
            Holding::Permit { slots, taken } => {
                self.rows.acquire_permit(slots, taken, &owner, ttl).await
            }
        }
    }

    async fn extend(&self, key: &LeaseKey, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        let owner = key.owner(owner);
        match &key.holding {
            Holding::Shared {
                name,
                token,
                recorded,
                ..
            } => match token.load(Ordering::SeqCst) {
                0 => Ok(false),
                token => {
                    let extended = self.rows.extend_share(name, token as i64, ttl).await?;
                    if extended && recorded.load(Ordering::SeqCst) {
                        let row = holder_row_name(name, LockKind::Shared);
                        self.rows.extend_row(&row, &owner, ttl).await?;
                    }
                    Ok(extended)
                }
            },
            holding => match holding.row() {
                Some(row) => self.rows.extend_row(row, &owner, ttl).await,
                None => Ok(false),
            },
        }
    }

    /// A permit whose slot is unknown was never granted (an abandoned
    /// attempt's own connection undoes its upsert); a writer also withdraws
    /// its waiting record.
    async fn release(&self, key: &LeaseKey, owner: &OwnerToken) -> Result<bool> {
        let owner = key.owner(owner);
        match &key.holding {
            Holding::Lock { name, waiting } => {
                let released = self.rows.release_row(name, &owner).await?;
                if waiting.swap(false, Ordering::SeqCst) {
                    self.rows.unmark_waiting(name, Some(&owner)).await?;
                }
                Ok(released)
            }
            Holding::Shared {
                name,
                token,
                recorded,
                ..
            } => match token.swap(0, Ordering::SeqCst) {
                0 => Ok(false),
                token => {
                    if recorded.swap(false, Ordering::SeqCst) {
                        let row = holder_row_name(name, LockKind::Shared);
                        self.rows.release_row(&row, &owner).await?;
                    }
                    self.rows.leave(name, token as i64).await
                }
            },
            holding => match holding.row() {
                Some(row) => self.rows.release_row(row, &owner).await,
                None => Ok(false),
            },
        }
    }

    fn can_hand_over(&self) -> bool {
        true
    }

    /// One conditional `UPDATE`: new owner, new expiry, a new token.
    async fn hand_over(
        &self,
        key: &LeaseKey,
        from: &OwnerToken,
        to: &OwnerToken,
        ttl: Duration,
    ) -> Result<Handover> {
        // The engine hands over only holdings that record no identity.
        let (Holding::Lock { name, .. }, None) = (&key.holding, &key.holder) else {
            return Ok(Handover::NotOurs);
        };
        let rows = &self.rows;
        let mut loan = rows.pool.lend(&rows.settings).await?;
        let answer = rows
            .settings
            .timed(
                rows.dialect
                    .hand_over(&mut loan, name, from.as_str(), to.as_str(), ttl),
            )
            .await;
        Ok(
            match loan.finish(&rows.settings, "hand the lease over", answer)? {
                Some(fence) => Handover::Passed(Some(FencingToken::new(fence.max(0) as u64))),
                None => Handover::NotOurs,
            },
        )
    }

    /// The live lease row, if any: held, with its fence, the remaining
    /// lease by the server's clock, its holders (a reader group's size) and
    /// the identity its owner records (a reader group's: its identity
    /// record's). A semaphore: the live rows of its slots.
    async fn status(&self, key: &LeaseKey) -> Result<LockStatus> {
        let rows: &[String] = match &key.holding {
            Holding::Lock { name, .. } | Holding::Shared { name, .. } => std::slice::from_ref(name),
            Holding::Permit { slots, .. } => slots,
        };
        let (mut holders, mut last, mut holder) = (0, None::<(i64, i64)>, None);
        let mut group = None;
        for row in rows {
            if let Some((fence, left_ms, owner)) = self.rows.row_status(row).await? {
                let owner = owner.unwrap_or_default();
                match group_size(&owner) {
                    Some(readers) => {
                        holders += readers;
                        group = Some(row);
                    }
                    None => holders += 1,
                }
                holder = holder.or_else(|| holder_of(&owner).map(str::to_owned));
                last = Some(last.map_or((fence, left_ms), |(f, l)| (f.max(fence), l.max(left_ms))));
            }
        }
        if let Some(name) = group {
            holder = self.read(&holder_row_name(name, LockKind::Shared)).await?;
        }
        Ok(match last {
            Some((fence, left_ms)) => {
                let status = LockStatus::held()
                    .with_remaining(Some(Duration::from_millis(left_ms.max(0) as u64)))
                    .with_holders(Some(holders))
                    .with_holder(holder);
                match &key.holding {
                    // Slots count their own tokens: none stands for the semaphore.
                    Holding::Permit { .. } => status,
                    _ => status.with_fencing_token(Some(FencingToken::new(fence.max(0) as u64))),
                }
            }
            None => LockStatus::free(),
        })
    }

    /// Postgres: `LISTEN` for the release's `NOTIFY` (of every permit slot,
    /// for a semaphore). Elsewhere none: waiters back off, never past the
    /// holder's expiry.
    async fn watch(&self, key: &LeaseKey) -> Result<ReleaseWatch> {
        let rows = &self.rows;
        Ok(match &key.holding {
            Holding::Lock { name, .. } | Holding::Shared { name, .. } => {
                rows.dialect.watch(&rows.settings, name).await
            }
            Holding::Permit { slots, .. } => {
                let mut watches = Vec::with_capacity(slots.len());
                for slot in slots {
                    watches.push(rows.dialect.watch(&rows.settings, slot).await);
                }
                ReleaseWatch::merge(watches)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_size_reads_reader_groups_only() {
        assert_eq!(group_size("\u{1}r17:3"), Some(3));
        assert_eq!(group_size("\u{1}r1:1"), Some(1));
        assert_eq!(group_size("3f2c9a4e-0000-4000-8000-000000000000"), None);
        assert_eq!(group_size("\u{1}r17"), None);
    }

    #[test]
    fn side_rows_are_apart_from_lock_rows_and_each_other() {
        let (permit, waiting) = (permit_row_name("jobs", 0), waiting_row_name("jobs"));
        assert!(permit.starts_with("\u{1}permit:") && waiting.starts_with("\u{1}waiting:"));
        assert!(validate_name(&permit).is_err() && validate_name(&waiting).is_err());
        assert_ne!(waiting_row_name("jobs"), waiting_row_name("jobs2"));
        assert!(waiting.len() <= 64, "fits every name column");
    }
}
