//! `row` mode, written once for every database that has it: a lock is a
//! locking `SELECT` of the name's row in a transaction that stays open
//! while it is held. Each database gives its statements ([`RowLocking`]);
//! [`RowSession`] is the [`SessionDb`] of the mode on any of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::TryFutureExt as _;
use lockkit_core::backend::Intent;
use lockkit_core::{Capabilities, LockKind, LockStatus, Result};
use sqlx::{Database, Executor};

use super::{Locked, LockingSql, Record, ServerWait, SessionDb};
use crate::error::{is_deadlock, is_lock_busy};
use crate::lease::permit_row_name;
use crate::names::check_slot_permits;
use crate::settings::Settings;
use crate::slots::SlotPlan;
use crate::statement::{Answer, Runs, Value};

/// One database's statements of `row` mode, on the dedicated connections
/// of its session modes.
pub(crate) trait RowLocking: SessionDb {
    /// The sqlx database.
    type Db: Runs;
    /// What `row` mode guarantees on this database.
    const CAPABILITIES: Capabilities;

    /// The sqlx connection of a dedicated connection.
    fn connection(conn: &mut Self::Conn) -> &mut <Self::Db as Database>::Connection;

    /// Sets how long the server waits for a row lock on `conn` (nothing
    /// for [`ServerWait::NoWait`]: the statement says `NOWAIT`).
    fn set_wait<'c>(&'c self, conn: &'c mut Self::Conn, wait: ServerWait) -> Answer<'c, ()>;

    /// The locking `SELECT` of a row, in its four forms (`FOR UPDATE`,
    /// `NOWAIT` for [`Intent::Try`]; the share-mode lock for a shared
    /// holding, where the mode claims them): a token once granted, no row
    /// when the row does not exist, a "lock busy" error when the wait ended.
    fn locking(&self) -> &LockingSql;

    /// The statement that deletes a row unless a transaction has it locked
    /// (see [`delete_if_free`](Self::delete_if_free)).
    fn delete_sql(&self) -> &Arc<str>;

    /// How a row's name binds in [`locking`](Self::locking) and
    /// [`delete_sql`](Self::delete_sql).
    fn row_values(name: &str) -> Vec<Value<'_>>;

    /// The first row of `names` that no one has locked, locked `FOR UPDATE
    /// SKIP LOCKED`: its name and a token; `None` when every existing one is
    /// locked.
    fn select_free<'c>(
        &'c self,
        conn: &'c mut Self::Conn,
        names: &'c [String],
    ) -> Answer<'c, Option<(String, i64)>>;

    /// `BEGIN`, then the row of the one permit slot `slot` locked `FOR
    /// UPDATE SKIP LOCKED` (as [`select_free`](Self::select_free)): its
    /// token, `None` when it is missing or held (the transaction stays
    /// open). Where the database can, the slot's row is made first if it is
    /// missing, as [`begin_and_select`](Self::begin_and_select) makes a
    /// lock's, all in one round trip.
    fn begin_and_select_slot<'c>(
        &'c self,
        conn: &'c mut Self::Conn,
        slot: &'c [String],
    ) -> Answer<'c, Option<i64>>;

    /// Creates the missing rows of `names` in one statement, committed on
    /// another connection.
    fn ensure_rows<'c>(&'c self, names: &'c [String]) -> Answer<'c, ()>;

    /// Deletes the row `name` in one autocommitted statement unless a
    /// transaction has it locked (`FOR UPDATE SKIP LOCKED` passes over it
    /// then, and does not wait): run after a holding's `ROLLBACK`, it leaves
    /// the row to a waiter that took the lock at once, or to a fellow reader,
    /// and otherwise removes it, so that a released name leaves no row.
    fn delete_if_free<'c>(&'c self, conn: &'c mut Self::Conn, name: &'c str) -> Answer<'c, ()> {
        let delete = Self::Db::changed(
            Self::connection(conn),
            (self.delete_sql(), &Self::row_values(name)),
        );
        Box::pin(delete.map_ok(drop))
    }

    /// A try of [`lock_row`]: `name`'s row made if it is missing, in an
    /// autocommitted statement on the lock's own connection that never
    /// waits for a lock a holder keeps on the row (a released name's row is
    /// deleted by its holder, so it is made before every try, and again
    /// after the locking `SELECT` found it gone), then `BEGIN`, then the
    /// locking `SELECT` ([`locking`](Self::locking)): `Some(token)` once
    /// granted, `None` when the row does not exist. After an error the
    /// caller rolls back (outside a transaction, a `ROLLBACK` does nothing).
    fn begin_and_select<'c>(
        &'c self,
        conn: &'c mut Self::Conn,
        name: &'c str,
        intent: Intent,
        shared: bool,
    ) -> Answer<'c, Option<i64>>;

    /// What a grant still needs (a token drawn elsewhere): the fencing
    /// token. By default the one the `SELECT` drew.
    fn granted<'c>(&'c self, conn: &'c mut Self::Conn, token: i64) -> Answer<'c, i64> {
        let _ = conn;
        Box::pin(std::future::ready(Ok(token)))
    }

    /// Whether `name`'s row exists and cannot be locked, asked on a pooled
    /// connection without waiting, and how many wait for it where the
    /// server can tell.
    fn row_state<'c>(&'c self, name: &'c str) -> Answer<'c, (bool, Option<usize>)>;
}

