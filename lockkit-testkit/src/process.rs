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

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fmt;
use std::fs::{self, File};
use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError, mpsc};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, Uid, User};

/// How many lines of a server's log an error message includes.
pub(crate) const LOG_TAIL_LINES: usize = 20;

const SETPRIV_HINT: &str =
    "install util-linux (it provides setpriv: apt-get install -y util-linux)";

/// How long [`ServerProcess::pause`] waits for every thread to stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(1);

/// How long [`ServerProcess::kill`] waits for a server's killed children to
/// be dead (they release what they hold, e.g. shared memory, on exit).
const CHILD_EXIT_TIMEOUT: Duration = Duration::from_secs(2);

/// The directory under the system's temporary directory where template data
/// directories are kept (see [`ensure_template`]).
const TEMPLATES_DIR: &str = "lockkit-testkit-templates";

/// Extra attempts, each on new ports, when a start finds a port taken.
const PORT_RETRIES: usize = 3;

/// Returns a TCP port on 127.0.0.1 that was free a moment ago.
///
/// Binds `127.0.0.1:0`, reads the port the kernel chose and drops the
/// listener. Another process may take the port before the server binds it, so
/// callers retry on "address already in use". Within this process the same
/// port is never returned twice, so servers started concurrently (and ports
/// kept for a restart) do not collide with each other.
pub fn free_port() -> u16 {
    static HANDED_OUT: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let handed_out = HANDED_OUT.get_or_init(|| Mutex::new(HashSet::new()));
    loop {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|listener| listener.local_addr())
            .map(|addr| addr.port())
            .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0 to find a free port: {e}"));
        let mut handed_out = handed_out.lock().unwrap_or_else(PoisonError::into_inner);
        if handed_out.insert(port) {
            return port;
        }
    }
}

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

/// Why a test server could not be started (or restarted).
#[derive(Debug)]
pub enum ServerError {
    /// The server's binary (or a helper such as `setpriv`, or a jar it
    /// needs) is not installed.
    NotInstalled {
        /// The binary looked for: a name searched on `PATH`, or a path (of a
        /// jar when it ends with `.jar`).
        binary: String,
        /// How to install it.
        hint: String,
    },
    /// Spawning the process failed.
    Spawn {
        /// What was being spawned.
        what: String,
        /// The operating system's error.
        source: io::Error,
    },
    /// Preparing the server failed (temporary directory, configuration file…).
    Io {
        /// What was being done.
        what: String,
        /// The operating system's error.
        source: io::Error,
    },
    /// The server did not become ready in time.
    NotReady {
        /// Which server.
        what: String,
        /// How long we waited.
        waited: Duration,
        /// The last lines of the server's log.
        log_tail: String,
    },
    /// The server exited before it became ready.
    Exited {
        /// Which server.
        what: String,
        /// Its exit status; `None` when the harness killed it meanwhile.
        status: Option<ExitStatus>,
        /// The last lines of the server's log.
        log_tail: String,
    },
}

impl ServerError {
    /// The server's log tail carried by this error, if any.
    pub fn log_tail(&self) -> Option<&str> {
        match self {
            Self::NotReady { log_tail, .. } | Self::Exited { log_tail, .. } => Some(log_tail),
            _ => None,
        }
    }

    /// Whether the server exited because one of its ports was taken meanwhile
    /// (its log says "Address already in use").
    pub(crate) fn is_address_in_use(&self) -> bool {
        matches!(self, Self::Exited { log_tail, .. } if log_tail.contains("Address already in use"))
    }
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotInstalled { binary, hint } => {
                if binary.ends_with(".jar") {
                    write!(f, "{binary} does not exist or is not a file: {hint}")
                } else if binary.contains('/') {
                    write!(
                        f,
                        "{binary} does not exist or is not an executable file: {hint}"
                    )
                } else {
                    write!(f, "{binary} was not found on PATH: {hint}")
                }
            }
            Self::Spawn { what, source } => write!(f, "cannot spawn {what}: {source}"),
            Self::Io { what, source } => write!(f, "cannot {what}: {source}"),
            Self::NotReady {
                what,
                waited,
                log_tail,
            } => write!(
                f,
                "{what} was not ready after {waited:?}; last lines of its log:\n{log_tail}"
            ),
            Self::Exited {
                what,
                status,
                log_tail,
            } => {
                match status {
                    Some(status) => write!(f, "{what} exited before it was ready ({status})")?,
                    None => write!(f, "{what} was killed before it was ready")?,
                }
                write!(f, "; last lines of its log:\n{log_tail}")
            }
        }
    }
}

