//! The in-process backend (`memory://`): full lock semantics without a server.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::lease::{Handover, LeaseBackend, LeaseLock};
use crate::backend::notify::{NotifyHub, ReleaseWatch};
use crate::backend::token::OwnerToken;
use crate::backend::wait::Attempt;
use crate::backend::wait::Intent;
use crate::backend::{ConnectFuture, Driver, boxed_connect};
use crate::capabilities::{Capabilities, ReleaseOnCrash};
use crate::error::{LockError, Result};
use crate::fencing::FencingToken;
use crate::name::validate_name;
use crate::options::LockKind;
use crate::status::LockStatus;

const BACKEND: &str = "memory";

/// A lock client on an in-process store: [`LeaseLock`] over [`MemoryBackend`].
///
/// It keeps every rule the networked backends keep — TTLs, owner tokens, fencing
/// tokens, release notifications — so it is a faithful stand-in in tests and
/// examples, and a real lock between tasks of one process.
pub type MemoryLock = LeaseLock<MemoryBackend>;

impl LeaseLock<MemoryBackend> {
    /// A client on the process-wide store that every `memory://` URL shares.
    pub fn shared() -> Self {
        LeaseLock::new(MemoryBackend::new(MemoryStore::global()))
    }

    /// A client on the given store.
    pub fn with_store(store: Arc<MemoryStore>) -> Self {
        LeaseLock::new(MemoryBackend::new(store))
    }

    /// Parses `memory://` (nothing else may follow the scheme) into a client on
    /// the process-wide store.
    pub fn from_url(url: &str) -> Result<Self> {
        if url == "memory://" || url == "memory:" {
            Ok(Self::shared())
        } else {
            Err(LockError::invalid_url(
                url,
                "memory:// takes no host, path or query",
            ))
        }
    }
}

/// The `memory://` driver: every client shares the process-wide store.
pub const MEMORY_DRIVER: Driver = Driver::new("memory", &["memory"], connect);

fn connect(url: &str) -> ConnectFuture<'_> {
    boxed_connect(async move { MemoryLock::from_url(url) })
}

/// Lease data of an in-process store. Cheap to share; several clients on one
/// store exclude each other like clients of one server.
///
/// A name takes memory only while it is held (or a writer waits on it):
/// fencing tokens come from one sequence of the whole store, so nothing of a
/// released name needs to stay.
#[derive(Debug)]
pub struct MemoryStore {
    state: Mutex<State>,
    /// The last fencing token drawn, for any name (drawn under `state`'s lock).
    fence: AtomicU64,
    /// Releases of reader-writer locks, by name.
    hub: NotifyHub,
    /// Releases of semaphore permits, by name (semaphores are a namespace
    /// of their own).
    permit_hub: NotifyHub,
    available: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    locks: HashMap<String, Holdings>,
    semaphores: HashMap<String, Holdings>,
    /// Attempts since the last sweep of holdings that ended without a release.
    since_sweep: u32,
}

/// How many attempts pass between two sweeps of expired holdings.
const SWEEP_EVERY: u32 = 1024;

impl State {
    fn map(&mut self, kind: LockKind) -> &mut HashMap<String, Holdings> {
        match kind {
            LockKind::Semaphore { .. } => &mut self.semaphores,
            _ => &mut self.locks,
        }
    }

    /// Forgets `key`'s name if nothing holds it any more.
    fn tidy(&mut self, key: &MemoryKey) {
        let map = self.map(key.kind);
        if map.get(&key.name).is_some_and(Holdings::is_empty) {
            map.remove(&key.name);
        }
    }

    /// Now and then, forgets every name whose holdings all expired.
    fn sweep_now_and_then(&mut self, now: Instant) {
        self.since_sweep += 1;
        if self.since_sweep < SWEEP_EVERY {
            return;
        }
        self.since_sweep = 0;
        for map in [&mut self.locks, &mut self.semaphores] {
            map.retain(|_, h| {
                h.purge(now);
                !h.is_empty()
            });
        }
    }
}

/// The holdings of one reader-writer lock, or one semaphore (whose permits
/// are its `shared` holdings).
#[derive(Debug, Default)]
struct Holdings {
    exclusive: Option<Held>,
    shared: Vec<Held>,
    /// An exclusive acquirer waiting for the readers to leave: new readers
    /// wait behind it.
    waiting_writer: Option<Held>,
    /// The last fencing token drawn for the name (0: none yet).
    fence: u64,
}

