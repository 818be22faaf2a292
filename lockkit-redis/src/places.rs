//! Places in line that a release kept for this client's next acquisition of
//! the same lock (see `RELEASE` in the scripts, and
//! [`LeaseBackend::release_keeping_place`](lockkit_core::backend::LeaseBackend::release_keeping_place)).
//!
//! A client that releases a lock another client waits for, and asks for it
//! again at once (a worker's loop), would send a second script to take its
//! place at the end of the line. The release takes that place in the same
//! step instead, and the next acquisition takes the place over and waits
//! for its turn without asking: in such a loop, a place costs this client
//! nothing but a map entry.
//!
//! A place that no acquisition took over when its turn comes is given up
//! then: the first message on its turn channel (the lease its turn granted,
//! or a reservation) goes to the client's keeper task, which releases that
//! turn to the next in line at once (one release). A place older than
//! [`QUEUE_PLACE`] that never got its turn is given up by the next place
//! kept (it leaves the line). A turn whose message came before its place
//! was marked kept is told to the keeper when it is marked. A client that
//! is dropped gives its places up in the background (its subscriptions may
//! outlive it, and a turn granted to one of its places would hold the lock
//! until the lease ran out); a client that went away without that finds
//! nobody listening on its turn channel: the release that comes to its
//! place goes on to the next in line.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use lockkit_core::backend::{KeptPlace, OwnerToken, ReleaseWatch};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::holding::RedisKey;
use crate::instance::RedisInstance;
use crate::keys::{Keys, QUEUE_PLACE};
use crate::notifications::{self, KeptTurn};
use crate::scripts::Release;
use crate::turns::NextTurn;

/// The places kept by one client, by lock key: at most one per lock (a
/// client's tasks queue for a name among themselves first).
pub(crate) struct Places {
    instance: RedisInstance,
    kept: Mutex<Kept>,
    /// Where turns that came to places nobody took over are told: the
    /// keeper task's, started with the first place.
    tell: OnceLock<mpsc::UnboundedSender<String>>,
}

/// The places, and when the oldest may have outlived [`QUEUE_PLACE`].
#[derive(Default)]
struct Kept {
    places: HashMap<String, Place>,
    sweep_at: Option<Instant>,
}

/// The turn of `owner`'s exclusive holding of `key` that a kept place is
/// to grant (see [`NextTurn`]).
pub(crate) fn next_turn(
    key: &RedisKey,
    owner: OwnerToken,
    ttl: Duration,
    stamp: u64,
    place: Option<u64>,
) -> NextTurn {
    let stored = key.stored(owner.as_str()).into_owned();
    NextTurn {
        owner,
        stored,
        ttl,
        stamp,
        place,
    }
}

/// One kept place.
struct Place {
    keys: Keys,
    /// This client's turn channel on the place's line.
    channel: String,
    next: NextTurn,
    fencing: bool,
    kept_at: Instant,
    /// The turn's watch: its subscriptions stay, and a turn that comes just
    /// before an acquisition takes the place over stays in the mailbox.
    _watch: ReleaseWatch,
}

impl Places {
    pub(crate) fn new(instance: RedisInstance) -> Places {
        Places {
            instance,
            kept: Mutex::default(),
            tell: OnceLock::new(),
        }
    }

