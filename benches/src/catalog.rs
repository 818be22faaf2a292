//! The deployments that the cross-backend benchmarks compare (from the
//! testkit's catalog, connected through `lockkit::connect`), and each one's
//! raw floor: the same lock operations written by hand against its server,
//! white-box, with no lock engine.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockkit::DistributedLock;
use lockkit_testkit::RedisServer;
use lockkit_testkit::TestServer;
pub use lockkit_testkit::catalog::{Deployment, Servers};
use redis::aio::ConnectionManager;

use crate::etcd_raw::RawEtcd;
use crate::raw::RawLock;
use crate::sql::{RawMy, RawPg, RawSqlite};
use crate::zk_raw::{zk_mkdir, zk_raw_cycle, zk_session};

/// The deployments the cross-backend benchmarks compare, in the order of
/// the tables: every deployment of the catalog but the fault suite's
/// replicated and persistent variants.
pub fn benched() -> Vec<Deployment> {
    use Deployment::*;
    Deployment::ALL
        .iter()
        .copied()
        .filter(|d| {
            !matches!(
                d,
                RedisAof
                    | ZkEnsemble
                    | RedisCluster
                    | RedisSentinel
                    | RedisSentinelWait
                    | EtcdCluster
                    | RedisClusterReplicas
                    | RedisClusterReplicasWait
            )
        })
        .collect()
}

/// The deployments named in `$LOCKKIT_BENCH_BACKENDS` (comma-separated
/// labels), else [`benched`]. Panics on an unknown label, naming the known
/// ones.
pub fn selected() -> Vec<Deployment> {
    match std::env::var("LOCKKIT_BENCH_BACKENDS") {
        Ok(list) if !list.trim().is_empty() => {
            Deployment::parse_list(&list).unwrap_or_else(|e| panic!("LOCKKIT_BENCH_BACKENDS: {e}"))
        }
        _ => benched(),
    }
}

/// A new client of `deployment` through `lockkit::connect`, exactly as an
/// application gets one (its own connections; `memory://` clients share the
/// process's store).
pub async fn connect(
    servers: &Servers,
    deployment: Deployment,
) -> lockkit::Result<Arc<dyn DistributedLock>> {
    lockkit::connect(&servers.url(deployment)).await
}

/// A client of `deployment` that outlasts criterion's pauses: the
/// ZooKeeper client runs on the calling runtime, which criterion leaves
/// unpolled on the current-thread flavour while it analyses a benchmark, so
/// its request, connect and session timeouts are 30 s (the defaults, 2 s
/// and 10 s, ran out; the client library times requests by the connect
/// timeout). Every other backend as [`connect`] makes it.
pub async fn connect_patient(
    servers: &Servers,
    deployment: Deployment,
) -> lockkit::Result<Arc<dyn DistributedLock>> {
    match deployment {
        Deployment::Zk | Deployment::ZkEnsemble => {
            let hosts: Vec<String> = servers
                .addrs(deployment)
                .iter()
                .map(ToString::to_string)
                .collect();
            let long = [
                ("command_timeout", "30s".to_owned()),
                ("connect_timeout", "30s".to_owned()),
                ("session_timeout", "30s".to_owned()),
            ];
            lockkit::connect(&servers.url_with(deployment, &hosts, &long)).await
        }
        _ => connect(servers, deployment).await,
    }
}

/// A backend's raw floor: its lock cycle written by hand on dedicated
/// connections, with no lock engine, guard or pool.
pub enum RawFloor {
    /// A map behind a mutex: insert if absent, then compare-and-remove.
    Memory(Mutex<HashMap<String, String>>, RawLock),
    /// `SET NX PX` + `EVALSHA` compare-and-delete on each connection, the
    /// connections in parallel (one for Redis, N for Redlock).
    Redis(Vec<ConnectionManager>, RawLock),
    /// `create` EPHEMERAL_SEQUENTIAL + `getChildren` + `delete`.
    Zk(zookeeper_client::Client),
    /// lockkit-sql's Postgres statements by hand.
    Pg(RawPg, Deployment),
    /// lockkit-sql's MariaDB statements by hand.
    My(RawMy, Deployment),
    /// lockkit-sql's SQLite statements by hand.
    Sqlite(RawSqlite),
    /// etcd's lock recipe by hand: grant, create transaction, delete
    /// transaction, revoke.
    Etcd(RawEtcd),
}

