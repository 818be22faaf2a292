//! The engine shared by lease-based backends (memory, Redis, Redlock, SQL lease rows).
//!
//! A backend implements [`LeaseBackend`]: a handful of primitive, single-round-trip
//! operations on one lock. [`LeaseLock`] turns it into a full
//! [`DistributedLock`]: validation, a per-name local FIFO, the shared wait policy
//! with release notifications, cancellation safety, guards with a watchdog, and
//! tracing.
//!
//! Shared holdings and semaphore permits go through the same operations: the
//! kind is part of the key ([`LeaseBackend::key`]), each holding has its own
//! owner token and lease, and only exclusive holdings use the local FIFO and
//! the local hand-over (readers and permit holders of one client hold
//! together, so queueing them locally would only serialise them).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::local_queue::{LocalHandle, LocalQueue, LocalSlot};
use crate::backend::notify::ReleaseWatch;
use crate::backend::token::OwnerToken;
use crate::backend::trace::traced_acquire;
use crate::backend::wait::{Attempt, Intent, Waiter};
use crate::backoff::Backoff;
use crate::capabilities::Capabilities;
use crate::error::{LockError, Result};
use crate::fencing::FencingToken;
use crate::guard::{Lease, LockGuard};
use crate::lock::DistributedLock;
use crate::options::{LockKind, LockOptions, Wait, clock_drift};
use crate::status::LockStatus;

