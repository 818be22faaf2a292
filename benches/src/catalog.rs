//! Every backend configuration that the cross-backend benchmarks compare,
//! the servers behind them (started by the testkit on loopback ports), and
//! each one's raw floor: the same lock operations written by hand against
//! its server.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockkit_core::{DistributedLock, MemoryLock};
use lockkit_testkit::{MariaDbServer, PostgresServer, RedisServer, ZkServer};
use redis::aio::ConnectionManager;

use crate::raw::RawLock;
use crate::sql::{RawMy, RawPg, RawSqlite};
use crate::zk_raw::{zk_mkdir, zk_raw_cycle, zk_session};

/// A backend configuration of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// `memory://`.
    Memory,
    /// One Redis server.
    Redis,
    /// Redlock over 3 Redis masters.
    Redlock3,
    /// Redlock over 5 Redis masters.
    Redlock5,
    /// ZooKeeper (one server).
    Zk,
    /// PostgreSQL lease rows.
    PgLease,
    /// PostgreSQL `FOR UPDATE` row locks.
    PgRow,
    /// PostgreSQL advisory locks.
    PgAdvisory,
    /// MariaDB lease rows.
    MyLease,
    /// MariaDB `FOR UPDATE` row locks.
    MyRow,
    /// MariaDB `GET_LOCK` named locks.
    MyNamed,
    /// SQLite lease rows (a file).
    SqliteLease,
}

