//! A real Redis Sentinel deployment on loopback, for tests: a master, one
//! replica that replicates through a [`TcpProxy`], and three sentinels.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use tokio::time::Instant;

use crate::netns::Fabric;
use crate::process::{
    ProcessSlot, Readiness, ServerError, free_port, resolve_binary, retry_on_taken_port, temp_dir,
};
use crate::proxy::TcpProxy;
use crate::redis_resp::{self, info_field};
use crate::redis_server::RedisServer;
use crate::server::{FaultControl, TestServer};

/// Environment variable that overrides the `redis-server` binary (the
/// sentinels run `redis-server --sentinel`).
const BINARY_ENV: &str = "LOCKKIT_REDIS_SERVER";
const INSTALL_HINT: &str = "run scripts/install-services.sh (or: apt-get install -y redis-server)";
const READINESS: Readiness = Readiness::ms(10000, 500, 10);
const LOG_FILE: &str = "sentinel.log";
const OUTPUT_FILE: &str = "sentinel.stdout.log";
const CONFIG_FILE: &str = "sentinel.conf";
/// The master name the sentinels monitor.
const MASTER_NAME: &str = "lockkit";
/// How many sentinels; a quorum of 2 of them declares the master down.
const SENTINELS: usize = 3;
const QUORUM: usize = 2;
/// `down-after-milliseconds`: the master is subjectively down after this.
const DOWN_AFTER_MS: u64 = 1000;
/// `failover-timeout`: a failed failover is retried after twice this. It is
/// also how long the sentinels leave a replica that replicates from another
/// address than the master's alone before they "fix" it (`+fix-slave-config`,
/// a `REPLICAOF` to the master's own address): long, so that the replica
/// keeps replicating through the proxy for the length of a test.
const FAILOVER_TIMEOUT_MS: u64 = 600_000;
/// How long the deployment may take to replicate and to know itself.
const READY_DEADLINE: Duration = Duration::from_secs(30);

/// A master, a replica and three sentinels on free loopback ports, for
/// tests of the `redis+sentinel://` mode and of failovers.
///
/// * The replica replicates **through a [`TcpProxy`]** in front of the
///   master ([`replication_proxy`](Self::replication_proxy)), so a test can
///   delay, cut ([`TcpProxy::blackhole`]) or reset replication. The replica
///   still announces its own port, so the sentinels reach it directly.
/// * The sentinels monitor the master as [`master_name`](Self::master_name)
///   with quorum 2, `down-after-milliseconds 1000` and `failover-timeout`
///   ten minutes (a shorter one lets them re-point the replica at the
///   master's own address, around the proxy): after the master is killed
///   (or paused) the replica is promoted within a few seconds
///   ([`wait_for_failover`](Self::wait_for_failover)).
/// * Every process can be paused, resumed, killed and restarted, and all of
///   them die with the `RedisSentinels` (and with the test process).
///
/// ```no_run
/// # async fn demo() {
/// use std::time::Duration;
/// use lockkit_testkit::{FaultControl, RedisSentinels, TestServer};
///
/// let deployment = RedisSentinels::start().await;
/// let url = deployment.url(); // redis+sentinel://127.0.0.1:s1,127.0.0.1:s2,127.0.0.1:s3/lockkit
/// let old = deployment.master().addr();
/// deployment.master().kill();
/// assert!(deployment.wait_for_failover(old, Duration::from_secs(30)).await);
/// # }
/// ```
pub struct RedisSentinels {
    // Dropped in this order: the sentinels first, so that none of them
    // fails over while the servers go.
    sentinels: Vec<RedisSentinel>,
    replica: RedisServer,
    /// The replication proxy (none when the servers run in namespaces).
    proxy: Option<TcpProxy>,
    master: RedisServer,
    master_name: String,
}

impl fmt::Debug for RedisSentinels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSentinels")
            .field("master_name", &self.master_name)
            .field("master", &self.master.addr())
            .field("replica", &self.replica.addr())
            .field(
                "replication_proxy",
                &self.proxy.as_ref().map(TcpProxy::addr),
            )
            .field("sentinels", &self.sentinel_ports())
            .finish()
    }
}