/// The primitive operations of a lease-based backend; see [`LeaseLock`].
///
/// A lock name is checked and mapped into the backend's keyspace once per
/// acquisition ([`key`](Self::key)); every other method works on that key. Each
/// is one atomic step on the server, bounded by the backend's own timeouts, and
/// must be safe to cancel at any await point.
#[async_trait::async_trait]
pub trait LeaseBackend: Send + Sync + fmt::Debug + 'static {
    /// A lock name in the backend's keyspace (e.g. the Redis keys of a name).
    type Key: Send + Sync + fmt::Debug + 'static;

    /// The backend's name for logs and errors, e.g. `"redis"`.
    fn backend_name(&self) -> &'static str;

    /// What the backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// Checks `name` — at least with [`validate_name`](crate::backend::validate_name) —
    /// and maps a holding of `kind` on it into the backend's keyspace,
    /// injectively. Exclusive and shared holdings of a name are the two
    /// sides of one reader-writer lock; a semaphore of the same name is
    /// unrelated to it. Only called with kinds the backend's
    /// [`capabilities`](Self::capabilities) claim.
    fn key(&self, name: &str, kind: LockKind) -> Result<Self::Key>;

    /// The key of a holding that records `holder` as its holder's identity
    /// (with the holding, and read back by [`status`](Self::status)). Only
    /// called when the [`capabilities`](Self::capabilities) claim
    /// [`holder`](Capabilities::holder); the default keeps the key as it is.
    fn with_holder(&self, key: Self::Key, holder: &str) -> Self::Key {
        let _ = holder;
        key
    }

    /// Takes a holding for `owner` for `ttl` if the rules of its kind allow:
    /// an exclusive one if nobody holds the name, a shared one if no
    /// exclusive holding is held *or waited for*, a permit if fewer than
    /// `permits` are held. The fencing token (if the backend has them, drawn
    /// from one sequence per name for both sides of a reader-writer lock) on
    /// success, the holder's remaining lease (if known) otherwise.
    ///
    /// With [`Intent::Wait`], a backend with shared holdings records a busy
    /// exclusive attempt as waiting, for about `ttl`, so that new shared
    /// attempts are busy until the writer has had its turn (no writer
    /// starvation); the record goes when the writer is granted, when
    /// [`release`](Self::release) is called with its owner (the engine does
    /// when a waiting acquire ends without a holding), or when it expires.
    /// Its `retry_after` is then at most `ttl / 2`, so the record is renewed
    /// by the next attempt before it runs out.
    async fn try_lock(
        &self,
        key: &Self::Key,
        owner: &OwnerToken,
        ttl: Duration,
        intent: Intent,
    ) -> Result<Attempt<Option<FencingToken>>>;

    /// Makes `owner`'s lease end `ttl` from now. `Ok(false)`: not `owner`'s.
    async fn extend(&self, key: &Self::Key, owner: &OwnerToken, ttl: Duration) -> Result<bool>;

    /// Deletes `owner`'s lease (and its record as a waiting writer, if any)
    /// and wakes waiters. `Ok(false)`: no lease of `owner`'s.
    async fn release(&self, key: &Self::Key, owner: &OwnerToken) -> Result<bool>;

    /// Removes what `owner`'s lease left on the server once it ran out, for
    /// a server that keeps expired leases (SQL rows): called after a
    /// holding kept to its [`min_hold`](crate::LockOptions::min_hold)
    /// ended. Default: nothing (the server drops expired keys by itself).
    async fn purge(&self, key: &Self::Key, owner: &OwnerToken) -> Result<()> {
        let _ = (key, owner);
        Ok(())
    }

    /// Whether [`hand_over`](Self::hand_over) works. Default: false.
    fn can_hand_over(&self) -> bool {
        false
    }

    /// Makes `from`'s lease `to`'s, ending `ttl` from now, with a new
    /// fencing token (where the backend fences), in one atomic step: the lock
    /// passes from one task of this client to the next without a release in
    /// between. [`Handover::NotOurs`] (and nothing changed) when the lease is
    /// not `from`'s. Only called when [`can_hand_over`](Self::can_hand_over)
    /// says so; the default is [`LockError::Unsupported`].
    async fn hand_over(
        &self,
        key: &Self::Key,
        from: &OwnerToken,
        to: &OwnerToken,
        ttl: Duration,
    ) -> Result<Handover> {
        let _ = (key, from, to, ttl);
        Err(LockError::Unsupported {
            backend: self.backend_name(),
            operation: "hand a lease over",
        })
    }

    /// What the server says about the lock, without taking it; see
    /// [`DistributedLock::status`]. Default: [`LockError::Unsupported`].
    async fn status(&self, key: &Self::Key) -> Result<LockStatus> {
        let _ = key;
        Err(LockError::Unsupported {
            backend: self.backend_name(),
            operation: "report a lock's status",
        })
    }

    /// Subscribes to release notifications of the lock. Default: none.
    async fn watch(&self, key: &Self::Key) -> Result<ReleaseWatch> {
        let _ = key;
        Ok(ReleaseWatch::none())
    }

    /// The watch [`watch`](Self::watch) would give, if it is live already
    /// and costs no request (a subscription this client keeps for a while
    /// after its last waiter, say); `None` otherwise, the default. A
    /// waiting acquire takes it before its first attempt: a release after
    /// that attempt then reaches it, so that a refused attempt needs no
    /// second one to cover the time it took to subscribe.
    fn live_watch(&self, key: &Self::Key) -> Option<ReleaseWatch> {
        let _ = key;
        None
    }

    /// Whether the server grants a waiting exclusive acquisition its lease
    /// by itself when its turn in line comes, and tells it (see
    /// [`take_turn`](Self::take_turn)). Default: false. When true, an
    /// acquisition keeps one owner token across its refused attempts (the
    /// server's line holds it), which is only sound where nothing a refused
    /// attempt leaves in flight can take back a lease a later attempt, or
    /// a turn, granted: Redlock's rollback of an attempt that won no quorum
    /// leaves a lease that the attempt's turn granted alone, and a later
    /// attempt's request to an instance where the rollback still runs
    /// waits for it, or is sent too late for its answer to count.
    fn grants_turns(&self) -> bool {
        false
    }

    /// A lease the server granted `owner` on its turn in line, since its
    /// last attempt, and told this client of (a message with the release),
    /// taken from where the message left it; `None` if no such message came
    /// (the default). Asked after each wake of a waiting acquisition when
    /// [`grants_turns`](Self::grants_turns) says so; the next attempt
    /// finds a lease that is `owner`'s already and counts it from then, so
    /// a message that got lost costs one round trip, no more.
    fn take_turn(&self, key: &Self::Key, owner: &OwnerToken) -> Option<Turn> {
        let _ = (key, owner);
        None
    }

    /// How long a waiting acquisition whose turn some of the servers
    /// told it of, too few for [`take_turn`](Self::take_turn) to give it
    /// (Redlock: fewer than a quorum of instances), waits for the others'
    /// messages before it asks again; `None` (the default) when no such
    /// message came. Asked after a wake that gave no turn.
    fn turn_told_in_part(&self, key: &Self::Key, owner: &OwnerToken) -> Option<Duration> {
        let _ = (key, owner);
        None
    }

    /// As [`release`](Self::release), for an exclusive holding of a
    /// `ttl` lease whose release found no task of this client waiting for
    /// the name: a backend whose line grants turns
    /// ([`grants_turns`](Self::grants_turns)) may keep this client's place
    /// in line in the same step, when it hands the lock to another
    /// client, so that a next acquisition of the name by this client
    /// (which [`resume_place`](Self::resume_place) then gives) waits for
    /// its turn without asking the server first. A place that no
    /// acquisition resumes soon is the backend's to give up. Default:
    /// [`release`](Self::release).
    async fn release_keeping_place(
        &self,
        key: &Self::Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<bool> {
        let _ = ttl;
        self.release(key, owner).await
    }

    /// The place in line a release of this client kept for the name
    /// ([`release_keeping_place`](Self::release_keeping_place)), taken
    /// over by a waiting exclusive acquisition: its owner token is the
    /// acquisition's from then on, as after a refused attempt, and its
    /// turn comes through [`take_turn`](Self::take_turn). `None` (the
    /// default) when no place is kept.
    fn resume_place(&self, key: &Self::Key) -> Option<KeptPlace> {
        let _ = key;
        None
    }
}