impl Holdings {
    /// Forgets whatever has expired by `now`.
    fn purge(&mut self, now: Instant) {
        if self.exclusive.as_ref().is_some_and(|h| h.expires_at <= now) {
            self.exclusive = None;
        }
        if self
            .waiting_writer
            .as_ref()
            .is_some_and(|h| h.expires_at <= now)
        {
            self.waiting_writer = None;
        }
        self.shared.retain(|h| h.expires_at > now);
    }

    /// Draws the next fencing token from the store's sequence.
    fn next_fence(&mut self, sequence: &AtomicU64) -> FencingToken {
        self.fence = sequence.fetch_add(1, Ordering::SeqCst) + 1;
        FencingToken::new(self.fence)
    }

    /// Nothing holds or waits here.
    fn is_empty(&self) -> bool {
        self.exclusive.is_none() && self.shared.is_empty() && self.waiting_writer.is_none()
    }

    /// The holding of `owner` of `kind`, if live.
    fn held_mut(&mut self, kind: LockKind, owner: &OwnerToken) -> Option<&mut Held> {
        match kind {
            LockKind::Exclusive => self.exclusive.as_mut().filter(|h| h.owner == *owner),
            _ => self.shared.iter_mut().find(|h| h.owner == *owner),
        }
    }

    /// How long until the first shared holding ends, if any.
    fn first_shared_expiry(&self, now: Instant) -> Option<Duration> {
        self.shared.iter().map(|h| h.expires_at - now).min()
    }

    fn status(&self, now: Instant) -> LockStatus {
        let remaining = |h: &Held| Some(h.expires_at - now);
        let fence = Some(FencingToken::new(self.fence));
        let holder = |h: &Held| h.holder.as_deref().map(str::to_owned);
        if let Some(held) = &self.exclusive {
            LockStatus::held()
                .with_fencing_token(fence)
                .with_remaining(remaining(held))
                .with_holders(Some(1))
                .with_holder(holder(held))
        } else if !self.shared.is_empty() {
            let last = self.shared.iter().max_by_key(|h| h.expires_at);
            LockStatus::held()
                .with_fencing_token(fence)
                .with_remaining(last.and_then(remaining))
                .with_holders(Some(self.shared.len()))
                .with_holder(self.shared.iter().find_map(holder))
        } else {
            LockStatus::free()
        }
    }
}

#[derive(Debug)]
struct Held {
    owner: OwnerToken,
    expires_at: Instant,
    /// The holder's identity, if it gave one.
    holder: Option<Arc<str>>,
}

/// What a store knows about a held lock; see [`MemoryStore::holder`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The holder's owner token.
    pub owner: String,
    /// How long the lease still runs.
    pub remaining: Duration,
    /// The last fencing token handed out for the name.
    pub fencing_token: FencingToken,
}

static GLOBAL: LazyLock<Arc<MemoryStore>> = LazyLock::new(MemoryStore::new);

impl MemoryStore {
    /// A new, empty store.
    pub fn new() -> Arc<Self> {
        Arc::new(MemoryStore {
            state: Mutex::default(),
            fence: AtomicU64::new(0),
            hub: NotifyHub::new(),
            permit_hub: NotifyHub::new(),
            available: AtomicBool::new(true),
        })
    }

    /// The process-wide store of `memory://`.
    pub fn global() -> Arc<Self> {
        GLOBAL.clone()
    }

    /// Fault injection: while an outage is on, every operation fails with
    /// `LockError::Unavailable`, as a dead server would make it.
    pub fn outage(&self, on: bool) {
        self.available.store(!on, Ordering::SeqCst);
        // Waiters should notice at once rather than at their next backoff step.
        self.hub.notify_all();
        self.permit_hub.notify_all();
    }

    /// Deletes every holding of the lock `name` (the writer's and the
    /// readers') and of the semaphore `name` behind their holders' backs (as
    /// an operator would); true if there was one.
    pub fn revoke(&self, name: &str) -> bool {
        let (lock, semaphore) = {
            let mut state = self.state();
            let take = |holdings: Option<&mut Holdings>| {
                holdings.is_some_and(|h| {
                    let had = h.exclusive.take().is_some() | !h.shared.is_empty();
                    h.shared.clear();
                    had
                })
            };
            (
                take(state.locks.get_mut(name)),
                take(state.semaphores.get_mut(name)),
            )
        };
        if lock {
            self.hub.notify(name);
        }
        if semaphore {
            self.permit_hub.notify(name);
        }
        lock || semaphore
    }

