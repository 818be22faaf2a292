//! The Redlock backend.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lockkit_core::backend::{
    Attempt, Intent, KeptPlace, LeaseBackend, LeaseLock, OwnerToken, ReleaseWatch, Turn,
};
use lockkit_core::{
    Capabilities, FencingToken, LockError, LockKind, LockStatus, ReleaseOnCrash, Result,
};
use lockkit_redis::{
    Keeping, KeptPlaces, RedisInstance, RedisKey, Release, Waiting, holder_of, turn_instant,
    turn_stamp,
};
use tokio::sync::watch;

use crate::error::{BACKEND, no_quorum, unreachable_quorum, unsure_status};
use crate::quorum::{Stragglers, Until, Votes, ask, finished, has_finished};

/// How many times a status read is made while its answers leave the
/// lock's state open (an instance slower than the instance timeout).
const STATUS_READS: usize = 3;

/// Whether grants on an instance draw fencing tokens: never (see
/// [`REDLOCK_CAPABILITIES`]), so a release leaves the fence counter alone.
const FENCING: bool = false;

/// A Redlock client: [`LeaseLock`] over [`RedlockBackend`].
pub type RedlockLock = LeaseLock<RedlockBackend>;

/// What Redlock guarantees: no fencing tokens (see the crate docs), crash
/// release by TTL, notified waits, and it survives a minority of instances down.
pub const REDLOCK_CAPABILITIES: Capabilities = Capabilities::new(ReleaseOnCrash::Ttl)
    .with_server_bounds(true)
    .with_notified_wait(true)
    .with_survives_minority_failure(true)
    .with_shared(true)
    .with_semaphore(true)
    .with_holder(true);

/// What a barging Redlock client guarantees (`barging=true`, see
/// [`RedlockLockBuilder::barging`](crate::RedlockLockBuilder::barging)):
/// its writers ask on the backoff, not notified.
pub const REDLOCK_BARGING_CAPABILITIES: Capabilities =
    REDLOCK_CAPABILITIES.with_notified_wait(false);

/// How long a waiter that some instances, too few, told of its turn waits
/// for the others' messages (at most an instance timeout) before it asks:
/// a release's requests reach the instances at once, and their messages
/// come within a fraction of this.
const TURN_GRACE: Duration = Duration::from_millis(5);

/// The least time the subscriptions of a waiter's other instances are
/// waited for once a quorum of them is live (see
/// [`RedlockBackend::watch`](LeaseBackend::watch)).
const SUBSCRIBE_GRACE: Duration = Duration::from_millis(1);

/// How long after a failed subscription in the background (see
/// `RedlockBackend::subscribe_later`) the next one waits: an instance that
/// is down is not asked on every wait.
const RESUBSCRIBE_PAUSE: Duration = Duration::from_secs(1);

/// The default upper bound of one request to one instance; the effective
/// default is min(this, ttl / 10).
pub const DEFAULT_INSTANCE_TIMEOUT: Duration = Duration::from_millis(50);

/// Acquire requests that were still in flight when a lease was granted: by
/// instance, a signal that fires when that request has finished.
type InFlight = Vec<(usize, watch::Receiver<()>)>;

/// The [`LeaseBackend`] of Redlock: one lock over N independent Redis masters.
#[derive(Debug)]
pub struct RedlockBackend {
    instances: Vec<RedisInstance>,
    prefix: String,
    quorum: usize,
    instance_timeout: Option<Duration>,
    /// By owner token: the acquire requests of a held lease that had not
    /// answered when it was granted. Its release to those instances waits for
    /// them, so that a late `SET` can never land after the `DEL`. Entries
    /// whose requests have all finished go when the next one is added (see
    /// [`forget_finished`]).
    in_flight: Mutex<HashMap<String, InFlight>>,
    /// The requests left running in the background, by instance.
    stragglers: Stragglers,
    /// By instance: whether a subscription is being made in the
    /// background (see [`subscribe_later`](Self::subscribe_later)).
    subscribing: Arc<[AtomicBool]>,
    /// Whether waiters of exclusive locks ask on the backoff, out of any
    /// line and deaf to releases (see [`barging`](Self::barging)).
    barging: bool,
    /// By instance: the places in line releases kept for this client's
    /// next acquisitions (see
    /// [`release_keeping_place`](LeaseBackend::release_keeping_place)).
    places: Vec<KeptPlaces>,
}

impl RedlockBackend {
    /// A backend over connected (or lazily connecting) instances.
    pub fn new(
        instances: Vec<RedisInstance>,
        prefix: impl Into<String>,
        instance_timeout: Option<Duration>,
    ) -> Self {
        let quorum = instances.len() / 2 + 1;
        let stragglers = Stragglers::new(instances.len());
        let subscribing = (0..instances.len())
            .map(|_| AtomicBool::new(false))
            .collect();
        let places = instances.iter().cloned().map(KeptPlaces::new).collect();
        RedlockBackend {
            instances,
            prefix: prefix.into(),
            quorum,
            instance_timeout,
            in_flight: Mutex::default(),
            stragglers,
            subscribing,
            barging: false,
            places,
        }
    }