    /// Records the place a release kept on `keys`' line, whose turn is
    /// `next` (its holding drawing fencing tokens when `fencing`); `watch`
    /// (the turn's watch, live) keeps its turn channel subscribed until
    /// the place is taken over or given up.
    pub(crate) fn keep(
        self: &Arc<Self>,
        keys: &Keys,
        next: NextTurn,
        fencing: bool,
        watch: ReleaseWatch,
    ) {
        let tell = self.tell.get_or_init(|| {
            let (tell, told) = mpsc::unbounded_channel();
            tokio::spawn(Places::keeper(Arc::downgrade(self), told));
            tell
        });
        let now = Instant::now();
        let channel = self.instance.turn_channel(keys);
        let turn = KeptTurn {
            lock: keys.lock.clone(),
            tell: tell.clone(),
        };
        let place = Place {
            keys: keys.clone(),
            channel: channel.clone(),
            next,
            fencing,
            kept_at: now,
            _watch: watch,
        };
        let old = {
            let mut kept = notifications::lock(&self.kept);
            // Not expected (one release of a name at a time per client); a
            // place replaced is left to its turn.
            kept.places.insert(keys.lock.clone(), place);
            // Marked with the place in the map (a turn that came already is
            // told now), and both taken out together (see `resume`): the
            // keeper finds every place whose turn it is told of, unless an
            // acquisition took that place over.
            self.instance.mark_kept(channel, turn);
            kept.sweep_at.get_or_insert(now + QUEUE_PLACE);
            kept.sweep(now)
        };
        for place in old {
            self.spawn_give_up(place);
        }
    }

    /// The place kept on the line of `lock`, taken over by an acquisition.
    pub(crate) fn resume(&self, lock: &str) -> Option<KeptPlace> {
        // Its turn came just now, and the keeper found the place gone:
        // asked again at once (the turn's message may have come before the
        // acquisition watched for it).
        let (place, came) = {
            let mut kept = notifications::lock(&self.kept);
            let place = kept.places.remove(lock)?;
            let came = !self.instance.unmark_kept(&place.channel);
            (place, came)
        };
        // Else asked again within half a place, as after a refused attempt.
        let ask_by = place.kept_at + QUEUE_PLACE / 2;
        Some(KeptPlace {
            owner: place.next.owner,
            ttl: place.next.ttl,
            retry_after: if came {
                Duration::ZERO
            } else {
                ask_by.saturating_duration_since(Instant::now())
            },
        })
    }

    /// Ends `owner`'s exclusive holding `key` as
    /// [`release_holding`](RedisInstance::release_holding) with
    /// [`Release::Grant`] does; where that hands the lock to the next
    /// client in line, and this client's turn channel there is subscribed
    /// (it waited in that line before), its place is kept for a next
    /// acquisition ([`resume`](Self::resume)), whose turn is `next` (see
    /// [`RedisInstance::release_keeping_place`]). Returns whether the
    /// holding was released.
    pub(crate) async fn release_keeping_place(
        self: &Arc<Self>,
        key: &RedisKey,
        owner: &str,
        fencing: bool,
        next: NextTurn,
        keeping: Option<&Keeping>,
    ) -> lockkit_core::Result<bool> {
        let watch = match key {
            RedisKey::Exclusive(keys) => self
                .instance
                .live_turn_watch(keys)
                .filter(ReleaseWatch::tells_turns)
                .map(|watch| (keys, watch)),
            _ => None,
        };
        let Some((keys, watch)) = watch else {
            return self
                .instance
                .release_holding(key, owner, fencing, Release::Grant)
                .await;
        };
        // A message left on the turn channel is of an earlier turn: out,
        // so that one there once the place is kept is its turn's (see
        // `keep`).
        self.instance.forget_turn_of(keys);
        let (released, kept) = self
            .instance
            .release_keeping_place(keys, &key.stored(owner), fencing, &next)
            .await?;
        if kept {
            match keeping.map(|keeping| notifications::lock(&keeping.closed)) {
                // Late: the release has returned, and its next acquisition
                // may have looked for the places already.
                Some(closed) if *closed => {
                    drop(closed);
                    let (instance, keys) = (self.instance.clone(), keys.clone());
                    tokio::spawn(
                        async move { give_up_turn(&instance, &keys, &next, fencing).await },
                    );
                }
                // Kept, with the window (if any) held open until the place
                // is in the map: a release that returns waits for it (see
                // `Keeping::close`).
                _open => self.keep(keys, next, fencing, watch),
            }
        }
        Ok(released)
    }

