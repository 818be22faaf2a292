//! The deployments that the benchmarks and the fault suite run lockkit on:
//! one list of names, the servers each one needs, and its lockkit URL.
//!
//! A [`Deployment`] is a backend and mode on a shape of servers (one Redis,
//! five Redlock masters, a ZooKeeper ensemble, Postgres in advisory mode…).
//! [`Servers::try_start`] starts what a set of deployments needs, sharing
//! servers where the deployments can (the three Postgres modes use one
//! server, Redlock×3 the first three of Redlock×5's masters), and
//! [`Servers::url`] gives the URL to hand to `lockkit::connect`, so that
//! benchmarks and fault runs measure exactly what users get.
//!
//! ```no_run
//! # async fn example() -> Result<(), lockkit_testkit::ServerError> {
//! use lockkit_testkit::catalog::{Deployment, Servers};
//!
//! let servers = Servers::try_start(&[Deployment::PgAdvisory, Deployment::Redis]).await?;
//! let url = servers.url(Deployment::PgAdvisory);
//! assert!(url.starts_with("postgres://") && url.ends_with("mode=advisory"));
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::{
    EtcdCluster, EtcdServer, Fabric, FaultControl, MariaDbServer, PostgresServer, RedisCluster,
    RedisSentinels, RedisServer, ServerError, TestServer, ZkEnsemble, ZkServer,
};

/// A backend and mode on a shape of servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Deployment {
    /// `memory://`: no server.
    Memory,
    /// One Redis server without persistence.
    Redis,
    /// One Redis server with AOF persistence, fsync on every write.
    RedisAof,
    /// Redlock over three Redis masters without persistence.
    Redlock3,
    /// Redlock over five Redis masters without persistence.
    Redlock5,
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
    /// SQLite lease rows in a file.
    SqliteLease,
    /// A Redis Cluster of three masters (no replicas).
    RedisCluster,
    /// Redis Sentinel: a master, an asynchronous replica (replicating
    /// through a [`TcpProxy`](crate::TcpProxy)), three sentinels.
    RedisSentinel,
    /// The same, and every grant waits for the replica's acknowledgement
    /// (`wait_replicas=1`) before it counts.
    RedisSentinelWait,
    /// One etcd server.
    Etcd,
    /// A three-member etcd cluster.
    EtcdCluster,
    /// A Redis Cluster of three masters with one replica each (the
    /// cluster promotes a replica when its master fails).
    RedisClusterReplicas,
    /// The same, and every grant and renewal waits for the replica's
    /// acknowledgement (`wait_replicas=1`) before it counts.
    RedisClusterReplicasWait,
}

/// The servers a deployment runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Needs {
    Nothing,
    Redis(usize),
    RedisAof,
    Zk,
    ZkEnsemble,
    Postgres,
    MariaDb,
    SqliteFile,
    Cluster,
    ClusterReplicas,
    Sentinel,
    Etcd,
    EtcdCluster,
}