    /// The same backend, whose waiters of exclusive locks hear no releases
    /// and ask again on the backoff (see
    /// [`RedlockLockBuilder::barging`](crate::RedlockLockBuilder::barging)).
    /// Its instances should keep no lines
    /// ([`RedisConfig::without_line`](lockkit_redis::RedisConfig::without_line)),
    /// as the builder's do.
    pub fn barging(mut self) -> Self {
        self.barging = true;
        self
    }

    /// The instances.
    pub fn instances(&self) -> &[RedisInstance] {
        &self.instances
    }

    /// How many instances must agree on a lock (either side): N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// How many instances must grant a permit of a semaphore of `permits`
    /// so that it never has more than `permits` holders:
    /// `⌊N·permits / (permits + 1)⌋ + 1`.
    ///
    /// Each instance admits at most `permits` holders. If `permits + 1`
    /// holders each held `q` instances, the instances would carry
    /// `(permits + 1)·q` holdings, so some instance would carry more than
    /// `permits` of them as soon as `(permits + 1)·q > N·permits`: this `q`
    /// is the least for which that holds. A plain majority is not enough
    /// (3 masters, 2 permits: three holders can each hold a different 2 of
    /// the 3). The price: a semaphore tolerates only `N − q` instances down
    /// (0 for 3 masters and 2 permits, 1 for 5 masters and 2 permits); with
    /// one permit it is the majority again.
    pub fn permit_quorum(&self, permits: u32) -> usize {
        bounding_quorum(self.instances.len(), permits)
    }

    /// The quorum of a holding.
    fn quorum_for(&self, key: &RedisKey) -> usize {
        match key {
            RedisKey::Permit { permits, .. } => self.permit_quorum(*permits),
            _ => self.quorum,
        }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The bound of one request to one instance for a lease of `ttl`.
    pub fn instance_timeout(&self, ttl: Option<Duration>) -> Duration {
        self.instance_timeout.unwrap_or_else(|| match ttl {
            Some(ttl) => (ttl / 10).min(DEFAULT_INSTANCE_TIMEOUT),
            None => DEFAULT_INSTANCE_TIMEOUT,
        })
    }

    fn all(&self) -> std::ops::Range<usize> {
        0..self.instances.len()
    }

    fn in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<String, InFlight>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Deletes `owner`'s key on the given instances, each after the acquire
    /// request to it has finished (where one is in `late`), and returns once
    /// `until` says so (see [`ask`]); the rest completes in the background.
    async fn delete(
        &self,
        keys: &Arc<RedisKey>,
        owner: &OwnerToken,
        which: impl IntoIterator<Item = usize>,
        late: &InFlight,
        release: Ending,
        until: Until<impl Fn(&Votes<bool>) -> bool>,
    ) -> Votes<bool> {
        let (keys, owner) = (Arc::clone(keys), Arc::new(owner.clone()));
        let release = Arc::new(release);
        ask(
            &self.instances,
            &self.stragglers,
            keys.channel(),
            which,
            self.instance_timeout(None),
            |index, instance| {
                let after = late
                    .iter()
                    .find(|(i, _)| *i == index)
                    .map(|(_, done)| done.clone());
                let (keys, owner) = (Arc::clone(&keys), Arc::clone(&owner));
                let (release, places) = (Arc::clone(&release), self.places[index].clone());
                async move {
                    if let Some(done) = after {
                        finished(done).await;
                    }
                    match &*release {
                        Ending::Release(release) => {
                            instance
                                .release_holding(&keys, owner.as_str(), FENCING, *release)
                                .await
                        }
                        Ending::KeepingPlace { next, ttl, keeping } => {
                            places
                                .release_keeping_place(&keys, owner.as_str(), next, *ttl, keeping)
                                .await
                        }
                    }
                }
            },
            until,
        )
        .await
    }

    /// [`release`](LeaseBackend::release) with `ending` on every instance.
    /// A release that keeps places waits for every instance that is not
    /// behind (see [`ask`]), so that the places it kept are known before
    /// the next acquisition looks for them.
    async fn end(&self, placed: &Placed, owner: &OwnerToken, ending: Ending) -> Result<bool> {
        let keys = &placed.keys;
        let quorum = self.quorum_for(keys);
        let late = self.in_flight().remove(owner.as_str()).unwrap_or_default();
        let until = match &ending {
            Ending::KeepingPlace { keeping, .. } => Some(keeping.clone()),
            Ending::Release(_) => None,
        };
        let every = until.is_some();
        let votes = self
            .delete(
                keys,
                owner,
                self.all(),
                &late,
                ending,
                Until {
                    decided: |votes: &Votes<bool>| {
                        !every
                            && (votes.count(|gone| *gone) >= quorum
                                || votes.count(|gone| !*gone) >= quorum)
                    },
                    enough: quorum,
                },
            )
            .await;
        // An instance not waited for keeps no place from now on.
        if let Some(until) = until {
            until.close();
        }
        if votes.count(|released| !*released) >= quorum {
            Ok(false)
        } else if votes.answers.len() >= quorum {
            Ok(true)
        } else {
            Err(self.undecided(&votes, quorum))
        }
    }

    /// `request` sent to every instance at once about `keys`, each bounded
    /// by the instance timeout (for a lease of `ttl`, where one is asked
    /// for): the votes, once `decided` or all answered (or `enough`
    /// answered and only instances behind are left: see [`ask`]).
    async fn ask_every<T: Send + 'static, Fut: Future<Output = Result<T>> + Send + 'static>(
        &self,
        keys: &RedisKey,
        ttl: Option<Duration>,
        request: impl FnMut(usize, RedisInstance) -> Fut,
        decided: impl Fn(&Votes<T>) -> bool,
        enough: usize,
    ) -> Votes<T> {
        let timeout = self.instance_timeout(ttl);
        let (instances, stragglers) = (&self.instances, &self.stragglers);
        ask(
            instances,
            stragglers,
            keys.channel(),
            self.all(),
            timeout,
            request,
            Until { decided, enough },
        )
        .await
    }

    /// `read` of `key` asked of every instance at once: the answers, once a
    /// quorum gave theirs; `Unavailable` when fewer than `quorum` answered.
    async fn read_all<T, Fut>(
        &self,
        key: &RedisKey,
        quorum: usize,
        read: impl Fn(RedisInstance, RedisKey) -> Fut,
    ) -> Result<Votes<T>>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let owned = key.clone();
        let request = move |_, instance| read(instance, owned.clone());
        let votes = self.ask_every(key, None, request, |_| false, quorum).await;
        if votes.answers.len() < quorum {
            return Err(self.undecided(&votes, quorum));
        }
        Ok(votes)
    }

