#![doc = include_str!("../README.md")]

mod backoff;
mod capabilities;
mod deferred;
mod error;
mod fencing;
mod guard;
mod lease;
mod local_queue;
mod lock;
mod memory;
mod name;
mod notify;
mod options;
mod redact;
mod status;
mod token;
mod trace;
mod url_param;
mod wait;

pub use backoff::{Backoff, Delays};
pub use capabilities::{Capabilities, ReleaseOnCrash};
pub use deferred::{ScheduledSpawn, spawn_at};
pub use error::{BoxError, LockError, Result};
pub use fencing::FencingToken;
pub use guard::{Lease, LockGuard, LossNotifier, LostReason};
pub use lease::{Handover, LeaseBackend, LeaseLock, MAX_LOCAL_PASSES};
pub use local_queue::{Baton, LocalHandle, LocalQueue, LocalSlot};
pub use lock::{DistributedLock, DynDistributedLock};
pub use memory::{HolderInfo, MEMORY_CAPABILITIES, MemoryBackend, MemoryLock, MemoryStore};
pub use name::{MAX_NAME_LEN, validate_name};
pub use notify::{NotifyHub, ReleaseWatch};
pub use options::{LockOptions, MAX_DURATION, MIN_TTL, Wait, check_ttl, clock_drift};
pub use redact::redact_url;
pub use status::LockStatus;
pub use token::OwnerToken;
pub use trace::traced_acquire;
pub use url_param::{MAX_TIMEOUT_PARAM, MultiHostUrl, host_list, timeout_param};
pub use wait::{Attempt, DEADLINE_GRACE, Waiter, acquire_by_attempts};

/// Re-exported so that backends implementing the traits use the same version.
pub use async_trait::async_trait;
