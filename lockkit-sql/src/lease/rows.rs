//! The statements of `lease` mode run one by one: a kept connection, the
//! command timeout, the error mapping, and an abandoned acquire's undo.

use std::slice;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockkit_core::backend::{Attempt, Intent};
use lockkit_core::{FencingToken, Result};

use super::{Args, Ask, Grant, LeaseDialect, LeaseSql, LiveRow, WaitingMark, waiting_row_name};
use crate::error::is_deadlock;
use crate::pool::{KeptPool, Undo};
use crate::settings::Settings;
use crate::slots::SlotPlan;
use crate::statement::Runs as _;

/// The statements of `lease` mode, each on a kept connection under the
/// command timeout.
#[derive(Debug)]
pub(super) struct Rows<D: LeaseDialect> {
    pub(super) dialect: Arc<D>,
    pub(super) pool: KeptPool<D::Db>,
    pub(super) settings: Settings,
}

impl<D: LeaseDialect> Rows<D> {
    /// What releases the lease if an acquire by `owner` (of a lease of
    /// `ttl`) is abandoned before its answer: the dialect's release, once the
    /// acquire's session has ended (see [`Undo`]).
    fn undo_acquire(&self, name: &str, owner: &str, ttl: Duration) -> Undo<D::Db> {
        let (dialect, owner) = (self.dialect.clone(), Arc::<str>::from(owner));
        Undo::new(&self.settings, name, ttl, move |conn, name, session| {
            let (dialect, owner) = (dialect.clone(), owner.clone());
            Box::pin(async move {
                if let Some(session) = session {
                    D::end_session(conn, session).await?;
                }
                let args = Args::of(&name).owner(&owner);
                dialect.release(conn, args).await.map(drop)
            })
        })
    }

    /// Cancellation-safe without a task per attempt: if the upsert is
    /// abandoned before it answers, a release runs after it has ended (see
    /// [`Undo`]), so it cannot be overtaken by a statement that may still
    /// take the lease.
    pub(super) async fn acquire_row(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let mut loan = self.pool.lend(&self.settings).await?;
        let undo = self.undo_acquire(name, owner, ttl);
        let answer = self
            .settings
            .timed(async {
                loan.session(D::session_id).await?;
                loan.undo_with(undo);
                let args = Args::of(name).owner(owner).ttl(ttl);
                let ask = Ask {
                    grant: Grant::Acquire,
                    args,
                };
                self.dialect.grant(&mut loan, ask).await
            })
            .await;
        loan.finish(&self.settings, "acquire", answer)
    }

    /// Runs `sqls` in order on one kept connection under the command
    /// timeout, until one changes a row: whether one did. (One statement,
    /// mostly; a leave where the last reader deletes the row tries that
    /// first.)
    async fn changes(&self, what: &str, sqls: &[LeaseSql], args: Args<'_>) -> Result<bool> {
        let statements = self.dialect.statements();
        let mut loan = self.pool.lend(&self.settings).await?;
        let answer = self
            .settings
            .timed(async {
                for sql in sqls {
                    let values = statements.values::<D>(sql, args);
                    if D::Db::changed(&mut loan, (&sql.text, &values)).await? >= 1 {
                        return Ok(true);
                    }
                }
                Ok(false)
            })
            .await;
        loan.finish(&self.settings, what, answer)
    }

    /// [`changes`](Self::changes) by a statement that frees `name` when it
    /// changes a row (a release, a reader group's last leave, a withdrawn
    /// waiting record): its waiters are then woken (see
    /// [`LeaseDialect::released`]).
    async fn frees(
        &self,
        name: &str,
        what: &str,
        sqls: &[LeaseSql],
        args: Args<'_>,
    ) -> Result<bool> {
        let changed = self.changes(what, sqls, args).await?;
        if changed {
            self.dialect.released(name);
        }
        Ok(changed)
    }

    pub(super) async fn extend_row(&self, name: &str, owner: &str, ttl: Duration) -> Result<bool> {
        let args = Args::of(name).owner(owner).ttl(ttl);
        let extend = &self.dialect.statements().extend;
        self.changes("extend", slice::from_ref(extend), args).await
    }

