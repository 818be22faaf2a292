//! One Redis deployment (a server, a Redis Cluster or a Sentinel-monitored
//! master): the command connection, the scripts, and release notifications.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockkit_core::backend::{Attempt, connect_retrying};
use lockkit_core::{FencingToken, LockError, Result};
use redis::RedisError;
use redis::aio::ConnectionManager;
use tokio::time::Instant;

use crate::connection::{
    Connection, client_for, manager_config, open, resp3, shard_subscriber, single,
};
use crate::error::{BACKEND, map_error, timed_out};
use crate::keys::{Keys, LeaseSet, QUEUE_PLACE, SemaphoreKeys};
use crate::notifications::{Notifications, Target};
use crate::renewals::{Held, Renewal, Renewals, Renewing};
use crate::scripts::{Call, Publish, Release, Releases, SCRIPTS, SOURCES, Waiting, is_no_script};
use crate::sentinel::Resolver;
use crate::settings::{Reach, RedisConfig, ReplicaWait, Topology};
use crate::turns;

/// A connection to one Redis deployment — a single server, a Redis Cluster,
/// or the master that Redis Sentinel names — with the lock operations as
/// single atomic scripts. Every call is bounded by the command timeout; the
/// connection reconnects on its own after the server comes back (and, with
/// Sentinel, follows the master to the promoted replica after a failover).
///
/// [`RedisLock`](crate::RedisLock) uses one; the Redlock backend uses N.
#[derive(Clone)]
pub struct RedisInstance {
    inner: Arc<Inner>,
}

struct Inner {
    address: String,
    reach: Reach,
    commands: Connection,
    /// With `WAIT`: the connection that acquires (and waits) on, so that a
    /// `WAIT` never holds up renewals and releases on `commands`.
    acquire: Option<Connection>,
    notifications: Arc<Notifications>,
    /// The release scripts, announcing with `PUBLISH` or `SPUBLISH`.
    releases: &'static Releases,
    command_timeout: Duration,
    wait: Option<ReplicaWait>,
    /// Batches renewals; none on a Cluster or with `WAIT` (see `renew`).
    renewals: Option<Renewals>,
    /// How long a release reserves the lock for the first client in line.
    turn: Duration,
    /// The id this connection's waiters stand under in the waiting lines
    /// of locks (see [`Keys::line`]): one per connection, whose tasks
    /// queue among themselves first; empty where waiters do not queue in
    /// lines ([`RedisConfig::without_line`]).
    waiter: Arc<str>,
}

impl fmt::Debug for RedisInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisInstance")
            .field("address", &self.inner.address)
            .field("mode", &self.inner.reach.name())
            .field("command_timeout", &self.inner.command_timeout)
            .field("wait_for_replicas", &self.inner.wait)
            .field("publish", &self.inner.releases.publish)
            .finish_non_exhaustive()
    }
}

