//! The single-instance Redis backend.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::backend::{
    Attempt, Handover, Intent, KeptPlace, LeaseBackend, LeaseLock, OwnerToken, ReleaseWatch, Turn,
};
use lockkit_core::{Capabilities, FencingToken, LockKind, LockStatus, ReleaseOnCrash, Result};

use crate::error::BACKEND;
use crate::holding::RedisKey;
use crate::instance::RedisInstance;
use crate::keys::Keys;
use crate::places::{Places, next_turn};
use crate::renewals::Renewing;
use crate::scripts::{Release, Waiting};
use crate::turns;

/// A lock client on one Redis server: [`LeaseLock`] over [`RedisBackend`].
pub type RedisLock = LeaseLock<RedisBackend>;

/// What the Redis backend guarantees on one server (`redis://`). In Redis
/// Cluster and Sentinel mode fencing is claimed only with
/// [`wait_for_replicas`](crate::RedisLockBuilder::wait_for_replicas): see
/// [`RedisBackend::fences`].
pub const REDIS_CAPABILITIES: Capabilities = Capabilities::new(ReleaseOnCrash::Ttl)
    .with_server_bounds(true)
    .with_fencing(true)
    .with_notified_wait(true)
    .with_shared(true)
    .with_semaphore(true)
    .with_holder(true);

/// What a fair Redis lock guarantees on one server (`fair=true`, see
/// [`RedisLockBuilder::fair`](crate::RedisLockBuilder::fair)): waiters are
/// served in order.
pub const REDIS_FAIR_CAPABILITIES: Capabilities = REDIS_CAPABILITIES.with_fifo(true);

/// What a barging Redis lock guarantees on one server (`barging=true`, see
/// [`RedisLockBuilder::barging`](crate::RedisLockBuilder::barging)): its
/// writers ask on the backoff, not notified.
pub const REDIS_BARGING_CAPABILITIES: Capabilities = REDIS_CAPABILITIES.with_notified_wait(false);

/// What the Redis backend guarantees in Redis Cluster and Sentinel mode
/// without `wait_replicas`, and wherever fencing is turned off: no fencing
/// (see [`RedisBackend::fences`]).
pub const REDIS_REPLICATED_CAPABILITIES: Capabilities = REDIS_CAPABILITIES.with_fencing(false);

/// The [`LeaseBackend`] of one Redis server.
#[derive(Debug)]
pub struct RedisBackend {
    instance: RedisInstance,
    prefix: String,
    /// For a fair lock, the id this client waits under in the queues.
    waiter: Option<Arc<str>>,
    /// Whether grants draw fencing tokens where the deployment can.
    fencing: bool,
    /// Whether waiters of exclusive locks ask on the backoff, out of any
    /// line and deaf to releases (see [`barging`](Self::barging)).
    barging: bool,
    /// The places in line releases kept for this client's next
    /// acquisitions (see `crate::places`).
    places: Arc<Places>,
}

impl RedisBackend {
    /// A backend on a connected instance with a key prefix.
    pub fn new(instance: RedisInstance, prefix: impl Into<String>) -> Self {
        RedisBackend {
            places: Arc::new(Places::new(instance.clone())),
            instance,
            prefix: prefix.into(),
            waiter: None,
            fencing: true,
            barging: false,
        }
    }

    /// The same backend, drawing fencing tokens (the default) where the
    /// deployment can, or never (see
    /// [`RedisLockBuilder::fencing`](crate::RedisLockBuilder::fencing)).
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// The same backend, serving the waiters of exclusive locks in order
    /// (see [`RedisLockBuilder::fair`](crate::RedisLockBuilder::fair)).
    pub fn fair(mut self) -> Self {
        self.waiter = Some(OwnerToken::new().as_str().into());
        self
    }

    /// Whether waiters are served in order.
    pub fn is_fair(&self) -> bool {
        self.waiter.is_some()
    }

    /// The same backend, whose waiters of exclusive locks hear no releases
    /// and ask again on the backoff (see
    /// [`RedisLockBuilder::barging`](crate::RedisLockBuilder::barging)).
    /// Its instance should keep no lines
    /// ([`RedisConfig::without_line`](crate::RedisConfig::without_line)),
    /// as the builder's does; one that keeps them queues its waiters
    /// without waking them for their turn. Not with [`fair`](Self::fair).
    pub fn barging(mut self) -> Self {
        self.barging = true;
        self.waiter = None;
        self
    }

