//! Distributed locks behind one object-safe async trait.
//!
//! lockkit puts Redis (one server, Cluster, Sentinel), Redlock, ZooKeeper,
//! etcd, PostgreSQL, MySQL/MariaDB and SQLite behind [`DistributedLock`], with
//! one wait, retry and timeout policy and one error type, so that an
//! application holds an `Arc<dyn DistributedLock>` and picks the backend by
//! URL. The [guide] explains each backend and what breaks its guarantees; this
//! page is the map of the API.
//!
//! [guide]: https://github.com/lockkit/lockkit/blob/main/docs/guide/README.md
//!
//! ```
//! use std::time::Duration;
//! use lockkit::LockOptions;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockkit::Result<()> {
//! let locks = lockkit::connect("memory://").await?; // or redis://, zk://, postgres://, …
//! let opts = LockOptions::new().ttl(Duration::from_secs(30)).wait_for(Duration::from_secs(5));
//! let guard = locks.acquire("nightly-report", &opts).await?;
//! let token = guard.fencing_token(); // pass it with every write the lock protects
//! # let _ = token;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Concepts
//!
//! - **A client**, from [`connect`] (or a backend's builder): an
//!   `Arc<dyn DistributedLock>` on one server or cluster. Make one per process
//!   and share it; tasks of one client that want the same name queue in a
//!   local FIFO.
//! - **A holding**, a [`LockGuard`]: the name, its [`FencingToken`] where the
//!   backend fences, a lease its watchdog renews every `ttl / 3`, a lost
//!   signal ([`LockGuard::lost`]), and a compare-and-delete
//!   [`release`](LockGuard::release). Dropping it releases in the background.
//! - **Options**, [`LockOptions`]: the lease (`ttl`), how long to wait
//!   (`wait_for`, `no_wait`, `wait_forever`), the kind ([`LockKind`]: exclusive,
//!   `shared()`, `semaphore(n)`), and a holder identity (`holder`).
//! - **What a backend can do**, [`Capabilities`]: fencing, what frees a
//!   crashed holder's lock, notified waits, FIFO order, survival of a minority
//!   failure, shared locks, semaphores. A backend refuses what it cannot do
//!   with [`LockError::Unsupported`].
//! - **Above the trait**: [`Election`] and [`Leadership`] for one leader at a
//!   time, [`acquire_all`] for several names without deadlock, and
//!   [`DistributedLock::status`] to see who holds a name without taking it.
//!
//! # Semantics
//!
//! - [`try_acquire`](DistributedLock::try_acquire) makes one attempt and
//!   answers `Ok(None)` when the name is held;
//!   [`acquire`](DistributedLock::acquire) waits as the options say and
//!   answers [`LockError::Timeout`] once the wait is over.
//! - A lease that is not renewed ends `ttl` after it was granted; the guard
//!   counts its validity on the client's monotonic clock from before the
//!   request, so [`LockGuard::lost`] fires before the server can grant the name
//!   to anyone else.
//! - A holder paused past its lease (a GC pause, a stopped VM) learns of the
//!   loss only when it runs again. Only the resource can refuse its late
//!   write, by checking the fencing token: [`fence`] is that check for
//!   PostgreSQL, MySQL/MariaDB, SQLite, Redis, etcd and HTTP services (the
//!   guide's [fencing your writes] page), and the guide's [semantics and
//!   safety] page says why.
//! - Every network call has a timeout; an unreachable server is
//!   [`LockError::Unavailable`]. Dropping an `acquire` future never leaks a
//!   lease. Passwords never appear in `Debug` output, logs or errors.
//! - Lock names are 1 to 255 bytes of UTF-8 without control characters.
//!
//! [semantics and safety]: https://github.com/lockkit/lockkit/blob/main/docs/guide/semantics.md
//! [fencing your writes]: https://github.com/lockkit/lockkit/blob/main/docs/guide/fencing.md
//!
//! # Backends and feature flags
//!
//! | feature | URL schemes | module |
//! | --- | --- | --- |
//! | (always) | `memory://` | [`MemoryLock`] |
//! | `redis` (default) | `redis://`, `rediss://`, `redis+cluster://`, `redis+sentinel://` | `lockkit::redis` |
//! | `redlock` | `redlock://` | `lockkit::redlock` |
//! | `zk` | `zk://` | `lockkit::zk` |
//! | `etcd` | `etcd://` | `lockkit::etcd` |
//! | `postgres` | `postgres://`, `postgresql://` | `lockkit::sql` |
//! | `mysql` | `mysql://`, `mariadb://` | `lockkit::sql` |
//! | `sqlite` (default) | `sqlite://` | `lockkit::sql` |
//! | `cli` (default) | the `lockkit` command | |
//! | `metrics` | counters and histograms through the `metrics` facade | [`metrics`] |
//! | `tower` | a layer refusing a stale `Fencing-Token` with 409 | `lockkit::fence::http` |
//! | `full` | all of the above | |
//!
//! A library should turn the defaults off and name its backends:
//! `lockkit = { version = "0.1", default-features = false, features =
//! ["redis"] }`. A URL whose backend is not compiled in fails with
//! [`LockError::BackendNotCompiled`], naming the feature. The backend modules
//! hold each backend's builder, for options a URL cannot express.
//!
//! # Writing a backend
//!
//! [`core::backend`] holds the engines the built-in backends are made of and
//! the [`Driver`](core::backend::Driver) that declares one to a [`Registry`].
//! It is less stable than the rest of the API: it may change in any minor
//! release while lockkit is 0.x.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod connect;

