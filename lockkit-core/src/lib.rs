#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backoff;
mod capabilities;
mod election;
mod error;
mod fencing;
mod guard;
mod lock;
mod lock_set;
mod lost;
mod memory;
mod name;
mod options;
mod sequencer;
mod status;

pub mod backend;
pub mod metrics;

pub use backoff::{Backoff, Delays};
pub use capabilities::{Capabilities, ReleaseOnCrash};
pub use election::{Election, Leadership};
pub use error::{BoxError, LockError, Result};
pub use fencing::FencingToken;
pub use guard::LockGuard;
pub use lock::{DistributedLock, DynDistributedLock};
pub use lock_set::acquire_all;
pub use lost::LostReason;
pub use memory::{MEMORY_DRIVER, MemoryLock, MemoryStore};
pub use name::MAX_NAME_LEN;
pub use options::{
    HoldBounds, LockKind, LockOptions, MAX_BOUND, MAX_DURATION, MAX_HOLDER_LEN, MIN_TTL, Wait,
};
pub use status::LockStatus;

/// Re-exported so that the attribute on a `DistributedLock` implementation
/// and the trait come from the same version.
pub use async_trait::async_trait;