    /// Whether waiters of exclusive locks ask on the backoff alone.
    pub fn is_barging(&self) -> bool {
        self.barging
    }

    /// The server connection.
    pub fn instance(&self) -> &RedisInstance {
        &self.instance
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether grants carry fencing tokens: not when turned off
    /// ([`fencing`](Self::fencing)). Else on one server, yes. Where
    /// replicas are promoted on failure (Cluster, Sentinel), only when every
    /// grant waits for a replica's acknowledgement: otherwise a replica
    /// promoted before the last grant reached it hands out that grant's
    /// token a second time, and a resource that accepts a token equal to
    /// the last one (as the usual `fence <= token` check does) lets the old
    /// holder's writes through. The fault suite shows it (`lockkit-faults`,
    /// scenario `failover`).
    pub fn fences(&self) -> bool {
        self.fencing && (self.instance.is_single() || self.instance.wait_for_replicas().is_some())
    }

    /// The Redis keys of the lock `name` ([`Keys::for_cluster`] in Redis Cluster).
    pub fn keys(&self, name: &str) -> Result<Keys> {
        if self.instance.is_cluster() {
            Keys::for_cluster(&self.prefix, name)
        } else {
            Keys::new(&self.prefix, name)
        }
    }
}

#[lockkit_core::async_trait]
impl LeaseBackend for RedisBackend {
    type Key = RedisKey;

    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    fn key(&self, name: &str, kind: LockKind) -> Result<RedisKey> {
        let cluster = self.instance.is_cluster();
        match (&self.waiter, kind) {
            (Some(waiter), LockKind::Exclusive) => Ok(RedisKey::Exclusive(Keys::fair(
                &self.prefix,
                name,
                cluster,
                waiter.clone(),
            )?)),
            _ => RedisKey::new(&self.prefix, name, kind, cluster),
        }
    }

    /// Stored with the owner token (see [`RedisKey::with_holder`]).
    fn with_holder(&self, key: RedisKey, holder: &str) -> RedisKey {
        key.with_holder(holder)
    }

    fn capabilities(&self) -> Capabilities {
        let caps = if self.fences() {
            REDIS_CAPABILITIES
        } else {
            REDIS_REPLICATED_CAPABILITIES
        };
        // A barging lock's writers ask on the backoff (its readers and
        // permits are still notified, but a capability speaks for all; see
        // `REDIS_BARGING_CAPABILITIES`).
        caps.with_fifo(self.is_fair())
            .with_notified_wait(!self.barging)
    }

    async fn try_lock(
        &self,
        key: &RedisKey,
        owner: &OwnerToken,
        ttl: Duration,
        intent: Intent,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let waiting = match intent {
            Intent::Wait if self.grants_turns() => Waiting::Turn,
            Intent::Wait => Waiting::ByArrival,
            Intent::Try => Waiting::No,
        };
        self.instance
            .try_hold(key, owner.as_str(), ttl, self.fences(), waiting)
            .await
    }

    /// The instance's own boxed future, not one boxed around it: the future
    /// of a batched renewal is then its answer's channel alone.
    fn extend<'s, 'k, 'o, 'f>(
        &'s self,
        key: &'k RedisKey,
        owner: &'o OwnerToken,
        ttl: Duration,
    ) -> Renewing<'f>
    where
        's: 'f,
        'k: 'f,
        'o: 'f,
        Self: 'f,
    {
        self.instance.extend_holding(key, owner.as_str(), ttl)
    }

    async fn release(&self, key: &RedisKey, owner: &OwnerToken) -> Result<bool> {
        let release = if self.grants_turns() {
            Release::Grant
        } else {
            Release::Wake
        };
        self.instance
            .release_holding(key, owner.as_str(), self.fences(), release)
            .await
    }

    /// On one server or a primary whose grants do not wait for replicas,
    /// unless the lock is fair (whose queue wakes its head to ask): a
    /// release makes the lease of the first waiter in line that asked for
    /// its turn ([`Waiting::Turn`]) that waiter's, and tells it on its
    /// turn channel, so that a handoff to another client costs it no
    /// round trip of its own.
    fn grants_turns(&self) -> bool {
        self.instance.grants_turns() && !self.is_fair()
    }

