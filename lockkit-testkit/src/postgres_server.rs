//! A real PostgreSQL server on a free loopback port, for tests: see
//! [`PostgresServer`].

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::clock::ServerClock;
use crate::process::{
    ProcessSlot, Readiness, ServerError, SpawnOptions, copy_template, current_user_name,
    default_templates_root, ensure_template, file_name_part, find_binary, free_port,
    retry_on_taken_port, run_helper, running_as_root, temp_dir, user_ids, within,
};
use crate::server::{FaultControl, TestServer, one_process_server};

/// Environment variable naming the directory of PostgreSQL's binaries.
const BIN_DIR_ENV: &str = "LOCKKIT_POSTGRES_BIN_DIR";
/// Where Debian installs each PostgreSQL version: `<this>/<version>/bin`.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";
const INSTALL_HINT: &str = "run scripts/install-services.sh (or: apt-get install -y postgresql)";
/// The user a root test process runs PostgreSQL as; also the superuser
/// role `initdb` creates.
const SERVER_USER: &str = "postgres";
const READINESS: Readiness = Readiness::ms(30000, 2000, 10);
const PSQL_TIMEOUT: Duration = Duration::from_secs(5);
/// The timeout of `postgres --version` and of `initdb`.
const SETUP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long dropping a server waits for its watcher's cleanup.
const WATCHER_TIMEOUT: Duration = Duration::from_secs(2);
/// Changes whenever the template's `initdb` options change, so that an old
/// template left in the temporary directory is not used.
const TEMPLATE_REVISION: u32 = 1;
const DATA_DIR: &str = "data";
const LOG_FILE: &str = "postgres.log";
/// Server settings given with `-c` on every start (before the builder's).
const SETTINGS: &[(&str, &str)] = &[
    ("listen_addresses", "127.0.0.1"),
    ("fsync", "off"),
    ("max_connections", "200"),
    ("shared_buffers", "16MB"),
    // Dynamic shared memory as files in the data directory, which goes with
    // the server's temporary directory: POSIX segments (Debian's default)
    // are left in /dev/shm by every killed server, and hold memory there.
    ("dynamic_shared_memory_type", "mmap"),
];

/// The watcher's script (`$1`: the data directory). `read` returns at the
/// end of its stdin, a pipe whose other end only the test process holds.
/// `-ef` compares device and inode, and is built into `sh` (no fork per
/// process). Line 7 of `postmaster.pid` is the shared memory key and ID.
const WATCHER_SCRIPT: &str = r#"read -r _
for p in /proc/[0-9]*; do
    [ "$p/cwd" -ef "$1" ] && kill -KILL "${p#/proc/}" 2>/dev/null