impl fmt::Debug for RawFloor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RawFloor::Memory(..) => "RawFloor::Memory",
            RawFloor::Redis(..) => "RawFloor::Redis",
            RawFloor::Zk(_) => "RawFloor::Zk",
            RawFloor::Pg(..) => "RawFloor::Pg",
            RawFloor::My(..) => "RawFloor::My",
            RawFloor::Sqlite(_) => "RawFloor::Sqlite",
            RawFloor::Etcd(_) => "RawFloor::Etcd",
        })
    }
}

/// The ZooKeeper directory of the raw floor's nodes.
const ZK_RAW_DIR: &str = "/lockkit-bench-raw/floor";
/// Where the etcd floor's lock directories live.
const ETCD_RAW_DIR: &str = "/lockkit-bench-raw/";
/// The lock name of the SQL row floors (a row of lockkit's table).
const SQL_RAW_ROW: &str = "bench-compare-raw-row";

impl RawFloor {
    /// The raw floor of `backend` (one of [`benched`]) on `servers`. The SQL
    /// floors use lockkit's table, which a lockkit client must have created
    /// first.
    pub async fn connect(servers: &Servers, backend: Deployment) -> RawFloor {
        let raw = RawLock::default();
        match backend {
            Deployment::Memory => RawFloor::Memory(Mutex::default(), raw),
            Deployment::Redis | Deployment::Redlock3 | Deployment::Redlock5 => {
                let n = backend.redis_masters();
                let urls: Vec<String> = servers.redis()[..n].iter().map(RedisServer::url).collect();
                let conns =
                    futures_util::future::join_all(urls.iter().map(|url| raw.connect(url))).await;
                RawFloor::Redis(conns, raw)
            }
            Deployment::Zk => {
                let client = zk_session(&servers.zk().connect_string()).await;
                zk_mkdir(&client, ZK_RAW_DIR).await;
                RawFloor::Zk(client)
            }
            Deployment::PgLease | Deployment::PgRow | Deployment::PgAdvisory => {
                RawFloor::Pg(RawPg::connect(&servers.pg().url()).await, backend)
            }
            Deployment::MariaDbLease | Deployment::MariaDbRow | Deployment::MariaDbNamed => {
                RawFloor::My(RawMy::connect(&servers.my().url()).await, backend)
            }
            Deployment::SqliteLease => {
                RawFloor::Sqlite(RawSqlite::connect(&servers.sqlite_path()).await)
            }
            Deployment::Etcd => RawFloor::Etcd(RawEtcd::connect(&servers.etcd().endpoint()).await),
            other => panic!("{other} is not benchmarked against a raw floor"),
        }
    }

    /// One raw lock cycle on a lock of its own (`name`, free).
    pub async fn cycle(&self, name: &str) {
        const TTL: Duration = Duration::from_secs(30);
        match self {
            RawFloor::Memory(map, raw) => {
                let token = raw.token();
                {
                    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
                    assert!(!map.contains_key(name), "raw memory: {name:?} was held");
                    map.insert(name.to_owned(), token.clone());
                }
                let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
                assert_eq!(map.get(name), Some(&token), "raw memory: not ours");
                map.remove(name);
            }
            RawFloor::Redis(conns, raw) => raw.parallel_cycle(conns, name, TTL).await,
            RawFloor::Zk(client) => zk_raw_cycle(client, ZK_RAW_DIR).await,
            RawFloor::Pg(pg, Deployment::PgLease) => pg.lease_cycle(name).await,
            RawFloor::Pg(pg, Deployment::PgRow) => pg.row_cycle(SQL_RAW_ROW).await,
            RawFloor::Pg(pg, _) => pg.advisory_cycle(lockkit_sql::advisory_key(name)).await,
            RawFloor::My(my, Deployment::MariaDbLease) => my.lease_cycle(name).await,
            RawFloor::My(my, Deployment::MariaDbRow) => my.row_cycle(SQL_RAW_ROW).await,
            RawFloor::My(my, _) => my.named_cycle(name).await,
            RawFloor::Sqlite(sqlite) => sqlite.lease_cycle(name).await,
            RawFloor::Etcd(etcd) => etcd.cycle(&format!("{ETCD_RAW_DIR}{name}/")).await,
        }
    }
}
