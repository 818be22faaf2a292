//! A real `redis-server` on a free loopback port, for tests.

use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;

use crate::clock::ServerClock;
use crate::netns::Fabric;
use crate::process::{
    ProcessSlot, Readiness, ServerError, free_port, resolve_binary, retry_on_taken_port, temp_dir,
};
use crate::redis_resp;
use crate::server::{TestServer, one_process_server};

/// Environment variable that overrides the `redis-server` binary.
const BINARY_ENV: &str = "LOCKKIT_REDIS_SERVER";
const INSTALL_HINT: &str = "run scripts/install-services.sh (or: apt-get install -y redis-server)";
const READINESS: Readiness = Readiness::ms(10000, 200, 10);
const LOG_FILE: &str = "redis.log";
const OUTPUT_FILE: &str = "redis.stdout.log";

/// Options shared by every (re)start of one server.
#[derive(Clone, Default)]
struct Options {
    appendonly: bool,
    password: Option<String>,
    args: Vec<String>,
    binary: Option<PathBuf>,
    shiftable_clock: bool,
    /// The namespace it runs in, if not the test's.
    netns: Option<(Arc<Fabric>, usize)>,
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("appendonly", &self.appendonly)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("extra_args", &self.args.len())
            .field("binary", &self.binary)
            .field("shiftable_clock", &self.shiftable_clock)
            .field(
                "netns",
                &self.netns.as_ref().map(|(fabric, i)| fabric.ip(*i)),
            )
            .finish()
    }
}

/// A `redis-server` child process bound to `127.0.0.1` on a free port, with
/// its own temporary directory, for tests.
///
/// The process is killed when the `RedisServer` is dropped, and also when the
/// test process dies (even if the server lives in a static). Fault injection:
/// [`pause`](crate::FaultControl::pause) (SIGSTOP), [`resume`](crate::FaultControl::resume),
/// [`kill`](crate::FaultControl::kill) and [`restart`](crate::FaultControl::restart) on the same port.
///
/// The `Debug` output never contains the password.
pub struct RedisServer {
    port: u16,
    /// 127.0.0.1, or the address of its network namespace.
    host: Ipv4Addr,
    binary: PathBuf,
    options: Options,
    process: ProcessSlot,
    dir: TempDir,
}

/// Configures a [`RedisServer`] before starting it.
#[derive(Debug, Default)]
pub struct RedisServerBuilder {
    options: Options,
}

impl RedisServerBuilder {
    /// AOF persistence (`--appendonly yes --appendfsync always`), so written
    /// data survives [`kill`](crate::FaultControl::kill) and [`restart`](crate::FaultControl::restart).
    /// Off by default: a restart then starts empty.
    pub fn appendonly(mut self, on: bool) -> Self {
        self.options.appendonly = on;
        self
    }

    /// Requires this password (`--requirepass`). [`RedisServer::url`] then
    /// contains it and [`RedisServer::command`] authenticates first.
    pub fn password(mut self, password: &str) -> Self {
        self.options.password = Some(password.to_owned());
        self
    }

    /// Appends a raw `redis-server` command-line argument (e.g. TLS options).
    pub fn arg(mut self, arg: &str) -> Self {
        self.options.args.push(arg.to_owned());
        self
    }

    /// Uses this `redis-server` binary (a path, or a name searched on `PATH`)
    /// instead of `$LOCKKIT_REDIS_SERVER` or `redis-server` on `PATH`.
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.options.binary = Some(path.into());
        self
    }

    /// Runs the server with a wall clock that a test can move
    /// ([`FaultControl::clock`](crate::FaultControl::clock), see
    /// [`ServerClock`](crate::ServerClock)). Off by default: every clock read
    /// then costs a system call.
    pub fn shiftable_clock(mut self, on: bool) -> Self {
        self.options.shiftable_clock = on;
        self
    }

    /// Runs the server in namespace `index` of `fabric`, bound to that
    /// namespace's address (see [`Fabric`]).
    pub fn in_namespace(mut self, fabric: Arc<Fabric>, index: usize) -> Self {
        self.options.netns = Some((fabric, index));
        self
    }

    /// Starts the server and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// With the [`ServerError`]'s message when it cannot be started.
    pub async fn start(self) -> RedisServer {
        self.try_start().await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts the server and waits until it answers `PING`.
    ///
    /// When another process takes the chosen port before the server binds it,
    /// retries up to three times on a new port.
    pub async fn try_start(self) -> Result<RedisServer, ServerError> {
        let binary = resolve_binary(
            self.options.binary.as_deref(),
            BINARY_ENV,
            "redis-server",
            INSTALL_HINT,
        )?;
        retry_on_taken_port("redis-server", || async {
            let dir = temp_dir("lockkit-redis-", "redis-server")?;
            let clock = self.options.shiftable_clock;
            let netns = self.options.netns.clone();
            let server = RedisServer {
                port: free_port(),
                host: netns
                    .as_ref()
                    .map_or(Ipv4Addr::LOCALHOST, |(fabric, i)| fabric.ip(*i)),
                binary: binary.clone(),
                options: self.options.clone(),
                process: ProcessSlot::default()
                    .with_clock(clock.then(|| ServerClock::in_dir(dir.path())).transpose()?)
                    .with_netns(netns),
                dir,
            };
            server.launch().await.map(|()| server)
        })
        .await
    }
}