/// A place in line kept for this client's next acquisition of a name (see
/// [`LeaseBackend::resume_place`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptPlace {
    /// The owner its turn grants the lease to.
    pub owner: OwnerToken,
    /// The lease its turn grants, counted from the turn.
    pub ttl: Duration,
    /// When to ask the server again if the turn has not come by then, as
    /// after a refused attempt.
    pub retry_after: Duration,
}

/// A lease the server granted a waiting acquisition when its turn came,
/// without being asked again (see [`LeaseBackend::take_turn`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Turn {
    /// Its fencing token, where the backend fences.
    pub fencing: Option<FencingToken>,
    /// When the attempt whose place in line the server granted was sent:
    /// the lease started after it, and its validity counts from here.
    pub since: Instant,
}

/// The answer of [`LeaseBackend::hand_over`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handover {
    /// The lease is the new owner's now, with this fencing token (where the
    /// backend fences).
    Passed(Option<FencingToken>),
    /// The lease was not the old owner's (any more); nothing changed.
    NotOurs,
}

/// How many times in a row a client passes a lock from one of its tasks to
/// the next (see [`LeaseLock`]) before it releases it to the server, so that
/// waiters of other clients get their chance.
pub const MAX_LOCAL_PASSES: u32 = 8;

/// A [`DistributedLock`] built from a [`LeaseBackend`].
///
/// Tasks of one `LeaseLock` that want the same name queue in a local FIFO and
/// only the head of the queue contends on the backend, so a task that releases
/// and asks again cannot starve the others, and the fairness between clients is
/// the backend's.
///
/// Where the backend can ([`LeaseBackend::can_hand_over`]), a holder whose
/// release finds tasks of the same client waiting passes the lease straight
/// to the next one in a single atomic step on the server (new owner, new
/// lease, new fencing token) instead of releasing it and letting the next
/// task take it again: one round trip per local handoff instead of two. It
/// does so at most [`MAX_LOCAL_PASSES`] times in a row, then releases to the
/// server, so that other clients' waiters get their turn.
pub struct LeaseLock<B> {
    backend: Arc<B>,
    local: LocalQueue,
}

impl<B: LeaseBackend> LeaseLock<B> {
    /// Wraps a backend.
    pub fn new(backend: B) -> Self {
        LeaseLock {
            backend: Arc::new(backend),
            local: LocalQueue::default(),
        }
    }

    /// The backend, for backend-specific operations.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The key of a valid request of a kind this backend can hold.
    fn check(&self, name: &str, opts: &LockOptions) -> Result<B::Key> {
        let key = self.backend.key(name, LockKind::Exclusive)?;
        opts.validate()?;
        opts.check_supported(self.backend.backend_name(), &self.backend.capabilities())?;
        let key = match opts.kind() {
            LockKind::Exclusive => key,
            kind => self.backend.key(name, kind)?,
        };
        Ok(match opts.holder_identity() {
            Some(holder) => self.backend.with_holder(key, holder),
            None => key,
        })
    }

    async fn try_acquire_inner(&self, name: &str, opts: &LockOptions) -> Result<Option<LockGuard>> {
        let key = self.check(name, opts)?;
        let slot = if queues_locally(opts) {
            let Some(slot) = self.local.try_enter(name) else {
                return Ok(None);
            };
            if let Some(guard) = self.adopt(&slot, name, opts).await {
                guard.attach_slot(slot);
                return Ok(Some(guard));
            }
            Some(slot)
        } else {
            None
        };
        let mut waiter = Waiter::new(name, opts);
        let mut grant = Grant::new(&self.backend, name, key, opts);
        Ok(match grant.attempt(&mut waiter, Intent::Try).await? {
            Attempt::Acquired(fencing) => Some(grant.into_guard(fencing, slot)),
            Attempt::Busy { .. } => None,
        })
    }