/// The key of a holding in `row` mode.
#[derive(Debug)]
pub(crate) enum RowKey {
    /// The row's name, and whether the lock is the share lock.
    Row { name: String, shared: bool },
    /// The rows of a semaphore's permit slots (see [`permit_row_name`]),
    /// and the slot taken, once granted.
    Slots {
        slots: Vec<String>,
        taken: AtomicUsize,
    },
}

/// `row` mode on the database whose statements `R` gives.
#[derive(Debug)]
pub(crate) struct RowSession<R>(pub(crate) R);

#[lockkit_core::async_trait]
impl<R: RowLocking> SessionDb for RowSession<R>
where
    for<'c> &'c mut <R::Db as Database>::Connection: Executor<'c, Database = R::Db>,
{
    type Conn = R::Conn;
    type Key = RowKey;

    fn settings(&self) -> &Settings {
        self.0.settings()
    }

    fn capabilities(&self) -> Capabilities {
        R::CAPABILITIES
    }

    fn key(&self, name: &str, kind: LockKind) -> Result<RowKey> {
        Ok(match kind {
            LockKind::Semaphore { permits } => {
                check_slot_permits(self.settings().backend, permits)?;
                RowKey::Slots {
                    slots: (0..permits)
                        .map(|slot| permit_row_name(name, slot))
                        .collect(),
                    taken: AtomicUsize::new(0),
                }
            }
            kind => RowKey::Row {
                name: name.to_owned(),
                shared: kind == LockKind::Shared,
            },
        })
    }

    async fn connect(&self) -> Result<R::Conn> {
        self.0.connect().await
    }

    async fn lock(
        &self,
        conn: &mut R::Conn,
        key: &RowKey,
        wait: ServerWait,
        _record: Option<Record<'_>>,
    ) -> Result<Locked> {
        let locking = &self.0;
        let locked = match key {
            RowKey::Slots { slots, taken } => {
                lock_slot_row(locking, conn, slots, taken, wait).await
            }
            RowKey::Row { name, shared } => match locking.set_wait(conn, wait).await {
                Ok(()) => lock_row(locking, conn, name, wait.intent(), *shared).await,
                Err(error) => Err(error),
            },
        };
        let granted = locked.map(|locked| locked.map(|drawn| (drawn as u64, false)));
        Locked::of(self.settings(), granted)
    }

    async fn unlock(
        &self,
        conn: &mut R::Conn,
        key: &RowKey,
        _record: Option<Record<'_>>,
    ) -> Result<bool> {
        let name = match key {
            RowKey::Row { name, .. } => name,
            RowKey::Slots { slots, taken } => &slots[taken.load(Ordering::SeqCst)],
        };
        unlock_row(&self.0, conn, name)
            .await
            .map_err(|error| self.settings().error("unlock", error))
    }

    async fn ping(&self, conn: &mut R::Conn, _key: &RowKey) -> Result<bool> {
        sqlx::raw_sql("SELECT 1")
            .execute(R::connection(conn))
            .await
            .map(|_| true)
            .map_err(|error| self.settings().error("liveness check", error))
    }

    /// Whether the row exists and cannot be locked (`FOR UPDATE SKIP
    /// LOCKED`), and its waiters where the server tells; a semaphore: how
    /// many of its slot rows are held.
    async fn status(&self, key: &RowKey) -> Result<LockStatus> {
        let settings = self.settings();
        let state = async |name: &str| {
            let asked = self.0.row_state(name);
            settings.bounded("read the lock's status", asked).await
        };
        match key {
            RowKey::Row { name, .. } => Ok(match state(name).await? {
                (true, waiting) => LockStatus::held().with_waiters(waiting),
                (false, _) => LockStatus::free(),
            }),
            RowKey::Slots { slots, .. } => {
                let mut holders = 0;
                for slot in slots {
                    holders += usize::from(state(slot).await?.0);
                }
                Ok(match holders {
                    0 => LockStatus::free(),
                    n => LockStatus::held().with_holders(Some(n)),
                })
            }
        }
    }

    fn abandon(&self, conn: R::Conn) {
        self.0.abandon(conn);
    }

    fn session_id(&self, conn: &R::Conn) -> Option<u64> {
        self.0.session_id(conn)
    }

    async fn interrupt(&self, id: u64) -> Result<()> {
        self.0.interrupt(id).await
    }
}