impl std::error::Error for ServerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Spawn { source, .. } | Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Finds an executable: `name` itself when it contains a `/`, otherwise the
/// first executable file called `name` in a directory of `PATH`.
pub(crate) fn find_binary(name: impl AsRef<OsStr>, hint: &str) -> Result<PathBuf, ServerError> {
    let name = name.as_ref();
    let not_installed = || ServerError::NotInstalled {
        binary: name.to_string_lossy().into_owned(),
        hint: hint.to_owned(),
    };
    let as_path = Path::new(name);
    if name.as_encoded_bytes().contains(&b'/') {
        return if is_executable(as_path) {
            Ok(as_path.to_path_buf())
        } else {
            Err(not_installed())
        };
    }
    let path = std::env::var_os("PATH").ok_or_else(not_installed)?;
    std::env::split_paths(&path)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(not_installed)
}

/// Resolves a server's binary: `explicit` (a builder option) when given,
/// else the non-empty environment variable `env_var`, else `default`; each a
/// path or a name searched on `PATH` (see [`find_binary`]).
pub(crate) fn resolve_binary(
    explicit: Option<&Path>,
    env_var: &str,
    default: &str,
    hint: &str,
) -> Result<PathBuf, ServerError> {
    if let Some(binary) = explicit {
        return find_binary(binary, hint);
    }
    match std::env::var_os(env_var) {
        Some(binary) if !binary.is_empty() => find_binary(binary, hint),
        _ => find_binary(default, hint),
    }
}

/// A new temporary directory `<tmp>/<prefix>XXXXXX` for `what`.
pub(crate) fn temp_dir(prefix: &str, what: &str) -> Result<tempfile::TempDir, ServerError> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|source| ServerError::Io {
            what: format!("create a temporary directory for {what}"),
            source,
        })
}

/// Runs `attempt` (which picks fresh ports each time) again, up to three
/// more times, while it fails because another process took one of its ports
/// before the server bound it.
pub(crate) async fn retry_on_taken_port<T, F, Fut>(
    what: &str,
    mut attempt: F,
) -> Result<T, ServerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ServerError>>,
{
    let mut retries = 0;
    loop {
        match attempt().await {
            Err(e) if retries < PORT_RETRIES && e.is_address_in_use() => {
                retries += 1;
                tracing::warn!("a port of {what} was taken meanwhile; retrying on other ports");
            }
            result => return result,
        }
    }
}

/// Awaits `future` for at most `timeout`; on expiry fails with
/// [`io::ErrorKind::TimedOut`] and the message `describe()` + " within …".
pub(crate) async fn within<T>(
    timeout: Duration,
    future: impl Future<Output = io::Result<T>>,
    describe: impl FnOnce() -> String,
) -> io::Result<T> {
    match tokio::time::timeout(timeout, future).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{} within {timeout:?}", describe()),
        )),
    }
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// A request to the spawner thread: the command and what to do with the result.
struct SpawnRequest {
    command: Command,
    reply: Box<dyn FnOnce(io::Result<Child>) + Send>,
}