impl Deployment {
    /// Every deployment, in the order of the reports.
    pub const ALL: &'static [Deployment] = &[
        Deployment::Memory,
        Deployment::Redis,
        Deployment::RedisAof,
        Deployment::Redlock3,
        Deployment::Redlock5,
        Deployment::Zk,
        Deployment::ZkEnsemble,
        Deployment::PgLease,
        Deployment::PgRow,
        Deployment::PgAdvisory,
        Deployment::MariaDbLease,
        Deployment::MariaDbRow,
        Deployment::MariaDbNamed,
        Deployment::SqliteLease,
        Deployment::RedisCluster,
        Deployment::RedisSentinel,
        Deployment::RedisSentinelWait,
        Deployment::Etcd,
        Deployment::EtcdCluster,
        Deployment::RedisClusterReplicas,
        Deployment::RedisClusterReplicasWait,
    ];

    /// The name on command lines, in benchmark ids and in reports, e.g.
    /// `redlock5`, `pg-advisory`, `mariadb-named`.
    pub fn label(self) -> &'static str {
        match self {
            Deployment::Memory => "memory",
            Deployment::Redis => "redis",
            Deployment::RedisAof => "redis-aof",
            Deployment::Redlock3 => "redlock3",
            Deployment::Redlock5 => "redlock5",
            Deployment::Zk => "zk",
            Deployment::ZkEnsemble => "zk-ensemble",
            Deployment::PgLease => "pg-lease",
            Deployment::PgRow => "pg-row",
            Deployment::PgAdvisory => "pg-advisory",
            Deployment::MariaDbLease => "mariadb-lease",
            Deployment::MariaDbRow => "mariadb-row",
            Deployment::MariaDbNamed => "mariadb-named",
            Deployment::SqliteLease => "sqlite-lease",
            Deployment::RedisCluster => "redis-cluster",
            Deployment::RedisSentinel => "redis-sentinel",
            Deployment::RedisSentinelWait => "redis-sentinel-wait",
            Deployment::Etcd => "etcd",
            Deployment::EtcdCluster => "etcd-cluster",
            Deployment::RedisClusterReplicas => "redis-cluster-replicas",
            Deployment::RedisClusterReplicasWait => "redis-cluster-replicas-wait",
        }
    }

    /// The deployment labelled `label`.
    pub fn from_label(label: &str) -> Option<Deployment> {
        Deployment::ALL.iter().copied().find(|d| d.label() == label)
    }

    /// Parses a comma-separated list of labels; the error names the
    /// unknown label and the known ones.
    pub fn parse_list(list: &str) -> Result<Vec<Deployment>, String> {
        list.split(',')
            .map(str::trim)
            .filter(|label| !label.is_empty())
            .map(|label| {
                Deployment::from_label(label).ok_or_else(|| {
                    format!(
                        "unknown deployment {label:?}; known: {}",
                        Deployment::ALL
                            .iter()
                            .map(|d| d.label())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
            })
            .collect()
    }

    /// The SQL mode (`lease`, `row`, `advisory`, `named`), for SQL deployments.
    pub fn sql_mode(self) -> Option<&'static str> {
        match self {
            Deployment::PgLease | Deployment::MariaDbLease | Deployment::SqliteLease => {
                Some("lease")
            }
            Deployment::PgRow | Deployment::MariaDbRow => Some("row"),
            Deployment::PgAdvisory => Some("advisory"),
            Deployment::MariaDbNamed => Some("named"),
            _ => None,
        }
    }

    /// How many Redis masters a Redis or Redlock deployment talks to.
    pub fn redis_masters(self) -> usize {
        match self.needs() {
            Needs::Redis(n) => n,
            Needs::RedisAof | Needs::Sentinel => 1,
            Needs::Cluster | Needs::ClusterReplicas => 3,
            _ => 0,
        }
    }

    /// Whether a client reaches every server at an address the deployment
    /// knows, so that a proxy can sit in between (not so for Redis Cluster
    /// and Sentinel, whose clients learn addresses from the servers).
    pub fn proxiable(self) -> bool {
        !matches!(
            self.needs(),
            Needs::Cluster
                | Needs::ClusterReplicas
                | Needs::Sentinel
                | Needs::Nothing
                | Needs::SqliteFile
        )
    }

    fn needs(self) -> Needs {
        match self {
            Deployment::Memory => Needs::Nothing,
            Deployment::Redis => Needs::Redis(1),
            Deployment::RedisAof => Needs::RedisAof,
            Deployment::Redlock3 => Needs::Redis(3),
            Deployment::Redlock5 => Needs::Redis(5),
            Deployment::Zk => Needs::Zk,
            Deployment::ZkEnsemble => Needs::ZkEnsemble,
            Deployment::PgLease | Deployment::PgRow | Deployment::PgAdvisory => Needs::Postgres,
            Deployment::MariaDbLease | Deployment::MariaDbRow | Deployment::MariaDbNamed => {
                Needs::MariaDb
            }
            Deployment::SqliteLease => Needs::SqliteFile,
            Deployment::RedisCluster => Needs::Cluster,
            Deployment::RedisClusterReplicas | Deployment::RedisClusterReplicasWait => {
                Needs::ClusterReplicas
            }
            Deployment::RedisSentinel | Deployment::RedisSentinelWait => Needs::Sentinel,
            Deployment::Etcd => Needs::Etcd,
            Deployment::EtcdCluster => Needs::EtcdCluster,
        }
    }
}

impl fmt::Display for Deployment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The servers of a set of deployments, on loopback ports, killed when
/// dropped; and a temporary directory for SQLite files.
#[derive(Debug)]
pub struct Servers {
    redis: Vec<RedisServer>,
    redis_aof: Option<RedisServer>,
    zk: Option<ZkServer>,
    zk_ensemble: Option<ZkEnsemble>,
    pg: Option<PostgresServer>,
    my: Option<MariaDbServer>,
    cluster: Option<RedisCluster>,
    cluster_replicas: Option<RedisCluster>,
    sentinels: Option<Box<RedisSentinels>>,
    etcd: Option<EtcdServer>,
    etcd_cluster: Option<EtcdCluster>,
    /// The network namespaces the servers run in, if they do.
    fabric: Option<Arc<Fabric>>,
    sqlite_dir: tempfile::TempDir,
}

/// How [`Servers::try_start_with`] starts the servers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StartOptions {
    /// The Redis, ZooKeeper, PostgreSQL and MariaDB servers run with a wall
    /// clock that a test can move ([`FaultControl::clock`]).
    pub shiftable_clocks: bool,
    /// The members of a ZooKeeper ensemble or of an etcd cluster, or the
    /// servers and sentinels of a Sentinel deployment, run in network
    /// namespaces of their own ([`Servers::fabric`]), so that a test can cut
    /// them off from each other (needs root). One such deployment a start.
    pub namespaces: bool,
}