    /// The status of the lock key when a quorum agree on one writer;
    /// `None` when no writer holds (readers may).
    async fn writer_status(&self, key: &RedisKey, quorum: usize) -> Result<Option<LockStatus>> {
        let votes = self
            .read_all(key, quorum, |instance, key| async move {
                instance.writer_of(&key).await
            })
            .await?;
        let mut holders: HashMap<&str, Vec<Duration>> = HashMap::new();
        for holder in votes
            .answers
            .iter()
            .filter_map(|(_, holder)| holder.as_ref())
        {
            holders
                .entry(holder.owner.as_str())
                .or_default()
                .push(holder.remaining);
        }
        if let Some((owner, lefts)) = holders.iter().find(|(_, lefts)| lefts.len() >= quorum) {
            return Ok(Some(
                LockStatus::held()
                    .with_remaining(lefts.iter().min().copied())
                    .with_holders(Some(1))
                    .with_holder(holder_of(owner).map(str::to_owned)),
            ));
        }
        // An owner seen on fewer than a quorum may still hold one with the
        // instances that did not answer: neither held nor free is known.
        let unknown = self.instances.len() - votes.answers.len();
        if holders
            .values()
            .any(|lefts| lefts.len() + unknown >= quorum)
        {
            return Err(self.unsure(&votes, quorum));
        }
        Ok(None)
    }

    /// `Unavailable` for a read whose answers fit both a held and a free
    /// lock.
    fn unsure<T>(&self, votes: &Votes<T>, quorum: usize) -> LockError {
        self.short_of(votes, quorum, unsure_status)
    }

    /// `error` of the answers in `votes` against `quorum` of the instances.
    fn short_of<T, E>(&self, votes: &Votes<T>, quorum: usize, error: E) -> LockError
    where
        E: Fn(usize, usize, usize, &[String]) -> LockError,
    {
        let answered = votes.answers.len();
        error(answered, self.instances.len(), quorum, &votes.failures)
    }

    /// One read of the status (see `status`).
    async fn read_status(&self, keys: &RedisKey) -> Result<LockStatus> {
        let quorum = self.quorum_for(keys);
        if let RedisKey::Exclusive(_) = keys
            && let Some(status) = self.writer_status(keys, quorum).await?
        {
            return Ok(status);
        }
        let votes = self
            .read_all(keys, quorum, |instance, key| async move {
                instance.holdings_of(&key).await
            })
            .await?;
        let mut counts: Vec<(usize, Duration)> = votes
            .answers
            .iter()
            .map(|(_, h)| (h.count, h.remaining))
            .collect();
        counts.sort_by_key(|&(count, _)| std::cmp::Reverse(count));
        let (count, remaining) = counts[quorum - 1];
        let unknown = self.instances.len() - votes.answers.len();
        let holding = counts.iter().filter(|&&(count, _)| count > 0).count();
        if count == 0 && holding > 0 && holding + unknown >= quorum {
            return Err(self.unsure(&votes, quorum));
        }
        // Any one of them: what an instance that counts holdings recorded.
        let holder = votes
            .answers
            .iter()
            .find_map(|(_, h)| h.holder.clone().filter(|_| h.count > 0));
        Ok(if count == 0 {
            LockStatus::free()
        } else {
            LockStatus::held()
                .with_holders(Some(count))
                .with_remaining(Some(remaining))
                .with_holder(holder)
        })
    }

