//! A real MariaDB server on a free loopback port, for tests: see
//! [`MariaDbServer`].

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tempfile::TempDir;
use tokio::net::TcpStream;

use crate::clock::ServerClock;
use crate::process::{
    ProcessSlot, Readiness, ServerError, copy_template, current_user_name, default_templates_root,
    ensure_template, file_name_part, find_binary, free_port, retry_on_taken_port, run_helper,
    running_as_root, temp_dir, within,
};
use crate::server::{TestServer, one_process_server};

/// Environment variable naming the directory of MariaDB's binaries.
const BIN_DIR_ENV: &str = "LOCKKIT_MARIADB_BIN_DIR";
/// Searched after `PATH`.
const FALLBACK_DIRS: &[&str] = &["/usr/sbin", "/usr/bin"];
const INSTALL_HINT: &str =
    "run scripts/install-services.sh (or: apt-get install -y mariadb-server)";
const READINESS: Readiness = Readiness::ms(30000, 2000, 20);
const SQL_TIMEOUT: Duration = Duration::from_secs(5);
/// The timeout of `mariadbd --version` and of `mariadb-install-db`.
const SETUP_TIMEOUT: Duration = Duration::from_secs(120);
/// Changes whenever the template's options change, so that an old template
/// left in the temporary directory is not used.
const TEMPLATE_REVISION: u32 = 1;
/// The database created in the template, named by [`MariaDbServer::url`].
const DATABASE: &str = "lockkit";
/// InnoDB's redo log size: the template's and every server's (a different
/// size would make the server resize the log at start). The default, 96 MB,
/// would triple the size of every copy.
const INNODB_LOG_FILE_SIZE: &str = "--innodb-log-file-size=16M";
/// Server options on every start (before the builder's). A commit is written
/// to the operating system at once and flushed to disk once a second, so it
/// survives [`MariaDbServer::kill`].
const OPTIONS: &[&str] = &[
    "--bind-address=127.0.0.1",
    "--skip-log-bin",
    "--skip-name-resolve",
    "--innodb-buffer-pool-size=64M",
    INNODB_LOG_FILE_SIZE,
    "--innodb-flush-log-at-trx-commit=2",
    "--max-connections=300",
    "--performance-schema=OFF",
];
const DATA_DIR: &str = "data";
const LOG_FILE: &str = "mariadb.log";
const OUTPUT_FILE: &str = "mariadb.stdout.log";
const PID_FILE: &str = "mariadbd.pid";
const SOCKET_FILE: &str = "mariadbd.sock";
const TMP_DIR: &str = "tmp";

/// MariaDB's binaries.
#[derive(Clone, Debug)]
struct Binaries {
    mariadbd: PathBuf,
    install_db: PathBuf,
    client: PathBuf,
}

impl Binaries {
    /// The binaries in `explicit`, else in `$LOCKKIT_MARIADB_BIN_DIR`, else
    /// on `PATH`, in `/usr/sbin` or in `/usr/bin`.
    fn find(explicit: Option<&Path>) -> Result<Self, ServerError> {
        let dir = match (explicit, std::env::var_os(BIN_DIR_ENV)) {
            (Some(dir), _) => Some(dir.to_path_buf()),
            (None, Some(dir)) if !dir.is_empty() => Some(PathBuf::from(dir)),
            _ => None,
        };
        let binary = |name: &str| match &dir {
            Some(dir) => find_binary(dir.join(name), INSTALL_HINT),
            None => find_binary(name, INSTALL_HINT).or_else(|not_on_path| {
                FALLBACK_DIRS
                    .iter()
                    .find_map(|dir| find_binary(Path::new(dir).join(name), INSTALL_HINT).ok())
                    .ok_or(not_on_path)
            }),
        };
        Ok(Self {
            mariadbd: binary("mariadbd")?,
            install_db: binary("mariadb-install-db")?,
            client: binary("mariadb")?,
        })
    }