impl RedisInstance {
    /// Connects, checks that the server answers, and loads the scripts;
    /// a server that is not up yet is tried again within the connect
    /// timeout ([`connect_retrying`]).
    pub async fn connect(config: RedisConfig) -> Result<RedisInstance> {
        let address = config.address();
        let resolver = match &config.topology {
            Topology::Sentinel {
                sentinels,
                master_name,
            } => Some(Resolver::new(
                sentinels.clone(),
                master_name.clone(),
                config.info.clone(),
                config.connect_timeout,
                config.command_timeout,
            )),
            _ => None,
        };
        let connect = |_left| async {
            let mut commands = open(&config, resolver.as_ref(), config.command_timeout).await?;
            // A lone PING first: it surfaces a missing or wrong password as one
            // clear error instead of one per script.
            let prepare = async {
                redis::cmd("PING").query_async::<()>(&mut commands).await?;
                let mut publish = Publish::Global;
                if matches!(config.topology, Topology::Cluster { .. }) {
                    // A cluster whose nodes are up but not agreed yet
                    // ("cluster_state:fail") is still starting.
                    let info: String = redis::cmd("CLUSTER")
                        .arg("INFO")
                        .query_async(&mut commands)
                        .await?;
                    if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
                        return Ok(Err(LockError::unavailable(
                            BACKEND,
                            format!("connect to {address}: the cluster's state is not ok yet"),
                        )));
                    }
                    if config.sharded_pubsub.unwrap_or(true)
                        && has_command(&mut commands, "SPUBLISH").await?
                    {
                        publish = Publish::Sharded;
                    } else if config.sharded_pubsub == Some(true) {
                        return Ok(Err(LockError::invalid_options(format!(
                            "sharded_pubsub: the servers at {address} have no SPUBLISH (Redis 7 has it)"
                        ))));
                    }
                }
                let releases = Releases::of(publish);
                let sources = SOURCES.iter().copied();
                for source in sources.chain(releases.sources.iter().map(String::as_str)) {
                    redis::cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(source)
                        .query_async::<()>(&mut commands)
                        .await?;
                }
                Ok::<_, RedisError>(Ok(releases))
            };
            let releases = prepare
                .await
                .map_err(|e| map_error(&address, "connect", e))??;
            let acquire = match config.wait {
                Some(wait) => Some(
                    open(
                        &config,
                        resolver.as_ref(),
                        config.command_timeout + wait.timeout,
                    )
                    .await?,
                ),
                None => None,
            };
            Ok::<_, LockError>((commands, acquire, releases))
        };
        let what = format!("connect to {address}");
        let (commands, acquire, releases) =
            connect_retrying(BACKEND, &what, config.connect_timeout, connect).await?;
        tracing::debug!(redis.address = %address, redis.mode = config.mode(), redis.publish = ?releases.publish, "connected");
        Self::build(&config, commands, acquire, resolver, releases)
    }

    /// An instance that connects on first use: no network traffic here, and a
    /// server that is down now is picked up once it is back. The scripts are
    /// loaded on their first `NOSCRIPT`. For Redlock, which must start with a
    /// quorum and let the other instances come later. Single servers only
    /// (`redis://`, `rediss://`).
    pub fn connect_lazy(config: RedisConfig) -> Result<RedisInstance> {
        if !matches!(config.topology, Topology::Single) {
            return Err(LockError::invalid_options(format!(
                "a lazy connection needs a single server, not {} mode",
                config.mode()
            )));
        }
        let client = client_for(&config, config.info.clone())?;
        let commands = ConnectionManager::new_lazy_with_config(
            client.clone(),
            manager_config(&config, config.command_timeout),
        )
        .map_err(|e| map_error(&config.address(), "set up the connection", e))?;
        let acquire = match config.wait {
            Some(wait) => Some(single(
                &config,
                ConnectionManager::new_lazy_with_config(
                    client,
                    manager_config(&config, config.command_timeout + wait.timeout),
                )
                .map_err(|e| map_error(&config.address(), "set up the connection", e))?,
            )),
            None => None,
        };
        Self::build(
            &config,
            single(&config, commands),
            acquire,
            None,
            Releases::of(Publish::Global),
        )
    }

    fn build(
        config: &RedisConfig,
        commands: Connection,
        acquire: Option<Connection>,
        resolver: Option<Arc<Resolver>>,
        releases: &'static Releases,
    ) -> Result<RedisInstance> {
        let address = config.address();
        // Release notifications arrive on a second, RESP3 connection that is only
        // opened when the first waiter needs it.
        let target = |push| {
            Ok(match (&config.topology, resolver) {
                (Topology::Sentinel { .. }, Some(resolver)) => Target::Sentinel(resolver),
                (Topology::Cluster { nodes }, _) if releases.publish == Publish::Sharded => {
                    Target::Shards(Box::new(shard_subscriber(config, nodes, push)?))
                }
                (Topology::Cluster { nodes }, _) => Target::Seeds(
                    nodes
                        .iter()
                        .map(|node| client_for(config, resp3(node)))
                        .collect::<Result<_>>()?,
                ),
                _ => Target::Fixed(Box::new(client_for(config, resp3(&config.info))?)),
            })
        };
        let notifications = Notifications::new(
            target,
            manager_config(config, config.command_timeout),
            address.clone(),
            config.command_timeout,
            config.subscription_linger,
        )?;
        let renewals = match (&config.topology, config.wait) {
            (Topology::Cluster { .. }, _) | (_, Some(_)) => None,
            _ => Some(Renewals::new(
                commands.clone(),
                address.clone(),
                config.command_timeout,
            )),
        };
        Ok(RedisInstance {
            inner: Arc::new(Inner {
                renewals,
                address,
                reach: config.reach(),
                commands,
                acquire,
                notifications,
                releases,
                command_timeout: config.command_timeout,
                wait: config.wait,
                waiter: if config.line {
                    lockkit_core::backend::OwnerToken::new().as_str().into()
                } else {
                    "".into()
                },
                turn: config.turn,
            }),
        })
    }

    /// The server address, `host:port` (see [`RedisConfig::address`] for
    /// Cluster and Sentinel).
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// `"single"`, `"cluster"` or `"sentinel"`; see [`RedisConfig::mode`].
    pub fn mode(&self) -> &'static str {
        self.inner.reach.name()
    }

    /// Whether this is one server (not a Cluster, not behind Sentinel).
    pub fn is_single(&self) -> bool {
        self.inner.reach == Reach::Single
    }

    /// Whether releases are announced with sharded pub/sub (`SPUBLISH`, to
    /// the shard of the lock key's slot only) rather than `PUBLISH` (to
    /// every node of a cluster). On a Redis Cluster whose servers have it,
    /// unless turned off (`sharded_pubsub=false`); never elsewhere.
    pub fn publishes_sharded(&self) -> bool {
        self.inner.releases.publish == Publish::Sharded
    }

    /// Whether this is a Redis Cluster (whose keys must be
    /// [`Keys::for_cluster`]).
    pub fn is_cluster(&self) -> bool {
        self.inner.reach == Reach::Cluster
    }

    /// The `WAIT` after every grant, if set: replicas and timeout.
    pub fn wait_for_replicas(&self) -> Option<(usize, Duration)> {
        self.inner.wait.map(|w| (w.replicas, w.timeout))
    }

    /// A clone of the command connection.
    pub(crate) fn commands(&self) -> Connection {
        self.inner.commands.clone()
    }

    /// `call` bounded by the command timeout. Plain functions returning the
    /// future, not `async fn`s: each async layer would keep its own copy of
    /// `call`, and a lock operation's future (boxed once a call) would grow
    /// by the script call's size at every layer.
    pub(crate) fn run<'s, T>(
        &'s self,
        what: &'s str,
        call: impl Future<Output = std::result::Result<T, RedisError>> + 's,
    ) -> impl Future<Output = Result<T>> + 's {
        self.run_within(what, self.inner.command_timeout, call)
    }

    fn run_within<'s, T>(
        &'s self,
        what: &'s str,
        limit: Duration,
        call: impl Future<Output = std::result::Result<T, RedisError>> + 's,
    ) -> impl Future<Output = Result<T>> + 's {
        let bounded = tokio::time::timeout(limit, call);
        async move {
            match bounded.await {
                Ok(result) => result.map_err(|e| map_error(&self.inner.address, what, e)),
                Err(_) => Err(timed_out(&self.inner.address, what, limit)),
            }
        }
    }

    /// `SET lock owner NX PX ttl` unless readers hold, and on success a
    /// fencing token drawn from the fence counter when `fencing` (see the
    /// scripts); on failure how long until a retry may succeed.
    /// An attempt that waits (see [`Waiting`]): a writer kept out by readers
    /// is recorded as waiting, so that new readers wait behind it (see
    /// [`Keys`]), and one kept out by a writer joins the lock's waiting line
    /// ([`Keys::line`]), unless this connection keeps no lines.
    ///
    /// With [`wait_for_replicas`](crate::RedisLockBuilder::wait_for_replicas),
    /// `WAIT` follows on the same connection; when too few replicas
    /// acknowledge, the lock is released again and the attempt fails with
    /// `LockError::Unavailable`.
    pub(crate) async fn try_lock(
        &self,
        keys: &Keys,
        owner: &str,
        ttl: Duration,
        fencing: bool,
        waiting: Waiting,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let lock_keys = [&keys.lock, &keys.fence, &keys.readers, &keys.writer_waiting];
        let (mut call, waiter) = match &keys.queue {
            Some(queue) => (
                Call::new(&SCRIPTS.acquire_fair, and_queue_keys(lock_keys, keys)),
                &*queue.waiter,
            ),
            None => {
                let turns = matches!(waiting, Waiting::Turn | Waiting::TurnSince { .. });
                let line = LineKeys::of(keys, turns);
                let call = Call::new(&SCRIPTS.acquire, line.after(lock_keys));
                (call, &*self.inner.waiter)
            }
        };
        call.arg(owner)
            .arg(ttl_millis(ttl))
            .arg(flag(fencing))
            .arg(flag(waiting.waits()))
            .arg(waiter)
            .arg(ttl_millis(QUEUE_PLACE));
        match waiting {
            Waiting::Since(micros) => {
                call.arg(micros);
            }
            Waiting::Turn => {
                call.arg("").arg(turns::stamp());
            }
            Waiting::TurnSince { place, stamp } => {
                call.arg(place).arg(stamp);
            }
            Waiting::No | Waiting::ByArrival => {}
        }
        let undo = || self.release(keys, owner, fencing, Release::Wake);
        self.grant(&keys.lock, call, fencing, undo).await
    }

    /// A shared holding of `keys`' name for `owner`, unless a writer holds
    /// it or waits for it; as [`try_lock`](Self::try_lock) otherwise.
    pub(crate) async fn try_share(
        &self,
        keys: &Keys,
        owner: &str,
        ttl: Duration,
        fencing: bool,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let mut call = Call::new(
            &SCRIPTS.acquire_shared,
            [&keys.lock, &keys.fence, &keys.readers, &keys.writer_waiting].map(String::as_str),
        );
        call.arg(owner).arg(ttl_millis(ttl)).arg(flag(fencing));
        let undo = || self.release_member(keys.reader_set(), owner, fencing);
        self.grant(&keys.readers, call, fencing, undo).await
    }

    /// One of `permits` permits of the semaphore `keys` for `owner`, after
    /// reclaiming expired ones; as [`try_lock`](Self::try_lock) otherwise.
    pub(crate) async fn try_permit(
        &self,
        keys: &SemaphoreKeys,
        owner: &str,
        ttl: Duration,
        fencing: bool,
        permits: u32,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let mut call = Call::new(
            &SCRIPTS.acquire_permit,
            [&keys.permits, &keys.fence].map(String::as_str),
        );
        call.arg(owner)
            .arg(ttl_millis(ttl))
            .arg(flag(fencing))
            .arg(permits);
        let undo = || self.release_member(keys.permit_set(), owner, fencing);
        self.grant(&keys.permits, call, fencing, undo).await
    }

    /// Runs a grant script (followed by `WAIT` where grants must reach
    /// replicas; `undo()` takes back a grant they did not acknowledge) and
    /// reads its answer.
    async fn grant(
        &self,
        key: &str,
        call: Call,
        fencing: bool,
        undo: impl AsyncFnOnce() -> Result<bool>,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let answer: i64 = match (self.inner.wait, &self.inner.acquire) {
            // Boxed, and the undo made only when needed: the replicated
            // grant's future (the undo's included) is several times the
            // plain one's, and would make every grant's future as large.
            (Some(wait), Some(acquire)) => {
                Box::pin(self.grant_replicated(key, acquire, &call, wait, undo)).await?
            }
            _ => {
                let mut conn = self.inner.commands.clone();
                self.run("acquire", call.invoke(&mut conn)).await?
            }
        };
        Ok(grant_answer(answer, fencing))
    }

    /// The grant script and `WAIT` on the connection `acquire`; a grant
    /// too few replicas acknowledged is undone and fails.
    async fn grant_replicated(
        &self,
        key: &str,
        acquire: &Connection,
        call: &Call,
        wait: ReplicaWait,
        undo: impl AsyncFnOnce() -> Result<bool>,
    ) -> Result<i64> {
        let mut conn = acquire.clone();
        let (answer, acknowledged) = self
            .run_within(
                "acquire and wait for the replicas",
                self.inner.command_timeout + wait.timeout,
                script_and_wait(&mut conn, call, wait),
            )
            .await?;
        if answer >= 0 && acknowledged < i64::try_from(wait.replicas).unwrap_or(i64::MAX) {
            return Err(self.not_replicated(key, undo(), acknowledged, wait).await);
        }
        Ok(answer)
    }

    /// After a grant that too few replicas acknowledged: releases it again
    /// and describes what happened.
    async fn not_replicated(
        &self,
        key: &str,
        undo: impl Future<Output = Result<bool>>,
        acknowledged: i64,
        wait: ReplicaWait,
    ) -> LockError {
        let mut message = format!(
            "key {key:?} on {}: lease written but only {acknowledged} of {} replicas acknowledged within {:?}",
            self.inner.address, wait.replicas, wait.timeout
        );
        match undo.await {
            Ok(_) => message.push_str("; released it again"),
            Err(error) => message.push_str(&format!(
                "; releasing it failed too ({error}), so it ends with its TTL"
            )),
        }
        tracing::warn!(redis.address = %self.inner.address, "{message}");
        LockError::unavailable(BACKEND, message)
    }

    /// Extends `owner`'s lease to `ttl` from now; false if the key is not `owner`'s.
    pub(crate) fn extend(&self, keys: &Keys, owner: &str, ttl: Duration) -> Renewing<'_> {
        self.renew(Renewal::new(
            Held::Lock,
            &keys.lock,
            &keys.fence,
            owner,
            ttl_millis(ttl),
        ))
    }

    /// Runs a renewal: batched with others (see [`crate::renewals`]) on a
    /// single server or a Sentinel master; alone on a Redis Cluster (the
    /// leases of a batch would span hash slots). Where grants must reach
    /// replicas, so must renewals (a replica promoted with the old expiry
    /// would free the lock early): they run alone, `WAIT` follows, and a
    /// renewal too few replicas acknowledged is `Unavailable`, so that the
    /// guard's validity does not move (its watchdog tries again while the
    /// lease lasts).
    ///
    /// The renewal is built, and a batched one queued, before the future is
    /// polled: the future of a batched renewal holds only its answer's
    /// channel (40 bytes, against 1 728 when it was one `async fn` with the
    /// path below inline; both measured with `size_of_val`). Those futures
    /// are what a client holding a million leases keeps in flight while the
    /// server falls behind (see `lockkit-scale density`).
    fn renew(&self, renewal: Renewal) -> Renewing<'_> {
        match &self.inner.renewals {
            Some(renewals) => renewals.renew(renewal),
            None => Box::pin(self.renew_alone(renewal)),
        }
    }

    /// A renewal in a call of its own, followed by `WAIT` where grants
    /// must reach replicas.
    async fn renew_alone(&self, renewal: Renewal) -> Result<bool> {
        let script = match renewal.held() {
            Held::Lock => &SCRIPTS.extend,
            Held::Member => &SCRIPTS.extend_member,
        };
        let mut call = Call::new(script, [renewal.key(), renewal.fence()]);
        call.arg(renewal.owner()).arg(renewal.ttl_ms());
        let extended: i64 = match (self.inner.wait, &self.inner.acquire) {
            (Some(wait), Some(acquire)) => {
                let mut conn = acquire.clone();
                let (extended, acknowledged): (i64, i64) = self
                    .run_within(
                        "extend and wait for the replicas",
                        self.inner.command_timeout + wait.timeout,
                        script_and_wait(&mut conn, &call, wait),
                    )
                    .await?;
                if extended == 1 && acknowledged < i64::try_from(wait.replicas).unwrap_or(i64::MAX)
                {
                    let message = format!(
                        "key {:?} on {}: renewal written but only {acknowledged} of {} replicas acknowledged within {:?}",
                        renewal.key(),
                        self.inner.address,
                        wait.replicas,
                        wait.timeout
                    );
                    tracing::warn!(redis.address = %self.inner.address, "{message}");
                    return Err(LockError::unavailable(BACKEND, message));
                }
                extended
            }
            _ => {
                let mut conn = self.inner.commands.clone();
                self.run("extend", call.invoke(&mut conn)).await?
            }
        };
        Ok(extended == 1)
    }

    /// Deletes the key if it is `owner`'s; false if it was not. What else
    /// happens, `release` says (see `RELEASE` in `crate::scripts`); the
    /// fence counter is cleaned up when the holding drew a token
    /// (`fencing`, as its grant was asked).
    pub(crate) async fn release(
        &self,
        keys: &Keys,
        owner: &str,
        fencing: bool,
        release: Release,
    ) -> Result<bool> {
        let mut conn = self.inner.commands.clone();
        let lock_keys = [&keys.lock, &keys.writer_waiting, &keys.fence];
        let call = match &keys.queue {
            Some(queue) => {
                let releases = &self.inner.releases;
                let mut call = Call::new(&releases.release_fair, and_queue_keys(lock_keys, keys));
                call.arg(owner)
                    .arg(&keys.channel)
                    .arg(release.arg())
                    .arg(&*queue.waiter)
                    .arg(flag(fencing));
                call
            }
            None => {
                let mut call = self.line_release(keys, owner, fencing, release);
                if let Release::Back(place) = release {
                    call.arg(place).arg(ttl_millis(QUEUE_PLACE));
                }
                call
            }
        };
        let released: i64 = self.run("release", call.invoke(&mut conn)).await?;
        Ok(released == 1)
    }

    /// As [`release`](Self::release) with [`Release::Grant`] (not for a
    /// fair lock), and when the lock goes to the head of the line this
    /// client takes the end of the line in the same step, as if it had
    /// asked again at once: its turn is to grant `next` (see
    /// [`Waiting::Turn`]), its place lasting [`QUEUE_PLACE`] as an
    /// attempt's would. The place is at the server's clock, or at
    /// `next.place` (Redlock: µs since the Unix epoch by the client's
    /// clock, as [`Waiting::Since`], so that it is the same on every
    /// instance). Returns whether the holding was released, and whether
    /// the place was kept.
    pub(crate) async fn release_keeping_place(
        &self,
        keys: &Keys,
        owner: &str,
        fencing: bool,
        next: &turns::NextTurn,
    ) -> Result<(bool, bool)> {
        let mut conn = self.inner.commands.clone();
        let mut call = self.line_release(keys, owner, fencing, Release::Grant);
        let record = format!(
            "{}|{}|{}|{}",
            next.stamp,
            ttl_millis(next.ttl),
            flag(fencing),
            next.stored
        );
        call.arg("").arg(ttl_millis(QUEUE_PLACE)).arg(record);
        if let Some(place) = next.place {
            call.arg(place);
        }
        let answer: i64 = self.run("release", call.invoke(&mut conn)).await?;
        Ok((answer & 1 == 1, answer >= 2))
    }

    /// The call of the release script of a lock with a line, with its
    /// first six arguments.
    fn line_release(&self, keys: &Keys, owner: &str, fencing: bool, release: Release) -> Call {
        let lock_keys = [&keys.lock, &keys.writer_waiting, &keys.fence];
        // A rollback reads the turns too, where turns are granted: it
        // leaves a lease the caller's turn granted alone (see `RELEASE`).
        let turns = match release {
            Release::Grant => true,
            Release::Back(_) => self.grants_turns(),
            Release::Wake | Release::Quiet => false,
        };
        let line = LineKeys::of(keys, turns);
        let mut call = Call::new(&self.inner.releases.release, line.after(lock_keys));
        call.arg(owner)
            .arg(&keys.channel)
            .arg(release.arg())
            .arg(&*self.inner.waiter)
            .arg(ttl_millis(self.inner.turn))
            .arg(flag(fencing));
        call
    }

    /// Makes `owner`'s lease in the sorted set `set` (readers, permits) end
    /// `ttl` from now; false if it has none or it ran out.
    pub(crate) fn extend_member(
        &self,
        set: LeaseSet<'_>,
        owner: &str,
        ttl: Duration,
    ) -> Renewing<'_> {
        self.renew(Renewal::new(
            Held::Member,
            set.set,
            set.fence,
            owner,
            ttl_millis(ttl),
        ))
    }

    /// Removes `owner`'s lease from the sorted set `set` and publishes on
    /// its channel; false if it had none (or it had run out). The last
    /// lease to go retires the fence counter when the set's holdings draw
    /// tokens (`fencing`).
    pub(crate) async fn release_member(
        &self,
        set: LeaseSet<'_>,
        owner: &str,
        fencing: bool,
    ) -> Result<bool> {
        let mut conn = self.inner.commands.clone();
        let mut call = Call::new(
            &self.inner.releases.release_member,
            [set.set, set.fence, set.lock.unwrap_or(set.set)],
        );
        call.arg(owner).arg(set.channel).arg(flag(fencing));
        let released: i64 = self.run("release", call.invoke(&mut conn)).await?;
        Ok(released == 1)
    }

    /// Passes `from`'s lease to `to` for `ttl` from now, drawing a new
    /// fencing token when `fencing`: `Ok(None)` if the lease was not `from`'s,
    /// else the token (0 without fencing). No release is published: the lock
    /// never comes free.
    pub(crate) async fn hand_over(
        &self,
        keys: &Keys,
        from: &str,
        to: &str,
        ttl: Duration,
        fencing: bool,
    ) -> Result<Option<u64>> {
        let mut conn = self.inner.commands.clone();
        let mut call = Call::new(
            &SCRIPTS.hand_over,
            [&keys.lock, &keys.fence].map(String::as_str),
        );
        call.arg(from)
            .arg(to)
            .arg(ttl_millis(ttl))
            .arg(flag(fencing));
        let token: i64 = self
            .run("hand the lease over", call.invoke(&mut conn))
            .await?;
        Ok(u64::try_from(token).ok())
    }

    /// The lease a release granted `owner` (as stored) on its turn in the
    /// line of `keys` and told this client of (see [`Waiting::Turn`]), if
    /// its message came: when the attempt whose place was granted was sent,
    /// and the fencing token drawn for it (0 without fencing).
    pub(crate) fn take_turn(&self, keys: &Keys, owner: &str) -> Option<(Instant, u64)> {
        let channel = self.lined_turn_channel(keys)?;
        let message = self.inner.notifications.take_message(&channel)?;
        let (stamp, token) = turns::read(&message, owner)?;
        Some((turns::instant_of(stamp), token))
    }

    /// As [`take_turn`](Self::take_turn): the stamp of the turn's
    /// message, left where it is (see [`forget_turn_of`](Self::forget_turn_of)).
    pub(crate) fn told_turn_of(&self, keys: &Keys, owner: &str) -> Option<u64> {
        let channel = self.lined_turn_channel(keys)?;
        let message = self.inner.notifications.message(&channel)?;
        turns::read(&message, owner).map(|(stamp, _)| stamp)
    }

    /// Drops the message left on this client's turn channel of `keys`, if
    /// any.
    pub(crate) fn forget_turn_of(&self, keys: &Keys) {
        if let Some(channel) = self.lined_turn_channel(keys) {
            self.inner.notifications.take_message(&channel);
        }
    }

    /// This client's turn channel on the line of `keys`.
    pub(crate) fn turn_channel(&self, keys: &Keys) -> String {
        keys.turn_channel(&self.inner.waiter)
    }

    /// [`turn_channel`](Self::turn_channel), where this connection waits
    /// in lines (it has a waiter id); `None` where it keeps none.
    fn lined_turn_channel(&self, keys: &Keys) -> Option<String> {
        (!self.inner.waiter.is_empty()).then(|| self.turn_channel(keys))
    }

    /// Marks `channel` (a turn channel of this client) as that of a kept
    /// place (see `crate::places`), whose first message is to be told as
    /// `turn` says.
    pub(crate) fn mark_kept(&self, channel: String, turn: crate::notifications::KeptTurn) {
        self.inner.notifications.mark_kept(channel, turn);
    }

    /// Unmarks `channel` (see [`mark_kept`](Self::mark_kept)); false if its
    /// turn came meanwhile.
    pub(crate) fn unmark_kept(&self, channel: &str) -> bool {
        self.inner.notifications.unmark_kept(channel)
    }

    /// Whether a waiting attempt of this connection can have its turn grant
    /// it the lease ([`Waiting::Turn`]): where it waits in lines, and not
    /// where grants wait for replicas (a grant a release makes is not
    /// followed by `WAIT`).
    pub fn grants_turns(&self) -> bool {
        !self.inner.waiter.is_empty() && self.inner.wait.is_none()
    }

    /// Subscribes to a release channel (of a lock or a semaphore).
    pub(crate) async fn watch_channel(&self, channel: &str) -> lockkit_core::backend::ReleaseWatch {
        self.inner.notifications.watch(channel).await
    }

    /// Subscribes to what wakes a waiter of the lock `keys` (not a fair
    /// one): its turn, on its own channel, and the releases published to
    /// every waiter (those that find nobody in the line).
    pub(crate) async fn watch_turn(&self, keys: &Keys) -> lockkit_core::backend::ReleaseWatch {
        if self.inner.waiter.is_empty() {
            return self.watch_channel(&keys.channel).await;
        }
        let released = self.watch_channel(&keys.channel).await;
        let turn = self
            .watch_channel(&keys.turn_channel(&self.inner.waiter))
            .await;
        turn_watch(released, turn)
    }

    /// [`watch_channel`](Self::watch_channel)'s watch, if the server has
    /// the subscription already; `None` otherwise.
    pub(crate) fn live_channel_watch(
        &self,
        channel: &str,
    ) -> Option<lockkit_core::backend::ReleaseWatch> {
        self.inner.notifications.live_watch(channel)
    }

    /// [`watch_turn`](Self::watch_turn)'s watch, if the server has its
    /// subscriptions already; `None` otherwise.
    pub(crate) fn live_turn_watch(
        &self,
        keys: &Keys,
    ) -> Option<lockkit_core::backend::ReleaseWatch> {
        let released = self.live_channel_watch(&keys.channel)?;
        if self.inner.waiter.is_empty() {
            return Some(released);
        }
        let turn = self.live_channel_watch(&keys.turn_channel(&self.inner.waiter))?;
        Some(turn_watch(released, turn))
    }

    /// Round trip of one `PING`, for benchmarks and health checks.
    pub async fn ping(&self) -> Result<()> {
        let mut conn = self.inner.commands.clone();
        self.run("ping", redis::cmd("PING").query_async::<()>(&mut conn))
            .await
    }
}

