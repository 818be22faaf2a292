//! One CPU for a benchmark and its servers.
//!
//! MariaDB serves each connection on a thread of its own, PostgreSQL on a
//! process of its own, and sqlx runs each SQLite connection on a worker
//! thread: a cycle's round trips wake those threads, and on a machine of
//! few cores a wake-up on another CPU costs several times what one on the
//! same CPU does. A floor and the lockkit cycle it is paired with run on
//! different connections, so each got a placement of its own, and their
//! ratio swung with it from run to run (`examples/sql_split.rs` shows each
//! cycle's CPU time and the server's).
//! Pinned to one CPU, every connection is served as every other is, and
//! the lockkit cycle's own work counts in full.

use std::process::Command;

/// The CPU [`pin_to_one_cpu`] pins to.
pub const BENCH_CPU: usize = 0;

/// Pins this process (each of its threads, and every thread and process
/// started afterwards, the servers among them) to CPU [`BENCH_CPU`], with
/// util-linux's `taskset`. Call it before the servers start. What it did,
/// for the summary.
///
/// # Panics
///
/// If `taskset` is missing or fails: a run that meant to pin and did not
/// would measure something else.
pub fn pin_to_one_cpu() -> String {
    let pid = std::process::id().to_string();
    let cpu = BENCH_CPU.to_string();
    let output = Command::new("taskset")
        .args(["--all-tasks", "--pid", "--cpu-list", &cpu, &pid])
        .output()
        .unwrap_or_else(|e| panic!("taskset (util-linux) is needed to pin the benchmark: {e}"));
    assert!(
        output.status.success(),
        "taskset could not pin the benchmark to CPU {cpu}: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    format!(
        "The benchmark process and the servers it started were pinned to CPU {cpu} (`taskset`), \
         so that each connection's server thread shares the client's CPU (see `lockkit_benches::cpu`)."
    )
}