impl RedisSentinels {
    /// Starts the deployment and waits until the replica is in sync and every
    /// sentinel knows the replica and the other sentinels.
    ///
    /// # Panics
    ///
    /// With the [`ServerError`]'s message when it cannot be started. Needs a
    /// tokio runtime (the proxy runs on it).
    pub async fn start() -> RedisSentinels {
        Self::try_start().await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`start`](Self::start), but returns the error.
    pub async fn try_start() -> Result<RedisSentinels, ServerError> {
        Self::launch(None).await
    }

    /// Like [`try_start`](Self::try_start), with every server in a network
    /// namespace of `fabric` (which needs five): the master in namespace 0,
    /// the replica in 1, the sentinels in 2 to 4, each bound to its
    /// namespace's address, and the replica replicating straight from the
    /// master (no [`replication_proxy`](Self::replication_proxy)).
    /// [`Fabric::isolate`] then cuts the master off from the others while
    /// the test's clients still reach it.
    pub async fn try_start_in(fabric: Arc<Fabric>) -> Result<RedisSentinels, ServerError> {
        assert!(
            fabric.len() >= 2 + SENTINELS,
            "a sentinel deployment needs {} namespaces",
            2 + SENTINELS
        );
        Self::launch(Some(fabric)).await
    }

    async fn launch(fabric: Option<Arc<Fabric>>) -> Result<RedisSentinels, ServerError> {
        let place = |i: usize| fabric.as_ref().map(|fabric| (fabric.clone(), i));
        let master = member(&[], place(0)).try_start().await?;
        let (proxy, upstream) = match &fabric {
            Some(_) => (None, master.addr()),
            None => {
                let proxy =
                    TcpProxy::start(master.addr())
                        .await
                        .map_err(|source| ServerError::Io {
                            what: "start the replication proxy".into(),
                            source,
                        })?;
                let addr = proxy.addr();
                (Some(proxy), addr)
            }
        };
        let (ip, port) = (upstream.ip().to_string(), upstream.port().to_string());
        let replica = member(&["--replicaof", &ip, &port], place(1))
            .try_start()
            .await?;
        let deadline = Instant::now() + READY_DEADLINE;
        wait_for(deadline, "the replica to sync", &replica, || async {
            replica
                .command(&["INFO", "replication"])
                .await
                .is_ok_and(|info| info_field(&info, "master_link_status") == Some("up"))
        })
        .await?;
        let mut sentinels = Vec::with_capacity(SENTINELS);
        for i in 0..SENTINELS {
            sentinels
                .push(RedisSentinel::try_start(MASTER_NAME, master.addr(), place(2 + i)).await?);
        }
        let deployment = RedisSentinels {
            sentinels,
            replica,
            proxy,
            master,
            master_name: MASTER_NAME.to_owned(),
        };
        let first = &deployment.sentinels[0];
        wait_for(
            deadline,
            "the sentinels to know each other",
            first,
            || async {
                let mut ready = true;
                for sentinel in &deployment.sentinels {
                    let known = sentinel
                        .command(&["SENTINEL", "MASTER", &deployment.master_name])
                        .await
                        .map(|reply| {
                            let fields = pairs(&reply);
                            fields.get("num-slaves").copied() == Some("1")
                                && fields.get("num-other-sentinels").copied()
                                    == Some(&*(SENTINELS - 1).to_string())
                        });
                    ready &= known.unwrap_or(false);
                }
                ready
            },
        )
        .await?;
        Ok(deployment)
    }

    /// The server started as the master (it stays this process across a
    /// failover: after one, it is dead, or a replica once restarted).
    pub fn master(&self) -> &RedisServer {
        &self.master
    }

    /// The server started as the replica (the new master after a failover).
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// The proxy the replica replicates through (pointing at the master);
    /// `None` when the servers run in namespaces.
    pub fn replication_proxy(&self) -> Option<&TcpProxy> {
        self.proxy.as_ref()
    }

    /// The sentinels (each with pause, resume, kill and restart).
    pub fn sentinels(&self) -> &[RedisSentinel] {
        &self.sentinels
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(RedisSentinel::port).collect()
    }