    pub(super) async fn release_row(&self, name: &str, owner: &str) -> Result<bool> {
        let args = Args::of(name).owner(owner);
        let mut loan = self.pool.lend(&self.settings).await?;
        let answer = self
            .settings
            .timed(self.dialect.release(&mut loan, args))
            .await;
        // The dialect's release wakes the waiters (see `LeaseDialect::release`).
        Ok(loan.finish(&self.settings, "release", answer)? >= 1)
    }

    /// Releases the row of `name` that a release reserved for this client,
    /// none of whose waiters wants it any longer (see `line::Turns`): to
    /// the next client in line, or to nobody, as the owner's release would.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(super) async fn pass_turn(&self, name: &str) {
        let client = &self.dialect.statements().client;
        let reserved = format!("{}{client}", super::RESERVED_FOR);
        match self.release_row(name, &reserved).await {
            Ok(true) => tracing::debug!(name, "passed on a turn that no waiter wanted"),
            Ok(false) => {}
            Err(error) => {
                tracing::debug!(name, %error, "could not pass on a turn; it runs out");
            }
        }
    }

    pub(super) async fn purge_row(&self, name: &str, owner: &str) -> Result<bool> {
        let purge = &self.dialect.statements().purge;
        let args = Args::of(name).owner(owner);
        self.changes("clear a lease that ran out", slice::from_ref(purge), args)
            .await
    }

    /// The live lease on row `name`.
    pub(super) async fn row_status(&self, name: &str) -> Result<Option<LiveRow>> {
        let statements = self.dialect.statements();
        let values = statements.values::<D>(&statements.status, Args::of(name));
        let mut loan = self.pool.lend(&self.settings).await?;
        let answer = self
            .settings
            .timed(D::Db::live(&mut loan, (&statements.status.text, &values)))
            .await;
        let live = loan.finish(&self.settings, "read the lock's status", answer)?;
        Ok(live.map(LiveRow::from))
    }

    /// A permit: each slot's row tried once, as [`SlotPlan`] orders them,
    /// with the lease upsert; busy, with the soonest expiry, when all are
    /// held.
    pub(super) async fn acquire_permit(
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
    ///
    /// Where the dialect asks it ([`LeaseDialect::READ_FIRST`]), a waiting
    /// writer whose record is fresh reads the row before it writes: while
    /// a lease stands in the way the attempt ends there, busy, without a
    /// write. Every waiting process tries on each release there, and their
    /// writes would queue for the database's one write lock.
    pub(super) async fn acquire_writer(
        &self,
        name: &str,
        waiting: &WaitingMark,
        owner: &str,
        ttl: Duration,
        intent: Intent,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let half = ttl / 2;
        // The waits' statements are boxed: an uncontended attempt's future
        // stays small.
        if D::READ_FIRST
            && intent == Intent::Wait
            && waiting.fresh(ttl / 4)
            && let Some(live) = Box::pin(self.row_status(name)).await?
        {
            return Ok(Attempt::Busy {
                retry_after: Some(live.remaining.min(half)),
            });
        }
        let answer = self.acquire_row(name, owner, ttl).await?;
        match answer {
            Attempt::Busy { retry_after } if intent == Intent::Wait => {
                // Set first: a record made by an abandoned attempt is withdrawn too.
                waiting.maybe.store(true, Ordering::SeqCst);
                Box::pin(self.mark_waiting(name, owner, ttl)).await?;
                waiting.written();
                Ok(Attempt::Busy {
                    retry_after: Some(retry_after.map_or(half, |r| r.min(half))),
                })
            }
            Attempt::Acquired(_) if waiting.maybe.swap(false, Ordering::SeqCst) => {
                if let Err(error) = Box::pin(self.unmark_granted(name)).await {
                    tracing::warn!(lock.name = %name, %error, "could not withdraw a granted writer's waiting record; it ends with its TTL");
                }
                Ok(answer)
            }
            answer => Ok(answer),
        }
    }

    pub(super) async fn mark_waiting(&self, name: &str, owner: &str, ttl: Duration) -> Result<()> {
        self.write_record(
            &waiting_row_name(name),
            owner,
            ttl,
            "record a waiting writer",
        )
        .await
    }

    pub(super) async fn unmark_waiting(&self, name: &str, owner: Option<&str>) -> Result<()> {
        let waiting = waiting_row_name(name);
        self.delete_record(Some(name), &waiting, owner, "withdraw a waiting writer")
            .await
    }

    /// Deletes the waiting record of `name` (whoever's) once a writer holds
    /// `name`, waking nobody: while it holds, neither a reader nor another
    /// writer can be granted, and its release wakes them all. (Waking them
    /// here sent the waiting processes to ask again for nothing.)
    async fn unmark_granted(&self, name: &str) -> Result<()> {
        let waiting = waiting_row_name(name);
        self.delete_record(
            None,
            &waiting,
            None,
            "withdraw a granted writer's waiting record",
        )
        .await
    }

    /// Writes `owner` into the record row `row` for `ttl`, in place of any
    /// earlier one (a waiting writer's record, or a holder's identity).
    pub(super) async fn write_record(
        &self,
        row: &str,
        owner: &str,
        ttl: Duration,
        what: &str,
    ) -> Result<()> {
        let args = Args::of(row).owner(owner).ttl(ttl);
        let record = &self.dialect.statements().record;
        self.changes(what, slice::from_ref(record), args)
            .await
            .map(drop)
    }

    /// Deletes the record row `row` if it is `owner`'s (anyone's with
    /// `None`), and wakes the waiters of `woken` (nobody's with `None`).
    pub(super) async fn delete_record(
        &self,
        woken: Option<&str>,
        row: &str,
        owner: Option<&str>,
        what: &str,
    ) -> Result<()> {
        // Without a name to wake, none (Postgres sends no `NOTIFY`).
        let args = Args {
            owner,
            woken: woken.unwrap_or(""),
            ..Args::of(row)
        };
        let forget = slice::from_ref(&self.dialect.statements().forget);
        match woken {
            Some(name) => self.frees(name, what, forget, args).await,
            None => self.changes(what, forget, args).await,
        }
        .map(drop)
    }

    /// One reader's attempt, as its own statement. A deadlock victim's
    /// statement did nothing (the server rolled it back): it runs again, up
    /// to three times in all (InnoDB picks victims among readers that race
    /// for the same rows).
    pub(super) async fn share_row(
        &self,
        name: &str,
        waiting: &str,
        ttl: Duration,
    ) -> Result<Attempt<Option<FencingToken>>> {
        const WHAT: &str = "acquire a shared lease";
        let ask = Ask {
            grant: Grant::Share,
            args: Args {
                waiting,
                ..Args::of(name).ttl(ttl)
            },
        };
        let mut tries = 0;
        loop {
            tries += 1;
            let mut loan = self.pool.lend(&self.settings).await?;
            let answer = self
                .settings
                .timed(self.dialect.grant(&mut loan, ask))
                .await;
            if tries < 3 && matches!(&answer, Ok(Err(error)) if is_deadlock(error)) {
                tracing::debug!(lock.name = %name, "shared lease attempt chosen as a deadlock victim; running it again");
                let _ = loan.finish(&self.settings, WHAT, answer);
                continue;
            }
            return loan.finish(&self.settings, WHAT, answer);
        }
    }

    pub(super) async fn extend_share(&self, name: &str, token: i64, ttl: Duration) -> Result<bool> {
        let args = Args::of(name).token(token).ttl(ttl);
        let extend = &self.dialect.statements().extend_share;
        self.changes("extend a shared lease", slice::from_ref(extend), args)
            .await
    }

    pub(super) async fn leave(&self, name: &str, token: i64) -> Result<bool> {
        let args = Args::of(name).token(token);
        let leave = &self.dialect.statements().leave;
        self.frees(name, "release a shared lease", leave, args)
            .await
    }
}