/// A waiter's watch of the releases published to every waiter and of its
/// turn: told of its turn only where both subscriptions are live.
fn turn_watch(
    released: lockkit_core::backend::ReleaseWatch,
    turn: lockkit_core::backend::ReleaseWatch,
) -> lockkit_core::backend::ReleaseWatch {
    let told = released.is_active() && turn.is_active();
    let watch = lockkit_core::backend::ReleaseWatch::merge([released, turn]);
    if told { watch.telling_turns() } else { watch }
}

/// A key's remaining time, from `PTTL`'s answer in milliseconds: `None`
/// for a key that does not exist (-2), `Duration::MAX` for one without
/// expiry (-1).
pub(crate) fn remaining_of(pttl: i64) -> Option<Duration> {
    match pttl {
        ..=-2 => None,
        -1 => Some(Duration::MAX),
        ms => Some(Duration::from_millis(ms.unsigned_abs())),
    }
}

/// `EVALSHA` of a script and `WAIT` in one pipeline, so that both go over
/// the same connection (`WAIT` counts the replicas that have the
/// connection's writes); the script is loaded on `NOSCRIPT`.
async fn script_and_wait<T: redis::FromRedisValue>(
    conn: &mut Connection,
    call: &Call,
    wait: ReplicaWait,
) -> std::result::Result<(T, i64), RedisError> {
    let mut pipe = redis::pipe();
    pipe.add_command(call.cmd().clone())
        .cmd("WAIT")
        .arg(wait.replicas)
        .arg(ttl_millis(wait.timeout));
    match pipe.query_async(conn).await {
        Err(error) if is_no_script(&error) => {
            call.load(conn).await?;
            pipe.query_async(conn).await
        }
        other => other,
    }
}