/// Session locks hold a connection each: room for a load generator's
/// hundreds of keys held at once.
const SQL_MAX_CONNECTIONS: &str = "600";

impl Servers {
    /// Starts what `deployments` need, in parallel.
    pub async fn try_start(deployments: &[Deployment]) -> Result<Servers, ServerError> {
        Self::try_start_with(deployments, StartOptions::default()).await
    }

    /// The network namespaces the servers run in (member `i` of an ensemble
    /// in namespace `i`), if they were started in some.
    pub fn fabric(&self) -> Option<&Fabric> {
        self.fabric.as_deref()
    }

    /// Like [`try_start`](Self::try_start), with `options`.
    pub async fn try_start_with(
        deployments: &[Deployment],
        options: StartOptions,
    ) -> Result<Servers, ServerError> {
        let StartOptions {
            shiftable_clocks,
            namespaces,
        } = options;
        // A ZooKeeper ensemble's or an etcd cluster's members each in a
        // namespace of their own (one fabric: a run has one deployment).
        let in_namespaces = |n: Needs| namespaces && deployments.iter().any(|d| d.needs() == n);
        let fabric = if in_namespaces(Needs::ZkEnsemble) || in_namespaces(Needs::EtcdCluster) {
            Some(Arc::new(Fabric::create(3)?))
        } else if in_namespaces(Needs::Sentinel) {
            // The master, the replica and three sentinels.
            Some(Arc::new(Fabric::create(5)?))
        } else {
            None
        };
        let needs: Vec<Needs> = deployments.iter().map(|d| d.needs()).collect();
        let any = |n: Needs| needs.contains(&n);
        let redis_count = needs
            .iter()
            .map(|n| match n {
                Needs::Redis(count) => *count,
                _ => 0,
            })
            .max()
            .unwrap_or(0);
        let redis = async {
            let started = futures_util::future::join_all((0..redis_count).map(|_| {
                RedisServer::builder()
                    .shiftable_clock(shiftable_clocks)
                    .try_start()
            }))
            .await;
            started.into_iter().collect::<Result<Vec<_>, _>>()
        };
        let redis_aof = optional(any(Needs::RedisAof), || {
            RedisServer::builder().appendonly(true).try_start()
        });
        let zk = optional(any(Needs::Zk), || {
            ZkServer::builder()
                .shiftable_clock(shiftable_clocks)
                .try_start()
        });
        let zk_ensemble = optional(any(Needs::ZkEnsemble), || {
            let builder = ZkServer::builder().shiftable_clock(shiftable_clocks);
            let fabric = fabric.clone();
            async move {
                match fabric {
                    Some(fabric) => builder.try_start_ensemble_in(fabric).await,
                    None => builder.try_start_ensemble(3).await,
                }
            }
        });
        let pg = optional(any(Needs::Postgres), || {
            PostgresServer::builder()
                .setting("max_connections", SQL_MAX_CONNECTIONS)
                .shiftable_clock(shiftable_clocks)
                .try_start()
        });
        let my = optional(any(Needs::MariaDb), || {
            MariaDbServer::builder()
                .arg(&format!("--max-connections={SQL_MAX_CONNECTIONS}"))
                .shiftable_clock(shiftable_clocks)
                .try_start()
        });
        let cluster = optional(any(Needs::Cluster), || RedisCluster::try_start(3));
        let cluster_replicas = optional(any(Needs::ClusterReplicas), || {
            RedisCluster::try_start_with_replicas(3)
        });
        let sentinels = optional(any(Needs::Sentinel), || {
            let fabric = fabric.clone();
            async move {
                match fabric {
                    Some(fabric) => RedisSentinels::try_start_in(fabric).await,
                    None => RedisSentinels::try_start().await,
                }
            }
        });
        let etcd = optional(any(Needs::Etcd), EtcdServer::try_start);
        let etcd_cluster = optional(any(Needs::EtcdCluster), || {
            let fabric = fabric.clone();
            async move {
                match fabric {
                    Some(fabric) => EtcdCluster::try_start_in(fabric).await,
                    None => EtcdCluster::try_start(3).await,
                }
            }
        });
        let (
            (redis, redis_aof, zk, zk_ensemble, pg, my, cluster, sentinels, etcd, etcd_cluster),
            cluster_replicas,
        ) = tokio::join!(
            async {
                tokio::join!(
                    redis,
                    redis_aof,
                    zk,
                    zk_ensemble,
                    pg,
                    my,
                    cluster,
                    sentinels,
                    etcd,
                    etcd_cluster
                )
            },
            cluster_replicas
        );
        Ok(Servers {
            redis: redis?,
            redis_aof: redis_aof?,
            zk: zk?,
            zk_ensemble: zk_ensemble?,
            pg: pg?,
            my: my?,
            cluster: cluster?,
            cluster_replicas: cluster_replicas?,
            sentinels: sentinels?.map(Box::new),
            etcd: etcd?,
            etcd_cluster: etcd_cluster?,
            fabric,
            sqlite_dir: tempfile::tempdir().map_err(|e| ServerError::Io {
                what: "create a temporary directory for SQLite".into(),
                source: e,
            })?,
        })
    }

