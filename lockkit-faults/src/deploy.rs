//! The deployments under test: the catalog's (lockkit-testkit), each run on
//! fresh servers, and every worker reaching them through its own
//! [`TcpProxy`] (one per server), so that one worker can be partitioned
//! from the rest.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

pub use lockkit_testkit::catalog::Deployment;
use lockkit_testkit::catalog::{Servers, StartOptions};
use lockkit_testkit::{FaultControl, TestServer};
use lockkit_testkit::{RedisSentinels, RedisServer, ServerError, TcpProxy};

use crate::record::millis;

/// The URL parameters of `deployment` for workers with leases of `lease`:
/// every bound well inside the lease, so that faults surface as errors
/// before the lease runs out.
pub fn url_params(deployment: Deployment, lease: Duration) -> Vec<(&'static str, String)> {
    let bound = millis(lease / 3).to_string();
    match deployment {
        Deployment::Memory | Deployment::SqliteLease | Deployment::Redlock3 => Vec::new(),
        Deployment::Zk | Deployment::ZkEnsemble => vec![
            ("session_timeout", millis(lease).to_string()),
            ("command_timeout", bound),
        ],
        d if d.sql_mode().is_some() => {
            vec![("command_timeout", bound.clone()), ("liveness", bound)]
        }
        Deployment::RedisSentinelWait | Deployment::RedisClusterReplicasWait => {
            vec![("command_timeout", bound.clone()), ("wait_timeout", bound)]
        }
        _ => vec![("command_timeout", bound)],
    }
}

