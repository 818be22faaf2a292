//! What starting a server needs: ports, binaries, directories, users,
//! helper commands and log tails.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::{self};
use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use nix::unistd::{Uid, User};

use super::*;

/// How many lines of a server's log an error message includes.
pub(crate) const LOG_TAIL_LINES: usize = 20;

/// Extra attempts, each on new ports, when a start finds a port taken.
pub(crate) const PORT_RETRIES: usize = 3;

/// Returns a TCP port on 127.0.0.1 that was free a moment ago.
///
/// The port is drawn at random below the kernel's range of ephemeral ports
/// (`net.ipv4.ip_local_port_range`) and checked by binding it: a port in
/// that range can be taken by any outgoing connection (or a client's
/// connection to itself) while its server is down for a test and
/// restarted on it, and the tests make connections by the thousand. Where
/// the range leaves no room below it, the kernel chooses (`127.0.0.1:0`).
/// Another process may still take the port before the server binds it, so
/// callers retry on "address already in use". Within this process the same
/// port is never returned twice, so servers started concurrently (and ports
/// kept for a restart) do not collide with each other; and a port handed
/// out is reserved for the life of this process in a lock file that other
/// test processes respect (`<tmp>/lockkit-testkit-ports/<port>`), so that
/// a server down for a test is restarted on its port even while other test
/// processes look for ports.
pub fn free_port() -> u16 {
    static HANDED_OUT: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let handed_out = HANDED_OUT.get_or_init(|| Mutex::new(HashSet::new()));
    let below = ephemeral_ports_start();
    // Draws left before the kernel chooses: a machine whose ports below
    // the range are nearly all taken still gets one.
    let mut draws = if below > FIRST_TEST_PORT + MIN_TEST_PORTS {
        1000
    } else {
        0
    };
    loop {
        let port = if draws > 0 {
            draws -= 1;
            let port = fastrand::u16(FIRST_TEST_PORT..below);
            if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err() {
                continue;
            }
            port
        } else {
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .and_then(|listener| listener.local_addr())
                .map(|addr| addr.port())
                .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0 to find a free port: {e}"))
        };
        let mut handed_out = handed_out.lock().unwrap_or_else(PoisonError::into_inner);
        if !handed_out.contains(&port) && reserve(port) {
            handed_out.insert(port);
            return port;
        }
    }
}

/// Reserves `port` for the life of this process against other processes
/// that use [`free_port`]: an exclusive lock on its file, held until the
/// process exits (the kernel drops it then, however the process ends).
/// `false` when another live process holds it. A directory that cannot be
/// made reserves nothing and refuses nothing.
fn reserve(port: u16) -> bool {
    static HELD: Mutex<Vec<fs::File>> = Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("lockkit-testkit-ports");
    if fs::create_dir_all(&dir).is_err() {
        return true;
    }
    let Ok(file) = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
    else {
        return true;
    };
    match file.try_lock() {
        Ok(()) => {
            HELD.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(file);
            true
        }
        Err(fs::TryLockError::WouldBlock) => false,
        Err(fs::TryLockError::Error(_)) => true,
    }
}

/// The lowest port [`free_port`] draws: above the well-known ports and
/// those of services installed on the machine (5432, 3306, 6379, 2181,
/// 2379…).
pub(crate) const FIRST_TEST_PORT: u16 = 10_000;

/// How many ports [`free_port`] needs between [`FIRST_TEST_PORT`] and the
/// ephemeral range to draw from them.
pub(crate) const MIN_TEST_PORTS: u16 = 1000;

/// The first port of the kernel's ephemeral range (32768 when it cannot be
/// read), read once.
pub(crate) fn ephemeral_ports_start() -> u16 {
    static START: OnceLock<u16> = OnceLock::new();
    *START.get_or_init(|| {
        fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|range| range.split_whitespace().next()?.parse().ok())
            .unwrap_or(32_768)
    })
}

/// A port on 127.0.0.1 where nothing listens, and nothing will while this
/// value lives: its socket is bound but never listens, so a connection is
/// refused at once and no other process (another test's server) can take
/// the port meanwhile, as it could one from [`free_port`].
#[derive(Debug)]
pub struct ClosedPort {
    _socket: tokio::net::TcpSocket,
    port: u16,
}

impl ClosedPort {
    /// Reserves one.
    ///
    /// # Panics
    ///
    /// If no socket can be bound on 127.0.0.1 (no loopback interface).
    pub fn reserve() -> ClosedPort {
        let bound = tokio::net::TcpSocket::new_v4().and_then(|socket| {
            socket.bind((Ipv4Addr::LOCALHOST, 0).into())?;
            let port = socket.local_addr()?.port();
            Ok((socket, port))
        });
        let (socket, port) =
            bound.unwrap_or_else(|e| panic!("cannot bind a socket on 127.0.0.1: {e}"));
        ClosedPort {
            _socket: socket,
            port,
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
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

/// A new temporary directory `/dev/shm/<prefix>XXXXXX` (memory, where
/// `fsync` costs nothing) for a server whose every write is synced to disk,
/// or [`temp_dir`]'s where there is no `/dev/shm`.
pub(crate) fn memory_temp_dir(prefix: &str, what: &str) -> Result<tempfile::TempDir, ServerError> {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return temp_dir(prefix, what);
    }
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(shm)
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

pub(crate) fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
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

/// Runs a short helper tool (`openssl`, `ip`, `cc`) to its end: `what`
/// names it in errors, `hint` says how to get it or what it needs. Fails
/// when it cannot be started, or exits unsuccessfully (with its stderr).
pub(crate) fn run_tool(
    what: &str,
    command: &mut std::process::Command,
    hint: &str,
) -> Result<(), ServerError> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ServerError::Io {
            what: format!("run {what} ({hint})"),
            source,
        })?;
    if output.status.success() {
        return Ok(());
    }
    Err(ServerError::Io {
        what: format!(
            "{what} failed: {} ({hint})",
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        source: io::Error::other(output.status.to_string()),
    })
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

pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
