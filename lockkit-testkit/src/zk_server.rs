//! Real ZooKeeper servers on free loopback ports, for tests: one standalone
//! server ([`ZkServer`]) or an ensemble forming a quorum ([`ZkEnsemble`]).
//!
//! Each server is a JVM (`ZooKeeperServerMain`, or `QuorumPeerMain` for an
//! ensemble member) started from Debian's `/usr/share/java/zookeeper.jar`,
//! whose manifest `Class-Path` names the jars it depends on; slf4j-simple is
//! added so that ZooKeeper logs (to stderr, captured in `zookeeper.log`).

use std::fs;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::clock::ServerClock;
use crate::netns::Fabric;
use crate::process::{
    ProcessSlot, Readiness, ServerError, free_port, memory_temp_dir, resolve_binary,
    retry_on_taken_port, within,
};
use crate::server::{TestServer, one_process_server};

/// Environment variable that overrides the `java` binary.
const JAVA_ENV: &str = "LOCKKIT_JAVA";
/// Environment variable that overrides ZooKeeper's jar.
const JAR_ENV: &str = "LOCKKIT_ZOOKEEPER_JAR";
const DEFAULT_JAR: &str = "/usr/share/java/zookeeper.jar";
/// The slf4j binding that makes ZooKeeper log to stderr.
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";
const INSTALL_HINT: &str =
    "run scripts/install-services.sh (or: apt-get install -y zookeeper default-jre-headless)";
const STANDALONE_MAIN: &str = "org.apache.zookeeper.server.ZooKeeperServerMain";
const QUORUM_MAIN: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
/// Small heap, serial GC, C1 only: starts in well under a second.
const JVM_OPTIONS: &[&str] = &[
    "-Xms64m",
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    // No /tmp/hsperfdata_<user>/<pid> files, which SIGKILL would leave behind.
    "-XX:-UsePerfData",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
    // Empty container nodes (a released lock's directory) are removed after
    // at most a second, not a minute, and without the default rate limit,
    // so that tests can see the storage of released names go.
    "-Dznode.container.checkIntervalMs=1000",
    "-Dznode.container.maxPerMinute=1000000",
    // An ensemble member that hears no vote during an election asks again
    // after a wait that doubles each time, up to a minute by default: one
    // lost round on a loaded machine could hold an election up for tens of
    // seconds. Two seconds at most keeps it retrying.
    "-Dzookeeper.fastleader.maxNotificationInterval=2000",
];
/// The four-letter words the servers answer.
const FOUR_LETTER_WORDS: &str = "srvr,ruok,stat,mntr,wchs,cons,dump,conf";
const STANDALONE_READINESS: Readiness = Readiness {
    deadline: Duration::from_secs(20),
    probe_timeout: Duration::from_millis(500),
    interval: Duration::from_millis(25),
};
/// A member is ready once a quorum formed, which needs its peers too.
const MEMBER_READINESS: Readiness = Readiness {
    deadline: Duration::from_secs(30),
    ..STANDALONE_READINESS
};
const FOUR_LETTER_TIMEOUT: Duration = Duration::from_secs(2);
/// The timeout of one `srvr` while watching an ensemble's quorum.
const QUORUM_PROBE_TIMEOUT: Duration = Duration::from_secs(1);
const CONFIG_FILE: &str = "zoo.cfg";
const DATA_DIR: &str = "data";
const LOG_FILE: &str = "zookeeper.log";
const STANDALONE_MODES: &[&str] = &["standalone"];
const MEMBER_MODES: &[&str] = &["leader", "follower"];

/// Options shared by every server started from one builder.
#[derive(Clone, Debug, Default)]
struct Options {
    java: Option<PathBuf>,
    jar: Option<PathBuf>,
    config: Vec<(String, String)>,
    shiftable_clock: bool,
}

/// What every (re)start of a server needs besides its directory and port.
#[derive(Clone, Debug)]
struct Launcher {
    java: PathBuf,
    classpath: String,
    extra_config: Vec<(String, String)>,
    shiftable_clock: bool,
}