    /// Like [`try_start`](Self::try_start).
    ///
    /// # Panics
    ///
    /// With the [`ServerError`]'s message when a server cannot be started.
    pub async fn start(deployments: &[Deployment]) -> Servers {
        Servers::try_start(deployments)
            .await
            .unwrap_or_else(|e| panic!("cannot start the servers: {e}"))
    }

    /// The addresses of the servers behind `deployment`, in the order of
    /// [`server`](Self::server)'s `index` (for Sentinel, the master).
    ///
    /// # Panics
    ///
    /// If its servers were not started.
    pub fn addrs(&self, deployment: Deployment) -> Vec<SocketAddr> {
        match deployment.needs() {
            Needs::Nothing | Needs::SqliteFile => Vec::new(),
            Needs::Redis(n) => self.redis[..n].iter().map(RedisServer::addr).collect(),
            Needs::RedisAof => vec![self.redis_aof().addr()],
            Needs::Zk => vec![self.zk().addr()],
            Needs::ZkEnsemble => self
                .zk_ensemble()
                .servers()
                .iter()
                .map(ZkServer::addr)
                .collect(),
            Needs::Postgres => vec![self.pg().addr()],
            Needs::MariaDb => vec![self.my().addr()],
            Needs::Cluster => self
                .cluster()
                .nodes()
                .iter()
                .map(RedisServer::addr)
                .collect(),
            Needs::ClusterReplicas => self
                .cluster_replicas()
                .all_nodes()
                .map(RedisServer::addr)
                .collect(),
            Needs::Sentinel => vec![self.sentinels().master().addr()],
            Needs::Etcd => vec![self.etcd().addr()],
            Needs::EtcdCluster => self
                .etcd_cluster()
                .servers()
                .iter()
                .map(EtcdServer::addr)
                .collect(),
        }
    }

