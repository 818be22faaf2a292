//! The in-process backend (`memory://`): full lock semantics without a server.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::lease::{Handover, LeaseBackend, LeaseLock};
use crate::backend::notify::{NotifyHub, ReleaseWatch};
use crate::backend::token::OwnerToken;
use crate::backend::wait::Attempt;
use crate::backend::{ConnectFuture, Driver, boxed_connect};
use crate::capabilities::{Capabilities, ReleaseOnCrash};
use crate::error::{LockError, Result};
use crate::fencing::FencingToken;
use crate::name::validate_name;
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
#[derive(Debug)]
pub struct MemoryStore {
    state: Mutex<State>,
    hub: NotifyHub,
    available: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    leases: HashMap<String, Held>,
    fences: HashMap<String, u64>,
}

impl State {
    /// Draws the next fencing token of `name`.
    fn next_fence(&mut self, name: &str) -> FencingToken {
        let fence = self.fences.entry(name.to_owned()).or_insert(0);
        *fence += 1;
        FencingToken::new(*fence)
    }
}

#[derive(Debug)]
struct Held {
    owner: OwnerToken,
    expires_at: Instant,
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
            hub: NotifyHub::new(),
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
    }

    /// Deletes the lease on `name` behind its holder's back (as an operator
    /// would); true if there was one.
    pub fn revoke(&self, name: &str) -> bool {
        let removed = self.state().leases.remove(name).is_some();
        if removed {
            self.hub.notify(name);
        }
        removed
    }

    /// The current holder of `name`, if its lease has not expired.
    pub fn holder(&self, name: &str) -> Option<HolderInfo> {
        let now = Instant::now();
        let state = self.state();
        let held = state.leases.get(name).filter(|h| h.expires_at > now)?;
        Some(HolderInfo {
            owner: held.owner.as_str().to_owned(),
            remaining: held.expires_at - now,
            fencing_token: FencingToken::new(state.fences.get(name).copied().unwrap_or(0)),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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
    .with_fencing(true)
    .with_notified_wait(true);

#[async_trait::async_trait]
impl LeaseBackend for MemoryBackend {
    /// The name itself.
    type Key = String;

    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    fn key(&self, name: &str) -> Result<String> {
        validate_name(name)?;
        Ok(name.to_owned())
    }

    fn capabilities(&self) -> Capabilities {
        MEMORY_CAPABILITIES
    }

    async fn try_lock(
        &self,
        name: &String,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt<Option<FencingToken>>> {
        self.store.check_available()?;
        let now = Instant::now();
        let mut state = self.store.state();
        if let Some(held) = state.leases.get(name)
            && held.expires_at > now
        {
            return Ok(Attempt::Busy {
                retry_after: Some(held.expires_at - now),
            });
        }
        state.leases.insert(
            name.clone(),
            Held {
                owner: owner.clone(),
                expires_at: now + ttl,
            },
        );
        Ok(Attempt::Acquired(Some(state.next_fence(name))))
    }

    async fn extend(&self, name: &String, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.store.check_available()?;
        let now = Instant::now();
        let mut state = self.store.state();
        match state.leases.get_mut(name) {
            Some(held) if held.owner == *owner && held.expires_at > now => {
                held.expires_at = now + ttl;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release(&self, name: &String, owner: &OwnerToken) -> Result<bool> {
        self.store.check_available()?;
        let now = Instant::now();
        let released = {
            let mut state = self.store.state();
            match state.leases.get(name) {
                Some(held) if held.owner == *owner => {
                    let live = held.expires_at > now;
                    state.leases.remove(name);
                    live
                }
                _ => false,
            }
        };
        if released {
            self.store.hub.notify(name);
        }
        Ok(released)
    }

    fn can_hand_over(&self) -> bool {
        true
    }

    async fn hand_over(
        &self,
        name: &String,
        from: &OwnerToken,
        to: &OwnerToken,
        ttl: Duration,
    ) -> Result<Handover> {
        self.store.check_available()?;
        let now = Instant::now();
        let mut state = self.store.state();
        match state.leases.get_mut(name) {
            Some(held) if held.owner == *from && held.expires_at > now => {
                held.owner = to.clone();
                held.expires_at = now + ttl;
                Ok(Handover::Passed(Some(state.next_fence(name))))
            }
            _ => Ok(Handover::NotOurs),
        }
    }

    async fn status(&self, name: &String) -> Result<LockStatus> {
        self.store.check_available()?;
        Ok(match self.store.holder(name) {
            Some(holder) => LockStatus::held()
                .with_fencing_token(Some(holder.fencing_token))
                .with_remaining(Some(holder.remaining)),
            None => LockStatus::free(),
        })
    }

    async fn watch(&self, name: &String) -> Result<ReleaseWatch> {
        self.store.check_available()?;
        Ok(self.store.hub.watch(name).0)
    }
}