done
set -- $(sed -n 7p "$1/postmaster.pid" 2>/dev/null)
if [ $# -eq 2 ] && awk -v k="$1" -v i="$2" '$1 == k && $2 == i { f = 1 } END { exit !f }' /proc/sysvipc/shm; then
    ipcrm -m "$2" 2>/dev/null
fi
exit 0
"#;

/// PostgreSQL's binaries, from one directory.
#[derive(Clone, Debug)]
struct Binaries {
    dir: PathBuf,
    postgres: PathBuf,
    initdb: PathBuf,
    pg_isready: PathBuf,
    psql: PathBuf,
}

impl Binaries {
    /// The binaries in `explicit`, else in `$LOCKKIT_POSTGRES_BIN_DIR`, else
    /// in the newest `/usr/lib/postgresql/*/bin`.
    fn find(explicit: Option<&Path>) -> Result<Self, ServerError> {
        let dir = match (explicit, std::env::var_os(BIN_DIR_ENV)) {
            (Some(dir), _) => dir.to_path_buf(),
            (None, Some(dir)) if !dir.is_empty() => PathBuf::from(dir),
            _ => newest_debian_bin_dir().ok_or_else(|| ServerError::NotInstalled {
                binary: format!("{DEBIAN_ROOT}/*/bin/postgres"),
                hint: INSTALL_HINT.to_owned(),
            })?,
        };
        let binary = |name: &str| find_binary(dir.join(name), INSTALL_HINT);
        Ok(Self {
            postgres: binary("postgres")?,
            initdb: binary("initdb")?,
            pg_isready: binary("pg_isready")?,
            psql: binary("psql")?,
            dir,
        })
    }

    /// The major version (`15`), from `postgres --version`; asked once per
    /// binary and process.
    async fn major_version(&self) -> Result<String, ServerError> {
        static VERSIONS: OnceLock<Mutex<HashMap<PathBuf, String>>> = OnceLock::new();
        let versions = VERSIONS.get_or_init(Mutex::default);
        let cached = versions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&self.postgres)
            .cloned();
        if let Some(version) = cached {
            return Ok(version);
        }
        let mut command = tokio::process::Command::new(&self.postgres);
        command.arg("--version");
        let what = format!("{} --version", self.postgres.display());
        let output = run_helper(&what, &mut command, SETUP_TIMEOUT).await?;
        // "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"
        let version = output
            .split_whitespace()
            .skip_while(|word| *word != "(PostgreSQL)")
            .nth(1)
            .and_then(|version| version.split('.').next())
            .map(file_name_part)
            .ok_or_else(|| ServerError::Io {
                what: format!("read the version in the output of {what}"),
                source: io::Error::new(io::ErrorKind::InvalidData, output.trim().to_owned()),
            })?;
        versions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(self.postgres.clone(), version.clone());
        Ok(version)
    }
}

/// The `bin` directory of the newest version under `/usr/lib/postgresql`
/// that has a `postgres` binary.
fn newest_debian_bin_dir() -> Option<PathBuf> {
    let version_of = |name: &str| -> Option<Vec<u32>> {
        name.split('.').map(|part| part.parse().ok()).collect()
    };
    fs::read_dir(DEBIAN_ROOT)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = version_of(entry.file_name().to_str()?)?;
            let bin = entry.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .max()
        .map(|(_, bin)| bin)
}

/// Who runs initdb and the server: `Some((uid, gid))` of `postgres` when
/// this process is root, `None` (this process's user) otherwise.
fn server_credentials() -> Result<Option<(u32, u32)>, ServerError> {
    if !running_as_root() {
        return Ok(None);
    }
    let what = || {
        format!(
            "find the user {SERVER_USER} (PostgreSQL refuses to run as root; \
             Debian's postgresql package creates this user: {INSTALL_HINT})"
        )
    };
    match user_ids(SERVER_USER) {
        Ok(Some(ids)) => Ok(Some(ids)),
        Ok(None) => Err(ServerError::Io {
            what: what(),
            source: io::Error::new(io::ErrorKind::NotFound, "no such user"),
        }),
        Err(source) => Err(ServerError::Io {
            what: what(),
            source,
        }),
    }
}

/// `setpriv --reuid U --regid G --init-groups -- program` when `run_as` is
/// set, else `program`.
fn command_as(run_as: Option<(u32, u32)>, program: &Path) -> tokio::process::Command {
    match run_as {
        Some((uid, gid)) => {
            let mut command = tokio::process::Command::new("setpriv");
            command
                .arg(format!("--reuid={uid}"))
                .arg(format!("--regid={gid}"))
                .args(["--init-groups", "--"])
                .arg(program);
            command
        }
        None => tokio::process::Command::new(program),
    }
}

/// Gives `path` to the user `run_as` (when set).
fn chown_to(path: &Path, run_as: Option<(u32, u32)>) -> Result<(), ServerError> {
    let Some((uid, gid)) = run_as else {
        return Ok(());
    };
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|source| ServerError::Io {
        what: format!("give {} to the user {SERVER_USER}", path.display()),
        source,
    })
}