/// The channel to the one thread that spawns every server. It is started on
/// first use and never exits (its `Sender` lives in a static), so the
/// parent-death signal of the servers fires only when the process dies.
fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
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
fn discard(mut child: Child) {
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

/// Where a server that can be killed and started again keeps its current
/// process (`None` while killed): pause, resume, kill and (re)launch with a
/// readiness probe, shared by every kind of server.
#[derive(Debug, Default)]
pub(crate) struct ProcessSlot {
    state: Mutex<Option<ServerProcess>>,
    options: SpawnOptions,
}

impl ProcessSlot {
    /// An empty slot whose processes are spawned with `options`.
    pub(crate) fn with_options(options: SpawnOptions) -> Self {
        Self {
            state: Mutex::default(),
            options,
        }
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

/// Defines the fault-injection methods `pid`, `pause`, `resume`, `kill`,
/// `restart` and `try_restart` inside the `impl` of a server type that has a
/// field `process: ProcessSlot` and an `async fn launch(&self) ->
/// Result<(), ServerError>` (which kills a running process first, starts it
/// on the same port in the same directory and waits until it is ready).
/// `$name` names the server in panic messages.
macro_rules! fault_injection {
    ($name:literal) => {
        /// The server's PID, `None` while it is killed (or has died).
        pub fn pid(&self) -> Option<u32> {
            self.process.pid()
        }

        /// Freezes the server with SIGSTOP (returning once all its threads
        /// stopped; for PostgreSQL, its backends and other children too):
        /// connections are still accepted by the kernel but nothing is
        /// answered until [`resume`](Self::resume). Does nothing while the
        /// server is killed.
        pub fn pause(&self) {
            self.process.pause();
        }

        /// Continues a paused server with SIGCONT.
        pub fn resume(&self) {
            self.process.resume();
        }

        /// Kills the server with SIGKILL (for PostgreSQL, its backends and
        /// other children too) and reaps it. The port and directory are kept
        /// for [`restart`](Self::restart). Idempotent.
        pub fn kill(&self) {
            self.process.kill();
        }

        /// Kills the server if it runs, then starts it again on the same
        /// port, in the same directory and with the same options, and waits
        /// until it is ready.
        ///
        /// # Panics
        ///
        /// With the [`ServerError`]'s message when it cannot be started.
        pub async fn restart(&self) {
            self.try_restart()
                .await
                .unwrap_or_else(|e| panic!(concat!("cannot restart ", $name, ": {}"), e));
        }

        /// Like [`restart`](Self::restart), but returns the error. On
        /// failure the server stays killed.
        pub async fn try_restart(&self) -> Result<(), ServerError> {
            self.launch().await
        }
    };
}
pub(crate) use fault_injection;

/// Polls `/proc/PID/task/*/stat` until no thread of `pid` can run any more
/// (stopped, traced, dead, or gone); `false` when `timeout` passed first.
fn wait_until_stopped(pid: u32, timeout: Duration) -> bool {
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

fn all_threads_stopped(pid: u32) -> bool {
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
struct ProcessId {
    pid: u32,
    start_time: u64,
}

impl ProcessId {
    fn raw_pid(self) -> Pid {
        // PIDs listed in /proc fit (pid_max is at most 2^22).
        Pid::from_raw(i32::try_from(self.pid).unwrap_or(i32::MAX))
    }
}

/// `/proc/PID/stat` of `pid` as (state, parent PID, start time).
fn proc_stat(pid: u32) -> Option<(char, u32, u64)> {
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
fn children_of(parent: u32) -> Vec<ProcessId> {
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
fn is_dead(process: ProcessId) -> bool {
    proc_stat(process.pid).is_none_or(|(state, _, start_time)| {
        start_time != process.start_time || matches!(state, 'Z' | 'X')
    })
}

/// Polls until every one of `processes` has exited; `false` when `timeout`
/// passed first.
fn wait_until_dead(processes: &[ProcessId], timeout: Duration) -> bool {
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

/// Whether this process runs as root (effective user ID 0).
pub(crate) fn running_as_root() -> bool {
    Uid::effective().is_root()
}

/// The name of this process's effective user (`uid<N>` when it has none).
pub(crate) fn current_user_name() -> String {
    let uid = Uid::effective();
    User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| format!("uid{uid}"), |user| user.name)
}

/// The user ID and primary group ID of the user `name`; `None` when there
/// is no such user.
pub(crate) fn user_ids(name: &str) -> io::Result<Option<(u32, u32)>> {
    let user = User::from_name(name).map_err(io::Error::from)?;
    Ok(user.map(|user| (user.uid.as_raw(), user.gid.as_raw())))
}

/// `text` reduced to characters that are safe in a file name (others become
/// `_`).
pub(crate) fn file_name_part(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Runs a helper command (`initdb`, `cp`…) to completion within `timeout`
/// and returns its stdout. The helper is killed when it times out or when the
/// returned future is dropped. A failure is a [`ServerError::Io`] whose
/// message has the exit status and the last lines of the helper's output.
pub(crate) async fn run_helper(
    what: &str,
    command: &mut tokio::process::Command,
    timeout: Duration,
) -> Result<String, ServerError> {
    let io_error = |source| ServerError::Io {
        what: format!("run {what}"),
        source,
    };
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| spawn_error(what, source))?;
    let output = within(timeout, child.wait_with_output(), || {
        format!("{what} did not finish")
    })
    .await
    .map_err(io_error)?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        return Ok(stdout);
    }
    let all = format!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    Err(io_error(io::Error::other(format!(
        "{}; last lines of its output:\n{}",
        output.status,
        tail(&all, LOG_TAIL_LINES)
    ))))
}

/// `<tmp>/lockkit-testkit-templates`: where template data directories are
/// kept unless a builder names another directory.
pub(crate) fn default_templates_root() -> PathBuf {
    std::env::temp_dir().join(TEMPLATES_DIR)
}

/// Returns the template directory `root/name`, building it first unless it
/// exists.
///
/// `build` fills a new, empty directory beside it
/// (`root/name.build-XXXXXX`), which is then renamed into place, so a
/// template that exists is complete. Builders racing for one template (tasks
/// of this process, or other processes: cargo nextest runs each test in its
/// own) build their own directories; the first rename wins and the others
/// discard theirs. Within this process builds are serialised, so the work is
/// done once. A failed build is removed.
///
/// `root` is created if missing, world-writable and sticky like `/tmp`, so
/// that the templates of different users (each keyed by its owner) can live
/// side by side.
pub(crate) async fn ensure_template<F, Fut>(
    root: &Path,
    name: &str,
    build: F,
) -> Result<PathBuf, ServerError>
where
    F: FnOnce(PathBuf) -> Fut,
    Fut: Future<Output = Result<(), ServerError>>,
{
    static BUILDING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let template = root.join(name);
    if template.is_dir() {
        return Ok(template);
    }
    let _building = BUILDING.lock().await;
    if template.is_dir() {
        return Ok(template);
    }
    create_shared_dir(root)?;
    let build_dir = tempfile::Builder::new()
        .prefix(&format!("{name}.build-"))
        .tempdir_in(root)
        .map_err(|source| ServerError::Io {
            what: format!("create a directory in {} to build {name}", root.display()),
            source,
        })?;
    let started = Instant::now();
    build(build_dir.path().to_path_buf()).await?;
    publish_template(build_dir, &template)?;
    tracing::debug!(
        "built the template {} in {:?}",
        template.display(),
        started.elapsed()
    );
    Ok(template)
}

/// Renames a finished build to `template`, or discards it when another
/// builder got there first.
fn publish_template(build: tempfile::TempDir, template: &Path) -> Result<(), ServerError> {
    match fs::rename(build.path(), template) {
        Ok(()) => {
            // Nothing is left at the build's path to remove.
            let _ = build.keep();
            Ok(())
        }
        Err(_) if template.is_dir() => {
            tracing::debug!(
                "{} was built by another process meanwhile; discarding ours",
                template.display()
            );
            Ok(())
        }
        Err(source) => Err(ServerError::Io {
            what: format!("move {} to {}", build.path().display(), template.display()),
            source,
        }),
    }
}

/// Creates `dir` (and its parents) unless it exists; a directory this
/// process creates is made world-writable and sticky, like `/tmp`.
fn create_shared_dir(dir: &Path) -> Result<(), ServerError> {
    if dir.is_dir() {
        return Ok(());
    }
    let io_error = |source| ServerError::Io {
        what: format!("create {}", dir.display()),
        source,
    };
    fs::create_dir_all(dir).map_err(io_error)?;
    let ours = fs::metadata(dir).map_err(io_error)?.uid() == Uid::effective().as_raw();
    if ours {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o1777)).map_err(io_error)?;
    }
    Ok(())
}

/// Copies the directory `template` to `dest` (which must not exist) with
/// `cp -a`: modes, owners and timestamps preserved.
pub(crate) async fn copy_template(template: &Path, dest: &Path) -> Result<(), ServerError> {
    let mut cp = tokio::process::Command::new("cp");
    cp.arg("-a").arg("--").arg(template).arg(dest);
    run_helper(
        &format!("cp -a {} {}", template.display(), dest.display()),
        &mut cp,
        Duration::from_secs(60),
    )
    .await
    .map(drop)
}

/// The tail of a server's log file, plus the tail of its stdout/stderr file
/// when that is a different, non-empty file.
pub(crate) fn log_tail(log_path: &Path, output_path: &Path, lines: usize) -> String {
    let mut out = match fs::read(log_path) {
        Ok(bytes) => tail(&String::from_utf8_lossy(&bytes), lines),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            format!("({} does not exist)", log_path.display())
        }
        Err(e) => format!("(cannot read {}: {e})", log_path.display()),
    };
    if output_path != log_path
        && let Ok(bytes) = fs::read(output_path)
    {
        let output = tail(&String::from_utf8_lossy(&bytes), lines);
        if !output.trim().is_empty() {
            out.push_str("\n--- stdout/stderr ---\n");
            out.push_str(&output);
        }
    }
    out
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Builds `setpriv [--reuid U --regid G --init-groups] --pdeathsig KILL --
/// <program> <args…>` from `command`.
fn wrap(
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
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => wrapped.env(key, value),
            None => wrapped.env_remove(key),
        };
    }
    if let Some(dir) = command.get_current_dir() {
        wrapped.current_dir(dir);
    }
    Ok(wrapped)
}

fn request(
    what: &str,
    command: Command,
    reply: Box<dyn FnOnce(io::Result<Child>) + Send>,
) -> Result<(), ServerError> {
    spawner()
        .send(SpawnRequest { command, reply })
        .map_err(|_| spawner_gone(what))
}

fn spawn_error(what: &str, source: io::Error) -> ServerError {
    ServerError::Spawn {
        what: what.to_owned(),
        source,
    }
}

fn spawner_gone(what: &str) -> ServerError {
    spawn_error(what, io::Error::other("the server spawner thread is gone"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_build_of_a_template_is_discarded() {
        let root = tempfile::tempdir().unwrap();
        let template = root.path().join("t");
        let first = tempfile::tempdir_in(root.path()).unwrap();
        fs::write(first.path().join("who"), "first").unwrap();
        let second = tempfile::tempdir_in(root.path()).unwrap();
        fs::write(second.path().join("who"), "second").unwrap();
        let second_path = second.path().to_path_buf();

        publish_template(first, &template).unwrap();
        publish_template(second, &template).unwrap();
        assert_eq!(fs::read_to_string(template.join("who")).unwrap(), "first");
        assert!(!second_path.exists(), "the losing build was not removed");
        let left: Vec<_> = fs::read_dir(root.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "{left:?}");
    }

    #[test]
    fn children_of_finds_a_child_and_is_dead_sees_it_exit() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let children = children_of(std::process::id());
        let found = children
            .iter()
            .find(|process| process.pid == child.id())
            .copied()
            .unwrap_or_else(|| panic!("{} not in {children:?}", child.id()));
        assert!(!is_dead(found));
        child.kill().unwrap();
        assert!(wait_until_dead(&[found], Duration::from_secs(2)));
        child.wait().unwrap();
        assert!(is_dead(found));
    }

    #[test]
    fn file_name_part_keeps_only_safe_characters() {
        assert_eq!(
            file_name_part("10.11.19-MariaDB-0+deb12u1 x/y"),
            "10.11.19-MariaDB-0+deb12u1_x_y"
        );
    }
}