    async fn acquire_inner(&self, name: &str, opts: &LockOptions) -> Result<LockGuard> {
        let key = self.check(name, opts)?;
        let mut waiter = Waiter::new(name, opts);
        let slot = match (queues_locally(opts), opts.wait()) {
            (true, Wait::NoWait) => Some(
                self.local
                    .try_enter(name)
                    .ok_or_else(|| waiter.timeout_error())?,
            ),
            (true, _) => Some(waiter.local_turn(&self.local, name).await?),
            (false, _) => None,
        };
        if let Some(entered) = &slot
            && let Some(guard) = self.adopt(entered, name, opts).await
        {
            guard.attach_slot(slot.expect("entered"));
            return Ok(guard);
        }
        let intent = Intent::of(opts.wait());
        let mut grant = Grant::new(&self.backend, name, key, opts);
        let mut watch = match intent {
            Intent::Wait => self.backend.live_watch(&grant.key),
            Intent::Try => None,
        };
        // A place in line this client's last release kept: its turn may
        // have come already; if not, the wait starts without an attempt.
        let mut resumed = match (intent, &slot) {
            (Intent::Wait, Some(_)) => grant.resume_place(),
            _ => None,
        };
        if resumed.is_some()
            && let Some(turn) = grant.take_turn()
        {
            return grant.into_resumed_guard(turn, slot).await;
        }
        // Whether the last wait was on a watch taken before it (not one
        // just subscribed, which may have missed the messages of a turn).
        let mut watched = false;
        loop {
            let attempt = match resumed.take() {
                Some(retry_after) => Ok(Attempt::Busy {
                    retry_after: Some(retry_after),
                }),
                None => grant.attempt(&mut waiter, intent).await,
            };
            let waited = match attempt {
                Ok(Attempt::Acquired(fencing)) => return Ok(grant.into_guard(fencing, slot)),
                Ok(Attempt::Busy { retry_after }) => {
                    watched = watch.is_some();
                    let key = grant.key.clone();
                    // Boxed, as the other waits below: an uncontended
                    // acquisition's future stays small (one allocation of
                    // under a kilobyte, which glibc serves from its small
                    // bins without first sorting every freed chunk).
                    Box::pin(waiter.busy(retry_after, &mut watch, || async move {
                        self.backend.watch(&key).await
                    }))
                    .await
                }
                Err(error) => Err(error),
            };
            if waited.is_ok()
                && let Some(turn) = grant.take_turn()
            {
                return grant.into_resumed_guard(turn, slot).await;
            }
            if waited.is_ok()
                && watched
                && let Some(grace) = grant.turn_told_in_part()
                && let Some(turn) = Box::pin(grant.rest_of_turn(grace, &waiter, &mut watch)).await
            {
                return grant.into_resumed_guard(turn, slot).await;
            }
            if let Err(error) = waited {
                // Giving up: what the acquisition and its watch hold on the
                // server (a waiting record, a place in line) goes before the
                // caller hears of it.
                Box::pin(async {
                    grant.give_up().await;
                    if let Some(watch) = watch.take() {
                        watch.close().await;
                    }
                })
                .await;
                return Err(error);
            }
        }
    }
}

impl<B: LeaseBackend> LeaseLock<B> {
    /// The holding the previous local holder passed on, if it left one that
    /// is known to be passed and still valid; made a guard for this turn. A
    /// baton in doubt (its pass failed midway) or gone stale is dropped,
    /// which releases it, and the turn asks the server as usual.
    async fn adopt(&self, slot: &LocalSlot, name: &str, opts: &LockOptions) -> Option<LockGuard> {
        let passed = slot.take_baton()?.downcast::<PassedLease<B>>().ok()?;
        if opts.bounds().any() {
            // Its bounds count from a grant of its own (dropping the baton
            // releases the passed lease).
            return None;
        }
        let stale = Instant::now() + clock_drift(passed.ttl) >= passed.sent + passed.ttl;
        if !passed.confirmed || stale {
            return None;
        }
        let mut passed = passed;
        let owner = passed.owner.take()?;
        let held = HeldLease {
            backend: self.backend.clone(),
            key: passed.key.clone(),
            owner,
            ttl: passed.ttl,
            queue: Some(slot.handle()),
        };
        // The guard counts from the passed lease until it extends it.
        let guard = LockGuard::new(
            name,
            Arc::new(held),
            passed.fencing,
            passed.ttl,
            passed.sent,
            opts.auto_renews(),
        );
        if opts.lease_ttl() != passed.ttl {
            // Dropped on failure, which releases whatever is left of it.
            Box::pin(guard.extend(opts.lease_ttl())).await.ok()?;
        }
        tracing::trace!(lock.name = %name, "took over the lease the previous local holder passed on");
        Some(guard)
    }
}