/// The template data directory for these binaries and user, built with
/// `initdb` unless it exists.
async fn template(
    binaries: &Binaries,
    run_as: Option<(u32, u32)>,
    root: &Path,
) -> Result<PathBuf, ServerError> {
    let user = match run_as {
        Some(_) => SERVER_USER.to_owned(),
        None => file_name_part(&current_user_name()),
    };
    let major = binaries.major_version().await?;
    let name = format!("postgres-{major}-{user}-r{TEMPLATE_REVISION}");
    let template = root.join(&name);
    ensure_template(root, &name, |dir| async move {
        chown_to(&dir, run_as)?;
        let mut initdb = command_as(run_as, &binaries.initdb);
        initdb
            .arg("-D")
            .arg(&dir)
            .args(["-U", SERVER_USER, "-A", "trust", "--no-sync"])
            .args(["--locale=C.UTF-8", "-E", "UTF8"])
            .current_dir(&dir);
        let what = format!(
            "{} (building the template data directory {})",
            binaries.initdb.display(),
            template.display()
        );
        run_helper(&what, &mut initdb, SETUP_TIMEOUT)
            .await
            .map(drop)
    })
    .await
}

/// A PostgreSQL server (a postmaster and its children) bound to `127.0.0.1`
/// on a free port, with its own temporary directory (`data/`, the data
/// directory, which also holds the Unix socket; `postgres.log`, the server's
/// output). Superuser `postgres`, no password (`trust`), database
/// `postgres`; `fsync=off`, `max_connections=200`, `shared_buffers=16MB`,
/// `dynamic_shared_memory_type=mmap`.
///
/// The server is killed when the `PostgresServer` is dropped, and also when
/// the test process dies (even if the server lives in a static, and even if
/// it is paused then). Fault injection: [`pause`](Self::pause) (SIGSTOP to
/// the postmaster and all its children), [`resume`](Self::resume),
/// [`kill`](Self::kill) (SIGKILL to all of them) and
/// [`restart`](Self::restart) on the same port with the same data directory,
/// so committed data survives (after crash recovery).
///
/// * **Binaries:** from `$LOCKKIT_POSTGRES_BIN_DIR`, else from the newest
///   `/usr/lib/postgresql/<version>/bin` (Debian's layout): `postgres`,
///   `initdb`, `pg_isready` and `psql`.
/// * **Template:** `initdb` runs once per machine, PostgreSQL major version
///   and user, into
///   `<tmp>/lockkit-testkit-templates/postgres-<major>-<user>-r<N>`; every
///   server starts from a `cp -a` copy of it. Test processes racing to build
///   it (cargo nextest runs each test in its own) each build their own copy
///   beside it and rename it into place; the first wins.
/// * **User:** PostgreSQL refuses to run as root, so a root test process runs
///   `initdb` and the server as the user `postgres` (created by Debian's
///   package) through `setpriv --reuid --regid --init-groups`, and the
///   server's directory belongs to that user. setpriv sets the parent-death
///   signal after switching user (a switch would clear it), so the server
///   still dies with the test process. A test process that is not root runs
///   everything as itself.
/// * **Children:** the postmaster forks backends and auxiliary processes that
///   call `setsid`, so they are not in its process group: pause, resume and
///   kill also signal every process whose parent is the postmaster (while the
///   postmaster is stopped, so that none is forked or reaped meanwhile).
/// * **Watcher:** one small `sh` per server waits for the end of a pipe that
///   only the test process holds. When the test process dies (however it
///   dies) or drops the server, the watcher kills every process whose working
///   directory is the server's data directory, and removes the server's
///   System V shared memory segment, which a killed postmaster leaves behind.
///   Without it, the children of a server paused when the test process died
///   would stay stopped forever (a stopped process ignores all but SIGKILL
///   and SIGCONT, and only the postmaster gets the parent-death signal).
pub struct PostgresServer {
    port: u16,
    binaries: Binaries,
    settings: Vec<(String, String)>,
    run_as: Option<(u32, u32)>,
    process: ProcessSlot,
    /// The watcher (see the module documentation); `None` once it is gone.
    watcher: Option<Child>,
    dir: TempDir,
}