    /// The version (`10.11.19-MariaDB-0+deb12u1`), from `mariadbd
    /// --version`; asked once per binary and process.
    async fn version(&self) -> Result<String, ServerError> {
        static VERSIONS: OnceLock<Mutex<HashMap<PathBuf, String>>> = OnceLock::new();
        let versions = VERSIONS.get_or_init(Mutex::default);
        let cached = versions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&self.mariadbd)
            .cloned();
        if let Some(version) = cached {
            return Ok(version);
        }
        let mut command = tokio::process::Command::new(&self.mariadbd);
        command.args(["--no-defaults", "--version"]);
        let what = format!("{} --version", self.mariadbd.display());
        let output = run_helper(&what, &mut command, SETUP_TIMEOUT).await?;
        // "mariadbd  Ver 10.11.19-MariaDB-0+deb12u1 for debian-linux-gnu on …"
        let version = output
            .split_whitespace()
            .skip_while(|word| *word != "Ver")
            .nth(1)
            .map(file_name_part)
            .ok_or_else(|| ServerError::Io {
                what: format!("read the version in the output of {what}"),
                source: io::Error::new(io::ErrorKind::InvalidData, output.trim().to_owned()),
            })?;
        versions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(self.mariadbd.clone(), version.clone());
        Ok(version)
    }

    /// A `mariadb` client command on `127.0.0.1:port` as `root`, tab-separated
    /// output without column names.
    fn client(&self, port: u16) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.client);
        command
            .args(["--no-defaults", "--protocol=TCP", "-h127.0.0.1"])
            .arg(format!("-P{port}"))
            .args(["-uroot", "-N", "-B"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }
}

/// The template data directory for these binaries and this user, built with
/// `mariadb-install-db` unless it exists.
async fn template(binaries: &Binaries, root: &Path) -> Result<PathBuf, ServerError> {
    let user = file_name_part(&current_user_name());
    let version = binaries.version().await?;
    let name = format!("mariadb-{version}-{user}-r{TEMPLATE_REVISION}");
    let template = root.join(&name);
    ensure_template(root, &name, |dir| async move {
        // Beside the build directory, named after it (so unique).
        let mut extra = dir.clone().into_os_string();
        extra.push(".sql");
        let extra = PathBuf::from(extra);
        let write_error = |source| ServerError::Io {
            what: format!("write {}", extra.display()),
            source,
        };
        tokio::fs::write(&extra, format!("CREATE DATABASE {DATABASE};\n"))
            .await
            .map_err(write_error)?;
        // A temporary directory of its own: concurrent installs sharing /tmp
        // were seen to lose each other's temporary tables ("Unknown table
        // 'mysql.tmp_user_sys'").
        let mut tmp = dir.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        tokio::fs::create_dir_all(&tmp)
            .await
            .map_err(|source| ServerError::Io {
                what: format!("create {}", tmp.display()),
                source,
            })?;
        let mut install = tokio::process::Command::new(&binaries.install_db);
        // --no-defaults must come first.
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.display()))
            .args([
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
                INNODB_LOG_FILE_SIZE,
            ])
            .arg(format!("--extra-file={}", extra.display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .current_dir(&dir);
        if running_as_root() {
            install.arg("--user=root");
        }
        let what = format!(
            "{} (building the template data directory {})",
            binaries.install_db.display(),
            template.display()
        );
        let result = run_helper(&what, &mut install, SETUP_TIMEOUT).await;
        let _ = tokio::fs::remove_file(&extra).await;
        let _ = tokio::fs::remove_dir_all(&tmp).await;
        result.map(drop)
    })
    .await
}

