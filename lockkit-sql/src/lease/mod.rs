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

#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod line;
mod reader;
mod records;
mod rows;
mod statements;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;

use lockkit_core::backend::{
    Attempt, Handover, Intent, LeaseBackend, OwnerToken, ReleaseWatch, holder_of, stored_owner,
    validate_name,
};
use lockkit_core::{Capabilities, FencingToken, LockKind, LockStatus, Result};

use crate::names::check_slot_permits;
use crate::pool::{KeptPool, SessionId};
use crate::settings::Settings;
use crate::statement::{Answer, LiveColumns, Runs, Value, millis, remaining_ms};

#[cfg(feature = "postgres")]
pub(crate) use line::InLine;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use line::{Line, PlaceSql, Places, RESERVED_FOR, Turns};
#[cfg(feature = "mysql")]
pub(crate) use records::bell_mark_row;
use records::waiting_row_name;
pub(crate) use records::{IdentityRecords, holder_row_name, permit_row_name};
use rows::Rows;
pub(crate) use statements::{Args, Ask, Grant, LeaseSql, LeaseStatements, Param};

/// A grant's answer: a fencing token, or busy with how long to wait.
pub(crate) type Granted = Attempt<Option<FencingToken>>;

/// A database connection of dialect `D`.
pub(crate) type Conn<D> = <<D as LeaseDialect>::Db as sqlx::Database>::Connection;

/// One database's lease statements. The ones whose answers read alike
/// everywhere are data ([`LeaseStatements`]: a text and its parameters);
/// the grants, whose answers each database gives its own way, are
/// methods. [`LeaseRows`] does the rest, the same on every database: binding,
/// kept connections, the command timeout, errors, and undoing an acquire
/// that was abandoned.
pub(crate) trait LeaseDialect: Send + Sync + fmt::Debug + 'static {
    /// The sqlx database.
    type Db: Runs;
    /// What `lease` mode guarantees on this database.
    const CAPABILITIES: Capabilities;

    /// The statements of [`LeaseStatements`].
    fn statements(&self) -> &LeaseStatements;

    /// How a row's name binds (text, by default).
    fn name_value(name: &str) -> Value<'_> {
        Value::Text(name)
    }

    /// How a lease binds (whole milliseconds, by default).
    fn ttl_value(ttl: Duration) -> Value<'static> {
        millis(ttl)
    }

    /// The session of `conn` on the server, which an abandoned acquire's
    /// undo ends (from another connection) before it runs; see
    /// [`crate::pool`]. `None` by default: the undo follows the given-up
    /// statement on its own connection (PostgreSQL, SQLite).
    fn session_id(_conn: &mut Conn<Self>) -> Answer<'_, Option<SessionId>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Ends `session` on the server, from `conn`, returning once it is
    /// gone: whatever it ran is then done or undone. Nothing by default
    /// (no dialect without [`session_id`](Self::session_id) is asked).
    fn end_session(_conn: &mut Conn<Self>, _session: SessionId) -> Answer<'_, ()> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Runs a grant's statement ([`LeaseStatements::grant`]): the new
    /// fence when granted, else how long what stands in the way still runs.
    fn grant<'c>(&'c self, conn: &'c mut Conn<Self>, ask: Ask<'c>) -> Answer<'c, Granted>;

    /// Runs [`LeaseStatements::hand_over`]: the new fence, or `None` when
    /// the lease was not the owner's. By default, the number the statement
    /// answers (`RETURNING fence`).
    fn hand_over<'c>(
        &'c self,
        conn: &'c mut Conn<Self>,
        args: Args<'c>,
    ) -> Answer<'c, Option<i64>> {
        let sql = &self.statements().hand_over;
        let values = self.statements().values::<Self>(sql, args);
        Self::Db::number(conn, (&sql.text, &values))
    }

    /// Runs `sql`, one of [`LeaseStatements`], with `args`: the rows it
    /// changed.
    fn run<'c>(
        &'c self,
        conn: &'c mut Conn<Self>,
        sql: &'c LeaseSql,
        args: Args<'c>,
    ) -> Answer<'c, u64> {
        let values = self.statements().values::<Self>(sql, args);
        Self::Db::changed(conn, (&sql.text, &values))
    }

    /// Runs the owner's release ([`LeaseStatements::release`], for the
    /// owner in `args`) and wakes the waiters it freed the lock for: the
    /// rows changed (0: the lease was not the owner's). Each dialect decides
    /// between its statements on the server's answers (PostgreSQL:
    /// `postgres::lease`; MySQL/MariaDB: `mysql::lease`; SQLite:
    /// `sqlite::lease`).
    fn release<'c>(&'c self, conn: &'c mut Conn<Self>, args: Args<'c>) -> Answer<'c, u64>;

    /// Wakes the waiters of `name` after a statement freed it (a release, a
    /// reader group's last leave, a withdrawn waiting record), where the
    /// statement itself does not (Postgres notifies in it, MySQL/MariaDB's
    /// release rings its bells). Nothing by default.
    fn released(&self, name: &str) {
        let _ = name;
    }

    /// Whether a waiting writer whose waiting record is fresh reads the row
    /// before it writes, and stays busy without a write while a lease stands
    /// in the way: for a database whose writes queue for one lock, where
    /// every waiting process tries on each release. `false` by default.
    const READ_FIRST: bool = false;

    /// Release notifications of `name`; none by default (waiters back off,
    /// never past the holder's expiry).
    fn watch<'a>(&'a self, settings: &'a Settings, name: &'a str) -> BoxFuture<'a, ReleaseWatch> {
        let _ = (settings, name);
        Box::pin(std::future::ready(ReleaseWatch::none()))
    }

    /// How many clients wait in line for `name`, where the database keeps
    /// a line (Postgres, SQLite: see `line`); `None` by default.
    fn waiting<'a>(&'a self, settings: &'a Settings, name: &'a str) -> Answer<'a, Option<usize>> {
        let _ = (settings, name);
        Box::pin(std::future::ready(Ok(None)))
    }

    /// The client's turns, where a release reserves a name for the client
    /// at the head of its line (Postgres, SQLite: see `line`): the engine
    /// passes on those that no waiter wants. `None` by default.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    fn turns(&self) -> Option<&Turns> {
        None
    }
}