/// Configures a [`PostgresServer`] before starting it.
#[derive(Debug, Default)]
pub struct PostgresServerBuilder {
    bin_dir: Option<PathBuf>,
    settings: Vec<(String, String)>,
    templates: Option<PathBuf>,
    shiftable_clock: bool,
}

impl PostgresServerBuilder {
    /// Uses the binaries (`postgres`, `initdb`, `pg_isready`, `psql`) in this
    /// directory instead of `$LOCKKIT_POSTGRES_BIN_DIR` or the newest
    /// `/usr/lib/postgresql/*/bin`.
    pub fn bin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.bin_dir = Some(dir.into());
        self
    }

    /// Adds (or, being later on the command line, overrides) a server
    /// setting, passed as `-c name=value`, e.g.
    /// `setting("lock_timeout", "2s")`.
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Keeps the template data directory under this directory instead of
    /// `<tmp>/lockkit-testkit-templates` (created if missing). When the test
    /// process is root, the user `postgres` must be able to reach it.
    pub fn templates_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.templates = Some(dir.into());
        self
    }

    /// Runs the server with a wall clock that a test can move
    /// ([`FaultControl::clock`](crate::FaultControl::clock), see
    /// [`ServerClock`](crate::ServerClock)). Off by default: every clock read
    /// then costs a system call.
    pub fn shiftable_clock(mut self, on: bool) -> Self {
        self.shiftable_clock = on;
        self
    }

    /// Starts the server and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// With the [`ServerError`]'s message when it cannot be started.
    pub async fn start(self) -> PostgresServer {
        self.try_start().await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts the server and waits until it accepts connections: builds the
    /// template data directory first if needed, then copies it.
    ///
    /// When another process takes the chosen port before the server binds it,
    /// retries up to three times on a new port.
    pub async fn try_start(self) -> Result<PostgresServer, ServerError> {
        let binaries = Binaries::find(self.bin_dir.as_deref())?;
        let run_as = server_credentials()?;
        let root = self.templates.unwrap_or_else(default_templates_root);
        let template = template(&binaries, run_as, &root).await?;
        retry_on_taken_port("PostgreSQL", || async {
            let dir = temp_dir("lockkit-postgres-", "PostgreSQL")?;
            chown_to(dir.path(), run_as)?;
            let data_dir = dir.path().join(DATA_DIR);
            copy_template(&template, &data_dir).await?;
            let mut server = PostgresServer {
                port: free_port(),
                binaries: binaries.clone(),
                settings: self.settings.clone(),
                run_as,
                process: ProcessSlot::with_options(SpawnOptions {
                    run_as,
                    signal_children: true,
                })
                .with_clock(
                    self.shiftable_clock
                        .then(|| ServerClock::in_dir(dir.path()))
                        .transpose()?,
                ),
                watcher: None,
                dir,
            };
            server.watcher = Some(spawn_watcher(&data_dir)?);
            server.launch().await.map(|()| server)
        })
        .await
    }
}

