//! `lease` mode: a row per lock with an owner and an expiry decided by the
//! server's clock, on every database.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use lockkit_core::backend::{
    Attempt, Handover, Intent, LeaseBackend, OwnerToken, ReleaseWatch, validate_name,
};
use lockkit_core::{Capabilities, FencingToken, LockKind, LockStatus, Result};

use crate::pool::{KeptPool, Undo};
use crate::settings::Settings;

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

#[lockkit_core::async_trait]
impl<D: LeaseDialect> LeaseBackend for LeaseRows<D> {
    type Key = String;

    fn backend_name(&self) -> &'static str {
        self.settings.backend
    }

    fn capabilities(&self) -> Capabilities {
        D::CAPABILITIES
    }

    /// Names are stored as they are (bound parameters; byte-wise
    /// comparison). Exclusive holdings only, so far.
    fn key(&self, name: &str, _kind: LockKind) -> Result<String> {
        validate_name(name)?;
        Ok(name.to_owned())
    }

    /// Cancellation-safe without a task per attempt: if the upsert is
    /// abandoned before it answers, a release runs after it on the same
    /// connection (see [`Undo`]), so it cannot overtake a statement that may
    /// still take the lease. (SQLite's statements run
    /// on a worker thread that a dropped future does not stop; the release
    /// queues behind it there too.)
    async fn try_lock(
        &self,
        name: &String,
        owner: &OwnerToken,
        ttl: Duration,
        _intent: Intent,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let mut loan = self.pool.lend(&self.settings).await?;
        loan.undo_with(self.undo_acquire(name, owner.as_str()));
        let answer = self
            .settings
            .timed(self.dialect.acquire(&mut loan, name, owner.as_str(), ttl))
            .await;
        loan.finish(&self.settings, "acquire", answer)
    }

    async fn extend(&self, name: &String, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        let mut loan = self.pool.lend(&self.settings).await?;
        let answer = self
            .settings
            .timed(self.dialect.extend(&mut loan, name, owner.as_str(), ttl))
            .await;
        loan.finish(&self.settings, "extend", answer)
    }

    async fn release(&self, name: &String, owner: &OwnerToken) -> Result<bool> {
        let mut loan = self.pool.lend(&self.settings).await?;
        let answer = self
            .settings
            .timed(self.dialect.release(&mut loan, name, owner.as_str()))
            .await;
        loan.finish(&self.settings, "release", answer)
    }

    fn can_hand_over(&self) -> bool {
        true
    }

    /// One conditional `UPDATE`: new owner, new expiry, fence + 1.
    async fn hand_over(
        &self,
        name: &String,
        from: &OwnerToken,
        to: &OwnerToken,
        ttl: Duration,
    ) -> Result<Handover> {
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
    /// lease by the server's clock.
    async fn status(&self, name: &String) -> Result<LockStatus> {
        let mut loan = self.pool.lend(&self.settings).await?;
        let answer = self
            .settings
            .timed(self.dialect.status(&mut loan, name))
            .await;
        Ok(
            match loan.finish(&self.settings, "read the lock's status", answer)? {
                Some((fence, left_ms)) => LockStatus::held()
                    .with_fencing_token(Some(FencingToken::new(fence.max(0) as u64)))
                    .with_remaining(Some(Duration::from_millis(left_ms.max(0) as u64))),
                None => LockStatus::free(),
            },
        )
    }

    /// Postgres: `LISTEN` for the release's `NOTIFY`. Elsewhere none: waiters
    /// back off, never past the holder's expiry.
    async fn watch(&self, name: &String) -> Result<ReleaseWatch> {
        Ok(self.dialect.watch(&self.settings, name).await)
    }
}