    /// How many lock and semaphore names whose holdings the store keeps
    /// start with `prefix` (a released name is forgotten at once, an
    /// expired one by a sweep every 1 024 attempts).
    pub fn names_kept(&self, prefix: &str) -> usize {
        let state = self.state();
        [&state.locks, &state.semaphores]
            .iter()
            .map(|map| map.keys().filter(|name| name.starts_with(prefix)).count())
            .sum()
    }

    /// The current exclusive holder of `name`, if its lease has not expired.
    pub fn holder(&self, name: &str) -> Option<HolderInfo> {
        let now = Instant::now();
        let state = self.state();
        let holdings = state.locks.get(name)?;
        let held = holdings.exclusive.as_ref().filter(|h| h.expires_at > now)?;
        Some(HolderInfo {
            owner: held.owner.as_str().to_owned(),
            remaining: held.expires_at - now,
            fencing_token: FencingToken::new(holdings.fence),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The holdings of `key`'s lock or semaphore, purged of what expired by
    /// `now`; `None` if nothing was ever held there.
    fn holdings<'s>(
        state: &'s mut State,
        key: &MemoryKey,
        now: Instant,
    ) -> Option<&'s mut Holdings> {
        let holdings = state.map(key.kind).get_mut(&key.name)?;
        holdings.purge(now);
        Some(holdings)
    }

    /// The holdings of `key`'s lock or semaphore, made if new.
    fn holdings_entry<'s>(state: &'s mut State, key: &MemoryKey, now: Instant) -> &'s mut Holdings {
        state.sweep_now_and_then(now);
        let map = state.map(key.kind);
        if !map.contains_key(&key.name) {
            map.insert(key.name.clone(), Holdings::default());
        }
        let holdings = map.get_mut(&key.name).expect("inserted above");
        holdings.purge(now);
        holdings
    }

    fn notify(&self, key: &MemoryKey) {
        match key.kind {
            LockKind::Semaphore { .. } => self.permit_hub.notify(&key.name),
            _ => self.hub.notify(&key.name),
        };
    }

    fn check_available(&self) -> Result<()> {
        if self.available.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(LockError::unavailable(
                BACKEND,
                "the in-memory store is switched off (fault injection)",
            ))
        }
    }
}

/// A holding's place in a [`MemoryStore`]: the name, and which side of its
/// reader-writer lock or which semaphore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryKey {
    name: String,
    kind: LockKind,
    holder: Option<Arc<str>>,
}

/// The [`LeaseBackend`] of an in-process [`MemoryStore`].
#[derive(Debug, Clone)]
pub struct MemoryBackend {
    store: Arc<MemoryStore>,
}

impl MemoryBackend {
    /// A backend on `store`.
    pub fn new(store: Arc<MemoryStore>) -> Self {
        MemoryBackend { store }
    }

    /// The store.
    pub fn store(&self) -> &Arc<MemoryStore> {
        &self.store
    }
}

/// What the memory backend guarantees.
pub const MEMORY_CAPABILITIES: Capabilities = Capabilities::new(ReleaseOnCrash::Ttl)
    .with_server_bounds(true)
    .with_fencing(true)
    .with_notified_wait(true)
    .with_shared(true)
    .with_semaphore(true)
    .with_holder(true);

#[async_trait::async_trait]
impl LeaseBackend for MemoryBackend {
    type Key = MemoryKey;

    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    fn key(&self, name: &str, kind: LockKind) -> Result<MemoryKey> {
        validate_name(name)?;
        Ok(MemoryKey {
            name: name.to_owned(),
            kind,
            holder: None,
        })
    }

    fn with_holder(&self, key: MemoryKey, holder: &str) -> MemoryKey {
        MemoryKey {
            holder: Some(holder.into()),
            ..key
        }
    }

    fn capabilities(&self) -> Capabilities {
        MEMORY_CAPABILITIES
    }

