//! A holding's keys ([`RedisKey`]: which side of a reader-writer lock, or
//! which semaphore) and the operations on one instance that dispatch on it,
//! shared by the single-server backend and Redlock.

use std::borrow::Cow;
use std::time::Duration;

use lockkit_core::backend::{Attempt, ReleaseWatch};
use lockkit_core::{FencingToken, LockKind, Result};

use crate::instance::{RedisInstance, flag, remaining_of};
use crate::keys::{Keys, SemaphoreKeys};
use crate::renewals::Renewing;
use crate::scripts::{Call, Release, SCRIPTS, Waiting};

/// A holding's keys in Redis: which side of a reader-writer lock, or which
/// semaphore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisKey {
    /// The lock key, checked against the readers.
    Exclusive(Keys),
    /// A member of the lock's readers.
    Shared(Keys),
    /// A member of the semaphore's permits.
    Permit {
        /// The semaphore's keys.
        keys: SemaphoreKeys,
        /// How many permits it has.
        permits: u32,
    },
}

impl RedisKey {
    /// The keys of a holding of `kind` on `name` under `prefix`, laid out for
    /// Redis Cluster when `cluster`.
    pub fn new(prefix: &str, name: &str, kind: LockKind, cluster: bool) -> Result<RedisKey> {
        let lock = |name| {
            if cluster {
                Keys::for_cluster(prefix, name)
            } else {
                Keys::new(prefix, name)
            }
        };
        Ok(match kind {
            LockKind::Shared => RedisKey::Shared(lock(name)?),
            LockKind::Semaphore { permits } => RedisKey::Permit {
                keys: if cluster {
                    SemaphoreKeys::for_cluster(prefix, name)?
                } else {
                    SemaphoreKeys::new(prefix, name)?
                },
                permits,
            },
            _ => RedisKey::Exclusive(lock(name)?),
        })
    }

    /// Whether a waiter for this holding asks again on the backoff alone,
    /// without a place in line, on a client whose `barging` option is set:
    /// writers do; readers and permits always wait in line.
    pub fn barges(&self, barging: bool) -> bool {
        barging && matches!(self, RedisKey::Exclusive(_))
    }

    /// The same holding, recording `holder` as its holder's identity: the
    /// value stored for it (the lock key's value, or the member of the
    /// readers' or permits' set) is the owner token, `\x1f` and the
    /// identity, so that it lives and dies with the lease, in the same slot.
    pub fn with_holder(mut self, holder: &str) -> RedisKey {
        let slot = match &mut self {
            RedisKey::Exclusive(keys) | RedisKey::Shared(keys) => &mut keys.holder,
            RedisKey::Permit { keys, .. } => &mut keys.holder,
        };
        *slot = Some(holder.into());
        self
    }

    /// What is stored for `owner`'s holding: the owner token, followed by
    /// `\x1f` and the holder identity where one is recorded.
    pub fn stored<'a>(&self, owner: &'a str) -> Cow<'a, str> {
        let holder = match self {
            RedisKey::Exclusive(keys) | RedisKey::Shared(keys) => keys.holder.as_deref(),
            RedisKey::Permit { keys, .. } => keys.holder.as_deref(),
        };
        lockkit_core::backend::stored_owner(owner, holder)
    }

    /// The channel that announces the releases that may let this holding in
    /// (for a fair lock, this client's own: see [`Queue`](crate::Queue)).
    pub fn channel(&self) -> &str {
        match self {
            RedisKey::Exclusive(Keys {
                queue: Some(queue), ..
            }) => &queue.channel,
            RedisKey::Exclusive(keys) | RedisKey::Shared(keys) => &keys.channel,
            RedisKey::Permit { keys, .. } => &keys.channel,
        }
    }
}