    /// The lockkit URL of `deployment`, straight to its servers.
    pub fn url(&self, deployment: Deployment) -> String {
        let hosts: Vec<String> = self
            .addrs(deployment)
            .iter()
            .map(ToString::to_string)
            .collect();
        self.url_with(deployment, &hosts, &[])
    }

    /// The lockkit URL of `deployment` through other addresses (proxies in
    /// front of [`addrs`](Self::addrs), in the same order; ignored where the
    /// deployment is not [`proxiable`](Deployment::proxiable)), with extra
    /// query parameters (e.g. `command_timeout`).
    pub fn url_with(
        &self,
        deployment: Deployment,
        hosts: &[String],
        params: &[(&str, String)],
    ) -> String {
        let hosts = hosts.join(",");
        let mut query: Vec<String> = Vec::new();
        if let Some(mode) = deployment.sql_mode()
            && deployment != Deployment::SqliteLease
        {
            query.push(format!("mode={mode}"));
        }
        if matches!(
            deployment,
            Deployment::RedisSentinelWait | Deployment::RedisClusterReplicasWait
        ) {
            query.push("wait_replicas=1".to_owned());
        }
        query.extend(params.iter().map(|(key, value)| format!("{key}={value}")));
        let base = match deployment.needs() {
            Needs::Nothing => "memory://".to_owned(),
            Needs::Redis(1) | Needs::RedisAof => format!("redis://{hosts}"),
            Needs::Redis(_) => format!("redlock://{hosts}"),
            Needs::Zk | Needs::ZkEnsemble => format!("zk://{hosts}/lockkit"),
            Needs::Postgres => format!("postgres://postgres@{hosts}/postgres"),
            Needs::MariaDb => format!("mysql://root@{hosts}/lockkit"),
            Needs::SqliteFile => format!("sqlite://{}", self.sqlite_path().display()),
            Needs::Cluster => self.cluster().url(),
            Needs::ClusterReplicas => self.cluster_replicas().url(),
            Needs::Sentinel => self.sentinels().url(),
            Needs::Etcd | Needs::EtcdCluster => format!("etcd://{hosts}/lockkit"),
        };
        if query.is_empty() {
            base
        } else {
            let separator = if base.contains('?') { '&' } else { '?' };
            format!("{base}{separator}{}", query.join("&"))
        }
    }

