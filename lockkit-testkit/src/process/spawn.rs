//! Spawning servers as child processes that die with the test process.

use std::fs::File;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{OnceLock, mpsc};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use super::*;

pub(crate) const SETPRIV_HINT: &str =
    "install util-linux (it provides setpriv: apt-get install -y util-linux)";

/// How [`ServerProcess::spawn_with`] runs a server, beyond its command.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SpawnOptions {
    /// Run the server as this user and group (`(uid, gid)`), with the user's
    /// supplementary groups: `setpriv --reuid --regid --init-groups`. Needs
    /// root. The parent-death signal still works: the kernel clears it on a
    /// change of credentials, but setpriv sets it after the switch, just
    /// before it execs the server.
    pub(crate) run_as: Option<(u32, u32)>,
    /// The server forks children that leave its process group (PostgreSQL's
    /// backends call `setsid`): pause, resume and kill signal its direct
    /// children too.
    pub(crate) signal_children: bool,
}

/// A request to the spawner thread: the command and what to do with the result.
pub(crate) struct SpawnRequest {
    command: Command,
    reply: Box<dyn FnOnce(io::Result<Child>) + Send>,
}

/// The channel to the one thread that spawns every server. It is started on
/// first use and never exits (its `Sender` lives in a static), so the
/// parent-death signal of the servers fires only when the process dies.
pub(crate) fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("lockkit-testkit-spawner".to_owned())
            .spawn(move || {
                for SpawnRequest { mut command, reply } in receiver {
                    reply(command.spawn());
                }
            })
            .unwrap_or_else(|e| panic!("cannot start the server spawner thread: {e}"));
        sender
    })
}