    fn take_turn(&self, key: &RedisKey, owner: &OwnerToken) -> Option<Turn> {
        let RedisKey::Exclusive(keys) = key else {
            return None;
        };
        let (since, token) = self.instance.take_turn(keys, &key.stored(owner.as_str()))?;
        let fencing = self.fences().then(|| FencingToken::new(token));
        Some(Turn { fencing, since })
    }

    /// On one server, where turns are granted
    /// ([`grants_turns`](LeaseBackend::grants_turns)) and this client's
    /// turn channel is subscribed already: when the release hands the lock
    /// to the head of the line, this client takes the end of the line in
    /// the same script, as if it had asked again at once (see
    /// `crate::places`).
    async fn release_keeping_place(
        &self,
        key: &RedisKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<bool> {
        if !(self.grants_turns() && self.instance.is_single()) {
            return self.release(key, owner).await;
        }
        let next = next_turn(key, OwnerToken::new(), ttl, turns::stamp(), None);
        self.places
            .release_keeping_place(key, owner.as_str(), self.fences(), next, None)
            .await
    }

    fn resume_place(&self, key: &RedisKey) -> Option<KeptPlace> {
        let RedisKey::Exclusive(keys) = key else {
            return None;
        };
        self.places.resume(&keys.lock)
    }

    /// Not while every grant must be acknowledged by replicas (`WAIT`): a
    /// hand-over is a grant too, and it is simpler to send every grant
    /// through the acquire script.
    /// Nor in a fair lock, whose grants all go through the queue.
    fn can_hand_over(&self) -> bool {
        self.instance.wait_for_replicas().is_none() && !self.is_fair()
    }

    /// One script: the lease becomes `to`'s with a new fencing token. Only
    /// exclusive holdings are passed on.
    async fn hand_over(
        &self,
        key: &RedisKey,
        from: &OwnerToken,
        to: &OwnerToken,
        ttl: Duration,
    ) -> Result<Handover> {
        let RedisKey::Exclusive(keys) = key else {
            return Ok(Handover::NotOurs);
        };
        Ok(
            match self
                .instance
                .hand_over(keys, from.as_str(), to.as_str(), ttl, self.fences())
                .await?
            {
                Some(token) => Handover::Passed(self.fences().then(|| FencingToken::new(token))),
                None => Handover::NotOurs,
            },
        )
    }

    /// One script reads the lock key's `PTTL`, the live readers (or permits),
    /// the fence counter and the waiters: for a fair lock its queue, else
    /// its waiting line. The token reported is the last one drawn for the
    /// name: the holder's (or the latest reader's), unless the key was set
    /// by a client that draws none (redis-py, redsync). The waiters are
    /// counted one per waiting client (its tasks wait behind one place);
    /// for a semaphore, and by a barging client (whose waiters are in no
    /// line), not at all. A lock reserved for the next waiter is free.
    async fn status(&self, key: &RedisKey) -> Result<LockStatus> {
        let mut holdings = self.instance.holdings_of(key).await?;
        if key.barges(self.barging) {
            // Barging waiters are in no line: the line's count misses them.
            holdings.waiters = None;
        }
        if holdings.count == 0 {
            return Ok(LockStatus::free().with_waiters(holdings.waiters));
        }
        Ok(LockStatus::held()
            .with_remaining(Some(holdings.remaining))
            .with_holders(Some(holdings.count))
            .with_waiters(holdings.waiters)
            .with_holder(holdings.holder)
            .with_fencing_token(
                holdings
                    .fence
                    .filter(|_| self.fences())
                    .map(FencingToken::new),
            ))
    }

    /// A barging lock's writers hear nothing: they ask on the backoff.
    async fn watch(&self, key: &RedisKey) -> Result<ReleaseWatch> {
        if key.barges(self.barging) {
            return Ok(ReleaseWatch::none());
        }
        Ok(self.instance.watch_holding(key).await)
    }

    fn live_watch(&self, key: &RedisKey) -> Option<ReleaseWatch> {
        if key.barges(self.barging) {
            return Some(ReleaseWatch::none());
        }
        self.instance.live_watch_of(key)
    }
}
