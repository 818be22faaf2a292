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
//!
//! A CPU left idle on a virtual machine halts, and a wake-up on it costs
//! more than one on a CPU that runs something: [`keep_awake`] keeps every
//! CPU busy at the lowest priority while a benchmark runs.

use std::process::{Child, Command};

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
/// What it did, for the summary. Call it once the servers have started
/// and [`pin_server`] has moved them: a server started afterwards would
/// start on this one CPU, beside every other server starting there.
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

/// Busy loops at the lowest priority, one on each CPU, while it lives (see
/// [`keep_awake`]).
#[derive(Debug)]
pub struct Awake {
    loops: Vec<Child>,
}

/// Keeps every CPU of the machine busy, at the lowest priority
/// (`SCHED_IDLE`, `chrt --idle`), until the returned value is dropped.
/// What it did, for the summary.
///
/// On a virtual machine an idle vCPU halts, and a wake-up on it (a reply
/// for a thread that sleeps there) first has to bring it back, which costs
/// more than a wake-up on a CPU that runs something. A library that leaves
/// the CPUs idle more often then pays for it in every round trip of its
/// critical sections, the same work in every library, while one that keeps
/// them busy does not. A loop at the lowest priority gives way at once to
/// any other thread, and keeps the CPU from halting. Each loop ends when
/// this process does, also without a drop (a run killed midway).
///
/// # Panics
///
/// If `chrt` or `taskset` (util-linux) is missing.
pub fn keep_awake() -> (Awake, String) {
    let cpus = lockkit_testkit::stamp::machine_cpus();
    let loops = (0..cpus)
        .map(|cpu| {
            Command::new("chrt")
                .args(["--idle", "0", "taskset", "--cpu-list"])
                .arg(cpu.to_string())
                // `$PPID` is this process: once it is gone, the loop ends.
                .args(["sh", "-c", "while kill -0 $PPID 2>/dev/null; do :; done"])
                .spawn()
                .unwrap_or_else(|e| panic!("chrt and taskset (util-linux) are needed: {e}"))
        })
        .collect();
    (
        Awake { loops },
        format!(
            "Every one of the machine's {cpus} CPUs ran a busy loop at the lowest priority \
             (`SCHED_IDLE`), which gives way to any other thread at once, so that no vCPU \
             halted while idle and a wake-up cost the same whoever had left the CPU idle \
             (see `lockkit_benches::cpu::keep_awake`)."
        ),
    )
}

impl Drop for Awake {
    fn drop(&mut self) {
        for busy in &mut self.loops {
            // Our own children, by their handles.
            let _ = busy.kill();
            let _ = busy.wait();
        }
    }
}