impl RedisServer {
    /// A builder for a server with options.
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// The last `lines` lines of the server's log (and of its stdout/stderr).
    pub fn log_tail(&self, lines: usize) -> String {
        crate::process::log_tail(
            &self.dir.path().join(LOG_FILE),
            &self.dir.path().join(OUTPUT_FILE),
            lines,
        )
    }

    /// Sends one command over a new TCP connection (after `AUTH` when a
    /// password is set) and returns the reply as text: simple strings, errors
    /// and integers as their text (an error as e.g. `ERR unknown command…`),
    /// bulk strings as their content, nil as `(nil)`, arrays as their items
    /// joined by spaces.
    ///
    /// Fails with [`io::ErrorKind::TimedOut`] when there is no reply within
    /// 2 s (e.g. while paused), with the connection's error when the server is
    /// down, and with [`io::ErrorKind::PermissionDenied`] when `AUTH` fails.
    pub async fn command(&self, args: &[&str]) -> Result<String, io::Error> {
        if args.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty redis command",
            ));
        }
        redis_resp::command_with(self.addr(), self.options.password.as_deref(), args).await
    }

    /// Whether the server reports the replication `role` (`"master"` or
    /// `"slave"`, as `INFO replication` names them) within `timeout`; a
    /// replica only once its link to the master is up too, so that it
    /// replicates (and acknowledges `WAIT`) from then on. Asked every 50 ms.
    pub async fn wait_for_role(&self, role: &str, timeout: Duration) -> bool {
        crate::eventually(timeout, || async {
            self.command(&["INFO", "replication"])
                .await
                .is_ok_and(|info| {
                    redis_resp::info_field(&info, "role") == Some(role)
                        && (role == "master"
                            || redis_resp::info_field(&info, "master_link_status") == Some("up"))
                })
        })
        .await
    }

    /// How many live keys match the glob `pattern` (a key past its expiry is
    /// not counted, even before the server has removed it).
    pub async fn count_keys(&self, pattern: &str) -> Result<usize, io::Error> {
        let count = self
            .command(&["EVAL", "return #redis.call('KEYS', ARGV[1])", "0", pattern])
            .await?;
        count.parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("counting keys {pattern:?}: the server answered {count:?}"),
            )
        })
    }

    fn what(&self) -> String {
        format!("redis-server on {}", self.addr())
    }

    fn redis_args(&self) -> Vec<String> {
        let dir = self.dir.path().to_string_lossy().into_owned();
        let logfile = self
            .dir
            .path()
            .join(LOG_FILE)
            .to_string_lossy()
            .into_owned();
        let mut args: Vec<String> = [
            "--port",
            &self.port.to_string(),
            "--bind",
            &self.host.to_string(),
            "--save",
            "",
            "--daemonize",
            "no",
            "--dir",
            &dir,
            "--logfile",
            &logfile,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        if self.options.netns.is_some() {
            // Reached from the test's namespace, not over loopback, which
            // protected mode would refuse without a password.
            args.extend(["--protected-mode", "no"].map(String::from));
        }
        if self.options.appendonly {
            args.extend(["--appendonly", "yes", "--appendfsync", "always"].map(String::from));
        } else {
            args.extend(["--appendonly", "no"].map(String::from));
        }
        if let Some(password) = &self.options.password {
            args.extend(["--requirepass".to_owned(), password.clone()]);
        }
        args.extend(self.options.args.iter().cloned());
        args
    }

    /// Spawns the process (killing a running one first) and waits until it
    /// answers `PING`; on failure kills it again.
    async fn launch(&self) -> Result<(), ServerError> {
        let mut command = Command::new(&self.binary);
        command.args(self.redis_args()).current_dir(self.dir.path());
        let addr = self.addr();
        let password = self.options.password.as_deref();
        let (log, output) = (
            self.dir.path().join(LOG_FILE),
            self.dir.path().join(OUTPUT_FILE),
        );
        self.process
            .launch(
                &self.what(),
                &command,
                &log,
                &output,
                READINESS,
                // `INFO` must name our PID, so a stranger that took the port
                // is never mistaken for our server.
                |pid| redis_resp::probe(addr, password, pid),
            )
            .await
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

one_process_server!(
    RedisServer,
    start: Self::builder().try_start(),
    url: |server| match &server.options.password {
        Some(password) => format!(
            "redis://:{}@{}:{}",
            percent_encode(password),
            server.host,
            server.port
        ),
        None => format!("redis://{}:{}", server.host, server.port),
    },
    host: |server| ::std::net::IpAddr::V4(server.host),
    debug: |server| {
        "binary" => &server.binary,
        "appendonly" => &server.options.appendonly,
        "password" => &server.options.password.as_ref().map(|_| "<redacted>"),
        "extra_args" => &server.options.args.len(),
    },
    kill_on_drop,
);