/// A permit: a free slot row if there is one, otherwise a wait on one slot
/// for a slice, as [`SlotPlan`] says.
async fn lock_slot_row<R: RowLocking>(
    locking: &R,
    conn: &mut R::Conn,
    slots: &[String],
    taken: &AtomicUsize,
    wait: ServerWait,
) -> sqlx::Result<Option<i64>>
where
    for<'c> &'c mut <R::Db as Database>::Connection: Executor<'c, Database = R::Db>,
{
    let plan = SlotPlan::new(slots.len());
    if let Some((slot, token)) = lock_free_slot(locking, conn, slots, plan.first()).await? {
        taken.store(slot, Ordering::SeqCst);
        return Ok(Some(token));
    }
    let (slot, Some(slice)) = (plan.first(), wait.slice()) else {
        return Ok(None);
    };
    locking.set_wait(conn, slice).await?;
    let token = lock_row(locking, conn, &slots[slot], Intent::Wait, false).await?;
    if token.is_some() {
        taken.store(slot, Ordering::SeqCst);
    }
    Ok(token)
}

/// Locks `name`'s row in a transaction that stays open while the lock is
/// held: the fencing token when granted, `None` when busy (rolled back). A
/// name without a row gets one before each try.
async fn lock_row<R: RowLocking>(
    locking: &R,
    conn: &mut R::Conn,
    name: &str,
    intent: Intent,
    shared: bool,
) -> sqlx::Result<Option<i64>>
where
    for<'c> &'c mut <R::Db as Database>::Connection: Executor<'c, Database = R::Db>,
{
    // A waiter can find the row gone when a holder's clean-up deleted it
    // meanwhile: it makes the row again and waits anew.
    for _ in 0..VANISHED_LIMIT {
        match locking.begin_and_select(conn, name, intent, shared).await {
            Ok(Some(token)) => {
                return match locking.granted(conn, token).await {
                    Ok(token) => Ok(Some(token)),
                    Err(error) => {
                        run::<R>(conn, "ROLLBACK").await?;
                        Err(error)
                    }
                };
            }
            Ok(None) => run::<R>(conn, "ROLLBACK").await?,
            // Waiters that find a deleted row, and the inserts that make it
            // again, can deadlock in InnoDB; the victim was rolled back
            // whole, and waits again.
            Err(error) if is_deadlock(&error) => {
                tracing::debug!(%error, "row lock chosen as a deadlock victim; waiting again");
                run::<R>(conn, "ROLLBACK").await?;
            }
            Err(error) => {
                run::<R>(conn, "ROLLBACK").await?;
                return if is_lock_busy(&error) {
                    Ok(None)
                } else {
                    Err(error)
                };
            }
        }
    }
    Err(sqlx::Error::Protocol(format!(
        "the row of lock {name:?} vanished (or its lock deadlocked) {VANISHED_LIMIT} times in a row while being locked"
    )))
}

