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
            self.instance.unmark_kept(&place.channel);
            let places = Arc::clone(self);
            tokio::spawn(async move { places.give_up(place).await });
        }
    }

    /// The place kept on the line of `lock`, taken over by an acquisition.
    pub(crate) fn resume(&self, lock: &str) -> Option<KeptPlace> {
        let place = lock_map(&self.kept).places.remove(lock)?;
        self.instance.unmark_kept(&place.channel);
        // Asked again within half a place, as after a refused attempt.
        let ask_by = place.kept_at + QUEUE_PLACE / 2;
        Some(KeptPlace {
            owner: place.next.owner,
            ttl: place.next.ttl,
            retry_after: ask_by.saturating_duration_since(Instant::now()),
        })
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