pub use connect::{Registry, connect, known_schemes};
pub use lockkit_core::backend::redact_url;
pub use lockkit_core::{
    Backoff, BoxError, Capabilities, DistributedLock, DynDistributedLock, Election, FencingToken,
    Leadership, LockError, LockGuard, LockKind, LockOptions, LockStatus, LostReason, MemoryLock,
    MemoryStore, ReleaseOnCrash, Result, Wait, acquire_all,
};

/// The core crate, for backend implementors: [`LeaseBackend`](lockkit_core::backend::LeaseBackend),
/// [`Waiter`](lockkit_core::backend::Waiter), [`Lease`](lockkit_core::backend::Lease) and friends.
pub use lockkit_core as core;

/// The resource side of fencing: refuse a stale holder's write in
/// PostgreSQL, MySQL/MariaDB, SQLite, Redis, etcd or an HTTP service (each
/// with its backend's cargo feature; the HTTP layer with `tower`). See the
/// guide's "Fencing your writes".
pub use lockkit_fence as fence;

/// The metric names lockkit emits through the `metrics` facade (with the
/// cargo feature `metrics`).
pub use lockkit_core::metrics;

/// The Redis backend (one server, Redis Cluster, or a Sentinel-monitored
/// master), for options a URL cannot express.
#[cfg(feature = "redis")]
pub use lockkit_redis as redis;

/// The Redlock backend, for options a URL cannot express.
#[cfg(feature = "redlock")]
pub use lockkit_redlock as redlock;

/// The ZooKeeper backend, for options a URL cannot express.
#[cfg(feature = "zk")]
pub use lockkit_zk as zk;

/// The etcd backend, for options a URL cannot express.
#[cfg(feature = "etcd")]
pub use lockkit_etcd as etcd;

/// The SQL backends (Postgres, MySQL/MariaDB, SQLite), for options a URL
/// cannot express.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use lockkit_sql as sql;

/// The README and the guide, compiled as doc tests: every Rust sample in them
/// builds, and runs unless it is marked `no_run` (it needs a server).
/// `tests/docs.rs` checks that every page of the guide is listed here.
#[cfg(all(doctest, feature = "full"))]
mod guide {
    macro_rules! pages {
        ($($item:ident = $path:literal),* $(,)?) => {
            $(
                #[doc = include_str!($path)]
                struct $item;
            )*
        };
    }
    pages! {
        Readme = "../README.md",
        GuideIndex = "../docs/guide/README.md",
        GettingStarted = "../docs/guide/getting-started.md",
        ChoosingABackend = "../docs/guide/choosing-a-backend.md",
        Redis = "../docs/guide/backends/redis.md",
        Redlock = "../docs/guide/backends/redlock.md",
        ZooKeeper = "../docs/guide/backends/zookeeper.md",
        Etcd = "../docs/guide/backends/etcd.md",
        Sql = "../docs/guide/backends/sql.md",
        Memory = "../docs/guide/backends/memory.md",
        Semantics = "../docs/guide/semantics.md",
        Fencing = "../docs/guide/fencing.md",
        Family = "../docs/guide/family.md",
        Bounds = "../docs/guide/bounds.md",
        Cli = "../docs/guide/cli.md",
        Operations = "../docs/guide/operations.md",
        CustomBackend = "../docs/guide/custom-backend.md",
        Faq = "../docs/guide/faq.md",
        Migrating = "../docs/guide/migrating.md",
    }
}