/// Kills and reaps a child nobody is waiting for any more.
pub(crate) fn discard(mut child: Child) {
    // The child was never reaped, so its PID (and group) is still ours.
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A server running as a child process, killed when dropped.
///
/// Signals go to the server's process group (the server and anything it
/// forked), and only while the process has not been reaped, so a PID that the
/// kernel may have reused is never signalled. A server spawned to signal its
/// children (PostgreSQL) also signals the processes whose parent it is, found
/// in `/proc`, and only while it is stopped: a stopped server neither forks
/// nor reaps, so the children found are all of them and their PIDs stay
/// theirs.
#[derive(Debug)]
pub struct ServerProcess {
    what: String,
    child: Child,
    log_path: PathBuf,
    output_path: PathBuf,
    options: SpawnOptions,
    /// `Some` once the child has been reaped (inner `None`: reaping failed).
    reaped: Option<Option<ExitStatus>>,
}

impl ServerProcess {
    /// Spawns `command` (program, arguments, environment changes and working
    /// directory are taken from it; `env_clear` and stdio settings are not)
    /// under `setpriv --pdeathsig KILL`, in its own process group, so that the
    /// server dies with this process. The fork happens on the dedicated spawner
    /// thread; this waits for it without blocking the runtime.
    ///
    /// `what` describes the server in messages. `log_path` is the server's
    /// log file; stdout and stderr are appended to `output_path` (which may be
    /// the same file). stdin is `/dev/null`.
    pub async fn spawn(
        what: &str,
        command: &Command,
        log_path: &Path,
        output_path: &Path,
    ) -> Result<Self, ServerError> {
        Self::spawn_with(
            what,
            command,
            log_path,
            output_path,
            SpawnOptions::default(),
        )
        .await
    }

    /// Like [`spawn`](Self::spawn), with options: another user, and
    /// signalling the server's children.
    pub(crate) async fn spawn_with(
        what: &str,
        command: &Command,
        log_path: &Path,
        output_path: &Path,
        options: SpawnOptions,
    ) -> Result<Self, ServerError> {
        let wrapped = wrap(what, command, output_path, options)?;
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let reply = Box::new(move |result: io::Result<Child>| {
            // If the caller's future was dropped meanwhile, nobody owns the
            // child: kill it instead of leaking a server.
            if let Err(Ok(child)) = sender.send(result) {
                discard(child);
            }
        });
        request(what, wrapped, reply)?;
        let child = receiver
            .await
            .map_err(|_| spawner_gone(what))?
            .map_err(|source| spawn_error(what, source))?;
        tracing::debug!(pid = child.id(), "started {what}");
        Ok(Self {
            what: what.to_owned(),
            child,
            log_path: log_path.to_path_buf(),
            output_path: output_path.to_path_buf(),
            options,
            reaped: None,
        })
    }

    /// The server's PID (still reported after it exited).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The description given at spawn time.
    pub fn description(&self) -> &str {
        &self.what
    }

    /// The server's log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Whether the process is still running (a stopped process counts as
    /// running). Reaps it if it has exited.
    pub fn is_running(&mut self) -> bool {
        if self.reaped.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                self.reaped = Some(Some(status));
                false
            }
            Err(e) => {
                // Cannot happen for our own unreaped child; never signal it again.
                tracing::warn!("cannot query {} (pid {}): {e}", self.what, self.pid());
                self.reaped = Some(None);
                false
            }
        }
    }

    /// The exit status, once the process has exited and been reaped.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.is_running() {
            None
        } else {
            self.reaped.flatten()
        }
    }

    /// Stops the server with SIGSTOP: it keeps its sockets but answers
    /// nothing until [`ServerProcess::resume`]. A server spawned to signal
    /// its children is stopped first, then its children.
    ///
    /// Returns once every thread of the server (and of those children) has
    /// stopped (at most after 1 s each): SIGSTOP takes effect asynchronously,
    /// thread by thread, and a multi-threaded server (a JVM) otherwise still
    /// answers, now and then, a request sent right after the signal.
    pub fn pause(&mut self) -> io::Result<()> {
        self.stop()?;
        if self.options.signal_children {
            let children = children_of(self.pid());
            for child in &children {
                let _ = kill(child.raw_pid(), Signal::SIGSTOP);
            }
            for child in &children {
                self.wait_stopped(child.pid);
            }
        }
        Ok(())
    }

    /// Continues a paused server with SIGCONT. A server spawned to signal its
    /// children is stopped first (if it was not), so that its children's
    /// PIDs stay theirs while they are continued, then continued itself.
    pub fn resume(&mut self) -> io::Result<()> {
        if self.options.signal_children {
            self.stop()?;
            for child in children_of(self.pid()) {
                let _ = kill(child.raw_pid(), Signal::SIGCONT);
            }
        }
        self.signal(Signal::SIGCONT)
    }

    /// SIGSTOP to the server's group, and waits until it stopped.
    fn stop(&mut self) -> io::Result<()> {
        self.signal(Signal::SIGSTOP)?;
        self.wait_stopped(self.pid());
        Ok(())
    }

    /// Waits until every thread of `pid` stopped (at most 1 s; a warning
    /// otherwise).
    fn wait_stopped(&self, pid: u32) {
        if !wait_until_stopped(pid, STOP_TIMEOUT) {
            tracing::warn!(
                "{} (pid {pid}) was not fully stopped after {STOP_TIMEOUT:?}",
                self.what,
            );
        }
    }

    fn signal(&mut self, signal: Signal) -> io::Result<()> {
        if !self.is_running() {
            return Err(io::Error::other(format!(
                "{} (pid {}) is not running",
                self.what,
                self.pid()
            )));
        }
        // Not reaped, so the PID and the group are still ours.
        let pid = self.raw_pid()?;
        match killpg(pid, signal) {
            Ok(()) => Ok(()),
            Err(_) => kill(pid, signal).map_err(io::Error::from),
        }
    }

    fn raw_pid(&self) -> io::Result<Pid> {
        i32::try_from(self.pid())
            .map(Pid::from_raw)
            .map_err(|_| io::Error::other("pid out of range"))
    }

    /// Kills the server with SIGKILL (its whole process group) and reaps it.
    /// Idempotent, and harmless after the process exited on its own.
    ///
    /// A server spawned to signal its children is stopped first, then its
    /// children are killed, then the server; this returns once those children
    /// are dead too (at most after 2 s), having released what they held.
    pub fn kill(&mut self) {
        if !self.is_running() {
            return;
        }
        let mut children = Vec::new();
        if let Ok(pid) = self.raw_pid() {
            if self.options.signal_children {
                // Stopped, it can neither fork a new child nor reap one (so
                // that its PID could be reused) while we kill them.
                if killpg(pid, Signal::SIGSTOP).is_err() {
                    let _ = kill(pid, Signal::SIGSTOP);
                }
                self.wait_stopped(self.pid());
                children = children_of(self.pid());
                for child in &children {
                    let _ = kill(child.raw_pid(), Signal::SIGKILL);
                }
            }
            // SIGKILL also ends a stopped (paused) process.
            if killpg(pid, Signal::SIGKILL).is_err() {
                let _ = kill(pid, Signal::SIGKILL);
            }
        }
        if !wait_until_dead(&children, CHILD_EXIT_TIMEOUT) {
            tracing::warn!(
                "children of {} (pid {}) were not dead after {CHILD_EXIT_TIMEOUT:?}",
                self.what,
                self.pid()
            );
        }
        match self.child.wait() {
            Ok(status) => self.reaped = Some(Some(status)),
            Err(e) => {
                tracing::warn!("cannot reap {} (pid {}): {e}", self.what, self.pid());
                self.reaped = Some(None);
            }
        }
        tracing::debug!(pid = self.pid(), "killed {}", self.what);
    }

    /// The last `lines` lines of the server's log (followed by the tail of
    /// its stdout/stderr when those go to a separate, non-empty file).
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_path, &self.output_path, lines)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Builds `setpriv [--reuid U --regid G --init-groups] --pdeathsig KILL --
/// <program> <args…>` from `command`.
pub(crate) fn wrap(
    what: &str,
    command: &Command,
    output_path: &Path,
    options: SpawnOptions,
) -> Result<Command, ServerError> {
    let setpriv = find_binary("setpriv", SETPRIV_HINT)?;
    let output = File::options()
        .create(true)
        .append(true)
        .open(output_path)
        .map_err(|source| ServerError::Io {
            what: format!("open {} for the output of {what}", output_path.display()),
            source,
        })?;
    let output_too = output
        .try_clone()
        .map_err(|source| spawn_error(what, source))?;
    let mut wrapped = Command::new(setpriv);
    if let Some((uid, gid)) = options.run_as {
        // setpriv switches credentials before it sets the parent-death
        // signal (which a switch would clear), then execs.
        wrapped
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .arg("--init-groups");
    }
    wrapped
        .args(["--pdeathsig", "KILL", "--"])
        .arg(command.get_program())
        .args(command.get_args())
        .stdin(Stdio::null())
        .stdout(output)
        .stderr(output_too)
        .process_group(0);
    copy_setting(command, &mut wrapped);
    Ok(wrapped)
}

/// Gives `to` the environment changes and working directory of `from`.
pub(crate) fn copy_setting(from: &Command, to: &mut Command) {
    for (key, value) in from.get_envs() {
        match value {
            Some(value) => to.env(key, value),
            None => to.env_remove(key),
        };
    }
    if let Some(dir) = from.get_current_dir() {
        to.current_dir(dir);
    }
}

pub(crate) fn request(
    what: &str,
    command: Command,
    reply: Box<dyn FnOnce(io::Result<Child>) + Send>,
) -> Result<(), ServerError> {
    spawner()
        .send(SpawnRequest { command, reply })
        .map_err(|_| spawner_gone(what))
}

pub(crate) fn spawn_error(what: &str, source: io::Error) -> ServerError {
    ServerError::Spawn {
        what: what.to_owned(),
        source,
    }
}

pub(crate) fn spawner_gone(what: &str) -> ServerError {
    spawn_error(what, io::Error::other("the server spawner thread is gone"))
}