    /// Whether a place is kept on the line of `lock`.
    fn is_kept(&self, lock: &str) -> bool {
        notifications::lock(&self.kept).places.contains_key(lock)
    }

    /// Gives up the place kept on the line of `lock`, if any, in the
    /// background.
    fn give_up_kept(&self, lock: &str) {
        let place = notifications::lock(&self.kept).places.remove(lock);
        if let Some(place) = place {
            self.spawn_give_up(place);
        }
    }

    fn spawn_give_up(&self, place: Place) {
        self.instance.unmark_kept(&place.channel);
        let instance = self.instance.clone();
        tokio::spawn(async move { place.give_up(&instance).await });
    }

    /// The keeper: gives up each place whose turn came before an
    /// acquisition took it over. It ends with the client (the last
    /// `Places` dropped).
    async fn keeper(places: Weak<Places>, mut told: mpsc::UnboundedReceiver<String>) {
        while let Some(lock) = told.recv().await {
            let Some(places) = places.upgrade() else {
                return;
            };
            // The turn's message goes with the place, in one step that an
            // acquisition resuming the place does not split: an
            // acquisition that found the place gone does not count the
            // turn this gives up (Redlock counts each instance's).
            let place = {
                let mut kept = notifications::lock(&places.kept);
                let place = kept.places.remove(&lock);
                if let Some(place) = &place {
                    places.instance.forget_turn_of(&place.keys);
                }
                place
            };
            if let Some(place) = place {
                place.give_up(&places.instance).await;
            }
        }
    }
}

impl Place {
    /// Passes on a turn that came to this place (the lock is its owner's,
    /// or reserved for this client), or takes the place out of the line.
    async fn give_up(self, instance: &RedisInstance) {
        give_up_turn(instance, &self.keys, &self.next, self.fencing).await;
    }
}

/// Passes on the turn `next` of a place kept on `keys`' line (the lock is
/// its owner's, or reserved for this client), or takes the place out of
/// the line.
async fn give_up_turn(instance: &RedisInstance, keys: &Keys, next: &NextTurn, fencing: bool) {
    if let Err(error) = instance
        .release(keys, &next.stored, fencing, Release::Grant)
        .await
    {
        tracing::debug!(lock.key = %keys.lock, %error,
            "could not give up a kept place in line; its turn ends with its reservation or lease");
    }
}

/// The places in line kept on one Redis server for a client of several
/// (Redlock): what [`RedisBackend`](crate::RedisBackend) keeps for its one
/// server, by instance. A release of such a client that hands the lock to
/// the next in line also keeps the client's place there, in the same
/// script, at a place in time the client gives (the same on every
/// instance, as [`Waiting::Since`](crate::Waiting::Since) places are), with
/// the record of the turn it is to grant, as a waiting attempt's
/// ([`Waiting::TurnSince`](crate::Waiting::TurnSince)). A place that no acquisition resumes is given up when its turn
/// comes, as on one server (see [`RedisBackend`](crate::RedisBackend)).
#[derive(Clone, Debug)]
pub struct KeptPlaces(Arc<Places>);

impl KeptPlaces {
    /// The places kept on `instance`.
    pub fn new(instance: RedisInstance) -> KeptPlaces {
        KeptPlaces(Arc::new(Places::new(instance)))
    }

    /// Ends `owner`'s exclusive holding `key` (without fencing tokens) as
    /// [`release_holding`](RedisInstance::release_holding) with
    /// [`Release::Grant`] does; where that hands the lock to the next client
    /// in line, and this client waited in that line before (its turn
    /// channel is still subscribed), its place is kept where `keeping`
    /// says, for a next acquisition ([`resume`](Self::resume)) whose owner
    /// is `next` and whose lease is `ttl`; unless `keeping` is closed by
    /// then, when the place is given up at once. Returns whether the
    /// holding was released.
    pub async fn release_keeping_place(
        &self,
        key: &RedisKey,
        owner: &str,
        next: &OwnerToken,
        ttl: Duration,
        keeping: &Keeping,
    ) -> lockkit_core::Result<bool> {
        let next = next_turn(key, next.clone(), ttl, keeping.stamp, Some(keeping.place));
        self.0
            .release_keeping_place(key, owner, false, next, Some(keeping))
            .await
    }

