//! lockkit's fault-injection suite (not published).
//!
//! Each run starts fresh servers (`lockkit-testkit`), a fenced
//! [`Resource`](resource::Resource), and worker processes (this crate's
//! binary, `lockkit-faults worker`) that take the lock again and again and
//! write to the resource with their fencing tokens, each through its own
//! loopback [`TcpProxy`](lockkit_testkit::TcpProxy). A
//! [`Scenario`](scenario::Scenario) injects faults (a worker paused, killed
//! or partitioned; servers killed, paused; SQL connections killed; Redlock
//! instances lost; a ZooKeeper leader killed; a server's clock leaping;
//! servers in network namespaces cut off from each other),
//! the [`check`](check::check) counts overlaps and stale writes from what
//! the resource recorded, the [`history`] checker lists every violation of
//! exclusion and token order, and the [`report`] writes a Markdown table
//! and a timeline per run.
//!
//! The [`fence_race`] is the race at the resource: writers on several
//! processes, holders paused past their lease, every write fenced at
//! PostgreSQL and Redis (`tests/fence_race.rs`).
//!
//! The [`soak`] runs the whole family of locks on every backend at once for
//! minutes, servers paused and restarted at random, and watches the client
//! process for growth (`scripts/soak.sh`).
//!
//! ```text
//! cargo run -p lockkit-faults --release -- run --out target/faults
//! cargo run -p lockkit-faults -- run --short --out target/faults-short
//! ```

pub mod check;
pub mod deploy;
pub mod fence_race;
pub mod history;
pub mod record;
pub mod report;
pub mod resource;
pub mod run;
pub mod scenario;
pub mod section;
pub mod soak;
pub mod soak_client;
pub mod stores;
pub mod timeline;
pub mod worker;