/// A MariaDB server (`mariadbd`) bound to `127.0.0.1` on a free port, with
/// its own temporary directory (`data/`, the data directory; `tmp/`, its
/// temporary tables; `mariadb.log`, its error log; its PID file and Unix
/// socket). User `root` without
/// password, also over TCP; database `lockkit`. Binary logging and the
/// performance schema are off, the buffer pool has 64 MB, at most 300
/// connections; a commit is written to the operating system at once and
/// flushed to disk once a second (`innodb_flush_log_at_trx_commit=2`), so it
/// survives [`kill`](crate::FaultControl::kill).
///
/// The process is killed when the `MariaDbServer` is dropped, and also when
/// the test process dies (even if the server lives in a static, and even if
/// it is paused then: `mariadbd` is a single process, so SIGSTOP, SIGKILL and
/// the parent-death signal reach all of it). Fault injection:
/// [`pause`](crate::FaultControl::pause) (SIGSTOP), [`resume`](crate::FaultControl::resume),
/// [`kill`](crate::FaultControl::kill) and [`restart`](crate::FaultControl::restart) on the same port with
/// the same data directory, so committed data survives (after crash
/// recovery).
///
/// * **Binaries:** `mariadbd`, `mariadb-install-db` and the `mariadb`
///   client, from `$LOCKKIT_MARIADB_BIN_DIR`, else from `PATH`, else from
///   `/usr/sbin` and `/usr/bin` (Debian puts `mariadbd` in `/usr/sbin`, which
///   is not on an ordinary user's `PATH`).
/// * **Template:** `mariadb-install-db` runs once per machine, MariaDB
///   version and user, into
///   `<tmp>/lockkit-testkit-templates/mariadb-<version>-<user>-r<N>` (with the
///   database `lockkit` created); every server starts from a `cp -a` copy of
///   it. Test processes racing to build it each build their own copy beside
///   it and rename it into place; the first wins.
/// * **User:** `mariadb-install-db --auth-root-authentication-method=normal`
///   creates `root@localhost`, `root@127.0.0.1` and `root@::1` without
///   password. A root test process runs the server as root (`--user=root`);
///   any other runs it as itself.
pub struct MariaDbServer {
    port: u16,
    binaries: Binaries,
    args: Vec<String>,
    process: ProcessSlot,
    dir: TempDir,
}

/// Configures a [`MariaDbServer`] before starting it.
#[derive(Debug, Default)]
pub struct MariaDbServerBuilder {
    bin_dir: Option<PathBuf>,
    args: Vec<String>,
    templates: Option<PathBuf>,
    shiftable_clock: bool,
}

impl MariaDbServerBuilder {
    /// Uses the binaries (`mariadbd`, `mariadb-install-db`, `mariadb`) in
    /// this directory instead of `$LOCKKIT_MARIADB_BIN_DIR` or those on
    /// `PATH`, in `/usr/sbin` or in `/usr/bin`.
    pub fn bin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.bin_dir = Some(dir.into());
        self
    }

    /// Appends a raw `mariadbd` option, e.g. `arg("--lock-wait-timeout=5")`;
    /// later options override earlier ones.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_owned());
        self
    }

    /// Keeps the template data directory under this directory instead of
    /// `<tmp>/lockkit-testkit-templates` (created if missing).
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

    /// Starts the server and waits until it answers queries.
    ///
    /// # Panics
    ///
    /// With the [`ServerError`]'s message when it cannot be started.
    pub async fn start(self) -> MariaDbServer {
        self.try_start().await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts the server and waits until it answers queries: builds the
    /// template data directory first if needed, then copies it.
    ///
    /// When another process takes the chosen port before the server binds it,
    /// retries up to three times on a new port.
    pub async fn try_start(self) -> Result<MariaDbServer, ServerError> {
        let binaries = Binaries::find(self.bin_dir.as_deref())?;
        let root = self.templates.unwrap_or_else(default_templates_root);
        let template = template(&binaries, &root).await?;
        retry_on_taken_port("MariaDB", || async {
            let dir = temp_dir("lockkit-mariadb-", "MariaDB")?;
            copy_template(&template, &dir.path().join(DATA_DIR)).await?;
            let server = MariaDbServer {
                port: free_port(),
                binaries: binaries.clone(),
                args: self.args.clone(),
                process: ProcessSlot::default().with_clock(
                    self.shiftable_clock
                        .then(|| ServerClock::in_dir(dir.path()))
                        .transpose()?,
                ),
                dir,
            };
            server.launch().await.map(|()| server)
        })
        .await
    }
}

impl MariaDbServer {
    /// A builder for a server with options.
    pub fn builder() -> MariaDbServerBuilder {
        MariaDbServerBuilder::default()
    }

