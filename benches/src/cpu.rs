//! Where a benchmark's client and its servers run.
//!
//! MariaDB serves each connection on a thread of its own, PostgreSQL on a
//! process of its own: a cycle's round trips wake those, and on a machine of
//! few cores a wake-up costs several times more on another CPU than on the
//! same one. Left to the scheduler, each connection's server thread sat on
//! the client's CPU or on the other one, and since a floor and the lockkit
//! cycle paired with it run on different connections, each was served at
//! a speed of its own, and their ratio swung from run to run
//! (`examples/sql_split.rs` shows each cycle's CPU time and the server's).
//! So the client is pinned to one CPU and the servers to another, as if
//! each ran on a host of its own: every round trip crosses from one CPU to
//! the other, the same for every connection. (An SQLite database is part of
//! the client: sqlx's worker threads share the client's CPU.)

use std::process::Command;

/// The CPU [`pin_client`] pins the benchmark process to.
pub const CLIENT_CPU: usize = 0;
/// The CPU [`pin_server`] pins a server to.
pub const SERVER_CPU: usize = 1;

/// The variable that, set (to anything), leaves the client and the servers
/// of the benchmarks that pin them to the scheduler instead, to compare:
/// [`pin_client`] and [`pin_server`] then do nothing.
pub const UNPINNED: &str = "LOCKKIT_BENCH_UNPINNED";

/// Whether [`UNPINNED`] is set.
fn unpinned() -> bool {
    std::env::var_os(UNPINNED).is_some()
}

/// Pins this process (each of its threads, and every thread and process it
/// starts afterwards) to CPU [`CLIENT_CPU`], unless [`UNPINNED`] is set.
/// What it did, for the summary.
///
/// # Panics
///
/// If `taskset` (util-linux) is missing or fails, or the machine has a
/// single CPU: a run that meant to pin and did not would measure something
/// else.
pub fn pin_client() -> String {
    if unpinned() {
        return format!(
            "The benchmark's client and its servers ran wherever the scheduler put them \
             (`{UNPINNED}` was set; see `lockkit_benches::cpu`)."
        );
    }
    check_cpus();
    taskset(std::process::id(), CLIENT_CPU).unwrap_or_else(|error| panic!("{error}"));
    format!(
        "The benchmark's client ran on CPU {CLIENT_CPU} and its servers on CPU {SERVER_CPU} \
         (`taskset`), so that every connection's round trips cross between the same two CPUs \
         (see `lockkit_benches::cpu`)."
    )
}

/// Pins the server process `pid` and the processes it started (each of
/// their threads, and every thread and process they start afterwards: the
/// threads or processes of the connections made after this) to CPU
/// [`SERVER_CPU`], unless [`UNPINNED`] is set.
///
/// # Panics
///
/// As [`pin_client`].
pub fn pin_server(pid: u32) {
    if unpinned() {
        return;
    }
    check_cpus();
    taskset(pid, SERVER_CPU).unwrap_or_else(|error| panic!("{error}"));
    for child in children(pid) {
        // A worker that ended meanwhile (PostgreSQL's autovacuum workers
        // come and go) has nothing left to pin.
        if let Err(error) = taskset(child, SERVER_CPU)
            && std::path::Path::new(&format!("/proc/{child}")).exists()
        {
            panic!("{error}");
        }
    }
}

/// The processes whose parent is `pid` (PostgreSQL's background workers).
fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&candidate| {
            // `pid (comm) state ppid …`; the name may hold spaces and parentheses.
            std::fs::read_to_string(format!("/proc/{candidate}/stat"))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// Both CPUs exist.
fn check_cpus() {
    let cpus = lockkit_testkit::stamp::machine_cpus();
    assert!(
        [CLIENT_CPU, SERVER_CPU].iter().all(|&cpu| cpu < cpus),
        "pinning the client and the servers apart needs CPUs {CLIENT_CPU} and {SERVER_CPU}; this machine has {cpus}"
    );
}

/// Pins `pid`'s threads to `cpu`; what went wrong otherwise.
fn taskset(pid: u32, cpu: usize) -> Result<(), String> {
    let output = Command::new("taskset")
        .args(["--all-tasks", "--pid", "--cpu-list"])
        .arg(cpu.to_string())
        .arg(pid.to_string())
        .output()
        .map_err(|e| format!("taskset (util-linux) is needed to pin the benchmark: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "taskset could not pin process {pid} to CPU {cpu}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}