impl Launcher {
    fn new(options: &Options) -> Result<Self, ServerError> {
        let java = resolve_binary(options.java.as_deref(), JAVA_ENV, "java", INSTALL_HINT)?;
        let jar = match (&options.jar, std::env::var_os(JAR_ENV)) {
            (Some(jar), _) => jar.clone(),
            (None, Some(jar)) if !jar.is_empty() => PathBuf::from(jar),
            _ => PathBuf::from(DEFAULT_JAR),
        };
        let mut classpath = Vec::new();
        for jar in [jar.as_path(), Path::new(SLF4J_SIMPLE_JAR)] {
            if !jar.is_file() {
                return Err(ServerError::NotInstalled {
                    binary: jar.to_string_lossy().into_owned(),
                    hint: INSTALL_HINT.to_owned(),
                });
            }
            classpath.push(jar.to_string_lossy().into_owned());
        }
        Ok(Self {
            java,
            classpath: classpath.join(":"),
            extra_config: options.config.clone(),
            shiftable_clock: options.shiftable_clock,
        })
    }
}

/// Where a server stands: alone, or member `id` (1-based) of an ensemble.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Standalone,
    Member { id: usize },
}

/// One ZooKeeper server, standalone or a member of a [`ZkEnsemble`], bound to
/// `127.0.0.1` on a free port, with its own temporary directory (`zoo.cfg`,
/// `data/`, `zookeeper.log`).
///
/// The JVM is killed when the `ZkServer` is dropped, and also when the test
/// process dies (even if the server lives in a static). Fault injection:
/// [`pause`](crate::FaultControl::pause) (SIGSTOP), [`resume`](crate::FaultControl::resume),
/// [`kill`](crate::FaultControl::kill) and [`restart`](crate::FaultControl::restart) on the same port with
/// the same data directory (ZooKeeper persists its transaction log and
/// snapshots there, so data survives). A member's restart waits until it has
/// rejoined its ensemble as leader or follower, which needs a quorum of its
/// peers.
pub struct ZkServer {
    port: u16,
    /// 127.0.0.1, or the address of its network namespace.
    host: Ipv4Addr,
    role: Role,
    launcher: Launcher,
    process: ProcessSlot,
    dir: TempDir,
}

/// Configures a [`ZkServer`] or a [`ZkEnsemble`] before starting it.
#[derive(Debug, Default)]
pub struct ZkServerBuilder {
    options: Options,
}

impl ZkServerBuilder {
    /// Uses this `java` binary (a path, or a name searched on `PATH`) instead
    /// of `$LOCKKIT_JAVA` or `java` on `PATH`.
    pub fn java(mut self, path: impl Into<PathBuf>) -> Self {
        self.options.java = Some(path.into());
        self
    }

    /// Uses this ZooKeeper jar instead of `$LOCKKIT_ZOOKEEPER_JAR` or
    /// `/usr/share/java/zookeeper.jar`. Its manifest must name the jars it
    /// depends on (Debian's does).
    pub fn jar(mut self, path: impl Into<PathBuf>) -> Self {
        self.options.jar = Some(path.into());
        self
    }