    /// The data directory, `dir()/data`.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join(DATA_DIR)
    }

    /// The last `lines` lines of the server's error log (and of its
    /// stdout/stderr).
    pub fn log_tail(&self, lines: usize) -> String {
        crate::process::log_tail(
            &self.dir.path().join(LOG_FILE),
            &self.dir.path().join(OUTPUT_FILE),
            lines,
        )
    }

    /// Runs `sql` with the `mariadb` client (as `root`, in database
    /// `lockkit`, over TCP, in batch mode without column names: `-N -B`) and
    /// returns its output, trimmed: one line per row, columns separated by
    /// tabs, `NULL` for null.
    ///
    /// Fails with [`io::ErrorKind::TimedOut`] when that takes more than 5 s
    /// (e.g. while paused), and with the client's exit status and error
    /// output when it fails (the server is down, the SQL is wrong…).
    pub async fn sql(&self, sql: &str) -> io::Result<String> {
        let mut command = self.binaries.client(self.port);
        command.arg("-e").arg(sql).arg(DATABASE);
        let output = within(SQL_TIMEOUT, command.output(), || {
            format!("mariadb on {} did not finish", self.addr())
        })
        .await?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
        } else {
            Err(io::Error::other(format!(
                "mariadb on {} failed ({}): {}",
                self.addr(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }

    fn what(&self) -> String {
        format!("MariaDB on {}", self.addr())
    }

    /// Spawns `mariadbd` (killing a running one first) and waits until it
    /// answers queries; on failure kills it again.
    async fn launch(&self) -> Result<(), ServerError> {
        let dir = self.dir.path();
        let pid_file = dir.join(PID_FILE);
        // Temporary tables in the server's own directory, not the shared /tmp
        // (see the template build).
        let tmp = dir.join(TMP_DIR);
        std::fs::create_dir_all(&tmp).map_err(|source| ServerError::Io {
            what: format!("create {}", tmp.display()),
            source,
        })?;
        let mut command = Command::new(&self.binaries.mariadbd);
        // --no-defaults must come first.
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join(DATA_DIR).display()))
            .arg(format!("--port={}", self.port))
            .arg(format!("--socket={}", dir.join(SOCKET_FILE).display()))
            .arg(format!("--pid-file={}", pid_file.display()))
            .arg(format!("--log-error={}", dir.join(LOG_FILE).display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .args(OPTIONS);
        if running_as_root() {
            command.arg("--user=root");
        }
        command.args(&self.args).current_dir(dir);
        let port = self.port;
        let binaries = &self.binaries;
        let pid_file = &pid_file;
        let (log, output) = (dir.join(LOG_FILE), dir.join(OUTPUT_FILE));
        self.process
            .launch(&self.what(), &command, &log, &output, READINESS, |pid| {
                probe(binaries, port, pid_file, pid)
            })
            .await
    }
}

/// One readiness probe: the PID file names our `pid`, and a query over TCP
/// as `root` answers with the path of our PID file (so a stranger that took
/// the port is never mistaken for our server, and the login works).
async fn probe(binaries: &Binaries, port: u16, pid_file: &Path, pid: u32) -> bool {
    let names_pid = tokio::fs::read_to_string(pid_file)
        .await
        .is_ok_and(|text| text.trim() == pid.to_string());
    if !names_pid
        || TcpStream::connect((Ipv4Addr::LOCALHOST, port))
            .await
            .is_err()
    {
        return false;
    }
    let mut command = binaries.client(port);
    command.args(["--connect-timeout=2", "-e", "SELECT @@pid_file"]);
    match command.output().await {
        Ok(output) if output.status.success() => {
            String::from_utf8_lossy(&output.stdout).trim() == pid_file.to_string_lossy()
        }
        _ => false,
    }
}

one_process_server!(
    MariaDbServer,
    start: Self::builder().try_start(),
    url: |server| format!("mysql://root@127.0.0.1:{}/{DATABASE}", server.port),
    debug: |server| {
        "mariadbd" => &server.binaries.mariadbd,
        "extra_args" => &server.args,
    },
    kill_on_drop,
);