/// Starts the watcher for the data directory `data_dir`.
fn spawn_watcher(data_dir: &Path) -> Result<Child, ServerError> {
    Command::new("sh")
        .arg("-c")
        .arg(WATCHER_SCRIPT)
        .arg("sh")
        .arg(data_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .current_dir("/")
        // Not in the test's process group, so that e.g. Ctrl-C in a terminal
        // does not end it before it has cleaned up.
        .process_group(0)
        .spawn()
        .map_err(|source| ServerError::Spawn {
            what: format!("the watcher of {}", data_dir.display()),
            source,
        })
}

impl PostgresServer {
    /// A builder for a server with options.
    pub fn builder() -> PostgresServerBuilder {
        PostgresServerBuilder::default()
    }

    /// The data directory, `dir()/data` (also the Unix socket's directory).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join(DATA_DIR)
    }

    /// The directory of the PostgreSQL binaries used (`postgres`, `psql`…).
    pub fn bin_dir(&self) -> &Path {
        &self.binaries.dir
    }

    /// The last `lines` lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.dir.path().join(LOG_FILE);
        crate::process::log_tail(&log, &log, lines)
    }

    /// Runs `sql` with `psql` (as `postgres`, in database `postgres`, over
    /// TCP, unaligned and without headers: `-At`, stopping at the first
    /// error) and returns its output, trimmed: one line per row, columns
    /// separated by `|`.
    ///
    /// Fails with [`io::ErrorKind::TimedOut`] when that takes more than 5 s
    /// (e.g. while paused), and with psql's exit status and error output when
    /// psql fails (the server is down, the SQL is wrong…).
    pub async fn psql(&self, sql: &str) -> io::Result<String> {
        let mut command = tokio::process::Command::new(&self.binaries.psql);
        command
            .arg("-X") // no ~/.psqlrc
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", SERVER_USER, "-d", "postgres"])
            .args(["-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let output = within(PSQL_TIMEOUT, command.output(), || {
            format!("psql on {} did not finish", self.addr())
        })
        .await?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
        } else {
            Err(io::Error::other(format!(
                "psql on {} failed ({}): {}",
                self.addr(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }

    fn what(&self) -> String {
        format!("PostgreSQL on {}", self.addr())
    }

    /// Spawns the postmaster (killing a running one first) and waits until
    /// it accepts connections; on failure kills it again.
    async fn launch(&self) -> Result<(), ServerError> {
        let data_dir = self.data_dir();
        let mut command = Command::new(&self.binaries.postgres);
        command
            .arg("-D")
            .arg(&data_dir)
            .args(["-p", &self.port.to_string()])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", data_dir.display()));
        let builder_settings = self.settings.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        for (name, value) in SETTINGS.iter().copied().chain(builder_settings) {
            command.arg("-c").arg(format!("{name}={value}"));
        }
        command.current_dir(&data_dir);
        let log = self.dir.path().join(LOG_FILE);
        let port = self.port;
        let pg_isready = &self.binaries.pg_isready;
        self.process
            .launch(&self.what(), &command, &log, &log, READINESS, |pid| {
                probe(pg_isready, &data_dir, port, pid)
            })
            .await
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        // Before the temporary directory is removed.
        self.kill();
        if let Some(mut watcher) = self.watcher.take() {
            // The end of its input: it kills whatever is left (nothing, by
            // now) and frees the shared memory segment.
            drop(watcher.stdin.take());
            let started = Instant::now();
            while matches!(watcher.try_wait(), Ok(None)) {
                if started.elapsed() >= WATCHER_TIMEOUT {
                    tracing::warn!("the watcher of {} did not finish", self.what());
                    let _ = watcher.kill();
                    let _ = watcher.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

/// One readiness probe: `postmaster.pid` names our postmaster `pid` and
/// `port` with the status `ready` (the postmaster writes it once it has
/// bound its sockets and accepts connections, so it is ours that listens),
/// and `pg_isready` confirms over TCP.
async fn probe(pg_isready: &Path, data_dir: &Path, port: u16, pid: u32) -> bool {
    let Ok(lock_file) = tokio::fs::read_to_string(data_dir.join("postmaster.pid")).await else {
        return false;
    };
    let lines: Vec<&str> = lock_file.lines().map(str::trim).collect();
    if lines.first() != Some(&pid.to_string().as_str())
        || lines.get(3) != Some(&port.to_string().as_str())
        || lines.get(7) != Some(&"ready")
    {
        return false;
    }
    tokio::process::Command::new(pg_isready)
        .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-U", SERVER_USER, "-d", "postgres", "-t", "2"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .status()
        .await
        .is_ok_and(|status| status.success())
}

one_process_server!(
    PostgresServer,
    start: Self::builder().try_start(),
    url: |server| format!("postgres://{SERVER_USER}@127.0.0.1:{}/postgres", server.port),
    debug: |server| {
        "bin_dir" => &server.binaries.dir,
        "user" => &server.run_as.map_or("(this process's user)", |_| SERVER_USER),
        "settings" => &server.settings,
    },
);
