//! Reading `/proc`: whether a process is stopped or dead, and its children.

use std::fs::{self};
use std::time::{Duration, Instant};

use nix::unistd::Pid;

/// Polls `/proc/PID/task/*/stat` until no thread of `pid` can run any more
/// (stopped, traced, dead, or gone); `false` when `timeout` passed first.
pub(crate) fn wait_until_stopped(pid: u32, timeout: Duration) -> bool {
    let started = Instant::now();
    loop {
        if all_threads_stopped(pid) {
            return true;
        }
        if started.elapsed() >= timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub(crate) fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return true; // gone
    };
    tasks.filter_map(Result::ok).all(|task| {
        // The state follows the command name, which is in parentheses and
        // may itself contain ") ".
        fs::read_to_string(task.path().join("stat")).map_or(true, |stat| {
            stat.rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next())
                .is_none_or(|state| matches!(state, 'T' | 't' | 'Z' | 'X'))
        })
    })
}

/// A process found in `/proc`: its PID and its start time (clock ticks
/// since boot), which together name it even after its PID is reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProcessId {
    pub(crate) pid: u32,
    pub(crate) start_time: u64,
}

impl ProcessId {
    pub(crate) fn raw_pid(self) -> Pid {
        // PIDs listed in /proc fit (pid_max is at most 2^22).
        Pid::from_raw(i32::try_from(self.pid).unwrap_or(i32::MAX))
    }
}

/// `/proc/PID/stat` of `pid` as (state, parent PID, start time).
pub(crate) fn proc_stat(pid: u32) -> Option<(char, u32, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields follow the command name, which is in parentheses and may
    // itself contain ") ": state is field 3, ppid 4, starttime 22.
    let (_, rest) = stat.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let parent = fields.get(1)?.parse().ok()?;
    let start_time = fields.get(19)?.parse().ok()?;
    Some((state, parent, start_time))
}

/// The processes whose parent is `parent` (zombies included).
pub(crate) fn children_of(parent: u32) -> Vec<ProcessId> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let (_, ppid, start_time) = proc_stat(pid)?;
            (ppid == parent).then_some(ProcessId { pid, start_time })
        })
        .collect()
}

/// Whether `process` has exited: gone, a zombie, or its PID names another
/// process by now. (A zombie no longer holds memory, files or sockets.)
pub(crate) fn is_dead(process: ProcessId) -> bool {
    proc_stat(process.pid).is_none_or(|(state, _, start_time)| {
        start_time != process.start_time || matches!(state, 'Z' | 'X')
    })
}

/// Polls until every one of `processes` has exited; `false` when `timeout`
/// passed first.
pub(crate) fn wait_until_dead(processes: &[ProcessId], timeout: Duration) -> bool {
    let started = Instant::now();
    loop {
        if processes.iter().all(|&process| is_dead(process)) {
            return true;
        }
        if started.elapsed() >= timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