    /// The name the sentinels monitor the master under.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// `redis+sentinel://127.0.0.1:s1,127.0.0.1:s2,127.0.0.1:s3/<master name>`
    /// (the sentinels' namespace addresses when they run in namespaces).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|sentinel| sentinel.addr().to_string())
            .collect();
        format!("redis+sentinel://{}/{}", hosts.join(","), self.master_name)
    }

    /// The master's address as the first sentinel that answers names it.
    pub async fn current_master_addr(&self) -> Option<SocketAddr> {
        for sentinel in self.sentinels.iter().filter(|s| s.pid().is_some()) {
            let Ok(reply) = sentinel
                .command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.master_name])
                .await
            else {
                continue;
            };
            let mut parts = reply.split_whitespace();
            if let (Some(ip), Some(port)) = (parts.next(), parts.next())
                && let Ok(addr) = format!("{ip}:{port}").parse()
            {
                return Some(addr);
            }
        }
        None
    }

    /// Waits until the sentinels name a master other than `old` and that
    /// server says (`ROLE`) it is a master; `false` when `timeout` passed
    /// first.
    pub async fn wait_for_failover(&self, old: SocketAddr, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(addr) = self.current_master_addr().await
                && addr != old
                && redis_resp::command(addr, &["ROLE"])
                    .await
                    .is_ok_and(|role| role.split_whitespace().next() == Some("master"))
            {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends one command to the current master (as the sentinels name it);
    /// the reply as text, as in [`RedisServer::command`].
    pub async fn master_command(&self, args: &[&str]) -> io::Result<String> {
        let addr = self.current_master_addr().await.ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotConnected, "no sentinel names a master")
        })?;
        redis_resp::command(addr, args).await
    }

    /// Kills every process: sentinels, replica and master.
    pub fn kill_all(&self) {
        for sentinel in &self.sentinels {
            sentinel.kill();
        }
        self.replica.kill();
        self.master.kill();
    }

    /// Pauses (SIGSTOP) every process, the sentinels first (so that none of
    /// them sees the master go).
    pub fn pause_all(&self) {
        for sentinel in &self.sentinels {
            sentinel.pause();
        }
        self.replica.pause();
        self.master.pause();
    }

    /// Resumes every process, the master first.
    pub fn resume_all(&self) {
        self.master.resume();
        self.replica.resume();
        for sentinel in &self.sentinels {
            sentinel.resume();
        }
    }
}

/// `field value field value …` as a map.
fn pairs(reply: &str) -> std::collections::HashMap<&str, &str> {
    let words: Vec<&str> = reply.split_whitespace().collect();
    words
        .chunks(2)
        .filter_map(|pair| match pair {
            [key, value] => Some((*key, *value)),
            _ => None,
        })
        .collect()
}