/// Whether a holding goes through the client's local FIFO (and can be
/// handed over locally): exclusive holdings that record no holder identity
/// (a hand-over would keep the previous holder's).
fn queues_locally(opts: &LockOptions) -> bool {
    opts.kind() == LockKind::Exclusive && opts.holder_identity().is_none()
}

#[async_trait::async_trait]
impl<B: LeaseBackend> DistributedLock for LeaseLock<B> {
    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<LockGuard>> {
        let backend = self.backend.backend_name();
        let attempt = self.try_acquire_inner(name, opts);
        traced_acquire("try_acquire", name, backend, attempt, Option::is_some).await
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<LockGuard> {
        let backend = self.backend.backend_name();
        let acquire = self.acquire_inner(name, opts);
        traced_acquire("acquire", name, backend, acquire, |_| true).await
    }

    fn capabilities(&self) -> Capabilities {
        self.backend.capabilities()
    }

    async fn watch_releases(&self, name: &str) -> Result<ReleaseWatch> {
        self.backend
            .watch(&self.backend.key(name, LockKind::Exclusive)?)
            .await
    }

    async fn status(&self, name: &str) -> Result<LockStatus> {
        self.status_of(name, LockKind::Exclusive).await
    }

    async fn status_of(&self, name: &str, kind: LockKind) -> Result<LockStatus> {
        let key = self.check(name, &LockOptions::of_kind(kind))?;
        self.backend.status(&key).await
    }
}

impl<B: fmt::Debug> fmt::Debug for LeaseLock<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseLock")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

/// One acquisition in progress: its key, the owner token of its current
/// attempt, and the duty to release whatever the server may have granted when
/// the caller never saw the outcome (an attempt cancelled, timed out or failed
/// in flight).
struct Grant<'a, B: LeaseBackend> {
    backend: &'a Arc<B>,
    name: &'a str,
    key: Arc<B::Key>,
    owner: OwnerToken,
    ttl: Duration,
    opts: &'a LockOptions,
    sent: Instant,
    in_doubt: bool,
    /// The last attempt may have left a record of this acquisition as a
    /// waiting writer ([`Intent::Wait`]), which a release with its owner
    /// removes.
    waiting_recorded: bool,
    /// Whether a busy attempt can record a waiting writer at all: an
    /// exclusive acquisition on a backend with shared holdings.
    records_waiting: bool,
    /// Whether the owner stays across attempts: an exclusive acquisition on
    /// a backend that grants turns ([`LeaseBackend::grants_turns`]).
    keeps_owner: bool,
    /// Whether an attempt has used `owner` yet (the first attempt takes the
    /// one made with the grant).
    owner_used: bool,
    /// The lease a resumed place's turn grants (see
    /// [`LeaseBackend::resume_place`]), where the acquisition resumed one.
    kept_ttl: Option<Duration>,
}

impl<'a, B: LeaseBackend> Grant<'a, B> {
    fn new(backend: &'a Arc<B>, name: &'a str, key: B::Key, opts: &'a LockOptions) -> Self {
        Grant {
            backend,
            name,
            key: Arc::new(key),
            owner: OwnerToken::new(),
            ttl: opts.lease_ttl(),
            opts,
            sent: Instant::now(),
            in_doubt: false,
            waiting_recorded: false,
            records_waiting: opts.kind() == LockKind::Exclusive && backend.capabilities().shared,
            keeps_owner: opts.kind() == LockKind::Exclusive && backend.grants_turns(),
            owner_used: false,
            kept_ttl: None,
        }
    }

    /// Takes over the place in line this client's last release kept for
    /// the name, if the backend kept one (see
    /// [`LeaseBackend::resume_place`]): its owner becomes this
    /// acquisition's, as after a refused attempt that left a place in line.
    /// Returns how long to wait for the turn before asking the server.
    fn resume_place(&mut self) -> Option<Duration> {
        if !self.keeps_owner || self.opts.bounds().any() {
            return None;
        }
        let place = self.backend.resume_place(&self.key)?;
        self.owner = place.owner;
        self.owner_used = true;
        self.sent = Instant::now();
        self.in_doubt = false;
        self.waiting_recorded = true;
        self.kept_ttl = Some(place.ttl);
        tracing::trace!(lock.name = %self.name, "waiting on the place in line the last release kept");
        Some(place.retry_after)
    }

