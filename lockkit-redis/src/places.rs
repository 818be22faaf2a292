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
//! kept (it leaves the line). A client that went away gives nothing up: the
//! release that comes to its place finds nobody listening on its turn
//! channel and goes on to the next in line.

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
use crate::notifications::KeptTurn;
use crate::scripts::Release;

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

/// The turn a kept place is to grant: a lease of `ttl` for `owner`
/// (`stored` as the lock key holds it).
pub(crate) struct NextTurn {
    pub(crate) owner: OwnerToken,
    pub(crate) stored: String,
    pub(crate) ttl: Duration,
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
        self.instance.mark_kept(channel.clone(), turn);
        let place = Place {
            keys: keys.clone(),
            channel,
            next,
            fencing,
            kept_at: now,
            _watch: watch,
        };
        let old = {
            let mut kept = lock_map(&self.kept);
            // Not expected (one release of a name at a time per client); a
            // place replaced is left to its turn.
            kept.places.insert(keys.lock.clone(), place);
            kept.sweep_at.get_or_insert(now + QUEUE_PLACE);
            kept.sweep(now)
        };
        for place in old {
            self.spawn_give_up(place);
        }
    }

    /// The place kept on the line of `lock`, taken over by an acquisition.
    pub(crate) fn resume(&self, lock: &str) -> Option<KeptPlace> {
        let place = lock_map(&self.kept).places.remove(lock)?;
        // Its turn came just now, and the keeper found the place gone:
        // asked again at once (the turn's message may have come before the
        // acquisition watched for it).
        let came = !self.instance.unmark_kept(&place.channel);
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

    /// Whether a place is kept on the line of `lock`.
    fn is_kept(&self, lock: &str) -> bool {
        lock_map(&self.kept).places.contains_key(lock)
    }

    /// Gives up the place kept on the line of `lock`, if any, in the
    /// background.
    fn give_up_kept(self: &Arc<Self>, lock: &str) {
        let place = lock_map(&self.kept).places.remove(lock);
        if let Some(place) = place {
            self.spawn_give_up(place);
        }
    }

    fn spawn_give_up(self: &Arc<Self>, place: Place) {
        self.instance.unmark_kept(&place.channel);
        let places = Arc::clone(self);
        tokio::spawn(async move { places.give_up(place).await });
    }

    /// The keeper: gives up each place whose turn came before an
    /// acquisition took it over. It ends with the client (the last
    /// `Places` dropped).
    async fn keeper(places: Weak<Places>, mut told: mpsc::UnboundedReceiver<String>) {
        while let Some(lock) = told.recv().await {
            let Some(places) = places.upgrade() else {
                return;
            };
            let place = lock_map(&places.kept).places.remove(&lock);
            if let Some(place) = place {
                places.give_up(place).await;
            }
        }
    }

    /// Passes on a turn that came to `place` (the lock is its owner's, or
    /// reserved for this client), or takes the place out of the line.
    async fn give_up(&self, place: Place) {
        let Place {
            keys,
            next,
            fencing,
            ..
        } = place;
        if let Err(error) = self
            .instance
            .release(&keys, &next.stored, fencing, Release::Grant)
            .await
        {
            tracing::debug!(lock.key = %keys.lock, %error,
                "could not give up a kept place in line; its turn ends with its reservation or lease");
        }
    }
}

/// The places in line kept on one Redis server for a client of several
/// (Redlock): what [`RedisBackend`](crate::RedisBackend) keeps for its one
/// server, by instance. A release of such a client that hands the lock to
/// the next in line also keeps the client's place there, in the same
/// script, at a place in time the client gives (the same on every
/// instance, as [`Waiting::Since`](crate::Waiting::Since) places are); its
/// turn reserves the lock for the client, as every turn of such a line
/// does. A place that no acquisition resumes is given up when its turn
/// comes, as on one server (see [`RedisBackend`](crate::RedisBackend)).
#[derive(Clone, Debug)]
pub struct KeptPlaces(Arc<Places>);

impl KeptPlaces {
    /// The places kept on `instance`.
    pub fn new(instance: RedisInstance) -> KeptPlaces {
        KeptPlaces(Arc::new(Places::new(instance)))
    }

    /// Ends `owner`'s exclusive holding `key` (without fencing tokens), as
    /// [`release_holding`](RedisInstance::release_holding) with
    /// [`Release::Grant`] does; where that hands the lock to the next client
    /// in line, and this client waited in that line before (its turn
    /// channel is still subscribed), its place is kept at `place` (µs since
    /// the Unix epoch, by this client's clock) for a next acquisition
    /// ([`resume`](Self::resume)) whose owner is `next` and whose lease is
    /// `ttl`. Returns whether the holding was released.
    pub async fn release_keeping_place(
        &self,
        key: &RedisKey,
        owner: &str,
        next: &OwnerToken,
        ttl: Duration,
        place: u64,
    ) -> lockkit_core::Result<bool> {
        let instance = &self.0.instance;
        let watch = match key {
            RedisKey::Exclusive(keys) => instance
                .live_turn_watch(keys)
                .filter(ReleaseWatch::tells_turns)
                .map(|watch| (keys, watch)),
            _ => None,
        };
        let Some((keys, watch)) = watch else {
            return instance
                .release_holding(key, owner, false, Release::Grant)
                .await;
        };
        let stored = key.stored(next.as_str()).into_owned();
        let (released, kept) = instance
            .release_keeping_place(keys, &key.stored(owner), false, &stored, ttl, Some(place))
            .await?;
        if kept {
            let next = NextTurn {
                owner: next.clone(),
                stored,
                ttl,
            };
            self.0.keep(keys, next, false, watch);
        }
        Ok(released)
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
    /// Unmarks the turn channels of the places still kept.
    fn drop(&mut self) {
        for place in lock_map(&self.kept).places.values() {
            self.instance.unmark_kept(&place.channel);
        }
    }
}

impl fmt::Debug for Places {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Places")
            .field("kept", &lock_map(&self.kept).places.len())
            .finish()
    }
}

fn lock_map(kept: &Mutex<Kept>) -> std::sync::MutexGuard<'_, Kept> {
    kept.lock().unwrap_or_else(|p| p.into_inner())
}