/// `lock_keys`, then for a fair lock its queue's two keys (order, then
/// deadlines), as the fair scripts take them after the plain ones.
fn and_queue_keys<'k, const N: usize>(
    lock_keys: [&'k String; N],
    keys: &'k Keys,
) -> impl Iterator<Item = &'k str> + Clone {
    let queue_keys = keys.queue.iter().flat_map(|q| [&q.order, &q.deadlines]);
    lock_keys.into_iter().chain(queue_keys).map(String::as_str)
}

/// The keys of a lock's waiting line that a script of a lock that is not
/// fair takes after its lock keys: the line, and its turns where the call
/// grants or asks for turns (derived only then).
struct LineKeys {
    line: String,
    turns: Option<String>,
}

impl LineKeys {
    fn of(keys: &Keys, turns: bool) -> LineKeys {
        LineKeys {
            line: keys.line(),
            turns: turns.then(|| keys.turns()),
        }
    }

    /// `lock_keys`, then these.
    fn after<'k, const N: usize>(
        &'k self,
        lock_keys: [&'k String; N],
    ) -> impl Iterator<Item = &'k str> + Clone {
        let line = std::iter::once(&self.line).chain(&self.turns);
        lock_keys.into_iter().chain(line).map(String::as_str)
    }
}

/// What a grant script's answer says (see `ACQUIRE` in `crate::scripts`):
/// granted with its token when not negative, else refused, `-3 - w` with w
/// the wait in ms before a retry (-1: the holding has no expiry, someone
/// set it by hand; -2: it went since the check, retry at once).
fn grant_answer(answer: i64, fencing: bool) -> Attempt<Option<FencingToken>> {
    if answer >= 0 {
        return Attempt::Acquired(fencing.then(|| FencingToken::new(answer as u64)));
    }
    Attempt::Busy {
        retry_after: match (-3_i64).saturating_sub(answer) {
            -1 => None,
            ..=-2 => Some(Duration::ZERO),
            ms => Some(Duration::from_millis(ms as u64)),
        },
    }
}