impl RedisInstance {
    /// The holdings of a reader-writer lock (`lock` its lock key, `set` its
    /// readers) or of a semaphore (`lock` `None`, `set` its permits), and
    /// the waiters counted in `waiters`, read in one script.
    pub(crate) async fn holdings(
        &self,
        lock: Option<&str>,
        fence: &str,
        set: &str,
        waiters: Option<Waiters<'_>>,
    ) -> Result<Holdings> {
        let mut conn = self.commands();
        let (key, kind) = match waiters {
            Some(Waiters::Queue(key)) => (Some(key), "queue"),
            Some(Waiters::Line(key)) => (Some(key), "line"),
            None => (None, ""),
        };
        let mut call = Call::new(
            &SCRIPTS.status,
            [lock.unwrap_or(set), fence, set].into_iter().chain(key),
        );
        call.arg(flag(lock.is_some())).arg(kind);
        let (count, remaining, fence, stored, queued): (i64, i64, i64, String, i64) = self
            .run("read the holdings", call.invoke(&mut conn))
            .await?;
        Ok(Holdings {
            count: usize::try_from(count).unwrap_or(0),
            remaining: remaining_of(remaining).unwrap_or_default(),
            fence: u64::try_from(fence).ok(),
            holder: crate::keys::holder_of(&stored).map(str::to_owned),
            waiters: usize::try_from(queued).ok(),
        })
    }

    /// Who holds the lock, read in one `MULTI`/`EXEC` (`GET` and `PTTL` of
    /// the lock key, `GET` of the fence counter); `None` if it is free.
    pub(crate) async fn holder(&self, keys: &Keys) -> Result<Option<Holder>> {
        let mut conn = self.commands();
        let (owner, pttl, fence): (Option<String>, i64, Option<u64>) = self
            .run(
                "read the lock's holder",
                redis::pipe()
                    .atomic()
                    .cmd("GET")
                    .arg(&keys.lock)
                    .cmd("PTTL")
                    .arg(&keys.lock)
                    .cmd("GET")
                    .arg(&keys.fence)
                    .query_async(&mut conn),
            )
            .await?;
        // A key reserved for the next waiter (see `Keys::line`) is no holding.
        let owner = owner.filter(|owner| !owner.starts_with(crate::scripts::TURN_MARK));
        Ok(owner.map(|owner| Holder {
            owner,
            // The key was read with its value, so it exists: a -2 from a
            // key that expired between the two reads is no time left.
            remaining: remaining_of(pttl).unwrap_or_default(),
            fence,
        }))
    }

    /// One attempt at the holding `key` for `owner`: a writer's `SET NX`
    /// (kept out by readers), a reader joining the readers' set, or a permit
    /// joining the permits' set, each one script. A writer's attempt that
    /// waits (see [`Waiting`]) and is refused joins the lock's waiting
    /// line (see [`Keys::line`]), unless the connection keeps none
    /// ([`RedisConfig::without_line`](crate::RedisConfig::without_line)).
    pub async fn try_hold(
        &self,
        key: &RedisKey,
        owner: &str,
        ttl: Duration,
        fencing: bool,
        waiting: Waiting,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let owner = &key.stored(owner);
        match key {
            RedisKey::Exclusive(keys) => self.try_lock(keys, owner, ttl, fencing, waiting).await,
            RedisKey::Shared(keys) => self.try_share(keys, owner, ttl, fencing).await,
            RedisKey::Permit { keys, permits } => {
                self.try_permit(keys, owner, ttl, fencing, *permits).await
            }
        }
    }