impl Backend {
    /// Every configuration, in the order of the tables.
    pub const ALL: &'static [Backend] = &[
        Backend::Memory,
        Backend::Redis,
        Backend::Redlock3,
        Backend::Redlock5,
        Backend::Zk,
        Backend::PgLease,
        Backend::PgRow,
        Backend::PgAdvisory,
        Backend::MyLease,
        Backend::MyRow,
        Backend::MyNamed,
        Backend::SqliteLease,
    ];

    /// The label in benchmark ids and tables, e.g. `redlock5`, `pg_row`.
    pub fn label(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Redis => "redis",
            Backend::Redlock3 => "redlock3",
            Backend::Redlock5 => "redlock5",
            Backend::Zk => "zk",
            Backend::PgLease => "pg_lease",
            Backend::PgRow => "pg_row",
            Backend::PgAdvisory => "pg_advisory",
            Backend::MyLease => "mysql_lease",
            Backend::MyRow => "mysql_row",
            Backend::MyNamed => "mysql_named",
            Backend::SqliteLease => "sqlite_lease",
        }
    }

    /// The configuration labelled `label`.
    pub fn parse(label: &str) -> Option<Backend> {
        Backend::ALL.iter().copied().find(|b| b.label() == label)
    }

    /// The configurations named in `$LOCKKIT_BENCH_BACKENDS` (comma
    /// separated labels), else all of them. Panics on an unknown label,
    /// naming the known ones.
    pub fn selected() -> Vec<Backend> {
        match std::env::var("LOCKKIT_BENCH_BACKENDS") {
            Ok(list) if !list.trim().is_empty() => list
                .split(',')
                .map(|label| {
                    Backend::parse(label.trim()).unwrap_or_else(|| {
                        panic!(
                            "LOCKKIT_BENCH_BACKENDS: unknown backend {label:?}; known: {}",
                            Backend::ALL
                                .iter()
                                .map(|b| b.label())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    })
                })
                .collect(),
            _ => Backend::ALL.to_vec(),
        }
    }

    /// How many Redis servers it needs.
    fn redis_servers(self) -> usize {
        match self {
            Backend::Redis => 1,
            Backend::Redlock3 => 3,
            Backend::Redlock5 => 5,
            _ => 0,
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The servers of a set of backend configurations, started on loopback
/// ports (and killed when dropped), and an SQLite file in a temporary
/// directory.
#[derive(Debug)]
pub struct Servers {
    redis: Vec<RedisServer>,
    zk: Option<ZkServer>,
    pg: Option<PostgresServer>,
    my: Option<MariaDbServer>,
    sqlite_dir: tempfile::TempDir,
}

impl Servers {
    /// Starts what `backends` need: up to five Redis servers (Redlock×3 uses
    /// the first three), ZooKeeper, PostgreSQL, MariaDB.
    pub async fn start(backends: &[Backend]) -> Servers {
        let needs = |which: &[Backend]| backends.iter().any(|b| which.contains(b));
        let redis_count = backends
            .iter()
            .map(|b| b.redis_servers())
            .max()
            .unwrap_or(0);
        let redis = futures_util::future::join_all((0..redis_count).map(|_| RedisServer::start()));
        let zk = async {
            match needs(&[Backend::Zk]) {
                true => Some(ZkServer::start().await),
                false => None,
            }
        };
        let pg = async {
            // Session locks hold a connection each: room for the load
            // generator's hundreds of keys held at once.
            match needs(&[Backend::PgLease, Backend::PgRow, Backend::PgAdvisory]) {
                true => Some(
                    PostgresServer::builder()
                        .setting("max_connections", "600")
                        .start()
                        .await,
                ),
                false => None,
            }
        };
        let my = async {
            match needs(&[Backend::MyLease, Backend::MyRow, Backend::MyNamed]) {
                true => Some(
                    MariaDbServer::builder()
                        .arg("--max-connections=600")
                        .start()
                        .await,
                ),
                false => None,
            }
        };
        let (redis, zk, pg, my) = tokio::join!(redis, zk, pg, my);
        Servers {
            redis,
            zk,
            pg,
            my,
            sqlite_dir: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    /// The lockkit URL of `backend` (panics if its server was not started).
    pub fn url(&self, backend: Backend) -> String {
        let redlock = |n: usize| {
            let hosts: Vec<String> = self.redis[..n]
                .iter()
                .map(|s| s.addr().to_string())
                .collect();
            format!("redlock://{}", hosts.join(","))
        };
        match backend {
            Backend::Memory => "memory://".to_owned(),
            Backend::Redis => self.redis[0].url(),
            Backend::Redlock3 => redlock(3),
            Backend::Redlock5 => redlock(5),
            Backend::Zk => self.zk().url("/lockkit-bench"),
            Backend::PgLease => format!("{}?mode=lease", self.pg().url()),
            Backend::PgRow => format!("{}?mode=row", self.pg().url()),
            Backend::PgAdvisory => format!("{}?mode=advisory", self.pg().url()),
            Backend::MyLease => format!("{}?mode=lease", self.my().url()),
            Backend::MyRow => format!("{}?mode=row", self.my().url()),
            Backend::MyNamed => format!("{}?mode=named", self.my().url()),
            Backend::SqliteLease => format!("sqlite://{}", self.sqlite_path().display()),
        }
    }

    /// The Redis servers (the first is the single-Redis backend's).
    pub fn redis(&self) -> &[RedisServer] {
        &self.redis
    }

    /// The ZooKeeper server.
    pub fn zk(&self) -> &ZkServer {
        self.zk.as_ref().expect("ZooKeeper was not started")
    }

    /// The PostgreSQL server.
    pub fn pg(&self) -> &PostgresServer {
        self.pg.as_ref().expect("PostgreSQL was not started")
    }

    /// The MariaDB server.
    pub fn my(&self) -> &MariaDbServer {
        self.my.as_ref().expect("MariaDB was not started")
    }

    /// The SQLite database file.
    pub fn sqlite_path(&self) -> std::path::PathBuf {
        self.sqlite_dir.path().join("locks.db")
    }
}

impl Servers {
    /// A new client of `backend` (its own connections; `memory://` clients
    /// share the process's store).
    pub async fn connect(
        &self,
        backend: Backend,
    ) -> lockkit_core::Result<Arc<dyn DistributedLock>> {
        let url = self.url(backend);
        Ok(match backend {
            Backend::Memory => Arc::new(MemoryLock::from_url(&url)?),
            Backend::Redis => Arc::new(lockkit_redis::connect(&url).await?),
            Backend::Redlock3 | Backend::Redlock5 => {
                Arc::new(lockkit_redlock::connect(&url).await?)
            }
            Backend::Zk => Arc::new(lockkit_zk::connect(&url).await?),
            _ => Arc::new(lockkit_sql::connect(&url).await?),
        })
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
    Pg(RawPg, Backend),
    /// lockkit-sql's MariaDB statements by hand.
    My(RawMy, Backend),
    /// lockkit-sql's SQLite statements by hand.
    Sqlite(RawSqlite),
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
        })
    }
}

/// The ZooKeeper directory of the raw floor's nodes.
const ZK_RAW_DIR: &str = "/lockkit-bench-raw/floor";
/// The lock name of the SQL row floors (a row of lockkit's table).
const SQL_RAW_ROW: &str = "bench-compare-raw-row";

impl RawFloor {
    /// The raw floor of `backend` on `servers`. The SQL floors use
    /// lockkit's table, which a lockkit client must have created first.
    pub async fn connect(servers: &Servers, backend: Backend) -> RawFloor {
        let raw = RawLock::default();
        match backend {
            Backend::Memory => RawFloor::Memory(Mutex::default(), raw),
            Backend::Redis | Backend::Redlock3 | Backend::Redlock5 => {
                let n = backend.redis_servers();
                let urls: Vec<String> = servers.redis()[..n].iter().map(RedisServer::url).collect();
                let conns =
                    futures_util::future::join_all(urls.iter().map(|url| raw.connect(url))).await;
                RawFloor::Redis(conns, raw)
            }
            Backend::Zk => {
                let client = zk_session(&servers.zk().connect_string()).await;
                zk_mkdir(&client, ZK_RAW_DIR).await;
                RawFloor::Zk(client)
            }
            Backend::PgLease | Backend::PgRow | Backend::PgAdvisory => RawFloor::Pg(
                RawPg::connect(&servers.pg().url(), SQL_RAW_ROW).await,
                backend,
            ),
            Backend::MyLease | Backend::MyRow | Backend::MyNamed => RawFloor::My(
                RawMy::connect(&servers.my().url(), SQL_RAW_ROW).await,
                backend,
            ),
            Backend::SqliteLease => {
                RawFloor::Sqlite(RawSqlite::connect(&servers.sqlite_path()).await)
            }
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
            RawFloor::Pg(pg, Backend::PgLease) => pg.lease_cycle(name).await,
            RawFloor::Pg(pg, Backend::PgRow) => pg.row_cycle(SQL_RAW_ROW).await,
            RawFloor::Pg(pg, _) => pg.advisory_cycle(lockkit_sql::advisory_key(name)).await,
            RawFloor::My(my, Backend::MyLease) => my.lease_cycle(name).await,
            RawFloor::My(my, Backend::MyRow) => my.row_cycle(SQL_RAW_ROW).await,
            RawFloor::My(my, _) => my.named_cycle(name).await,
            RawFloor::Sqlite(sqlite) => sqlite.lease_cycle(name).await,
        }
    }
}