/// Whether the server knows `command` (`COMMAND INFO` answers nil for one
/// it does not).
async fn has_command(conn: &mut Connection, command: &str) -> redis::RedisResult<bool> {
    let info: Vec<redis::Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg(command)
        .query_async(conn)
        .await?;
    Ok(info.first().is_some_and(|v| *v != redis::Value::Nil))
}

/// A script's boolean argument.
pub(crate) fn flag(on: bool) -> &'static str {
    if on { "1" } else { "0" }
}

fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_answers_read_back_as_the_scripts_write_them() {
        let token = |answer| match grant_answer(answer, true) {
            Attempt::Acquired(token) => token.map(FencingToken::get),
            Attempt::Busy { .. } => panic!("{answer} is a grant"),
        };
        let wait = |answer| match grant_answer(answer, true) {
            Attempt::Busy { retry_after } => retry_after,
            Attempt::Acquired(_) => panic!("{answer} is a refusal"),
        };
        assert_eq!(token(1_764_000_000_000_000), Some(1_764_000_000_000_000));
        assert!(matches!(grant_answer(0, false), Attempt::Acquired(None)));
        // -3 - w for a wait of w ms; -1 (no expiry) and -2 (gone) as PTTL says.
        assert_eq!(wait(-3), Some(Duration::ZERO));
        assert_eq!(wait(-3 - 250), Some(Duration::from_millis(250)));
        assert_eq!(wait(-2), None);
        assert_eq!(wait(-1), Some(Duration::ZERO));
        assert_eq!(
            wait(i64::MIN),
            Some(Duration::from_millis(i64::MAX as u64 - 2))
        );
    }
}
