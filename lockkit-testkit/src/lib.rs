//! Test support for lockkit (not published).
//!
//! * Real servers as child processes on free loopback ports, in temporary
//!   directories, killed when dropped and when the test process dies:
//!   [`RedisServer`].
//! * Fault injection on them: pause (SIGSTOP), resume, kill, restart.
//! * [`conformance`]: the behavioural suite every backend runs against its real
//!   server, one named test per case.
//!
//! A missing server binary is a loud failure that says how to install it
//! (`scripts/install-services.sh`), never a silent skip.

pub mod conformance;
pub mod contention;
mod process;
mod redis_server;

pub use contention::{Probe, spawn_contenders};
pub use process::{ServerError, ServerProcess, free_port};
pub use redis_server::{RedisServer, RedisServerBuilder};