    async fn try_lock(
        &self,
        key: &MemoryKey,
        owner: &OwnerToken,
        ttl: Duration,
        intent: Intent,
    ) -> Result<Attempt<Option<FencingToken>>> {
        self.store.check_available()?;
        let now = Instant::now();
        let mut state = self.store.state();
        let h = MemoryStore::holdings_entry(&mut state, key, now);
        let busy = |until: Option<Duration>| Ok(Attempt::Busy { retry_after: until });
        let held = Held {
            owner: owner.clone(),
            expires_at: now + ttl,
            holder: key.holder.clone(),
        };
        match key.kind {
            LockKind::Exclusive => {
                if let Some(writer) = &h.exclusive {
                    return busy(Some(writer.expires_at - now));
                }
                if !h.shared.is_empty() {
                    let readers_leave = h.first_shared_expiry(now);
                    if intent == Intent::Wait {
                        h.waiting_writer = Some(Held {
                            owner: owner.clone(),
                            expires_at: now + ttl,
                            holder: None,
                        });
                        return busy(readers_leave.map(|d| d.min(ttl / 2)));
                    }
                    return busy(readers_leave);
                }
                // A writer is granted: the record of a waiting one has done
                // its work. Its owner is that of an earlier attempt (each
                // attempt has its own), so it goes whoever left it; a writer
                // still waiting records itself again at its next attempt,
                // which the exclusive holding makes busy meanwhile.
                h.waiting_writer = None;
                h.exclusive = Some(held);
            }
            LockKind::Shared => {
                if let Some(writer) = h.exclusive.as_ref().or(h.waiting_writer.as_ref()) {
                    return busy(Some(writer.expires_at - now));
                }
                h.shared.push(held);
            }
            LockKind::Semaphore { permits } => {
                if h.shared.len() >= permits as usize {
                    return busy(h.first_shared_expiry(now));
                }
                h.shared.push(held);
            }
        }
        Ok(Attempt::Acquired(Some(h.next_fence(&self.store.fence))))
    }

    async fn extend(&self, key: &MemoryKey, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.store.check_available()?;
        let now = Instant::now();
        let mut state = self.store.state();
        let held =
            MemoryStore::holdings(&mut state, key, now).and_then(|h| h.held_mut(key.kind, owner));
        Ok(match held {
            Some(held) => {
                held.expires_at = now + ttl;
                true
            }
            None => false,
        })
    }

    async fn release(&self, key: &MemoryKey, owner: &OwnerToken) -> Result<bool> {
        self.store.check_available()?;
        let now = Instant::now();
        let (released, withdrawn) = {
            let mut state = self.store.state();
            let Some(h) = MemoryStore::holdings(&mut state, key, now) else {
                return Ok(false);
            };
            let released = match key.kind {
                LockKind::Exclusive => h.exclusive.take_if(|held| held.owner == *owner).is_some(),
                _ => {
                    let before = h.shared.len();
                    h.shared.retain(|held| held.owner != *owner);
                    h.shared.len() != before
                }
            };
            let withdrawn = key.kind == LockKind::Exclusive
                && h.waiting_writer
                    .take_if(|held| held.owner == *owner)
                    .is_some();
            state.tidy(key);
            (released, withdrawn)
        };
        if released || withdrawn {
            self.store.notify(key);
        }
        Ok(released)
    }

    /// Forgets the name once nothing holds it, and wakes its waiters.
    async fn purge(&self, key: &MemoryKey, _owner: &OwnerToken) -> Result<()> {
        self.store.check_available()?;
        let now = Instant::now();
        let mut state = self.store.state();
        if MemoryStore::holdings(&mut state, key, now).is_some() {
            state.tidy(key);
            drop(state);
            self.store.notify(key);
        }
        Ok(())
    }

    fn can_hand_over(&self) -> bool {
        true
    }

    async fn hand_over(
        &self,
        key: &MemoryKey,
        from: &OwnerToken,
        to: &OwnerToken,
        ttl: Duration,
    ) -> Result<Handover> {
        self.store.check_available()?;
        let now = Instant::now();
        let mut state = self.store.state();
        let Some(h) = MemoryStore::holdings(&mut state, key, now) else {
            return Ok(Handover::NotOurs);
        };
        match h.held_mut(key.kind, from) {
            Some(held) => {
                held.owner = to.clone();
                held.expires_at = now + ttl;
                Ok(Handover::Passed(Some(h.next_fence(&self.store.fence))))
            }
            None => Ok(Handover::NotOurs),
        }
    }

    async fn status(&self, key: &MemoryKey) -> Result<LockStatus> {
        self.store.check_available()?;
        let now = Instant::now();
        let mut state = self.store.state();
        Ok(MemoryStore::holdings(&mut state, key, now)
            .map_or_else(LockStatus::free, |h| h.status(now)))
    }

    async fn watch(&self, key: &MemoryKey) -> Result<ReleaseWatch> {
        self.store.check_available()?;
        let hub = match key.kind {
            LockKind::Semaphore { .. } => &self.store.permit_hub,
            _ => &self.store.hub,
        };
        Ok(hub.watch(&key.name).0)
    }
}
