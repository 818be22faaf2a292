//! For backend authors: the pieces a [`DistributedLock`](crate::DistributedLock)
//! implementation is built from. Applications never need this module.
//!
//! * Declaring a backend: a [`Driver`] (name, URL schemes, connect function)
//!   that `lockkit::connect` and `lockkit::Registry` find it by.
//! * Two engines that turn a few primitive operations into a full lock with
//!   the shared wait policy, a per-name local FIFO, tracing and cancellation
//!   safety:
//!   - [`LeaseLock`] over a [`LeaseBackend`], for servers that keep leases
//!     with an expiry (Redis, Redlock, SQL lease rows, memory): one attempt,
//!     its holder's remaining lease, release notifications, local hand-over;
//!   - [`QueuedLock`] over a [`QueueBackend`], for servers that queue the
//!     waiters themselves (ZooKeeper, SQL session locks).
//! * The holding side: [`Lease`] (extend and release on the server), which
//!   [`LockGuard::new`](crate::LockGuard::new) wraps with the watchdog, and a
//!   [`LossNotifier`] for losses the backend notices itself.
//! * The wait policy on its own ([`Waiter`], [`Attempt`],
//!   [`acquire_by_attempts`]) for backends that write `acquire` by hand.
//! * Plumbing: release notifications ([`NotifyHub`], [`ReleaseWatch`]), the
//!   local queue ([`LocalQueue`]), per-thread deferred spawns
//!   ([`spawn_at`]), owner tokens ([`OwnerToken`]) and the holder identity
//!   stored beside them ([`stored_owner`], [`holder_of`]), the acquire span
//!   ([`traced_acquire`]), connecting to a server that is still starting
//!   ([`connect_retrying`]), and URL helpers ([`MultiHostUrl`], [`host_list`],
//!   [`timeout_param`], [`bool_param`], [`check_timeout`], [`redact_url`]).
//!
//! The conformance suite (the `lockkit-conformance` crate) checks a new
//! backend against the contract every built-in backend keeps.
//!
//! # Stability
//!
//! This module is far less stable than the application API
//! ([`DistributedLock`](crate::DistributedLock), [`LockOptions`](crate::LockOptions),
//! [`LockGuard`](crate::LockGuard), [`LockError`](crate::LockError)): it
//! follows the built-in backends' needs, and while lockkit is 0.x any minor
//! release may change it (the changelog says how). So may the trait's
//! implementor hooks, [`attempt`](crate::DistributedLock::attempt) and
//! [`watch_releases`](crate::DistributedLock::watch_releases). A backend
//! outside this workspace should pin lockkit's minor version.

mod connect;
pub(crate) mod deferred;
mod driver;
pub(crate) mod lease;
pub(crate) mod local_queue;
pub(crate) mod notify;
mod queued;
pub(crate) mod token;
pub(crate) mod trace;
pub(crate) mod url;
pub(crate) mod wait;

pub use crate::guard::{Lease, LossNotifier};
pub use crate::memory::{HolderInfo, MEMORY_CAPABILITIES, MemoryBackend, MemoryKey};
pub use crate::name::validate_name;
pub use crate::options::{check_ttl, clock_drift};
pub use connect::{CONNECT_BACKOFF, connect_retrying};
pub use deferred::{ScheduledSpawn, spawn_at};
pub use driver::{ConnectFn, ConnectFuture, Driver, boxed_connect};
pub use lease::{Handover, KeptPlace, LeaseBackend, LeaseLock, MAX_LOCAL_PASSES, Turn};
pub use local_queue::{Baton, LocalHandle, LocalQueue, LocalSlot};
pub use notify::{NotifyHub, ReleaseWatch};
pub use queued::{QueueBackend, QueuedLock, Request};
pub use token::{HOLDER_SEPARATOR, OwnerToken, holder_of, stored_owner};
pub use trace::traced_acquire;
pub use url::{
    MAX_TIMEOUT_PARAM, MultiHostUrl, bool_param, check_timeout, host_list, redact_url,
    timeout_param,
};
pub use wait::{Attempt, DEADLINE_GRACE, Intent, Waiter, acquire_by_attempts};