    fn undecided<T>(&self, votes: &Votes<T>, quorum: usize) -> LockError {
        self.short_of(votes, quorum, unreachable_quorum)
    }
}

/// A lock's keys (the same on every instance), and where a waiter for it
/// stands in the instances' waiting lines: when its `acquire` began, so that
/// the place is the same on every instance and on every attempt (an attempt
/// granted by some instances and rolled back leaves their lines, and the
/// next one must come back to the same place).
#[derive(Clone, Debug)]
pub struct Placed {
    /// Shared with every instance's request about it, which must own what
    /// it sends (it may finish in the background).
    keys: Arc<RedisKey>,
    since: u64,
    /// The stamp of the acquisition's last waiting attempt, where turns are
    /// granted (see [`RedlockBackend::take_turn`](LeaseBackend::take_turn)):
    /// a turn's message of an earlier attempt does not count. One more than
    /// the stamp; 0 before the first; 1 (any stamp) on a place a release
    /// kept, whose turns are all of that place (see
    /// [`resume_place`](LeaseBackend::resume_place)).
    attempt: Arc<AtomicU64>,
    /// While a resumed place is waited for (no attempt since): the
    /// instances, one bit each, where the acquisition took the place over,
    /// whose turns alone count (a place an instance kept too late, or one
    /// its keeper gave up, is released by the client, and its turn must
    /// not count). 0: every instance.
    resumed_on: Arc<AtomicU64>,
}

impl RedlockBackend {
    /// Subscribes to what wakes a waiter of `keys` on instance `index` in
    /// a task of its own, unless one already subscribes there: the
    /// subscription lingers for the next wait (see `live_watch`). One
    /// such task per instance at most, so that a frozen instance does not
    /// gather them, and after a failure none for [`RESUBSCRIBE_PAUSE`].
    fn subscribe_later(&self, index: usize, keys: &Arc<RedisKey>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.subscribing[index].swap(true, Ordering::AcqRel) {
            return;
        }
        let (subscribing, instance) =
            (Arc::clone(&self.subscribing), self.instances[index].clone());
        let keys = Arc::clone(keys);
        runtime.spawn(async move {
            if !instance.watch_holding(&keys).await.is_active() {
                // Failed (the instance is down, say): not again at once.
                tokio::time::sleep(RESUBSCRIBE_PAUSE).await;
            }
            subscribing[index].store(false, Ordering::Release);
        });
    }

    /// The instances that told this client of `owner`'s turn for the last
    /// waiting attempt of `placed`, with each message's stamp.
    fn told_turns(&self, placed: &Placed, owner: &OwnerToken) -> Vec<(usize, u64)> {
        let Some(attempt) = placed.attempt.load(Ordering::Relaxed).checked_sub(1) else {
            return Vec::new();
        };
        let resumed_on = placed.resumed_on.load(Ordering::Relaxed);
        self.instances
            .iter()
            .enumerate()
            .filter(|&(index, _)| resumed_on == 0 || resumed_on & (1 << index) != 0)
            .filter_map(|(index, instance)| {
                let stamp = instance.told_turn(&placed.keys, owner.as_str())?;
                (stamp >= attempt).then_some((index, stamp))
            })
            .collect()
    }
}

/// How [`RedlockBackend::delete`] ends a holding on each instance.
enum Ending {
    /// [`RedisInstance::release_holding`] with this.
    Release(Release),
    /// [`KeptPlaces::release_keeping_place`]: the releasing client's next
    /// turn grants `next` a lease of `ttl`, where `keeping` says (a place
    /// in time and a stamp, one on every instance, and the window in
    /// which instances keep places).
    KeepingPlace {
        next: OwnerToken,
        ttl: Duration,
        keeping: Keeping,
    },
}

/// Drops the entries of [`RedlockBackend::in_flight`] whose requests have
/// all finished: a release has nothing left to wait for there, and a
/// holding that ends without a release (lost, its lease kept for a lock
/// delay) would otherwise leave its entry for the life of the client.
fn forget_finished(in_flight: &mut HashMap<String, InFlight>) {
    in_flight.retain(|_, late| !late.iter().all(|(_, done)| has_finished(done)));
}

/// Now, in microseconds since the Unix epoch (0 before it).
fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        })
}

/// `⌊n·permits / (permits + 1)⌋ + 1`: see [`RedlockBackend::permit_quorum`].
fn bounding_quorum(n: usize, permits: u32) -> usize {
    let (n, p) = (n as u64, u64::from(permits.max(1)));
    (n * p / (p + 1) + 1) as usize
}

