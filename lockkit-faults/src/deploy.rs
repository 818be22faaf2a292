//! The backends under test and their servers: each run gets fresh servers,
//! and every worker reaches them through its own [`TcpProxy`] (one per
//! server), so that one worker can be partitioned from the rest.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use lockkit_testkit::{
    MariaDbServer, PostgresServer, RedisCluster, RedisSentinels, RedisServer, ServerError,
    TcpProxy, ZkEnsemble, ZkServer,
};

use crate::record::millis;
use crate::scenario::Scenario;

/// A backend (and deployment) of the suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Backend {
    /// One Redis server without persistence.
    Redis,
    /// One Redis server with AOF persistence, fsync on every write.
    RedisAof,
    /// Redlock over three Redis masters without persistence.
    Redlock,
    /// One ZooKeeper server.
    Zk,
    /// A three-server ZooKeeper ensemble.
    ZkEnsemble,
    /// PostgreSQL lease rows.
    PgLease,
    /// PostgreSQL `SELECT … FOR UPDATE` row locks.
    PgRow,
    /// PostgreSQL advisory locks.
    PgAdvisory,
    /// MariaDB lease rows.
    MariaDbLease,
    /// MariaDB `SELECT … FOR UPDATE` row locks.
    MariaDbRow,
    /// MariaDB `GET_LOCK` named locks.
    MariaDbNamed,
    /// A Redis Cluster of three masters (no replicas).
    RedisCluster,
    /// Redis Sentinel: a master, an asynchronous replica, three sentinels.
    RedisSentinel,
    /// The same, and every grant waits for the replica's acknowledgement
    /// (`WAIT 1`) before it counts.
    RedisSentinelWait,
}

impl Backend {
    /// Every backend, in report order.
    pub const ALL: [Backend; 14] = [
        Backend::Redis,
        Backend::RedisAof,
        Backend::Redlock,
        Backend::Zk,
        Backend::ZkEnsemble,
        Backend::PgLease,
        Backend::PgRow,
        Backend::PgAdvisory,
        Backend::MariaDbLease,
        Backend::MariaDbRow,
        Backend::MariaDbNamed,
        Backend::RedisCluster,
        Backend::RedisSentinel,
        Backend::RedisSentinelWait,
    ];

    /// The name used on the command line and in the report.
    pub fn label(self) -> &'static str {
        match self {
            Backend::Redis => "redis",
            Backend::RedisAof => "redis-aof",
            Backend::Redlock => "redlock",
            Backend::Zk => "zk",
            Backend::ZkEnsemble => "zk-ensemble",
            Backend::PgLease => "pg-lease",
            Backend::PgRow => "pg-row",
            Backend::PgAdvisory => "pg-advisory",
            Backend::MariaDbLease => "mariadb-lease",
            Backend::MariaDbRow => "mariadb-row",
            Backend::MariaDbNamed => "mariadb-named",
            Backend::RedisCluster => "redis-cluster",
            Backend::RedisSentinel => "redis-sentinel",
            Backend::RedisSentinelWait => "redis-sentinel-wait",
        }
    }

    /// The backend with this label.
    pub fn from_label(label: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.label() == label)
    }

    /// The scenarios that apply to this backend.
    pub fn scenarios(self) -> &'static [Scenario] {
        use Scenario::*;
        match self {
            Backend::Redis | Backend::Zk => &[
                HolderPaused,
                HolderKilled,
                ServerKilled,
                ServerPaused,
                Partition,
            ],
            Backend::RedisAof => &[ServerKilled],
            Backend::Redlock => &[HolderPaused, HolderKilled, Partition, MinorityThenMajority],
            Backend::ZkEnsemble => &[HolderPaused, Partition, LeaderKilled],
            Backend::PgLease
            | Backend::PgRow
            | Backend::PgAdvisory
            | Backend::MariaDbLease
            | Backend::MariaDbRow
            | Backend::MariaDbNamed => &[
                HolderPaused,
                HolderKilled,
                ServerKilled,
                ServerPaused,
                Partition,
                ConnectionKilled,
            ],
            // The cluster and sentinel clients learn the servers' addresses
            // from the servers, so a per-worker proxy cannot sit in between:
            // no partition scenario for them.
            Backend::RedisCluster => &[HolderPaused, HolderKilled, ServerKilled],
            Backend::RedisSentinel | Backend::RedisSentinelWait => &[HolderPaused, Failover],
        }
    }

    fn sql_mode(self) -> Option<&'static str> {
        match self {
            Backend::PgLease | Backend::MariaDbLease => Some("lease"),
            Backend::PgRow | Backend::MariaDbRow => Some("row"),
            Backend::PgAdvisory => Some("advisory"),
            Backend::MariaDbNamed => Some("named"),
            _ => None,
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The servers of one deployment.
enum Servers {
    Redis(Vec<RedisServer>),
    Zk(ZkServer),
    ZkEnsemble(ZkEnsemble),
    Postgres(PostgresServer),
    MariaDb(MariaDbServer),
    Cluster(RedisCluster),
    Sentinel(Box<RedisSentinels>),
}

/// Fresh servers for one run of one backend, and a proxy per worker and server.
pub struct Deployment {
    backend: Backend,
    servers: Servers,
    /// `proxies[client][server]`.
    proxies: Vec<Vec<TcpProxy>>,
    lease: Duration,
}

impl fmt::Debug for Deployment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deployment")
            .field("backend", &self.backend)
            .field("servers", &self.addrs())
            .finish_non_exhaustive()
    }
}