    /// A lease the server granted this acquisition on its turn (see
    /// [`LeaseBackend::take_turn`]), if one came and is still valid by this
    /// client's reckoning; a stale one is left to the next attempt, which
    /// finds it (or its successor) on the server.
    fn take_turn(&mut self) -> Option<Turn> {
        if !self.keeps_owner {
            return None;
        }
        let turn = self.backend.take_turn(&self.key, &self.owner)?;
        let ttl = self.kept_ttl.map_or(self.ttl, |kept| kept.min(self.ttl));
        let fresh = Instant::now() < turn.since + ttl - clock_drift(ttl);
        fresh.then_some(turn)
    }

    /// How long to wait for the rest of a turn that some servers told this
    /// acquisition of, too few (see [`LeaseBackend::turn_told_in_part`]).
    fn turn_told_in_part(&self) -> Option<Duration> {
        if !self.keeps_owner {
            return None;
        }
        self.backend.turn_told_in_part(&self.key, &self.owner)
    }

    /// The rest of a turn told in part (see
    /// [`turn_told_in_part`](Self::turn_told_in_part)): waits for the
    /// others' messages on `watch` for `grace` (and no later than the
    /// waiter's deadline); `None` when the turn has not come by then, and
    /// the acquisition asks again.
    async fn rest_of_turn(
        &mut self,
        grace: Duration,
        waiter: &Waiter<'_>,
        watch: &mut Option<ReleaseWatch>,
    ) -> Option<Turn> {
        let watch = watch.as_mut()?;
        let mut until = Instant::now() + grace;
        if let Some(deadline) = waiter.deadline() {
            until = until.min(deadline);
        }
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => return self.take_turn(),
                () = watch.changed() => {}
            }
            if let Some(turn) = self.take_turn() {
                return Some(turn);
            }
        }
    }

    /// As [`into_turn_guard`](Self::into_turn_guard); a turn a resumed
    /// place granted with a shorter lease than this acquisition asks for
    /// is extended to it first (dropped on failure, which releases it).
    async fn into_resumed_guard(self, turn: Turn, slot: Option<LocalSlot>) -> Result<LockGuard> {
        let (ttl, kept) = (self.ttl, self.kept_ttl);
        let guard = self.into_turn_guard(turn, slot);
        if kept.is_some_and(|kept| kept < ttl) {
            Box::pin(guard.extend(ttl)).await?;
        }
        Ok(guard)
    }

    /// The guard of a lease granted on this acquisition's turn: as
    /// [`into_guard`](Self::into_guard), counted from when the attempt whose
    /// place was granted was sent.
    fn into_turn_guard(mut self, turn: Turn, slot: Option<LocalSlot>) -> LockGuard {
        self.sent = turn.since;
        self.in_doubt = false;
        self.waiting_recorded = false;
        self.into_guard(turn.fencing, slot)
    }

    /// The lease asked of the server: the TTL with the bounds applied.
    fn server_ttl(&self) -> Duration {
        self.opts.bounds().server_ttl(self.ttl)
    }

    /// One `try_lock`, bounded by the waiter. Every attempt has an owner token
    /// of its own, so that whatever cleans up after one attempt (a rollback
    /// still in flight on a slow server) can never touch the next one's lease;
    /// except on a backend that grants turns, whose line holds the owner
    /// (see [`LeaseBackend::grants_turns`]).
    async fn attempt(
        &mut self,
        waiter: &mut Waiter<'_>,
        intent: Intent,
    ) -> Result<Attempt<Option<FencingToken>>> {
        crate::metrics::attempt(self.backend.backend_name());
        if self.owner_used && !self.keeps_owner {
            self.owner = OwnerToken::new();
        }
        self.owner_used = true;
        self.sent = Instant::now();
        self.in_doubt = true;
        // The new attempt replaces (or, granted, removes) any record the
        // previous one left.
        self.waiting_recorded =
            (self.records_waiting || self.keeps_owner) && intent == Intent::Wait;
        let outcome = waiter
            .attempt(
                self.backend
                    .try_lock(&self.key, &self.owner, self.server_ttl(), intent),
            )
            .await?;
        if let Attempt::Acquired(_) = outcome
            && Instant::now() >= self.sent + self.ttl - clock_drift(self.ttl)
        {
            // Still in doubt: dropping the grant releases the stale lease.
            return Err(LockError::unavailable(
                self.backend.backend_name(),
                format!(
                    "the lease on {:?} was granted after its ttl of {:?} had run out; the backend is too slow for this ttl",
                    self.name, self.ttl
                ),
            ));
        }
        self.in_doubt = false;
        if let Attempt::Acquired(_) = outcome {
            self.waiting_recorded = false;
        }
        Ok(outcome)
    }

    /// After the last attempt was refused and the wait is over: its record
    /// as a waiting writer (and, where the backend keeps one with it, its
    /// place in line) goes now, rather than in the background once the
    /// grant is dropped. An attempt in doubt, or a release that fails, is
    /// left to the drop, which tries again.
    async fn give_up(&mut self) {
        if self.in_doubt || !self.waiting_recorded {
            return;
        }
        match self.backend.release(&self.key, &self.owner).await {
            Ok(_) => self.waiting_recorded = false,
            Err(error) => {
                tracing::debug!(lock.key = ?self.key, %error, "could not withdraw a waiting record yet; trying again in the background");
            }
        }
    }

    /// The guard of the granted holding; `slot` is the client's turn on the
    /// name (exclusive holdings only), through which it may be passed on.
    fn into_guard(mut self, fencing: Option<FencingToken>, slot: Option<LocalSlot>) -> LockGuard {
        // Granted, so nothing is left in doubt for the drop to release: the
        // owner moves to the holding.
        debug_assert!(!self.in_doubt && !self.waiting_recorded);
        let held = HeldLease {
            backend: self.backend.clone(),
            key: self.key.clone(),
            owner: self.owner.take(),
            ttl: self.ttl,
            // A bounded holding is never passed on: its bounds are its own.
            queue: slot
                .as_ref()
                .filter(|_| !self.opts.bounds().any())
                .map(LocalSlot::handle),
        };
        let guard = LockGuard::granted(self.name, Arc::new(held), fencing, self.sent, self.opts);
        if let Some(slot) = slot {
            guard.attach_slot(slot);
        }
        guard
    }
}