    /// Makes `owner`'s holding `key` end `ttl` from now; false if it is not
    /// `owner`'s (any more).
    ///
    /// The renewal is sent (or queued for its batch) before the future is
    /// polled.
    pub fn extend_holding(&self, key: &RedisKey, owner: &str, ttl: Duration) -> Renewing<'_> {
        let owner = &key.stored(owner);
        match key {
            RedisKey::Exclusive(keys) => self.extend(keys, owner, ttl),
            RedisKey::Shared(keys) => self.extend_member(keys.reader_set(), owner, ttl),
            RedisKey::Permit { keys, .. } => self.extend_member(keys.permit_set(), owner, ttl),
        }
    }

    /// Ends `owner`'s holding `key` (for a writer, its record as waiting
    /// too); false if it held none. `fencing` as the holding was granted
    /// (with [`try_hold`](Self::try_hold)): a holding that drew a token
    /// cleans up the fence counter. Releases of shared holdings and permits
    /// are always published; an exclusive one as `release` says.
    pub async fn release_holding(
        &self,
        key: &RedisKey,
        owner: &str,
        fencing: bool,
        release: Release,
    ) -> Result<bool> {
        let owner = &key.stored(owner);
        match key {
            RedisKey::Exclusive(keys) => self.release(keys, owner, fencing, release).await,
            RedisKey::Shared(keys) => self.release_member(keys.reader_set(), owner, fencing).await,
            RedisKey::Permit { keys, .. } => {
                self.release_member(keys.permit_set(), owner, fencing).await
            }
        }
    }

    /// The stamp of the turn a release granted `owner` on `key`'s line
    /// (an exclusive one) and told this client of, if its message came
    /// (see [`Waiting::Turn`]); the message stays until
    /// [`forget_turn`](Self::forget_turn), or the next one on the channel.
    pub fn told_turn(&self, key: &RedisKey, owner: &str) -> Option<u64> {
        match key {
            RedisKey::Exclusive(keys) => self.told_turn_of(keys, &key.stored(owner)),
            _ => None,
        }
    }

    /// Drops the message of a turn on `key`'s line (see
    /// [`told_turn`](Self::told_turn)).
    pub fn forget_turn(&self, key: &RedisKey) {
        if let RedisKey::Exclusive(keys) = key {
            self.forget_turn_of(keys);
        }
    }

    /// The holdings of `key`'s lock (writer or readers) or semaphore.
    pub async fn holdings_of(&self, key: &RedisKey) -> Result<Holdings> {
        match key {
            RedisKey::Exclusive(keys) | RedisKey::Shared(keys) => {
                let line;
                let waiters = match &keys.queue {
                    Some(queue) => Waiters::Queue(&queue.deadlines),
                    None => {
                        line = keys.line();
                        Waiters::Line(&line)
                    }
                };
                self.holdings(Some(&keys.lock), &keys.fence, &keys.readers, Some(waiters))
                    .await
            }
            RedisKey::Permit { keys, .. } => {
                self.holdings(None, &keys.fence, &keys.permits, None).await
            }
        }
    }

    /// Who holds `key`'s lock as a writer, read in one `MULTI`/`EXEC`;
    /// `None` if no writer does (readers and permits have no one holder).
    pub async fn writer_of(&self, key: &RedisKey) -> Result<Option<Holder>> {
        match key {
            RedisKey::Exclusive(keys) | RedisKey::Shared(keys) => self.holder(keys).await,
            RedisKey::Permit { .. } => Ok(None),
        }
    }

    /// Release notifications that may let `key` in: for a writer of a lock
    /// that is not fair, its turn in the line as well (see
    /// [`Keys::line`]).
    pub async fn watch_holding(&self, key: &RedisKey) -> ReleaseWatch {
        match key {
            RedisKey::Exclusive(keys) if keys.queue.is_none() => self.watch_turn(keys).await,
            _ => self.watch_channel(key.channel()).await,
        }
    }

    /// [`watch_holding`](Self::watch_holding)'s watch, if the server has its
    /// subscriptions already (they stay a while after their last waiter:
    /// [`subscription_linger`](crate::RedisLockBuilder::subscription_linger));
    /// `None` otherwise. No request.
    pub fn live_watch_of(&self, key: &RedisKey) -> Option<ReleaseWatch> {
        match key {
            RedisKey::Exclusive(keys) if keys.queue.is_none() => self.live_turn_watch(keys),
            _ => self.live_channel_watch(key.channel()),
        }
    }
}

/// Where a lock's waiters are counted.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Waiters<'k> {
    /// A fair lock's queue, by its deadlines key: the waiters whose place
    /// is live.
    Queue(&'k str),
    /// A lock's waiting line (see [`Keys::line`]): every client in it.
    Line(&'k str),
}

/// The holder of a lock as one Redis server sees it; see
/// [`RedisInstance::writer_of`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The lock key's value: the holder's owner token.
    pub owner: String,
    /// The lock key's remaining TTL (`Duration::MAX` for a key without one).
    pub remaining: Duration,
    /// The fence counter: the last fencing token drawn for the name, if any.
    pub fence: Option<u64>,
}

/// What a reader-writer lock's or a semaphore's holdings are; see
/// [`RedisInstance::holdings_of`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holdings {
    /// How many: 1 for a writer, else the live readers or permits.
    pub count: usize,
    /// How long the longest of them still runs (`Duration::MAX` for a lock
    /// key without expiry).
    pub remaining: Duration,
    /// The last fencing token drawn for the name, if any.
    pub fence: Option<u64>,
    /// The holder identity one of them recorded, if any.
    pub holder: Option<String>,
    /// For a lock, the clients waiting in its line, or for a fair lock the
    /// clients whose place in its queue is live (the tasks of one client
    /// queue among themselves behind one place); `None` for a semaphore.
    pub waiters: Option<usize>,
}