fn granted(answer: &Attempt<Option<FencingToken>>) -> bool {
    matches!(answer, Attempt::Acquired(_))
}

/// A request for [`ask`] made from `op`: each instance's request owns a
/// share of the keys and of the owner token, so that one the caller no
/// longer waits for can still complete in the background.
fn request<Fut>(
    keys: &Arc<RedisKey>,
    owner: &OwnerToken,
    op: impl Fn(RedisInstance, Arc<RedisKey>, Arc<OwnerToken>) -> Fut,
) -> impl FnMut(usize, RedisInstance) -> Fut {
    let (keys, owner) = (Arc::clone(keys), Arc::new(owner.clone()));
    move |_, instance| op(instance, Arc::clone(&keys), Arc::clone(&owner))
}

#[lockkit_core::async_trait]
impl LeaseBackend for RedlockBackend {
    type Key = Placed;

    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        if self.barging {
            REDLOCK_BARGING_CAPABILITIES
        } else {
            REDLOCK_CAPABILITIES
        }
    }

    /// The keys of one server (no Redis Cluster layout), on every instance.
    fn key(&self, name: &str, kind: LockKind) -> Result<Placed> {
        Ok(Placed {
            keys: Arc::new(RedisKey::new(&self.prefix, name, kind, false)?),
            since: unix_micros(),
            attempt: Arc::default(),
            resumed_on: Arc::default(),
        })
    }

    /// Stored with the owner token on every instance (see
    /// [`RedisKey::with_holder`]).
    fn with_holder(&self, key: Placed, holder: &str) -> Placed {
        Placed {
            keys: Arc::new(Arc::unwrap_or_clone(key.keys).with_holder(holder)),
            ..key
        }
    }

    /// Asks every instance at once and returns as soon as a quorum granted
    /// the lock, or (for a writer) so many refused that no quorum can
    /// grant it; a frozen minority costs nothing. Requests still in flight
    /// then complete in the background, and the lease's release waits for
    /// them on their instances. Without a quorum the partial grant is
    /// rolled back (quietly: it wakes nobody), and the answer is `Busy`
    /// when enough instances answered or refused, `Unavailable` when not.
    /// A waiting attempt that is refused keeps (or takes) its place in
    /// every instance's waiting line, at the time its `acquire` began (see
    /// `Placed`), also where its grant was rolled back
    /// ([`Release::Back`]); after such a split vote it asks again on the
    /// backoff.
    async fn try_lock(
        &self,
        placed: &Placed,
        owner: &OwnerToken,
        ttl: Duration,
        intent: Intent,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let keys = &placed.keys;
        let quorum = self.quorum_for(keys);
        // One place in the waiting line on every instance: the instances
        // then agree on the head of the line, and a release on each of them
        // reserves the lock for the same waiter (placed by the server's
        // clock, the places would follow each instance's own order of
        // arrival, and the reservations would split the votes).
        let waiting = match intent {
            // In no line (its instances keep none), but still recorded as
            // the waiting writer where readers keep it out.
            Intent::Wait if keys.barges(self.barging) => Waiting::ByArrival,
            Intent::Wait if self.grants_turns() && matches!(**keys, RedisKey::Exclusive(_)) => {
                let stamp = turn_stamp();
                placed.attempt.store(stamp + 1, Ordering::Relaxed);
                placed.resumed_on.store(0, Ordering::Relaxed);
                Waiting::TurnSince {
                    place: placed.since,
                    stamp,
                }
            }
            Intent::Wait => Waiting::Since(placed.since),
            Intent::Try => Waiting::No,
        };
        let total = self.instances.len();
        let hold = request(keys, owner, move |instance, keys, owner| async move {
            instance
                .try_hold(&keys, owner.as_str(), ttl, FENCING, waiting)
                .await
        });
        // Decided by a quorum of grants, or for a writer by refusals that
        // leave too few instances to make one: a refused writer then does
        // not wait for a frozen minority's timeout before it waits for the
        // release. (Not for readers and permits: the rollback of a late
        // grant of theirs is published, and would wake every waiter.)
        let refusals_decide = matches!(**keys, RedisKey::Exclusive(_));
        let decided = |votes: &Votes<_>| {
            votes.count(granted) >= quorum
                || (refusals_decide && votes.count(|a| !granted(a)) > total - quorum)
        };
        let mut votes = self.ask_every(keys, Some(ttl), hold, decided, quorum).await;
        let silent = votes.silent(total);
        let late: InFlight = std::mem::take(&mut votes.late);
        let yes = votes.count(granted);
        // Known before the outcome, so that a release after this call was
        // cut off (rolling back, below) waits for them as well.
        if !late.is_empty() {
            let mut in_flight = self.in_flight();
            forget_finished(&mut in_flight);
            in_flight.insert(owner.as_str().to_owned(), late.clone());
        }
        if yes >= quorum {
            // Redlock has no safe fencing token.
            return Ok(Attempt::Acquired(None));
        }
        // Roll back: wait for the instances that granted (they have just
        // answered); the silent ones are rolled back in the background.
        let granted_by = votes.which(granted);
        self.delete(
            keys,
            owner,
            granted_by.iter().copied().chain(silent),
            &late,
            Ending::Release(match waiting {
                Waiting::Since(place) | Waiting::TurnSince { place, .. } => Release::Back(place),
                _ => Release::Quiet,
            }),
            Until {
                decided: |votes: &Votes<bool>| {
                    granted_by
                        .iter()
                        .all(|i| votes.answers.iter().any(|(j, _)| j == i))
                },
                // Decided by the instances that granted alone.
                enough: usize::MAX,
            },
        )
        .await;
        self.in_flight().remove(owner.as_str());
        let answered = votes.answers.len();
        // Busy once enough instances refused, whoever else answered.
        if answered < quorum && answered - yes <= total - quorum {
            return Err(no_quorum(answered, yes, total, quorum, &votes.failures));
        }
        // A split vote (some instances granted, too few): the grants were
        // just rolled back, and the refusals may be other waiters' rolled
        // back grants or reservations, which nobody is told of. Asking again
        // on the backoff settles it; sleeping until the refusing instances'
        // times would hold every waiter up for a whole reservation.
        let retry_after = if yes > 0 {
            None
        } else {
            votes
                .answers
                .iter()
                .filter_map(|(_, answer)| match answer {
                    Attempt::Busy { retry_after } => *retry_after,
                    Attempt::Acquired(_) => None,
                })
                .min()
        };
        tracing::trace!(granted = yes, answered, quorum, "redlock: no quorum");
        Ok(Attempt::Busy { retry_after })
    }

    /// Needs a quorum of instances that still hold our token; returns as soon
    /// as the outcome is decided. `Ok(false)` (lost) once a quorum answered
    /// that it does not.
    async fn extend(&self, placed: &Placed, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        let keys = &placed.keys;
        let quorum = self.quorum_for(keys);
        let extend = request(keys, owner, move |instance, keys, owner| async move {
            instance.extend_holding(&keys, owner.as_str(), ttl).await
        });
        let decided = |votes: &Votes<bool>| {
            votes.count(|ours| *ours) >= quorum || votes.count(|ours| !*ours) >= quorum
        };
        let votes = self
            .ask_every(keys, Some(ttl), extend, decided, quorum)
            .await;
        if votes.count(|ours| *ours) >= quorum {
            Ok(true)
        } else if votes.count(|ours| !*ours) >= quorum {
            Ok(false)
        } else {
            Err(self.undecided(&votes, quorum))
        }
    }

    /// Deletes our key on every instance and wakes waiters; returns as soon as
    /// the outcome is decided (the requests to a slow minority complete in the
    /// background, each after the acquire request to its instance).
    /// `Ok(false)` (lost) when a quorum answered that the lease was not ours;
    /// `Ok(true)` when a quorum released it, or when enough instances answered
    /// and none of them holds our token any more; `Unavailable` when fewer than
    /// a quorum answered.
    ///
    /// Where turns are granted ([`grants_turns`](Self::grants_turns)),
    /// each instance's release grants the head of its line its turn
    /// ([`Release::Grant`]).
    async fn release(&self, placed: &Placed, owner: &OwnerToken) -> Result<bool> {
        let release = if self.grants_turns() {
            Release::Grant
        } else {
            Release::Wake
        };
        self.end(placed, owner, Ending::Release(release)).await
    }

    /// As [`release`](Self::release), and on each instance where the lock
    /// goes to the next client in line, this client takes the end of the
    /// line in the same script, as if it had asked again at once: at one
    /// place in time (this client's clock now), the same on every instance,
    /// as a waiting attempt's place is (see `Placed`), with the record of
    /// the turn it is to grant (a new owner's lease of `ttl`, one stamp on
    /// every instance). A next acquisition that finds the place kept on a
    /// quorum of instances ([`resume_place`](Self::resume_place)) waits
    /// for that turn without asking first: in a loop of acquisitions, the
    /// releasing client's next refused attempt (one script per instance)
    /// is not sent. Only where turns are granted
    /// ([`grants_turns`](Self::grants_turns)), not for a barging client,
    /// whose waiters take no place. The release waits for every instance
    /// that is not behind (see `ask`), so that the next acquisition finds
    /// every place it kept.
    async fn release_keeping_place(
        &self,
        placed: &Placed,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<bool> {
        let keys = &placed.keys;
        // Only where this client waits on every instance: a place kept on
        // some instances and not on the others would put it at the head of
        // some lines and behind others in the rest, and the instances would
        // grant the lock to different waiters.
        let everywhere = || {
            self.instances.iter().all(|instance| {
                instance
                    .live_watch_of(keys)
                    .is_some_and(|watch| watch.tells_turns())
            })
        };
        // Up to 64 instances (one bit each, see `Placed::resumed_on`).
        if !self.grants_turns()
            || keys.barges(self.barging)
            || self.instances.len() > 64
            || !everywhere()
        {
            return self.release(placed, owner).await;
        }
        let ending = Ending::KeepingPlace {
            next: OwnerToken::new(),
            ttl,
            keeping: Keeping::new(unix_micros(), turn_stamp()),
        };
        self.end(placed, owner, ending).await
    }

    /// The place a release kept on a quorum of the instances (see
    /// [`release_keeping_place`](Self::release_keeping_place)); a place
    /// kept on fewer is given up, and the acquisition asks as usual. Its
    /// owner is new, so every turn told to that owner is the kept place's
    /// ([`take_turn`](Self::take_turn) counts them all, until an attempt).
    fn resume_place(&self, placed: &Placed) -> Option<KeptPlace> {
        let keys = &placed.keys;
        let kept = self.places.iter().filter(|p| p.is_kept(keys)).count();
        if kept < self.quorum {
            if kept > 0 {
                self.places.iter().for_each(|p| p.give_up(keys));
            }
            return None;
        }
        let (mut resumed, mut resumed_on) = (0, 0u64);
        let place = self
            .places
            .iter()
            .enumerate()
            .filter_map(|(index, p)| Some((index, p.resume(keys)?)))
            .inspect(|&(index, _)| {
                resumed += 1;
                resumed_on |= 1 << index;
            })
            .map(|(_, place)| place)
            .reduce(|first, other| KeptPlace {
                retry_after: first.retry_after.min(other.retry_after),
                ..first
            })?;
        placed.attempt.store(1, Ordering::Relaxed);
        placed.resumed_on.store(resumed_on, Ordering::Relaxed);
        // A keeper gave some up meanwhile (their turns came): asked at once.
        Some(if resumed < self.quorum {
            KeptPlace {
                retry_after: Duration::ZERO,
                ..place
            }
        } else {
            place
        })
    }

    /// Unless barging, where every instance can (see
    /// [`RedisInstance::grants_turns`]): a release on each instance makes
    /// the lease of the first waiter in its line (the same on every
    /// instance: see `Placed`) that waiter's, and tells it; the waiter
    /// holds once a quorum told it (see [`take_turn`](Self::take_turn)),
    /// without asking again. A rollback of a waiting attempt leaves a lease
    /// its turn granted alone (the instance's record says which), so that a
    /// turn that was told is not taken back.
    fn grants_turns(&self) -> bool {
        !self.barging && self.instances.iter().all(RedisInstance::grants_turns)
    }

    /// The turn a quorum of instances told this client of, each for the
    /// acquisition's last waiting attempt (an earlier attempt's turn may
    /// have been granted where a later attempt was granted too, and rolled
    /// back with it); counted from the attempt.
    fn take_turn(&self, placed: &Placed, owner: &OwnerToken) -> Option<Turn> {
        let told = self.told_turns(placed, owner);
        if told.len() < self.quorum_for(&placed.keys) {
            return None;
        }
        for &(index, _) in &told {
            self.instances[index].forget_turn(&placed.keys);
        }
        let first = told.iter().map(|&(_, stamp)| stamp).min()?;
        Some(Turn {
            fencing: None,
            since: turn_instant(first),
        })
    }

    /// While some instances, too few, told this client of its turn: the
    /// others' messages are waited for a little (5 ms, at most an
    /// instance timeout).
    fn turn_told_in_part(&self, placed: &Placed, owner: &OwnerToken) -> Option<Duration> {
        let told = self.told_turns(placed, owner).len();
        (told > 0 && told < self.quorum_for(&placed.keys))
            .then(|| self.instance_timeout(None).min(TURN_GRACE))
    }

    /// An exclusive holding: held when a quorum of the instances that
    /// answered hold the same owner token; the remaining lease is the
    /// shortest among them. Readers or permits: the number of holdings that
    /// a quorum of the instances confirm (the quorum-th largest count). Never
    /// a fencing token. `Unavailable` when fewer than a quorum answered, or
    /// when the answers fit both a held and a free lock; such a read is
    /// made again (three times in all) before it says so: one
    /// slow instance should not make a held lock look free, nor fail the
    /// read.
    async fn status(&self, placed: &Placed) -> Result<LockStatus> {
        let keys = &placed.keys;
        let mut reads = 1;
        loop {
            match self.read_status(keys).await {
                Err(LockError::Unavailable { .. }) if reads < STATUS_READS => reads += 1,
                // Barging waiters are in no line: the lines' count misses them.
                Ok(status) if keys.barges(self.barging) => return Ok(status.with_waiters(None)),
                answer => return answer,
            }
        }
    }

    /// Release notifications from a quorum of instances that listen (or
    /// from those that subscribe in time), and from every other that
    /// subscribes within as long again (at least 1 ms). A
    /// quorum is enough for a release: a release that counts reaches a
    /// quorum of instances, and two quorums share one; a turn needs a
    /// quorum of the instances that grant it, so the others are waited for
    /// a little. A frozen minority's subscription (which waits for its
    /// reply) thus costs the waiter that little.
    async fn watch(&self, placed: &Placed) -> Result<ReleaseWatch> {
        let keys = &placed.keys;
        if keys.barges(self.barging) {
            return Ok(ReleaseWatch::none());
        }
        let quorum = self.quorum_for(keys);
        let mut pending: FuturesUnordered<_> = self
            .instances
            .iter()
            .enumerate()
            .map(|(index, instance)| async move { (index, instance.watch_holding(keys).await) })
            .collect();
        let mut watches = Vec::with_capacity(self.instances.len());
        let started = tokio::time::Instant::now();
        // Counting the watches that can fire: one whose subscription
        // failed waits by polling.
        let mut live = 0;
        let _ = tokio::time::timeout(self.instance_timeout(None), async {
            while live < quorum
                && let Some((index, watch)) = pending.next().await
            {
                live += usize::from(watch.is_active());
                watches.push((index, watch));
            }
        })
        .await;
        // The other instances' subscriptions get as long again (at least
        // `SUBSCRIBE_GRACE`): a waiter's turn comes from every instance
        // that grants it, and one it does not hear costs it a wait for the
        // rest (see `turn_told_in_part`), or costs every grant where a
        // quorum needs every live instance (one held by a client that
        // died).
        let grace = if live >= quorum {
            started.elapsed().max(SUBSCRIBE_GRACE)
        } else {
            Duration::ZERO
        };
        let _ = tokio::time::timeout(grace, async {
            while let Some(answer) = pending.next().await {
                watches.push(answer);
            }
        })
        .await;
        drop(pending);
        // Those still subscribing subscribe in the background, for the
        // waits after this one (their subscriptions linger).
        for index in self.all() {
            if !watches.iter().any(|(i, _)| *i == index) {
                self.subscribe_later(index, keys);
            }
        }
        let watches = watches.into_iter().map(|(_, watch)| watch);
        Ok(ReleaseWatch::merge(watches))
    }

    /// As [`watch`](Self::watch), from the instances whose subscriptions
    /// are live already, if they are a quorum.
    fn live_watch(&self, placed: &Placed) -> Option<ReleaseWatch> {
        let keys = &placed.keys;
        if keys.barges(self.barging) {
            return Some(ReleaseWatch::none());
        }
        let mut live = Vec::with_capacity(self.instances.len());
        for (index, instance) in self.instances.iter().enumerate() {
            match instance.live_watch_of(keys) {
                Some(watch) => live.push(watch),
                // A quorum may do, but a turn is heard from every
                // instance that grants it.
                None => self.subscribe_later(index, keys),
            }
        }
        (live.len() >= self.quorum_for(keys)).then(|| ReleaseWatch::merge(live))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tokio::sync::watch;

    use super::{bounding_quorum, forget_finished};

    /// An entry goes once every request in it has finished (its signal's
    /// sender dropped), and not before.
    #[test]
    fn finished_requests_are_forgotten() {
        let (first, first_done) = watch::channel(());
        let (second, second_done) = watch::channel(());
        let (third, third_done) = watch::channel(());
        let mut in_flight = HashMap::from([
            ("a".to_owned(), vec![(0, first_done), (2, second_done)]),
            ("b".to_owned(), vec![(1, third_done)]),
        ]);
        forget_finished(&mut in_flight);
        assert_eq!(in_flight.len(), 2, "nothing has finished yet");
        drop(first);
        drop(third);
        forget_finished(&mut in_flight);
        let left: Vec<&String> = in_flight.keys().collect();
        assert_eq!(left, ["a"], "b's only request finished; a's second runs");
        drop(second);
        forget_finished(&mut in_flight);
        assert!(in_flight.is_empty());
    }

    /// `permits + 1` holders of `q` instances each fit on `n` instances of
    /// `permits` places each exactly when `(permits + 1)·q <= n·permits`
    /// (fill the instances round-robin): the quorum is the least `q` for
    /// which they do not fit, it is the majority for one permit, and never
    /// more than all instances.
    #[test]
    fn the_permit_quorum_is_the_least_that_bounds_the_holders() {
        for n in 1..=9_usize {
            for permits in 1..=12_u32 {
                let q = bounding_quorum(n, permits);
                let p = permits as usize;
                assert!(q <= n, "n={n} permits={permits}: q={q}");
                assert!(
                    (p + 1) * q > n * p,
                    "n={n} permits={permits}: {q} lets in one more"
                );
                assert!(
                    (p + 1) * (q - 1) <= n * p,
                    "n={n} permits={permits}: {q} is not the least"
                );
            }
            assert_eq!(bounding_quorum(n, 1), n / 2 + 1);
        }
        assert_eq!(bounding_quorum(3, 2), 3);
        assert_eq!(bounding_quorum(5, 2), 4);
        assert_eq!(bounding_quorum(5, 4), 5);
    }
}