/// Replication cut off by [`Testbed::cut_replication_of`].
#[derive(Clone, Copy, Debug)]
pub enum Cut {
    /// Sentinel's replication proxy blackholes.
    Sentinel,
    /// Cluster: the lock's master and its frozen replica (indexes of the
    /// cluster's `all_nodes`).
    Cluster {
        /// The lock's master.
        master: usize,
        /// Its replica, frozen.
        replica: usize,
    },
}

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
    /// `options` says whether the servers' wall clocks can be moved
    /// ([`shift_clock`](Self::shift_clock)), and whether they run in network
    /// namespaces ([`cut_servers`](Self::cut_servers)).
    pub async fn start(
        deployment: Deployment,
        clients: u32,
        lease: Duration,
        options: StartOptions,
    ) -> Result<Self, String> {
        let servers = Servers::try_start_with(&[deployment], options)
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
        self.servers.url_with(
            self.deployment,
            &hosts,
            &url_params(self.deployment, self.lease),
        )
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

    /// Moves the wall clock of server `index` `offset` ahead of the
    /// machine's (`None`: back to the machine's).
    pub fn shift_clock(&self, index: usize, offset: Option<Duration>) -> Result<(), String> {
        let clock = self
            .servers
            .server(self.deployment, index)
            .clock()
            .ok_or_else(|| format!("{} server {index} has no clock to move", self.deployment))?;
        let ms = offset.map_or(0, |offset| {
            i64::try_from(offset.as_millis()).unwrap_or(i64::MAX)
        });
        clock.set_offset_ms(ms).map_err(server_error)
    }

    /// Whether this is a Redis Sentinel deployment.
    pub fn is_sentinel(&self) -> bool {
        self.sentinels().is_ok()
    }

    /// Waits until the sentinels name a master other than the one started
    /// as the master, and it serves as one.
    pub async fn wait_for_promotion(&self, timeout: Duration) -> Result<(), String> {
        let old = self.sentinels()?.master().addr();
        if self.wait_for_failover(old, timeout).await? {
            Ok(())
        } else {
            Err(format!(
                "the sentinels promoted no replica within {timeout:?}"
            ))
        }
    }

    /// After a partition that promoted the replica: waits until the old
    /// master (back in touch) is the new master's replica, as the sentinels
    /// make it; tells it so itself if they have not within `timeout`.
    pub async fn demote_old_master(&self, timeout: Duration) -> Result<(), String> {
        let old = self.sentinels()?.master();
        if old.wait_for_role("slave", timeout).await {
            return Ok(());
        }
        let master = self.named_master().await?;
        self.follow(master).await
    }

    /// The master the sentinels name.
    async fn named_master(&self) -> Result<SocketAddr, String> {
        self.sentinels()?
            .current_master_addr()
            .await
            .ok_or_else(|| "no sentinel names a master".to_owned())
    }

    /// Makes the Sentinel deployment's old master a replica of `master`.
    async fn follow(&self, master: SocketAddr) -> Result<(), String> {
        let reply = self
            .sentinels()?
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

    /// Cuts (`true`) or heals every link between server `index` and the
    /// other servers; the workers still reach it.
    pub fn cut_servers(&self, index: usize, on: bool) -> Result<(), String> {
        let fabric = self.servers.fabric().ok_or_else(|| {
            format!(
                "{}'s servers do not run in network namespaces",
                self.deployment
            )
        })?;
        fabric.isolate(index, on).map_err(server_error)
    }

    /// Starts server `index` again (same port, same directory).
    pub async fn restart(&self, index: usize) -> Result<(), String> {
        self.servers
            .server(self.deployment, index)
            .try_restart()
            .await
            .map_err(server_error)
    }

    /// Cuts the replication of the master that holds lock `name` (for
    /// Sentinel: of the master), so that what it writes next never reaches
    /// its replica; [`fail_over`](Self::fail_over) then kills that master.
    ///
    /// Sentinel: the replication link's proxy blackholes. Cluster: the
    /// replica of the lock's master is frozen (SIGSTOP) and the master
    /// drops its link (`CLIENT KILL TYPE replica`), so nothing is on the way.
    pub async fn cut_replication_of(&self, name: &str) -> Result<Cut, String> {
        match self.deployment {
            Deployment::RedisSentinel | Deployment::RedisSentinelWait => {
                self.check_replication_path().await?;
                self.cut_replication(true)?;
                Ok(Cut::Sentinel)
            }
            Deployment::RedisClusterReplicas | Deployment::RedisClusterReplicasWait => {
                let cluster = self.servers.cluster_replicas();
                let key = format!("{}{name}", lockkit::redis::DEFAULT_PREFIX);
                let master = cluster
                    .master_of(&key)
                    .await
                    .ok_or_else(|| format!("no node serves {key:?}"))?;
                let replica = cluster
                    .replica_of(master)
                    .await
                    .ok_or_else(|| format!("{} reports no replica", master.addr()))?;
                let index = |node: &RedisServer| {
                    cluster
                        .all_nodes()
                        .position(|n| n.port() == node.port())
                        .unwrap_or_default()
                };
                replica.pause();
                let reply = master
                    .command(&["CLIENT", "KILL", "TYPE", "replica"])
                    .await
                    .map_err(|e| format!("CLIENT KILL on {}: {e}", master.addr()))?;
                if reply.trim() == "0" {
                    replica.resume();
                    return Err(format!("{} had no replica connected", master.addr()));
                }
                Ok(Cut::Cluster {
                    master: index(master),
                    replica: index(replica),
                })
            }
            d => Err(format!("{d} has no replicas")),
        }
    }

    /// Kills the master whose replication [`cut_replication_of`](Self::cut_replication_of)
    /// cut, lets the replica be promoted (by the sentinels, by the
    /// cluster's other masters), and brings the old master back as the new
    /// one's replica, so that grants can be acknowledged again.
    pub async fn fail_over(&self, cut: Cut, timeout: Duration) -> Result<(), String> {
        match cut {
            Cut::Sentinel => {
                let old = self.kill_master()?;
                self.reset_replication()?;
                self.cut_replication(false)?;
                if !self.wait_for_failover(old, timeout).await? {
                    return Err(format!("no failover within {timeout:?}"));
                }
                self.rejoin_old_master().await
            }
            Cut::Cluster { master, replica } => {
                let nodes: Vec<&RedisServer> =
                    self.servers.cluster_replicas().all_nodes().collect();
                let (master, replica) = (nodes[master], nodes[replica]);
                master.kill();
                replica.resume();
                if !replica.wait_for_role("master", timeout).await {
                    return Err(format!(
                        "the replica {} was not promoted within {timeout:?}",
                        replica.addr()
                    ));
                }
                master.try_restart().await.map_err(server_error)?;
                if !master.wait_for_role("slave", timeout).await {
                    return Err(format!(
                        "the old master {} did not rejoin as a replica within {timeout:?}",
                        master.addr()
                    ));
                }
                self.settle(timeout).await
            }
        }
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
            Deployment::RedisClusterReplicas | Deployment::RedisClusterReplicasWait
                if !self.servers.cluster_replicas().wait_until_ok(timeout).await =>
            {
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

    /// The Sentinel deployment's replication proxy.
    fn replication_proxy(&self) -> Result<&TcpProxy, String> {
        self.sentinels()?
            .replication_proxy()
            .ok_or_else(|| format!("{} replicates without a proxy", self.deployment))
    }

    /// Checks that the replica still replicates through the proxy (the
    /// sentinels may re-point it at the master's own address).
    async fn check_replication_path(&self) -> Result<(), String> {
        let sentinels = self.sentinels()?;
        let info = sentinels
            .replica()
            .command(&["INFO", "replication"])
            .await
            .map_err(|e| format!("INFO of the replica: {e}"))?;
        let port = self.replication_proxy()?.port().to_string();
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
    async fn rejoin_old_master(&self) -> Result<(), String> {
        let master = self.named_master().await?;
        self.sentinels()?
            .master()
            .try_restart()
            .await
            .map_err(server_error)?;
        self.follow(master).await
    }

    /// Blackholes (`true`) or heals the replica's replication link.
    fn cut_replication(&self, on: bool) -> Result<(), String> {
        self.replication_proxy()?.blackhole(on);
        Ok(())
    }

    /// Drops the replication link's connections (and what a blackhole held).
    fn reset_replication(&self) -> Result<(), String> {
        self.replication_proxy()?.reset_connections();
        Ok(())
    }

    /// Kills the Sentinel deployment's master; returns its address.
    fn kill_master(&self) -> Result<SocketAddr, String> {
        let sentinels = self.sentinels()?;
        let master = sentinels.master();
        master.kill();
        Ok(master.addr())
    }

    /// Waits until the sentinels name a master other than `old`.
    async fn wait_for_failover(&self, old: SocketAddr, timeout: Duration) -> Result<bool, String> {
        Ok(self.sentinels()?.wait_for_failover(old, timeout).await)
    }

    /// What the servers say of themselves, for a run whose fault did not
    /// recover: a ZooKeeper ensemble's members, each with its mode and the
    /// last `lines` lines of its log (an ensemble that formed no quorum
    /// serves no client). `None` for the other deployments.
    pub async fn describe(&self, lines: usize) -> Option<String> {
        match self.deployment {
            Deployment::ZkEnsemble => Some(self.servers.zk_ensemble().describe(lines).await),
            _ => None,
        }
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