    /// Whether a place is kept for `key`.
    pub fn is_kept(&self, key: &RedisKey) -> bool {
        matches!(key, RedisKey::Exclusive(keys) if self.0.is_kept(&keys.lock))
    }

    /// The place kept for `key`, taken over by an acquisition: its owner,
    /// its lease, and when to ask again if no turn came by then (at once
    /// if its turn came just before).
    pub fn resume(&self, key: &RedisKey) -> Option<KeptPlace> {
        match key {
            RedisKey::Exclusive(keys) => self.0.resume(&keys.lock),
            _ => None,
        }
    }

    /// Gives up the place kept for `key`, if any (in the background): it
    /// leaves the line, or passes its turn on if the turn came.
    pub fn give_up(&self, key: &RedisKey) {
        if let RedisKey::Exclusive(keys) = key {
            self.0.give_up_kept(&keys.lock);
        }
    }
}

/// A release that keeps places on several servers (Redlock): where the
/// places go (`place`, µs since the Unix epoch by this client's clock, the
/// same on every server), the stamp their turns carry (see
/// [`turn_stamp`](crate::turn_stamp)), and until when it takes them: until
/// it returns, and its next acquisition may look for them
/// ([`close`](Self::close)). A server that answers later (one the release
/// did not wait for) has its place given up at once, so that no place is
/// kept that the acquisition did not take over.
#[derive(Clone, Debug)]
pub struct Keeping {
    place: u64,
    stamp: u64,
    closed: Arc<Mutex<bool>>,
}

impl Keeping {
    /// Places at `place`, whose turns carry `stamp`, taken until
    /// [`close`](Self::close).
    pub fn new(place: u64, stamp: u64) -> Keeping {
        Keeping {
            place,
            stamp,
            closed: Arc::default(),
        }
    }

    /// Ends the release: a place kept before this is in the map, and one
    /// kept after it is given up.
    pub fn close(&self) {
        *notifications::lock(&self.closed) = true;
    }
}

impl Kept {
    /// The places kept before `now` less [`QUEUE_PLACE`], taken out, when
    /// the oldest may be that old (checked at most once per
    /// [`QUEUE_PLACE`]).
    fn sweep(&mut self, now: Instant) -> Vec<Place> {
        if self.sweep_at.is_none_or(|at| now < at) {
            return Vec::new();
        }
        let old: Vec<_> = self
            .places
            .extract_if(|_, place| place.kept_at + QUEUE_PLACE <= now)
            .map(|(_, place)| place)
            .collect();
        self.sweep_at = self
            .places
            .values()
            .map(|place| place.kept_at + QUEUE_PLACE)
            .min();
        old
    }
}

impl Drop for Places {
    /// Gives up the places still kept, in the background (where a runtime
    /// runs): the client is going away, and its subscriptions may linger
    /// after it (a subscriber shared with other clients of the server, or
    /// one that closes when its last task ends), so that a release would
    /// grant such a place its turn, which nobody would pass on before its
    /// lease ran out. A place left (no runtime) is passed over once its
    /// client's subscriptions are gone.
    fn drop(&mut self) {
        let places: Vec<Place> = notifications::lock(&self.kept)
            .places
            .drain()
            .map(|(_, place)| place)
            .collect();
        let runtime = tokio::runtime::Handle::try_current().ok();
        for place in places {
            self.instance.unmark_kept(&place.channel);
            if let Some(runtime) = &runtime {
                let instance = self.instance.clone();
                runtime.spawn(async move { place.give_up(&instance).await });
            }
        }
    }
}

impl fmt::Debug for Places {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Places")
            .field("kept", &notifications::lock(&self.kept).places.len())
            .finish()
    }
}
