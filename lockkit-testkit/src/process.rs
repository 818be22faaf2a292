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

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fmt;
use std::fs::{self, File};
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError, mpsc};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// How many lines of a server's log an error message includes.
pub(crate) const LOG_TAIL_LINES: usize = 20;

const SETPRIV_HINT: &str =
    "install util-linux (it provides setpriv: apt-get install -y util-linux)";

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

/// Why a test server could not be started (or restarted).
#[derive(Debug)]
pub enum ServerError {
    /// The server's binary (or a helper such as `setpriv`) is not installed.
    NotInstalled {
        /// The binary looked for: a name searched on `PATH`, or a path.
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
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotInstalled { binary, hint } => {
                if binary.contains('/') {
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
/// kernel may have reused is never signalled.
#[derive(Debug)]
pub struct ServerProcess {
    what: String,
    child: Child,
    log_path: PathBuf,
    output_path: PathBuf,
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
        let wrapped = wrap(what, command, output_path)?;
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
        Ok(Self::new(what, child, log_path, output_path))
    }

    fn new(what: &str, child: Child, log_path: &Path, output_path: &Path) -> Self {
        tracing::debug!(pid = child.id(), "started {what}");
        Self {
            what: what.to_owned(),
            child,
            log_path: log_path.to_path_buf(),
            output_path: output_path.to_path_buf(),
            reaped: None,
        }
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
    /// nothing until [`ServerProcess::resume`].
    pub fn pause(&mut self) -> io::Result<()> {
        self.signal(Signal::SIGSTOP)
    }

    /// Continues a paused server with SIGCONT.
    pub fn resume(&mut self) -> io::Result<()> {
        self.signal(Signal::SIGCONT)
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
    pub fn kill(&mut self) {
        if !self.is_running() {
            return;
        }
        if let Ok(pid) = self.raw_pid() {
            // SIGKILL also ends a stopped (paused) process.
            if killpg(pid, Signal::SIGKILL).is_err() {
                let _ = kill(pid, Signal::SIGKILL);
            }
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

/// Builds `setpriv --pdeathsig KILL -- <program> <args…>` from `command`.
fn wrap(what: &str, command: &Command, output_path: &Path) -> Result<Command, ServerError> {
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
