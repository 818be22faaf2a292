//! `lease` mode: a row per lock with an owner and an expiry decided by the
//! server's clock, on every database.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use lockkit_core::backend::{
    Attempt, Handover, LeaseBackend, OwnerToken, ReleaseWatch, validate_name,
};
use lockkit_core::{Capabilities, FencingToken, LockStatus, Result};

use crate::settings::Settings;

/// One database's lease statements; [`LeaseRows`] makes a
/// [`LeaseBackend`] of them.
///
/// Statically dispatched, one `LeaseRows` type per database, so that the
/// future of an operation holds only that database's statement future: a
/// single enum over all three made every call box (and copy) the largest of
/// them, about 18 KB per call.
pub(crate) trait LeaseDb: Send + Sync + fmt::Debug + 'static {
    /// What `lease` mode guarantees on this database.
    const CAPABILITIES: Capabilities;

    /// The lease upsert: the new fence when taken, the holder's remaining
    /// lease when not.
    fn try_lock<'a>(
        &'a self,
        settings: &'a Settings,
        name: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Attempt<Option<FencingToken>>>> + Send + 'a;

    /// Owner-conditional extension; `Ok(false)`: not `owner`'s.
    fn extend<'a>(
        &'a self,
        settings: &'a Settings,
        name: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool>> + Send + 'a;

    /// Owner-conditional release; `Ok(false)`: not `owner`'s.
    fn release<'a>(
        &'a self,
        settings: &'a Settings,
        name: &'a str,
        owner: &'a str,
    ) -> impl Future<Output = Result<bool>> + Send + 'a;

    /// Owner-conditional pass of the live lease from `from` to `to` for
    /// `ttl`, with the fence bumped: the new fence, or `None` when the lease
    /// was not `from`'s.
    fn hand_over<'a>(
        &'a self,
        settings: &'a Settings,
        name: &'a str,
        from: &'a str,
        to: &'a str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<i64>>> + Send + 'a;

    /// The live lease on `name`, if any: its fence and remaining milliseconds.
    fn status<'a>(
        &'a self,
        settings: &'a Settings,
        name: &'a str,
    ) -> impl Future<Output = Result<Option<(i64, i64)>>> + Send + 'a;

    /// Release notifications of `name`; none by default (waiters back off,
    /// never past the holder's expiry).
    fn watch<'a>(
        &'a self,
        settings: &'a Settings,
        name: &'a str,
    ) -> impl Future<Output = ReleaseWatch> + Send + 'a {
        let _ = (settings, name);
        std::future::ready(ReleaseWatch::none())
    }
}

/// The [`LeaseBackend`] of `lease` mode on database `D`.
#[derive(Debug)]
pub(crate) struct LeaseRows<D> {
    db: D,
    settings: Settings,
}

impl<D: LeaseDb> LeaseRows<D> {
    pub(crate) fn new(db: D, settings: Settings) -> Self {
        LeaseRows { db, settings }
    }
}

#[lockkit_core::async_trait]
impl<D: LeaseDb> LeaseBackend for LeaseRows<D> {
    type Key = String;

    fn backend_name(&self) -> &'static str {
        self.settings.backend
    }

    fn capabilities(&self) -> Capabilities {
        D::CAPABILITIES
    }

    /// Names are stored as they are (bound parameters; byte-wise comparison).
    fn key(&self, name: &str) -> Result<String> {
        validate_name(name)?;
        Ok(name.to_owned())
    }

    /// Cancellation-safe without a task per attempt: if the upsert is
    /// abandoned before it answers, a release runs after it on the same
    /// connection (see [`Undo`](crate::pool::Undo)), so it cannot overtake
    /// a statement that may still take the lease. (SQLite's statements run
    /// on a worker thread that a dropped future does not stop; the release
    /// queues behind it there too.)
    async fn try_lock(
        &self,
        name: &String,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt<Option<FencingToken>>> {
        self.db
            .try_lock(&self.settings, name, owner.as_str(), ttl)
            .await
    }

    async fn extend(&self, name: &String, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.db
            .extend(&self.settings, name, owner.as_str(), ttl)
            .await
    }

    async fn release(&self, name: &String, owner: &OwnerToken) -> Result<bool> {
        self.db.release(&self.settings, name, owner.as_str()).await
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
        Ok(
            match self
                .db
                .hand_over(&self.settings, name, from.as_str(), to.as_str(), ttl)
                .await?
            {
                Some(fence) => Handover::Passed(Some(FencingToken::new(fence.max(0) as u64))),
                None => Handover::NotOurs,
            },
        )
    }

    /// The live lease row, if any: held, with its fence and the remaining
    /// lease by the server's clock.
    async fn status(&self, name: &String) -> Result<LockStatus> {
        Ok(match self.db.status(&self.settings, name).await? {
            Some((fence, left_ms)) => LockStatus::held()
                .with_fencing_token(Some(FencingToken::new(fence.max(0) as u64)))
                .with_remaining(Some(Duration::from_millis(left_ms.max(0) as u64))),
            None => LockStatus::free(),
        })
    }

    /// Postgres: `LISTEN` for the release's `NOTIFY`. Elsewhere none: waiters
    /// back off, never past the holder's expiry.
    async fn watch(&self, name: &String) -> Result<ReleaseWatch> {
        Ok(self.db.watch(&self.settings, name).await)
    }
}