fn server_error(e: ServerError) -> String {
    e.to_string()
}

impl Deployment {
    /// Starts the backend's servers and `clients` proxies in front of each.
    /// `lease` is the lease length the workers use (also the ZooKeeper
    /// session timeout).
    pub async fn start(backend: Backend, clients: u32, lease: Duration) -> Result<Self, String> {
        let servers = match backend {
            Backend::Redis => {
                Servers::Redis(vec![RedisServer::try_start().await.map_err(server_error)?])
            }
            Backend::RedisAof => Servers::Redis(vec![
                RedisServer::builder()
                    .appendonly(true)
                    .try_start()
                    .await
                    .map_err(server_error)?,
            ]),
            Backend::Redlock => {
                let mut servers = Vec::new();
                for _ in 0..3 {
                    servers.push(RedisServer::try_start().await.map_err(server_error)?);
                }
                Servers::Redis(servers)
            }
            Backend::Zk => Servers::Zk(ZkServer::try_start().await.map_err(server_error)?),
            Backend::ZkEnsemble => {
                Servers::ZkEnsemble(ZkEnsemble::try_start(3).await.map_err(server_error)?)
            }
            Backend::PgLease | Backend::PgRow | Backend::PgAdvisory => {
                Servers::Postgres(PostgresServer::try_start().await.map_err(server_error)?)
            }
            Backend::MariaDbLease | Backend::MariaDbRow | Backend::MariaDbNamed => {
                Servers::MariaDb(MariaDbServer::try_start().await.map_err(server_error)?)
            }
            Backend::RedisCluster => {
                Servers::Cluster(RedisCluster::try_start(3).await.map_err(server_error)?)
            }
            Backend::RedisSentinel | Backend::RedisSentinelWait => Servers::Sentinel(Box::new(
                RedisSentinels::try_start().await.map_err(server_error)?,
            )),
        };
        let mut deployment = Deployment {
            backend,
            servers,
            proxies: Vec::new(),
            lease,
        };
        let proxied = !matches!(
            deployment.servers,
            Servers::Cluster(_) | Servers::Sentinel(_)
        );
        for _ in 0..if proxied { clients } else { 0 } {
            let mut proxies = Vec::new();
            for addr in deployment.addrs() {
                proxies.push(
                    TcpProxy::start(addr)
                        .await
                        .map_err(|e| format!("cannot start a proxy: {e}"))?,
                );
            }
            deployment.proxies.push(proxies);
        }
        Ok(deployment)
    }