/// A live lease row.
#[derive(Debug)]
pub(crate) struct LiveRow {
    pub(crate) fence: i64,
    /// Until it expires, by the server's clock.
    pub(crate) remaining: Duration,
    /// A writer's stored owner, or a reader group (see [`group_size`]).
    pub(crate) owner: Option<String>,
}

impl From<LiveColumns> for LiveRow {
    fn from((fence, remaining, owner): LiveColumns) -> Self {
        LiveRow {
            fence,
            remaining: remaining_ms(remaining),
            owner,
        }
    }
}

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
        let rows = Arc::new(Rows {
            dialect: Arc::new(dialect),
            pool,
            settings,
        });
        #[cfg(any(feature = "postgres", feature = "sqlite"))]
        if let Some(turns) = rows.dialect.turns() {
            let rows = Arc::downgrade(&rows);
            turns.on_pass(move |name| {
                if let (Some(rows), Ok(runtime)) =
                    (rows.upgrade(), tokio::runtime::Handle::try_current())
                {
                    runtime.spawn(async move { rows.pass_turn(&name).await });
                }
            });
        }
        LeaseRows { rows }
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

/// A writer's waiting record, as its holding knows it.
#[derive(Debug, Default)]
pub(crate) struct WaitingMark {
    /// Whether it may have recorded itself (set before the write).
    maybe: AtomicBool,
    /// When it last wrote its record.
    at: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl WaitingMark {
    /// Its record was just written.
    fn written(&self) {
        *self.at.lock().unwrap_or_else(|p| p.into_inner()) = Some(tokio::time::Instant::now());
    }

    /// Whether its record was written less than `within` ago.
    fn fresh(&self, within: Duration) -> bool {
        self.at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|at| at.elapsed() < within)
    }
}

