//! The process slot of a server: start, pause, resume, kill, and reading
//! `/proc` to know when that has happened.

use std::future::Future;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::*;
use crate::clock::ServerClock;
use crate::netns::Fabric;
use std::sync::Arc;

/// How long [`ServerProcess::pause`] waits for every thread to stop.
pub(crate) const STOP_TIMEOUT: Duration = Duration::from_secs(1);

/// How long [`ServerProcess::kill`] waits for a server's killed children to
/// be dead (they release what they hold, e.g. shared memory, on exit).
pub(crate) const CHILD_EXIT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long to wait for a server to become ready, and how to probe it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Readiness {
    /// The overall deadline.
    pub(crate) deadline: Duration,
    /// The timeout of one probe.
    pub(crate) probe_timeout: Duration,
    /// The pause between two probes.
    pub(crate) interval: Duration,
}

impl Readiness {
    /// Probes every `interval_ms`, each for at most `probe_ms`, until
    /// `deadline_ms` has passed.
    pub(crate) const fn ms(deadline_ms: u64, probe_ms: u64, interval_ms: u64) -> Readiness {
        Readiness {
            deadline: Duration::from_millis(deadline_ms),
            probe_timeout: Duration::from_millis(probe_ms),
            interval: Duration::from_millis(interval_ms),
        }
    }
}

/// Where a server that can be killed and started again keeps its current
/// process (`None` while killed): pause, resume, kill and (re)launch with a
/// readiness probe, shared by every kind of server.
#[derive(Debug, Default)]
pub struct ProcessSlot {
    state: Mutex<Option<ServerProcess>>,
    options: SpawnOptions,
    /// The wall clock every process of this slot runs with, if it can be moved.
    clock: Option<ServerClock>,
    /// The network namespace its processes run in, if not the test's.
    netns: Option<(Arc<Fabric>, usize)>,
}

impl ProcessSlot {
    /// An empty slot whose processes are spawned with `options`.
    pub(crate) fn with_options(options: SpawnOptions) -> Self {
        Self {
            state: Mutex::default(),
            options,
            clock: None,
            netns: None,
        }
    }

    /// The same slot, whose processes run in namespace `index` of `fabric`.
    pub(crate) fn with_netns(mut self, netns: Option<(Arc<Fabric>, usize)>) -> Self {
        self.netns = netns;
        self
    }

    /// The same slot, whose processes run with `clock` (see [`ServerClock`]).
    pub(crate) fn with_clock(mut self, clock: Option<ServerClock>) -> Self {
        self.clock = clock;
        self
    }

    /// The wall clock of this slot's processes, if it can be moved.
    pub(crate) fn clock(&self) -> Option<&ServerClock> {
        self.clock.as_ref()
    }

    fn lock(&self) -> MutexGuard<'_, Option<ServerProcess>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The server's PID, `None` while it is killed (or has died).
    pub(crate) fn pid(&self) -> Option<u32> {
        let mut state = self.lock();
        let process = state.as_mut()?;
        process.is_running().then(|| process.pid())
    }

    /// SIGSTOP; does nothing while killed (a failure is logged).
    pub(crate) fn pause(&self) {
        if let Some(process) = self.lock().as_mut()
            && let Err(e) = process.pause()
        {
            tracing::warn!("cannot pause {}: {e}", process.description());
        }
    }

    /// SIGCONT; does nothing while killed (a failure is logged).
    pub(crate) fn resume(&self) {
        if let Some(process) = self.lock().as_mut()
            && let Err(e) = process.resume()
        {
            tracing::warn!("cannot resume {}: {e}", process.description());
        }
    }

    /// Kills and reaps the process, if any. Idempotent.
    pub(crate) fn kill(&self) {
        let process = self.lock().take();
        if let Some(mut process) = process {
            process.kill();
        }
    }

    /// Spawns `command` (see [`ServerProcess::spawn`]) in place of the
    /// current process (killed first), and waits until `probe(pid)` answers
    /// `true` within `readiness`. On failure the new process is killed again
    /// and the error carries the tail of its log.
    pub(crate) async fn launch<P, Fut>(
        &self,
        what: &str,
        command: &Command,
        log_path: &Path,
        output_path: &Path,
        readiness: Readiness,
        mut probe: P,
    ) -> Result<(), ServerError>
    where
        P: FnMut(u32) -> Fut,
        Fut: Future<Output = bool>,
    {
        self.kill();
        let shifted;
        let command = match &self.clock {
            Some(clock) => {
                shifted = clock.wrap(command)?;
                &shifted
            }
            None => command,
        };
        let entered;
        let command = match &self.netns {
            Some((fabric, index)) => {
                entered = fabric.enter(*index, command);
                &entered
            }
            None => command,
        };
        let process =
            ServerProcess::spawn_with(what, command, log_path, output_path, self.options).await?;
        let pid = process.pid();
        let previous = self.lock().replace(process);
        drop(previous);
        let started = Instant::now();
        let log_tail = || log_tail(log_path, output_path, LOG_TAIL_LINES);
        let result = loop {
            if let Some(status) = self.exited(pid) {
                break Err(ServerError::Exited {
                    what: what.to_owned(),
                    status,
                    log_tail: log_tail(),
                });
            }
            if tokio::time::timeout(readiness.probe_timeout, probe(pid))
                .await
                .is_ok_and(|ready| ready)
            {
                tracing::debug!(pid, "{what} is ready after {:?}", started.elapsed());
                break Ok(());
            }
            if started.elapsed() >= readiness.deadline {
                break Err(ServerError::NotReady {
                    what: what.to_owned(),
                    waited: started.elapsed(),
                    log_tail: log_tail(),
                });
            }
            tokio::time::sleep(readiness.interval).await;
        };
        if result.is_err() {
            self.kill();
        }
        result
    }

    /// `Some(status)` when the process `pid` is no longer running: its exit
    /// status, or `None` when another caller killed (or replaced) it.
    fn exited(&self, pid: u32) -> Option<Option<ExitStatus>> {
        let mut state = self.lock();
        match state.as_mut() {
            Some(process) if process.pid() == pid => {
                if process.is_running() {
                    None
                } else {
                    Some(process.exit_status())
                }
            }
            _ => Some(None),
        }
    }
}