impl<B: LeaseBackend> Drop for Grant<'_, B> {
    fn drop(&mut self) {
        if !self.in_doubt && !self.waiting_recorded {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (backend, key, owner) = (self.backend.clone(), self.key.clone(), self.owner.clone());
        let until = self.sent
            + self
                .server_ttl()
                .clamp(MIN_CLEANUP_RETRIES, MAX_CLEANUP_RETRIES);
        runtime.spawn(async move {
            let mut pauses = CLEANUP_BACKOFF.delays();
            loop {
                let pause = pauses.next().unwrap_or(CLEANUP_BACKOFF.max());
                match backend.release(&key, &owner).await {
                    Ok(_) => return,
                    Err(error) if error.is_temporary() && Instant::now() + pause < until => {
                        tracing::debug!(lock.key = ?key, %error, ?pause, "could not release an interrupted acquire yet; trying again");
                        tokio::time::sleep(pause).await;
                    }
                    Err(error) => {
                        tracing::warn!(lock.key = ?key, %error, "could not release an interrupted acquire; its lease ends with its TTL");
                        return;
                    }
                }
            }
        });
    }
}

/// The release of an interrupted acquire that fails for a reason that may
/// pass (a server that does not answer yet, whose late answer may still
/// grant the lease) is tried again, after the shared [`Backoff`]'s pauses
/// (from 50 ms, doubling up to 1 s), until the lease would have run out by
/// itself: for at least [`MIN_CLEANUP_RETRIES`] and at most
/// [`MAX_CLEANUP_RETRIES`] (the task keeps the client's connections; a
/// longer lease left behind then ends with its TTL).
const CLEANUP_BACKOFF: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
/// See [`CLEANUP_BACKOFF`].
const MIN_CLEANUP_RETRIES: Duration = Duration::from_secs(10);
/// See [`CLEANUP_BACKOFF`].
const MAX_CLEANUP_RETRIES: Duration = Duration::from_secs(120);

/// How long after a lease kept to its min hold has run out its purge is
/// sent (the server's clock may run a little behind this client's).
const PURGE_GRACE: Duration = Duration::from_millis(50);

/// The lease behind a guard from a [`LeaseLock`].
struct HeldLease<B: LeaseBackend> {
    backend: Arc<B>,
    key: Arc<B::Key>,
    owner: OwnerToken,
    /// The lease length a pass to the next local task gives it.
    ttl: Duration,
    /// The client's queue on the name, to pass the lease on through.
    queue: Option<LocalHandle>,
}