/// The rows of one kind of holding.
#[derive(Debug)]
enum Holding {
    /// A writer's holding of the lock's row (the name itself); `waiting`:
    /// whether it may have recorded itself as a waiting writer.
    Lock { name: String, waiting: WaitingMark },
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
                waiting: WaitingMark::default(),
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
                // Boxed, as a permit's: the other kinds' attempts would
                // make every writer's attempt's future as large.
                Box::pin(self.acquire_reader(name, waiting, token, ttl, record, recorded)).await
            }
            Holding::Permit { slots, taken } => {
                Box::pin(self.rows.acquire_permit(slots, taken, &owner, ttl)).await
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

    /// Lock and permit rows; a reader group's row stays until the name is
    /// next taken (its other readers may still count on it).
    async fn purge(&self, key: &LeaseKey, owner: &OwnerToken) -> Result<()> {
        if let (Holding::Lock { .. } | Holding::Permit { .. }, Some(row)) =
            (&key.holding, key.holding.row())
        {
            self.rows.purge_row(row, &key.owner(owner)).await?;
        }
        Ok(())
    }

    /// A permit whose slot is unknown was never granted (an abandoned
    /// attempt's [`Undo`](crate::pool::Undo) releases its upsert); a writer
    /// also withdraws its waiting record.
    async fn release(&self, key: &LeaseKey, owner: &OwnerToken) -> Result<bool> {
        let owner = key.owner(owner);
        match &key.holding {
            Holding::Lock { name, waiting } => {
                let released = self.rows.release_row(name, &owner).await?;
                if waiting.maybe.swap(false, Ordering::SeqCst) {
                    // Boxed, as the other kinds' releases: seldom needed,
                    // they would make every release's future as large.
                    Box::pin(self.rows.unmark_waiting(name, Some(&owner))).await?;
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
                    Box::pin(async {
                        if recorded.swap(false, Ordering::SeqCst) {
                            let row = holder_row_name(name, LockKind::Shared);
                            self.rows.release_row(&row, &owner).await?;
                        }
                        self.rows.leave(name, token as i64).await
                    })
                    .await
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
        let args = Args {
            to: to.as_str(),
            ..Args::of(name).owner(from.as_str()).ttl(ttl)
        };
        let answer = rows
            .settings
            .timed(rows.dialect.hand_over(&mut loan, args))
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
        let (mut holders, mut last, mut holder) = (0, None::<(i64, Duration)>, None);
        let mut group = None;
        for row in rows {
            if let Some(live) = self.rows.row_status(row).await? {
                let (fence, remaining) = (live.fence, live.remaining);
                let owner = live.owner.unwrap_or_default();
                match group_size(&owner) {
                    Some(readers) => {
                        holders += readers;
                        group = Some(row);
                    }
                    None => holders += 1,
                }
                holder = holder.or_else(|| holder_of(&owner).map(str::to_owned));
                last = Some(last.map_or((fence, remaining), |(f, r)| {
                    (f.max(fence), r.max(remaining))
                }));
            }
        }
        if let Some(name) = group {
            holder = self.read(&holder_row_name(name, LockKind::Shared)).await?;
        }
        Ok(match last {
            Some((fence, remaining)) => {
                // Counted only where held: a free lock's status has no waiters.
                let waiters = match &key.holding {
                    Holding::Lock { name, .. } => {
                        let settings = &self.rows.settings;
                        let asked = self.rows.dialect.waiting(settings, name);
                        settings.bounded("count the clients in line", asked).await?
                    }
                    _ => None,
                };
                let status = LockStatus::held()
                    .with_remaining(Some(remaining))
                    .with_holders(Some(holders))
                    .with_holder(holder)
                    .with_waiters(waiters);
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