    /// Adds (or, being later in `zoo.cfg`, overrides) a `zoo.cfg` setting,
    /// e.g. `config("maxSessionTimeout", "120000")`.
    pub fn config(mut self, key: &str, value: &str) -> Self {
        self.options.config.push((key.to_owned(), value.to_owned()));
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

    /// Starts a standalone server and waits until `srvr` reports
    /// `Mode: standalone`.
    ///
    /// # Panics
    ///
    /// With the [`ServerError`]'s message when it cannot be started.
    pub async fn start(self) -> ZkServer {
        self.try_start().await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a standalone server and waits until `srvr` reports
    /// `Mode: standalone`. Retries on a new port when another process takes
    /// the chosen one first.
    pub async fn try_start(self) -> Result<ZkServer, ServerError> {
        let launcher = Launcher::new(&self.options)?;
        retry_on_taken_port("ZooKeeper", || async {
            let server = ZkServer::create(launcher.clone(), Role::Standalone, free_port(), None)?;
            server.write_config(&[])?;
            server.launch().await.map(|()| server)
        })
        .await
    }

    /// Starts an ensemble of `n` servers and waits until every member reports
    /// `Mode: leader` or `Mode: follower`.
    ///
    /// # Panics
    ///
    /// With the [`ServerError`]'s message when it cannot be started, and when
    /// `n` is 0.
    pub async fn start_ensemble(self, n: usize) -> ZkEnsemble {
        self.try_start_ensemble(n)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts an ensemble of `n` servers and waits until every member reports
    /// `Mode: leader` or `Mode: follower`. Retries on new ports when another
    /// process takes one of the chosen ones first.
    ///
    /// # Panics
    ///
    /// When `n` is 0.
    pub async fn try_start_ensemble(self, n: usize) -> Result<ZkEnsemble, ServerError> {
        assert!(n > 0, "a ZooKeeper ensemble needs at least one server");
        let launcher = Launcher::new(&self.options)?;
        retry_on_taken_port("a ZooKeeper ensemble", || {
            ZkEnsemble::launch(launcher.clone(), n, None)
        })
        .await
    }

    /// Like [`try_start_ensemble`](Self::try_start_ensemble), with member
    /// `i` in namespace `i` of `fabric` (one member per namespace), bound to
    /// that namespace's address: [`Fabric::cut`] then parts members while
    /// the test still reaches each.
    pub async fn try_start_ensemble_in(
        self,
        fabric: Arc<Fabric>,
    ) -> Result<ZkEnsemble, ServerError> {
        let n = fabric.len();
        assert!(n > 0, "a ZooKeeper ensemble needs at least one server");
        let launcher = Launcher::new(&self.options)?;
        retry_on_taken_port("a ZooKeeper ensemble", || {
            ZkEnsemble::launch(launcher.clone(), n, Some(fabric.clone()))
        })
        .await
    }
}

impl ZkServer {
    /// A builder for a server (or an ensemble) with options.
    pub fn builder() -> ZkServerBuilder {
        ZkServerBuilder::default()
    }

    /// A server on `127.0.0.1`, or in namespace `i` of a fabric.
    fn create(
        launcher: Launcher,
        role: Role,
        port: u16,
        netns: Option<(Arc<Fabric>, usize)>,
    ) -> Result<Self, ServerError> {
        // ZooKeeper syncs its transaction log before it answers a write (a
        // session's creation included): on a disk the other tests keep
        // busy, a sync can outlast the conformance suite's 1 s timeouts.
        let dir = memory_temp_dir("lockkit-zk-", "ZooKeeper")?;
        let clock = launcher
            .shiftable_clock
            .then(|| ServerClock::in_dir(dir.path()))
            .transpose()?;
        let host = netns
            .as_ref()
            .map_or(Ipv4Addr::LOCALHOST, |(fabric, i)| fabric.ip(*i));
        let server = Self {
            port,
            host,
            role,
            launcher,
            process: ProcessSlot::default().with_clock(clock).with_netns(netns),
            dir,
        };
        let data_dir = server.data_dir();
        fs::create_dir(&data_dir).map_err(|source| ServerError::Io {
            what: format!("create {}", data_dir.display()),
            source,
        })?;
        if let Role::Member { id } = role {
            server.write_file(&format!("{DATA_DIR}/myid"), &format!("{id}\n"))?;
        }
        Ok(server)
    }

    /// Writes `zoo.cfg`, with these extra lines (an ensemble's `server.N`).
    fn write_config(&self, extra: &[String]) -> Result<(), ServerError> {
        let mut lines = vec![
            "tickTime=500".to_owned(),
            format!("dataDir={}", self.data_dir().display()),
            format!("clientPort={}", self.port),
            format!("clientPortAddress={}", self.host),
            "minSessionTimeout=1000".to_owned(),
            "maxSessionTimeout=60000".to_owned(),
            "admin.enableServer=false".to_owned(),
            format!("4lw.commands.whitelist={FOUR_LETTER_WORDS}"),
        ];
        lines.extend(extra.iter().cloned());
        lines.extend(
            self.launcher
                .extra_config
                .iter()
                .map(|(key, value)| format!("{key}={value}")),
        );
        lines.push(String::new());
        self.write_file(CONFIG_FILE, &lines.join("\n"))
    }

    fn write_file(&self, name: &str, contents: &str) -> Result<(), ServerError> {
        let path = self.dir.path().join(name);
        fs::write(&path, contents).map_err(|source| ServerError::Io {
            what: format!("write {}", path.display()),
            source,
        })
    }

    /// `127.0.0.1:PORT`, a ZooKeeper connect string.
    pub fn connect_string(&self) -> String {
        self.addr().to_string()
    }

    /// `zk://127.0.0.1:PORT/ROOT` (`root` without its leading slashes).
    pub fn url_at(&self, root: &str) -> String {
        zk_url(&self.connect_string(), root)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join(DATA_DIR)
    }

    /// The last `lines` lines of the server's log (ZooKeeper's and the JVM's
    /// output).
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.dir.path().join(LOG_FILE);
        crate::process::log_tail(&log, &log, lines)
    }

    /// Sends a four-letter word (`srvr`, `ruok`, `stat`, `mntr`, `wchs`,
    /// `cons`, `dump` or `conf`) over a new connection and returns everything
    /// the server sends until it closes the connection.
    ///
    /// Fails with [`io::ErrorKind::TimedOut`] when that takes more than 2 s
    /// (e.g. while paused), with [`io::ErrorKind::InvalidInput`] when `cmd`
    /// is not four lowercase ASCII letters, and with the connection's error when the
    /// server is down.
    pub async fn four_letter(&self, cmd: &str) -> io::Result<String> {
        four_letter(self.addr(), cmd, FOUR_LETTER_TIMEOUT).await
    }

    /// The `Mode:` reported by `srvr` (`standalone`, `leader`, `follower`),
    /// `None` when the server does not answer in time or is not serving.
    async fn mode_within(addr: SocketAddr, timeout: Duration) -> Option<String> {
        let srvr = four_letter(addr, "srvr", timeout).await.ok()?;
        parse_mode(&srvr)
    }

    fn what(&self) -> String {
        match self.role {
            Role::Standalone => format!("ZooKeeper on {}", self.addr()),
            Role::Member { id } => format!("ZooKeeper member {id} on {}", self.addr()),
        }
    }

    /// Spawns the JVM (killing a running one first) and waits until `srvr`
    /// reports the mode of its role; on failure kills it again.
    async fn launch(&self) -> Result<(), ServerError> {
        let (main, modes, readiness) = match self.role {
            Role::Standalone => (STANDALONE_MAIN, STANDALONE_MODES, STANDALONE_READINESS),
            Role::Member { .. } => (QUORUM_MAIN, MEMBER_MODES, MEMBER_READINESS),
        };
        let mut command = Command::new(&self.launcher.java);
        command
            .args(JVM_OPTIONS)
            .arg("-cp")
            .arg(&self.launcher.classpath)
            .arg(main)
            .arg(self.dir.path().join(CONFIG_FILE))
            .current_dir(self.dir.path());
        let log = self.dir.path().join(LOG_FILE);
        let addr = self.addr();
        let data_dir = self.data_dir();
        self.process
            .launch(&self.what(), &command, &log, &log, readiness, |_pid| {
                probe(addr, modes, &data_dir)
            })
            .await
    }
}

/// An ensemble of ZooKeeper servers on loopback forming a quorum, for tests.
///
/// Member `i` (0-based in [`servers`](Self::servers)) has `myid` `i + 1`;
/// every member has its own client port, quorum port and election port on
/// `127.0.0.1` (and binds only there), and its own directory. Fault injection
/// is per member: `ensemble.servers()[i].kill()`, `.pause()`, `.restart()`…
/// Every member is killed when the ensemble is dropped.
#[derive(Debug)]
pub struct ZkEnsemble {
    servers: Vec<ZkServer>,
}

impl ZkEnsemble {
    /// Starts `n` servers and waits until each is leader or follower.
    ///
    /// # Panics
    ///
    /// With the [`ServerError`]'s message when it cannot be started, and when
    /// `n` is 0.
    pub async fn start(n: usize) -> ZkEnsemble {
        ZkServer::builder().start_ensemble(n).await
    }

    /// Starts `n` servers and waits until each is leader or follower.
    ///
    /// # Panics
    ///
    /// When `n` is 0.
    pub async fn try_start(n: usize) -> Result<ZkEnsemble, ServerError> {
        ZkServer::builder().try_start_ensemble(n).await
    }

    async fn launch(
        launcher: Launcher,
        n: usize,
        fabric: Option<Arc<Fabric>>,
    ) -> Result<ZkEnsemble, ServerError> {
        let mut servers = Vec::with_capacity(n);
        // A follower may take 10 ticks (5 s) to sync, and is dropped after
        // 5 ticks (2.5 s) without heartbeat.
        let mut peers = vec!["initLimit=10".to_owned(), "syncLimit=5".to_owned()];
        for id in 1..=n {
            let netns = fabric.as_ref().map(|fabric| (fabric.clone(), id - 1));
            let server =
                ZkServer::create(launcher.clone(), Role::Member { id }, free_port(), netns)?;
            peers.push(format!(
                "server.{id}={}:{}:{}",
                server.host,
                free_port(),
                free_port()
            ));
            servers.push(server);
        }
        if n == 1 {
            // Otherwise a lone server runs standalone despite its server.1 line.
            peers.push("standaloneEnabled=false".to_owned());
        }
        for server in &servers {
            server.write_config(&peers)?;
        }
        // Members become ready only together (a quorum), so they start at once.
        let mut starting = JoinSet::new();
        for (index, server) in servers.into_iter().enumerate() {
            starting.spawn(async move {
                let result = server.launch().await;
                (index, server, result)
            });
        }
        let mut slots: Vec<Option<ZkServer>> = (0..n).map(|_| None).collect();
        let mut first_error = None;
        while let Some(joined) = starting.join_next().await {
            let (index, server, result) = joined.unwrap_or_else(|e| {
                panic!("a task starting a ZooKeeper ensemble member failed: {e}")
            });
            if let Err(e) = result {
                // An exit because a port was taken explains the others' failures.
                if first_error
                    .as_ref()
                    .is_none_or(|first: &ServerError| !first.is_address_in_use())
                {
                    first_error = Some(e);
                }
            }
            slots[index] = Some(server);
        }
        match first_error {
            // Dropping the members kills them.
            Some(e) => Err(e),
            None => Ok(ZkEnsemble {
                servers: slots.into_iter().flatten().collect(),
            }),
        }
    }

    /// The members, in `myid` order (member `i` has `myid` `i + 1`).
    pub fn servers(&self) -> &[ZkServer] {
        &self.servers
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,…`, a ZooKeeper connect string.
    pub fn connect_string(&self) -> String {
        self.servers
            .iter()
            .map(ZkServer::connect_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `zk://127.0.0.1:P1,127.0.0.1:P2,…/ROOT` (`root` without its leading
    /// slashes).
    pub fn url_at(&self, root: &str) -> String {
        zk_url(&self.connect_string(), root)
    }

    /// Each member's `Mode:` (`leader` or `follower`) as reported by `srvr`
    /// now; `None` for a member that is killed, paused (no answer within
    /// 1 s) or not serving (no quorum).
    pub async fn modes(&self) -> Vec<Option<String>> {
        let mut asking = JoinSet::new();
        for (index, server) in self.servers.iter().enumerate() {
            let addr = server.addr();
            asking.spawn(async move {
                (
                    index,
                    ZkServer::mode_within(addr, QUORUM_PROBE_TIMEOUT).await,
                )
            });
        }
        let mut modes = vec![None; self.servers.len()];
        while let Some(joined) = asking.join_next().await {
            if let Ok((index, mode)) = joined {
                modes[index] = mode;
            }
        }
        modes
    }

    /// The index in [`servers`](Self::servers) of the member whose `srvr`
    /// says `Mode: leader`, if any.
    pub async fn leader(&self) -> Option<usize> {
        self.modes()
            .await
            .iter()
            .position(|mode| mode.as_deref() == Some("leader"))
    }

    /// What each member says of itself now, for a failing test's message:
    /// its `Mode:` and the last `lines` lines of its log.
    pub async fn describe(&self, lines: usize) -> String {
        let modes = self.modes().await;
        let mut text = String::new();
        for (index, (server, mode)) in self.servers.iter().zip(modes).enumerate() {
            let mode = mode.as_deref().unwrap_or("no answer");
            text.push_str(&format!(
                "--- member {index} (myid {}), mode {mode}, last lines of its log:\n{}\n",
                index + 1,
                server.log_tail(lines)
            ));
        }
        text
    }

    /// Waits until a leader and `n / 2` followers answer (a majority serves
    /// clients); `false` when that does not happen within `timeout`.
    pub async fn wait_for_quorum(&self, timeout: Duration) -> bool {
        let started = Instant::now();
        loop {
            let modes = self.modes().await;
            let count = |wanted: &str| {
                modes
                    .iter()
                    .filter(|mode| mode.as_deref() == Some(wanted))
                    .count()
            };
            if count("leader") >= 1 && count("follower") >= self.servers.len() / 2 {
                return true;
            }
            if started.elapsed() >= timeout {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn zk_url(connect_string: &str, root: &str) -> String {
    format!("zk://{connect_string}/{}", root.trim_start_matches('/'))
}

/// The value of the `Mode:` line of a `srvr` answer.
fn parse_mode(srvr: &str) -> Option<String> {
    srvr.lines()
        .find_map(|line| line.strip_prefix("Mode:"))
        .map(|mode| mode.trim().to_owned())
}

/// One readiness probe: `srvr` reports one of `modes`, and `conf` names our
/// data directory (so a stranger that took the port is never mistaken for
/// our server).
async fn probe(addr: SocketAddr, modes: &[&str], data_dir: &Path) -> bool {
    let Ok(srvr) = four_letter(addr, "srvr", FOUR_LETTER_TIMEOUT).await else {
        return false;
    };
    if !parse_mode(&srvr).is_some_and(|mode| modes.contains(&mode.as_str())) {
        return false;
    }
    let Ok(conf) = four_letter(addr, "conf", FOUR_LETTER_TIMEOUT).await else {
        return false;
    };
    let ours = data_dir.to_string_lossy();
    conf.lines()
        .filter_map(|line| line.strip_prefix("dataDir="))
        .any(|dir| dir.starts_with(ours.as_ref()))
}

async fn four_letter(addr: SocketAddr, cmd: &str, timeout: Duration) -> io::Result<String> {
    if cmd.len() != 4 || !cmd.bytes().all(|byte| byte.is_ascii_lowercase()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{cmd:?} is not a four-letter word"),
        ));
    }
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(cmd.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    };
    within(timeout, exchange, || {
        format!("ZooKeeper on {addr} did not answer {cmd}")
    })
    .await
}

one_process_server!(
    ZkServer,
    start: Self::builder().try_start(),
    url: |server| server.url_at("lockkit"),
    host: |server| ::std::net::IpAddr::V4(server.host),
    debug: |server| {
        "role" => &server.role,
        "java" => &server.launcher.java,
    },
    kill_on_drop,
);