/// How often in a row [`lock_row`] makes a vanished row again.
const VANISHED_LIMIT: usize = 64;

/// Ends a `row` mode holding of the row `name`: `ROLLBACK`, which hands
/// the lock to the next waiter at once, then the row's clean-up (see
/// [`RowLocking::delete_if_free`]). A failed clean-up leaves the row, which
/// serves the name's next holder. The two go in two messages: in one, the
/// SQL bench's handoff to the waiter that the `ROLLBACK` woke was much
/// slower than the server's own.
async fn unlock_row<R: RowLocking>(
    locking: &R,
    conn: &mut R::Conn,
    name: &str,
) -> sqlx::Result<bool>
where
    for<'c> &'c mut <R::Db as Database>::Connection: Executor<'c, Database = R::Db>,
{
    run::<R>(conn, "ROLLBACK").await?;
    if let Err(error) = locking.delete_if_free(conn, name).await {
        tracing::debug!(%error, "could not delete a released row; it stays");
    }
    Ok(true)
}

/// Locks a free permit slot of a semaphore's rows (`slots`, see
/// [`permit_row_name`]) in a transaction that
/// stays open while the permit is held: the slot's index and the token, or
/// `None` when every slot is held (rolled back). The slot `first` is tried
/// alone first (a point lookup, and clients spread over the slots), then
/// all of them. Missing slot rows are created, and the slots tried again.
async fn lock_free_slot<R: RowLocking>(
    locking: &R,
    conn: &mut R::Conn,
    slots: &[String],
    first: usize,
) -> sqlx::Result<Option<(usize, i64)>>
where
    for<'c> &'c mut <R::Db as Database>::Connection: Executor<'c, Database = R::Db>,
{
    for round in 0..2 {
        let free = match locking
            .begin_and_select_slot(conn, &slots[first..=first])
            .await
        {
            Ok(Some(token)) => Ok(Some((first, token))),
            Ok(None) if slots.len() > 1 => match locking.select_free(conn, slots).await {
                Ok(Some((row, token))) => match slots.iter().position(|slot| *slot == row) {
                    Some(slot) => Ok(Some((slot, token))),
                    None => Err(sqlx::Error::Protocol(format!(
                        "the server locked {row:?}, which is not a slot of this semaphore"
                    ))),
                },
                answer => answer.map(|_| None),
            },
            answer => answer.map(|_| None),
        };
        match free {
            Ok(Some((slot, token))) => {
                let granted = locking.granted(conn, token).await.map(|t| (slot, t));
                if granted.is_err() {
                    run::<R>(conn, "ROLLBACK").await?;
                }
                return granted.map(Some);
            }
            Ok(None) => {
                run::<R>(conn, "ROLLBACK").await?;
                if round == 0 {
                    match locking.ensure_rows(slots).await {
                        // Another client is creating the same rows.
                        Err(error) if is_lock_busy(&error) || is_deadlock(&error) => {}
                        answer => answer?,
                    }
                }
            }
            // As in `lock_row`: tried again.
            Err(error) if is_deadlock(&error) => run::<R>(conn, "ROLLBACK").await?,
            Err(error) => {
                run::<R>(conn, "ROLLBACK").await?;
                return Err(error);
            }
        }
    }
    Ok(None)
}

/// `BEGIN` or `ROLLBACK` on a dedicated connection.
async fn run<R: RowLocking>(conn: &mut R::Conn, statement: &'static str) -> sqlx::Result<()>
where
    for<'c> &'c mut <R::Db as Database>::Connection: Executor<'c, Database = R::Db>,
{
    sqlx::raw_sql(statement)
        .execute(R::connection(conn))
        .await
        .map(drop)
}
