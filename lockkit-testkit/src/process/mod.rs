//! Generic management of real servers run as child processes.
//!
//! Every server is spawned as `setpriv --pdeathsig KILL -- <binary> <args…>` in
//! its own process group, from one dedicated thread that never exits. The
//! kernel's parent-death signal fires when the *thread* that forked the child
//! exits, so spawning from short-lived tokio or test threads would kill servers
//! early; spawning from a thread that lives as long as the process makes a
//! server die exactly when the test process dies (also for servers held in
//! statics, which are never dropped, and under `cargo nextest`, which runs
//! every test in its own process). `setpriv` execs the server, so the PID we
//! hold is the server's PID.
//!
//! Two options generalise this for PostgreSQL ([`SpawnOptions`]): running the
//! server as another user (`setpriv --reuid --regid --init-groups`; setpriv
//! sets the parent-death signal *after* switching user, so the switch does
//! not clear it), and signalling the server's children too, for a server whose
//! children leave its process group.
//!
//! Servers whose setup is slow (initdb, mariadb-install-db) copy a template
//! data directory built once per machine: see [`ensure_template`].

mod error;
mod procfs;
mod setup;
mod slot;
mod spawn;
mod template;
#[cfg(test)]
mod tests;

pub use error::ServerError;
pub(crate) use procfs::*;
pub(crate) use setup::*;
pub use setup::{ClosedPort, free_port};
pub use slot::ProcessSlot;
pub(crate) use slot::*;
pub use spawn::ServerProcess;
pub(crate) use spawn::*;
pub(crate) use template::*;