impl<B: LeaseBackend> HeldLease<B> {
    /// Passes the lease to the next task of this client waiting for it, if
    /// one waits and the backend can; `None` when it did not try.
    async fn pass_on(&self) -> Option<Result<bool>> {
        let queue = self.queue.as_ref()?;
        if !self.backend.can_hand_over()
            || queue.waiting() == 0
            || queue.passes() >= MAX_LOCAL_PASSES
        {
            queue.reset_passes();
            return None;
        }
        let next = OwnerToken::new();
        let sent = Instant::now();
        // In place before the request is sent: if this future is dropped
        // midway, the next turn (or the queue, when it goes) drops the baton,
        // which releases whatever the pass may have made the next owner's.
        queue.put_baton(Box::new(PassedLease {
            backend: self.backend.clone(),
            key: self.key.clone(),
            owner: Some(next.clone()),
            fencing: None,
            sent,
            ttl: self.ttl,
            confirmed: false,
        }));
        let answer = self
            .backend
            .hand_over(&self.key, &self.owner, &next, self.ttl)
            .await;
        let baton = queue
            .take_baton()
            .and_then(|b| b.downcast::<PassedLease<B>>().ok());
        Some(match (answer, baton) {
            (Ok(Handover::Passed(fencing)), Some(mut baton)) => {
                baton.fencing = fencing;
                baton.confirmed = true;
                queue.put_baton(baton);
                queue.count_pass();
                Ok(true)
            }
            (Ok(Handover::NotOurs), Some(mut baton)) => {
                // Nothing was passed: nothing to release.
                baton.owner = None;
                Ok(false)
            }
            (Err(error), Some(baton)) => {
                // In doubt: the next turn releases it.
                queue.put_baton(baton);
                Err(error)
            }
            (answer, None) => answer.map(|a| matches!(a, Handover::Passed(_))),
        })
    }
}

/// A lease passed on to the next local task ([`LocalHandle::put_baton`]).
/// Dropped untaken, it releases the lease (a compare-and-delete on the new
/// owner: harmless if the pass never happened).
struct PassedLease<B: LeaseBackend> {
    backend: Arc<B>,
    key: Arc<B::Key>,
    owner: Option<OwnerToken>,
    fencing: Option<FencingToken>,
    /// When the pass was sent: the lease's validity counts from then.
    sent: Instant,
    ttl: Duration,
    /// The server answered that the lease is the new owner's.
    confirmed: bool,
}

impl<B: LeaseBackend> Drop for PassedLease<B> {
    fn drop(&mut self) {
        let Some(owner) = self.owner.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (backend, key) = (self.backend.clone(), self.key.clone());
        runtime.spawn(async move {
            if let Err(error) = backend.release(&key, &owner).await {
                tracing::warn!(lock.key = ?key, %error, "could not release a lease passed on to no one; it ends with its TTL");
            }
        });
    }
}

impl<B: LeaseBackend> fmt::Debug for HeldLease<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldLease")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl<B: LeaseBackend> Lease for HeldLease<B> {
    fn backend_name(&self) -> &'static str {
        self.backend.backend_name()
    }

    /// The backend's own boxed future, not one boxed around it: one
    /// allocation per renewal fewer (a million leases renew 100 000 times a
    /// second).
    fn extend<'a, 'b>(
        &'a self,
        ttl: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<bool>> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        self.backend.extend(&self.key, &self.owner, ttl)
    }

    /// Passed on to the next local task where one waits; else released,
    /// and where the holding went through the client's queue (an
    /// exclusive holding without bounds), with this client's place in line
    /// kept where the backend keeps one (see
    /// [`LeaseBackend::release_keeping_place`]).
    async fn release(&self) -> Result<bool> {
        if let Some(passed) = self.pass_on().await {
            return passed;
        }
        if self.queue.is_some() {
            return self
                .backend
                .release_keeping_place(&self.key, &self.owner, self.ttl)
                .await;
        }
        self.backend.release(&self.key, &self.owner).await
    }

    /// The lease made to end `after` from now; then, once it has, what it
    /// left is purged (see [`LeaseBackend::purge`]) while this client runs.
    async fn release_after(&self, after: Duration) -> Result<bool> {
        if !self.backend.extend(&self.key, &self.owner, after).await? {
            return Ok(false);
        }
        let (backend, key, owner) = (self.backend.clone(), self.key.clone(), self.owner.clone());
        let ended = Instant::now() + after + PURGE_GRACE;
        tokio::spawn(async move {
            tokio::time::sleep_until(ended).await;
            if let Err(error) = backend.purge(&key, &owner).await {
                tracing::debug!(lock.key = ?key, %error, "could not clear a lease that ran out; the name's next holder reuses it");
            }
        });
        Ok(true)
    }
}
