//! The deployments under test: the catalog's (lockkit-testkit), each run on
//! fresh servers, and every worker reaching them through its own
//! [`TcpProxy`] (one per server), so that one worker can be partitioned
//! from the rest.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

pub use lockkit_testkit::catalog::Deployment;
use lockkit_testkit::catalog::Servers;
use lockkit_testkit::{FaultControl, TestServer};
use lockkit_testkit::{RedisSentinels, ServerError, TcpProxy};

use crate::record::millis;

/// Fresh servers for one run of one deployment, and a proxy per worker and server.
pub struct Testbed {
    deployment: Deployment,
    servers: Servers,
    /// `proxies[client][server]`.
    proxies: Vec<Vec<TcpProxy>>,
    lease: Duration,
}

impl fmt::Debug for Testbed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Testbed")
            .field("deployment", &self.deployment)
            .field("servers", &self.servers.addrs(self.deployment))
            .finish_non_exhaustive()
    }
}

fn server_error(e: ServerError) -> String {
    e.to_string()
}

impl Testbed {
    /// Starts the deployment's servers and `clients` proxies in front of each.
    /// `lease` is the lease length the workers use (also the ZooKeeper
    /// session timeout).
    pub async fn start(
        deployment: Deployment,
        clients: u32,
        lease: Duration,
    ) -> Result<Self, String> {
        let servers = Servers::try_start(&[deployment])
            .await
            .map_err(server_error)?;
        let mut proxies = Vec::new();
        if deployment.proxiable() {
            for _ in 0..clients {
                let mut mine = Vec::new();
                for addr in servers.addrs(deployment) {
                    mine.push(
                        TcpProxy::start(addr)
                            .await
                            .map_err(|e| format!("cannot start a proxy: {e}"))?,
                    );
                }
                proxies.push(mine);
            }
        }
        Ok(Testbed {
            deployment,
            servers,
            proxies,
            lease,
        })
    }

    /// The deployment.
    pub fn deployment(&self) -> Deployment {
        self.deployment
    }

    /// The URL for `client` (through its proxies), or, for `None`, straight
    /// to the servers.
    pub fn url(&self, client: Option<u32>) -> String {
        let hosts: Vec<String> = match client {
            Some(client) if !self.proxies.is_empty() => self.proxies[client as usize]
                .iter()
                .map(|proxy| proxy.addr().to_string())
                .collect(),
            _ => self
                .servers
                .addrs(self.deployment)
                .iter()
                .map(ToString::to_string)
                .collect(),
        };
        // Every bound well inside the lease, so that faults surface as
        // errors before the lease runs out.
        let bound = millis(self.lease / 3).to_string();
        let params: Vec<(&str, String)> = match self.deployment {
            Deployment::Redlock3 => Vec::new(),
            Deployment::Zk | Deployment::ZkEnsemble => vec![
                ("session_timeout", millis(self.lease).to_string()),
                ("command_timeout", bound),
            ],
            d if d.sql_mode().is_some() => {
                vec![("command_timeout", bound.clone()), ("liveness", bound)]
            }
            Deployment::RedisSentinelWait => {
                vec![("command_timeout", bound.clone()), ("wait_timeout", bound)]
            }
            _ => vec![("command_timeout", bound)],
        };
        self.servers.url_with(self.deployment, &hosts, &params)
    }

    /// How many servers there are.
    pub fn server_count(&self) -> usize {
        self.servers.addrs(self.deployment).len()
    }

    /// SIGSTOP of server `index`.
    pub fn pause(&self, index: usize) {
        self.servers.server(self.deployment, index).pause();
    }

    /// SIGCONT of server `index`.
    pub fn resume(&self, index: usize) {
        self.servers.server(self.deployment, index).resume();
    }

    /// SIGKILL of server `index`.
    pub fn kill(&self, index: usize) {
        self.servers.server(self.deployment, index).kill();
    }

    /// Starts server `index` again (same port, same directory).
    pub async fn restart(&self, index: usize) -> Result<(), String> {
        self.servers
            .server(self.deployment, index)
            .try_restart()
            .await
            .map_err(server_error)
    }

    /// Waits, after restarts, until the deployment serves again where it
    /// needs more than the servers' own readiness: a Redis Cluster whose
    /// restarted nodes must find each other again.
    pub async fn settle(&self, timeout: Duration) -> Result<(), String> {
        match self.deployment {
            Deployment::RedisCluster if !self.servers.cluster().wait_until_ok(timeout).await => {
                Err(format!(
                    "the cluster is not ok {timeout:?} after the restart"
                ))
            }
            _ => Ok(()),
        }
    }

    /// Partitions `client` from every server (`true`) or heals it.
    pub fn partition(&self, client: u32, on: bool) -> Result<(), String> {
        self.partition_from(client, 0..self.server_count(), on)
    }

    /// Partitions `client` from the servers `indexes` (`true`) or heals
    /// those links; its links to the other servers stay as they are.
    pub fn partition_from(
        &self,
        client: u32,
        indexes: impl IntoIterator<Item = usize>,
        on: bool,
    ) -> Result<(), String> {
        let proxies = self
            .proxies
            .get(client as usize)
            .ok_or_else(|| format!("{} runs without proxies", self.deployment))?;
        for index in indexes {
            proxies
                .get(index)
                .ok_or_else(|| format!("{} has no server {index}", self.deployment))?
                .blackhole(on);
        }
        Ok(())
    }

    fn sentinels(&self) -> Result<&RedisSentinels, String> {
        match self.deployment {
            Deployment::RedisSentinel | Deployment::RedisSentinelWait => {
                Ok(self.servers.sentinels())
            }
            _ => Err(format!("{} has no sentinels", self.deployment)),
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

    /// The index of the leader of a ZooKeeper ensemble or an etcd cluster.
    pub async fn leader(&self) -> Option<usize> {
        match self.deployment {
            Deployment::ZkEnsemble => self.servers.zk_ensemble().leader().await,
            Deployment::EtcdCluster => self.servers.etcd_cluster().leader().await,
            _ => None,
        }
    }

    /// Kills every client connection on the SQL server, the way an operator
    /// or a failover proxy would: `pg_terminate_backend`, MariaDB `KILL`.
    /// etcd's gRPC connections are reset (TCP RST on both sides) by every
    /// worker's proxy, as a load balancer or a member's restart of its
    /// listener would. Returns how many were killed (for etcd, the proxies
    /// that reset theirs).
    pub async fn kill_connections(&self) -> Result<usize, String> {
        match self.deployment {
            Deployment::Etcd | Deployment::EtcdCluster => {
                let proxies = self.proxies.iter().flatten();
                Ok(proxies.map(TcpProxy::reset_connections).count())
            }
            Deployment::PgLease | Deployment::PgRow | Deployment::PgAdvisory => {
                let server = self.servers.pg();
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
            Deployment::MariaDbLease | Deployment::MariaDbRow | Deployment::MariaDbNamed => {
                let server = self.servers.my();
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
            _ => Err(format!(
                "{} has no SQL connections to kill",
                self.deployment
            )),
        }
    }
}