    /// Server `index` of `deployment` (see [`addrs`](Self::addrs)), for
    /// fault injection.
    ///
    /// # Panics
    ///
    /// If its servers were not started, or there is no such index.
    pub fn server(&self, deployment: Deployment, index: usize) -> &dyn FaultControl {
        match deployment.needs() {
            Needs::Zk => self.zk(),
            Needs::ZkEnsemble => &self.zk_ensemble().servers()[index],
            Needs::Postgres => self.pg(),
            Needs::MariaDb => self.my(),
            Needs::Redis(_) => &self.redis[index],
            Needs::RedisAof => self.redis_aof(),
            Needs::Cluster => &self.cluster().nodes()[index],
            Needs::ClusterReplicas => self
                .cluster_replicas()
                .all_nodes()
                .nth(index)
                .expect("no such node of the cluster"),
            Needs::Sentinel => self.sentinels().master(),
            Needs::Etcd => self.etcd(),
            Needs::EtcdCluster => &self.etcd_cluster().servers()[index],
            Needs::Nothing | Needs::SqliteFile => {
                panic!("{deployment} runs on no server process")
            }
        }
    }

    /// The Redis servers of the Redis and Redlock deployments (the first
    /// is single Redis's).
    pub fn redis(&self) -> &[RedisServer] {
        &self.redis
    }

    /// The Redis server with AOF persistence.
    pub fn redis_aof(&self) -> &RedisServer {
        self.redis_aof
            .as_ref()
            .expect("the AOF Redis server was not started")
    }

    /// The ZooKeeper server.
    pub fn zk(&self) -> &ZkServer {
        self.zk.as_ref().expect("ZooKeeper was not started")
    }

    /// The ZooKeeper ensemble.
    pub fn zk_ensemble(&self) -> &ZkEnsemble {
        self.zk_ensemble
            .as_ref()
            .expect("the ZooKeeper ensemble was not started")
    }

    /// The PostgreSQL server.
    pub fn pg(&self) -> &PostgresServer {
        self.pg.as_ref().expect("PostgreSQL was not started")
    }

    /// The MariaDB server.
    pub fn my(&self) -> &MariaDbServer {
        self.my.as_ref().expect("MariaDB was not started")
    }

    /// The Redis Cluster with a replica per master.
    pub fn cluster_replicas(&self) -> &RedisCluster {
        self.cluster_replicas
            .as_ref()
            .expect("the Redis Cluster with replicas was not started")
    }

    /// The Redis Cluster without replicas.
    pub fn cluster(&self) -> &RedisCluster {
        self.cluster
            .as_ref()
            .expect("the Redis Cluster was not started")
    }

    /// The Sentinel deployment.
    pub fn sentinels(&self) -> &RedisSentinels {
        self.sentinels
            .as_deref()
            .expect("the Sentinel deployment was not started")
    }

    /// The etcd server.
    pub fn etcd(&self) -> &EtcdServer {
        self.etcd.as_ref().expect("etcd was not started")
    }

    /// The etcd cluster.
    pub fn etcd_cluster(&self) -> &EtcdCluster {
        self.etcd_cluster
            .as_ref()
            .expect("the etcd cluster was not started")
    }

    /// The SQLite database file.
    pub fn sqlite_path(&self) -> PathBuf {
        self.sqlite_dir.path().join("locks.db")
    }
}

/// Runs `start` when `needed`.
async fn optional<T, F, Fut>(needed: bool, start: F) -> Result<Option<T>, ServerError>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, ServerError>>,
{
    if needed {
        start().await.map(Some)
    } else {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_unique_and_parse_back() {
        for &d in Deployment::ALL {
            assert_eq!(Deployment::from_label(d.label()), Some(d));
        }
        let mut labels: Vec<&str> = Deployment::ALL.iter().map(|d| d.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Deployment::ALL.len());
        assert!(Deployment::parse_list("redis, pg-row").is_ok());
        assert!(
            Deployment::parse_list("redis,pg_row")
                .unwrap_err()
                .contains("pg_row")
        );
    }
}