    /// The backend.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        match &self.servers {
            Servers::Redis(servers) => servers.iter().map(RedisServer::addr).collect(),
            Servers::Zk(server) => vec![server.addr()],
            Servers::ZkEnsemble(ensemble) => {
                ensemble.servers().iter().map(ZkServer::addr).collect()
            }
            Servers::Postgres(server) => vec![server.addr()],
            Servers::MariaDb(server) => vec![server.addr()],
            Servers::Cluster(cluster) => cluster.nodes().iter().map(RedisServer::addr).collect(),
            Servers::Sentinel(sentinels) => vec![sentinels.master().addr()],
        }
    }

    /// The URL for `client` (through its proxies), or, for `None`, straight
    /// to the servers.
    pub fn url(&self, client: Option<u32>) -> String {
        let hosts: Vec<String> = match client {
            Some(client) if !self.proxies.is_empty() => self.proxies[client as usize]
                .iter()
                .map(|proxy| proxy.addr().to_string())
                .collect(),
            _ => self.addrs().iter().map(ToString::to_string).collect(),
        };
        let hosts = hosts.join(",");
        // Every bound well inside the lease, so that faults surface as
        // errors before the lease runs out.
        let bound = millis(self.lease / 3);
        match self.backend {
            Backend::Redis | Backend::RedisAof => {
                format!("redis://{hosts}?command_timeout={bound}")
            }
            Backend::Redlock => format!("redlock://{hosts}"),
            Backend::Zk | Backend::ZkEnsemble => format!(
                "zk://{hosts}/faults?session_timeout={}&command_timeout={bound}",
                millis(self.lease)
            ),
            Backend::PgLease | Backend::PgRow | Backend::PgAdvisory => format!(
                "postgres://postgres@{hosts}/postgres?mode={}&command_timeout={bound}&liveness={bound}",
                self.backend.sql_mode().unwrap_or("lease")
            ),
            Backend::MariaDbLease | Backend::MariaDbRow | Backend::MariaDbNamed => format!(
                "mysql://root@{hosts}/lockkit?mode={}&command_timeout={bound}&liveness={bound}",
                self.backend.sql_mode().unwrap_or("lease")
            ),
            Backend::RedisCluster => match &self.servers {
                Servers::Cluster(cluster) => format!("{}?command_timeout={bound}", cluster.url()),
                _ => unreachable!("a cluster backend runs on a cluster"),
            },
            Backend::RedisSentinel | Backend::RedisSentinelWait => match &self.servers {
                Servers::Sentinel(sentinels) => format!(
                    "{}?command_timeout={bound}{}",
                    sentinels.url(),
                    if self.backend == Backend::RedisSentinelWait {
                        format!("&wait_replicas=1&wait_timeout={bound}")
                    } else {
                        String::new()
                    }
                ),
                _ => unreachable!("a sentinel backend runs on sentinels"),
            },
        }
    }

    /// How many servers there are.
    pub fn server_count(&self) -> usize {
        self.addrs().len()
    }

    /// SIGSTOP of server `index`.
    pub fn pause(&self, index: usize) {
        match &self.servers {
            Servers::Redis(servers) => servers[index].pause(),
            Servers::Zk(server) => server.pause(),
            Servers::ZkEnsemble(ensemble) => ensemble.servers()[index].pause(),
            Servers::Postgres(server) => server.pause(),
            Servers::MariaDb(server) => server.pause(),
            Servers::Cluster(cluster) => cluster.nodes()[index].pause(),
            Servers::Sentinel(sentinels) => sentinels.master().pause(),
        }
    }

    /// SIGCONT of server `index`.
    pub fn resume(&self, index: usize) {
        match &self.servers {
            Servers::Redis(servers) => servers[index].resume(),
            Servers::Zk(server) => server.resume(),
            Servers::ZkEnsemble(ensemble) => ensemble.servers()[index].resume(),
            Servers::Postgres(server) => server.resume(),
            Servers::MariaDb(server) => server.resume(),
            Servers::Cluster(cluster) => cluster.nodes()[index].resume(),
            Servers::Sentinel(sentinels) => sentinels.master().resume(),
        }
    }

    /// SIGKILL of server `index`.
    pub fn kill(&self, index: usize) {
        match &self.servers {
            Servers::Redis(servers) => servers[index].kill(),
            Servers::Zk(server) => server.kill(),
            Servers::ZkEnsemble(ensemble) => ensemble.servers()[index].kill(),
            Servers::Postgres(server) => server.kill(),
            Servers::MariaDb(server) => server.kill(),
            Servers::Cluster(cluster) => cluster.nodes()[index].kill(),
            Servers::Sentinel(sentinels) => sentinels.master().kill(),
        }
    }

    /// Starts server `index` again (same port, same directory).
    pub async fn restart(&self, index: usize) -> Result<(), String> {
        match &self.servers {
            Servers::Redis(servers) => servers[index].try_restart().await,
            Servers::Zk(server) => server.try_restart().await,
            Servers::ZkEnsemble(ensemble) => ensemble.servers()[index].try_restart().await,
            Servers::Postgres(server) => server.try_restart().await,
            Servers::MariaDb(server) => server.try_restart().await,
            Servers::Cluster(cluster) => cluster.nodes()[index].try_restart().await,
            Servers::Sentinel(sentinels) => sentinels.master().try_restart().await,
        }
        .map_err(server_error)
    }

    /// Waits, after restarts, until the deployment serves again where it
    /// needs more than the servers' own readiness: a Redis Cluster whose
    /// restarted nodes must find each other again.
    pub async fn settle(&self, timeout: Duration) -> Result<(), String> {
        match &self.servers {
            Servers::Cluster(cluster) if !cluster.wait_until_ok(timeout).await => Err(format!(
                "the cluster is not ok {timeout:?} after the restart"
            )),
            _ => Ok(()),
        }
    }

    /// Partitions `client` from every server (`true`) or heals it.
    pub fn partition(&self, client: u32, on: bool) -> Result<(), String> {
        let proxies = self
            .proxies
            .get(client as usize)
            .ok_or_else(|| format!("{} runs without proxies", self.backend))?;
        for proxy in proxies {
            proxy.blackhole(on);
        }
        Ok(())
    }

    fn sentinels(&self) -> Result<&RedisSentinels, String> {
        match &self.servers {
            Servers::Sentinel(sentinels) => Ok(sentinels),
            _ => Err(format!("{} has no sentinels", self.backend)),
        }
    }

    /// Checks that the replica still replicates through the proxy (the
    /// sentinels may re-point it at the master's own address).
    pub async fn check_replication_path(&self) -> Result<(), String> {
        let sentinels = self.sentinels()?;
        let info = sentinels
            .replica()
            .command(&["INFO", "replication"])
            .await
            .map_err(|e| format!("INFO of the replica: {e}"))?;
        let port = sentinels.replication_proxy().port().to_string();
        let through_proxy = info
            .lines()
            .any(|line| line.trim().strip_prefix("master_port:") == Some(port.as_str()));
        if through_proxy {
            Ok(())
        } else {
            Err(format!(
                "the replica does not replicate through the proxy (port {port}): {info}"
            ))
        }
    }

    /// Restarts the killed old master and makes it the new master's replica
    /// at once (what the sentinels would do after some 10 to 20 s, or an
    /// operator), so that grants can be acknowledged again.
    pub async fn rejoin_old_master(&self) -> Result<(), String> {
        let sentinels = self.sentinels()?;
        let master = sentinels
            .current_master_addr()
            .await
            .ok_or("no sentinel names a master")?;
        sentinels
            .master()
            .try_restart()
            .await
            .map_err(server_error)?;
        let reply = sentinels
            .master()
            .command(&[
                "REPLICAOF",
                &master.ip().to_string(),
                &master.port().to_string(),
            ])
            .await
            .map_err(|e| format!("REPLICAOF on the old master: {e}"))?;
        if reply.starts_with("OK") {
            Ok(())
        } else {
            Err(format!("REPLICAOF on the old master: {reply}"))
        }
    }

    /// Blackholes (`true`) or heals the replica's replication link.
    pub fn cut_replication(&self, on: bool) -> Result<(), String> {
        self.sentinels()?.replication_proxy().blackhole(on);
        Ok(())
    }

    /// Drops the replication link's connections (and what a blackhole held).
    pub fn reset_replication(&self) -> Result<(), String> {
        self.sentinels()?.replication_proxy().reset_connections();
        Ok(())
    }

    /// Kills the Sentinel deployment's master; returns its address.
    pub fn kill_master(&self) -> Result<SocketAddr, String> {
        let sentinels = self.sentinels()?;
        let master = sentinels.master();
        master.kill();
        Ok(master.addr())
    }

    /// Waits until the sentinels name a master other than `old`.
    pub async fn wait_for_failover(
        &self,
        old: SocketAddr,
        timeout: Duration,
    ) -> Result<bool, String> {
        Ok(self.sentinels()?.wait_for_failover(old, timeout).await)
    }

    /// The index of the ZooKeeper ensemble's leader.
    pub async fn leader(&self) -> Option<usize> {
        match &self.servers {
            Servers::ZkEnsemble(ensemble) => ensemble.leader().await,
            _ => None,
        }
    }

    /// Kills every client connection on the SQL server, the way an operator
    /// or a failover proxy would: `pg_terminate_backend`, MariaDB `KILL`.
    /// Returns how many were killed.
    pub async fn kill_connections(&self) -> Result<usize, String> {
        match &self.servers {
            Servers::Postgres(server) => {
                let killed = server
                    .psql(
                        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()) AS t",
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                killed
                    .trim()
                    .parse()
                    .map_err(|e| format!("{killed:?}: {e}"))
            }
            Servers::MariaDb(server) => {
                let ids = server
                    .sql(
                        "SELECT id FROM information_schema.processlist \
                         WHERE command <> 'Daemon' AND id <> CONNECTION_ID()",
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                let ids: Vec<&str> = ids
                    .lines()
                    .map(str::trim)
                    .filter(|id| id.chars().all(|c| c.is_ascii_digit()) && !id.is_empty())
                    .collect();
                if ids.is_empty() {
                    return Ok(0);
                }
                // A connection may end by itself meanwhile; KILL of a gone id
                // fails, so kill them one statement at a time.
                let mut killed = 0;
                for id in &ids {
                    if server.sql(&format!("KILL {id}")).await.is_ok() {
                        killed += 1;
                    }
                }
                Ok(killed)
            }
            _ => Err(format!("{} has no SQL connections to kill", self.backend)),
        }
    }
}