/// Polls `ready` until it holds or `deadline` passes (then `NotReady` with
/// the log of `server`).
async fn wait_for<S, F, Fut>(
    deadline: Instant,
    what: &str,
    server: &S,
    mut ready: F,
) -> Result<(), ServerError>
where
    S: LogTail,
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if ready().await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(ServerError::NotReady {
                what: format!("Redis Sentinel deployment (waiting for {what})"),
                waited: started.elapsed(),
                log_tail: server.tail(20),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

trait LogTail {
    fn tail(&self, lines: usize) -> String;
}

impl LogTail for RedisServer {
    fn tail(&self, lines: usize) -> String {
        self.log_tail(lines)
    }
}

impl LogTail for RedisSentinel {
    fn tail(&self, lines: usize) -> String {
        self.log_tail(lines)
    }
}

/// A server of the deployment, started with `args`: announced on loopback,
/// and with no 5 s pause before a full sync (the default for diskless
/// syncs).
fn member(args: &[&str], netns: Option<(Arc<Fabric>, usize)>) -> crate::RedisServerBuilder {
    let host = netns
        .as_ref()
        .map_or(Ipv4Addr::LOCALHOST, |(fabric, i)| fabric.ip(*i))
        .to_string();
    let member = [
        "--repl-diskless-sync-delay",
        "0",
        "--replica-announce-ip",
        &host,
    ];
    let args = args.iter().chain(&member);
    let builder = args.fold(RedisServer::builder(), |builder, arg| builder.arg(arg));
    match netns {
        Some((fabric, i)) => builder.in_namespace(fabric, i),
        None => builder,
    }
}

/// One Redis Sentinel (`redis-server CONFIG --sentinel`) on a free loopback
/// port, with its own temporary directory and writable configuration file;
/// part of [`RedisSentinels`]. A restart keeps the configuration the
/// sentinel rewrote (its view of the deployment).
#[derive(Debug)]
pub struct RedisSentinel {
    port: u16,
    /// 127.0.0.1, or the address of its network namespace.
    host: Ipv4Addr,
    binary: PathBuf,
    process: ProcessSlot,
    dir: TempDir,
}

impl RedisSentinel {
    /// Starts a sentinel that monitors the master at `master` as
    /// `master_name` (in namespace `netns`, if given).
    async fn try_start(
        master_name: &str,
        master: SocketAddr,
        netns: Option<(Arc<Fabric>, usize)>,
    ) -> Result<RedisSentinel, ServerError> {
        let binary = resolve_binary(None, BINARY_ENV, "redis-server", INSTALL_HINT)?;
        retry_on_taken_port("redis sentinel", || async {
            let sentinel = RedisSentinel {
                port: free_port(),
                host: netns
                    .as_ref()
                    .map_or(Ipv4Addr::LOCALHOST, |(fabric, i)| fabric.ip(*i)),
                binary: binary.clone(),
                process: ProcessSlot::default().with_netns(netns.clone()),
                dir: temp_dir("lockkit-sentinel-", "redis sentinel")?,
            };
            sentinel.write_config(master_name, master)?;
            sentinel.launch().await.map(|()| sentinel)
        })
        .await
    }

    fn write_config(&self, master_name: &str, master: SocketAddr) -> Result<(), ServerError> {
        let dir = self.dir.path();
        let config = format!(
            "port {port}\n\
             bind {host}\n\
             protected-mode no\n\
             daemonize no\n\
             dir {dir}\n\
             logfile {log}\n\
             sentinel announce-ip {host}\n\
             sentinel monitor {master_name} {master_ip} {master_port} {QUORUM}\n\
             sentinel down-after-milliseconds {master_name} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {master_name} {FAILOVER_TIMEOUT_MS}\n\
             sentinel parallel-syncs {master_name} 1\n",
            port = self.port,
            host = self.host,
            master_ip = master.ip(),
            master_port = master.port(),
            dir = dir.display(),
            log = dir.join(LOG_FILE).display(),
        );
        std::fs::write(dir.join(CONFIG_FILE), config).map_err(|source| ServerError::Io {
            what: format!("write {}", dir.join(CONFIG_FILE).display()),
            source,
        })
    }

    /// The TCP port (the same across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `HOST:PORT` (127.0.0.1, or its namespace's address).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((self.host, self.port))
    }

    /// The last `lines` lines of the sentinel's log (and of its output).
    pub fn log_tail(&self, lines: usize) -> String {
        crate::process::log_tail(
            &self.dir.path().join(LOG_FILE),
            &self.dir.path().join(OUTPUT_FILE),
            lines,
        )
    }

    /// Sends one command over a new connection and returns the reply as
    /// text, as [`RedisServer::command`] does.
    pub async fn command(&self, args: &[&str]) -> io::Result<String> {
        redis_resp::command(self.addr(), args).await
    }

    /// Spawns the sentinel (killing a running one first) and waits until it
    /// answers `PING`.
    async fn launch(&self) -> Result<(), ServerError> {
        let mut command = Command::new(&self.binary);
        command
            .arg(self.dir.path().join(CONFIG_FILE))
            .arg("--sentinel")
            .current_dir(self.dir.path());
        let addr = self.addr();
        self.process
            .launch(
                &format!("redis sentinel on {addr}"),
                &command,
                &self.dir.path().join(LOG_FILE),
                &self.dir.path().join(OUTPUT_FILE),
                READINESS,
                |pid| redis_resp::probe(addr, None, pid),
            )
            .await
    }
}

#[async_trait::async_trait]
impl FaultControl for RedisSentinel {
    fn process(&self) -> &ProcessSlot {
        &self.process
    }

    async fn try_restart(&self) -> Result<(), ServerError> {
        self.launch().await
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        self.kill();
    }
}
