//! The resource side of fencing: refuse a stale lock holder's write in the
//! store it writes to.
//!
//! A lock alone cannot stop a holder that was paused past its lease (a GC
//! pause, a stopped VM, a partition) from writing after the next holder
//! did. Its [`FencingToken`] can, but only where the write lands: the store
//! remembers the greatest token it admitted for a resource and refuses a
//! smaller one. This crate is that check, for the stores people write to.
//!
//! The rule, everywhere: a token is **admitted** when it is greater than or
//! equal to the greatest token admitted for the resource (equal: the same
//! holder writing again), and admitting it records it. A smaller token is
//! refused with [`FenceError::Stale`], naming the resource, the token and
//! the greatest admitted one, and nothing is written.
//!
//! | store | feature | how the write and the check go together |
//! | --- | --- | --- |
//! | PostgreSQL | `postgres` | [`postgres::admit`] in the write's transaction; from any client, `SELECT lockkit_fence(resource, token)` |
//! | MySQL / MariaDB | `mysql` | [`mysql::admit`] in the write's transaction; from any client, `SELECT lockkit_fence(resource, token)` |
//! | SQLite | `sqlite` | [`sqlite::admit`] in the write's transaction |
//! | Redis | `redis` | [`redis::FencedWrite`]: one script checks and writes; any client can `EVAL` it |
//! | etcd | `etcd` | [`etcd::write`]: one transaction whose compare is the fence |
//! | an HTTP service | `tower` | [`http::FenceLayer`]: 409 Conflict for a stale `Fencing-Token` header |
//! | the lock service | — | [`is_current`]: is this token still the holding? (Chubby's `CheckSequencer`) |
//!
//! `lockkit fence install --url URL` creates the SQL table and function;
//! `lockkit fence check --url URL RESOURCE TOKEN` admits one token from a
//! shell. The guide's page "Fencing your writes" has the recipes.
//!
//! Resource names are 1 to 255 bytes without control characters
//! ([`check_resource`]); SQL stores keep tokens up to `i64::MAX`
//! ([`MAX_SQL_TOKEN`]). Bad input gets a typed error and writes nothing.
//! Network timeouts are those of the connection or client you pass in.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod holding;
mod resource;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod sql;
#[cfg(any(
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite",
    feature = "redis",
    feature = "etcd"
))]
mod store;

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "tower")]
pub mod http;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use error::{BoxError, FenceError, Result};
pub use holding::is_current;
pub use lockkit_core::FencingToken;
pub use resource::{MAX_RESOURCE_LEN, MAX_SQL_TOKEN, bigint, check_resource};
#[cfg(any(
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite",
    feature = "redis",
    feature = "etcd"
))]
pub use store::{Installed, SCHEMES, Store, install_sql};
