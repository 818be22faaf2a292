//! Where the load generator keeps its stock: in the lock's own backend (a
//! Redis key, an SQL row, a ZooKeeper node's data, an etcd key, a map in
//! process), so
//! that the read-modify-write under the lock is a real round trip to a real
//! server, and a write carries the holder's fencing token where it has one.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use lockkit_core::FencingToken;
use redis::aio::ConnectionManager;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{MySqlPool, PgPool, SqlitePool};
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError};

/// A stock of `keys` counters, each with the highest fencing token a write
/// to it has carried.
///
/// A fenced write succeeds only if its token is higher than the stored one
/// (`UPDATE … WHERE fence < $token`); a write without a token always
/// succeeds.
#[derive(Debug)]
pub enum Stock {
    /// In-process counters (for `memory://`).
    Memory(Mutex<HashMap<usize, (i64, u64)>>),
    /// `lockkit-load:stock:<k>` and `lockkit-load:fence:<k>` on a Redis
    /// server; the fenced write is a Lua script.
    Redis(ConnectionManager),
    /// Rows of `lockkit_load_stock` in PostgreSQL.
    Pg(PgPool),
    /// Rows of `lockkit_load_stock` in MySQL/MariaDB.
    My(MySqlPool),
    /// Rows of `lockkit_load_stock` in SQLite.
    Sqlite(SqlitePool),
    /// Nodes `/lockkit-load/stock-<k>` whose data is `<stock> <fence>`.
    Zk(Client),
    /// etcd keys `/lockkit-load/stock-<k>` whose value is `<stock> <fence>`;
    /// the fenced write is a transaction on the key's mod revision.
    Etcd(EtcdStock),
}

/// The etcd stock's client (`etcd_client::Client` has no `Debug`, and is
/// some 3.7 KB by value: boxed).
#[derive(Clone)]
pub struct EtcdStock(Box<etcd_client::Client>);

impl std::fmt::Debug for EtcdStock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EtcdStock")
    }
}

const FENCED_SET: &str = "if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then \
    redis.call('SET', KEYS[1], ARGV[1]) redis.call('SET', KEYS[2], ARGV[2]) return 1 end return 0";
/// Where the ZooKeeper and etcd stocks keep their keys.
const STOCK_DIR: &str = "/lockkit-load";

fn redis_keys(k: usize) -> (String, String) {
    (
        format!("lockkit-load:stock:{k}"),
        format!("lockkit-load:fence:{k}"),
    )
}

/// Key `k`'s node (ZooKeeper) or key (etcd).
fn stock_path(k: usize) -> String {
    format!("{STOCK_DIR}/stock-{k}")
}

fn sql_error(what: &str) -> impl Fn(sqlx::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl Stock {
    /// The stock that lives where the locks of `url` live: the same Redis
    /// server (Redlock: its first master), database or ZooKeeper ensemble.
    pub async fn for_lock_url(url: &str) -> Result<Stock, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| format!("not a URL: {url}"))?;
        let without_query = |u: &str| u.split('?').next().unwrap_or(u).to_owned();
        match scheme {
            "memory" => Ok(Stock::Memory(Mutex::default())),
            "redis" | "rediss" => {
                let client = redis::Client::open(without_query(url)).map_err(|e| e.to_string())?;
                let conn = ConnectionManager::new(client)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Stock::Redis(conn))
            }
            "redlock" => {
                let hosts = without_query(rest);
                let first = hosts.split(',').next().unwrap_or("");
                let client =
                    redis::Client::open(format!("redis://{first}")).map_err(|e| e.to_string())?;
                let conn = ConnectionManager::new(client)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Stock::Redis(conn))
            }
            "postgres" | "postgresql" => {
                let pool = PgPoolOptions::new()
                    .max_connections(8)
                    .connect(&without_query(url))
                    .await
                    .map_err(sql_error("connect"))?;
                Ok(Stock::Pg(pool))
            }
            "mysql" | "mariadb" => {
                let url = without_query(url).replacen("mariadb://", "mysql://", 1);
                let pool = MySqlPoolOptions::new()
                    .max_connections(8)
                    .connect(&url)
                    .await
                    .map_err(sql_error("connect"))?;
                Ok(Stock::My(pool))
            }
            "sqlite" => {
                let options = SqliteConnectOptions::from_str(&without_query(url))
                    .map_err(sql_error("the SQLite URL"))?
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .busy_timeout(Duration::from_secs(10));
                let pool = SqlitePoolOptions::new()
                    .max_connections(4)
                    .connect_with(options)
                    .await
                    .map_err(sql_error("open"))?;
                Ok(Stock::Sqlite(pool))
            }
            "zk" => {
                let hosts = without_query(rest);
                let hosts = hosts.split('/').next().unwrap_or("");
                let client = Client::connector()
                    .with_session_timeout(Duration::from_secs(10))
                    .connect(hosts)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Stock::Zk(client))
            }
            "etcd" => {
                let hosts = without_query(rest);
                let hosts = hosts.split('/').next().unwrap_or("");
                let endpoints: Vec<String> =
                    hosts.split(',').map(|h| format!("http://{h}")).collect();
                let client = etcd_client::Client::connect(endpoints, None)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Stock::Etcd(EtcdStock(Box::new(client))))
            }
            other => Err(format!("no stock store for scheme {other:?}")),
        }
    }

    /// Sets keys `0..keys` to `stock` each, with no token seen yet.
    pub async fn reset(&self, keys: usize, stock: i64) -> Result<(), String> {
        match self {
            Stock::Memory(map) => {
                let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
                map.clear();
                map.extend((0..keys).map(|k| (k, (stock, 0))));
            }
            Stock::Redis(conn) => {
                let mut conn = conn.clone();
                for chunk in (0..keys).collect::<Vec<_>>().chunks(1000) {
                    let mut pipe = redis::pipe();
                    for &k in chunk {
                        let (stock_key, fence_key) = redis_keys(k);
                        pipe.cmd("SET").arg(stock_key).arg(stock).ignore();
                        pipe.cmd("SET").arg(fence_key).arg(0).ignore();
                    }
                    pipe.query_async::<()>(&mut conn)
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
            Stock::Pg(pool) => {
                sqlx::raw_sql(
                    "CREATE TABLE IF NOT EXISTS lockkit_load_stock (k int PRIMARY KEY, qty bigint NOT NULL, fence bigint NOT NULL); \
                     TRUNCATE lockkit_load_stock",
                )
                .execute(pool)
                .await
                .map_err(sql_error("create the stock table"))?;
                sqlx::query("INSERT INTO lockkit_load_stock SELECT k, $1, 0 FROM generate_series(0, $2 - 1) AS k")
                    .bind(stock)
                    .bind(keys as i32)
                    .execute(pool)
                    .await
                    .map_err(sql_error("fill the stock table"))?;
            }
            Stock::My(pool) => {
                for statement in [
                    "CREATE TABLE IF NOT EXISTS lockkit_load_stock (k INT PRIMARY KEY, qty BIGINT NOT NULL, fence BIGINT NOT NULL) ENGINE=InnoDB",
                    "TRUNCATE lockkit_load_stock",
                ] {
                    sqlx::query(statement)
                        .execute(pool)
                        .await
                        .map_err(sql_error(statement))?;
                }
                for chunk in (0..keys).collect::<Vec<_>>().chunks(1000) {
                    let values = vec!["(?, ?, 0)"; chunk.len()].join(",");
                    let sql =
                        format!("INSERT INTO lockkit_load_stock (k, qty, fence) VALUES {values}");
                    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
                    for &k in chunk {
                        query = query.bind(k as i32).bind(stock);
                    }
                    query
                        .execute(pool)
                        .await
                        .map_err(sql_error("fill the stock table"))?;
                }
            }
            Stock::Sqlite(pool) => {
                sqlx::raw_sql(
                    "CREATE TABLE IF NOT EXISTS lockkit_load_stock (k INTEGER PRIMARY KEY, qty INTEGER NOT NULL, fence INTEGER NOT NULL); \
                     DELETE FROM lockkit_load_stock",
                )
                .execute(pool)
                .await
                .map_err(sql_error("create the stock table"))?;
                sqlx::query(
                    "WITH RECURSIVE n(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM n WHERE k + 1 < ?1) \
                     INSERT INTO lockkit_load_stock SELECT k, ?2, 0 FROM n",
                )
                .bind(keys as i64)
                .bind(stock)
                .execute(pool)
                .await
                .map_err(sql_error("fill the stock table"))?;
            }
            Stock::Zk(client) => {
                let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
                match client.mkdir(STOCK_DIR, &persistent).await {
                    Ok(()) | Err(ZkError::NodeExists) => {}
                    Err(e) => return Err(format!("mkdir {STOCK_DIR}: {e}")),
                }
                let data = format!("{stock} 0");
                for k in 0..keys {
                    match client
                        .create(&stock_path(k), data.as_bytes(), &persistent)
                        .await
                    {
                        Ok(_) => {}
                        Err(ZkError::NodeExists) => {
                            client
                                .set_data(&stock_path(k), data.as_bytes(), None)
                                .await
                                .map_err(|e| e.to_string())?;
                        }
                        Err(e) => return Err(format!("create {}: {e}", stock_path(k))),
                    }
                }
            }
            Stock::Etcd(client) => {
                let data = format!("{stock} 0");
                for k in 0..keys {
                    client
                        .0
                        .clone()
                        .put(stock_path(k), data.clone(), None)
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// The stock of key `k`.
    pub async fn read(&self, k: usize) -> Result<i64, String> {
        Ok(match self {
            Stock::Memory(map) => map.lock().unwrap_or_else(|p| p.into_inner())[&k].0,
            Stock::Redis(conn) => redis::cmd("GET")
                .arg(redis_keys(k).0)
                .query_async(&mut conn.clone())
                .await
                .map_err(|e| e.to_string())?,
            Stock::Pg(pool) => {
                sqlx::query_scalar("SELECT qty FROM lockkit_load_stock WHERE k = $1")
                    .bind(k as i32)
                    .fetch_one(pool)
                    .await
                    .map_err(sql_error("read"))?
            }
            Stock::My(pool) => sqlx::query_scalar("SELECT qty FROM lockkit_load_stock WHERE k = ?")
                .bind(k as i32)
                .fetch_one(pool)
                .await
                .map_err(sql_error("read"))?,
            Stock::Sqlite(pool) => {
                sqlx::query_scalar("SELECT qty FROM lockkit_load_stock WHERE k = ?1")
                    .bind(k as i64)
                    .fetch_one(pool)
                    .await
                    .map_err(sql_error("read"))?
            }
            Stock::Zk(client) => zk_read(client, k).await?.0,
            Stock::Etcd(client) => etcd_read(client, k).await?.0,
        })
    }

    /// Writes `qty` to key `k`: with a token, only if it is newer than every
    /// token the key has seen. Whether the write was applied.
    pub async fn write(
        &self,
        k: usize,
        qty: i64,
        token: Option<FencingToken>,
    ) -> Result<bool, String> {
        let fence = token.map(|t| i64::try_from(t.get()).unwrap_or(i64::MAX));
        Ok(match self {
            Stock::Memory(map) => {
                let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
                let entry = map.get_mut(&k).ok_or("no such key")?;
                match token {
                    Some(t) if t.get() <= entry.1 => false,
                    _ => {
                        *entry = (qty, token.map_or(entry.1, |t| t.get()));
                        true
                    }
                }
            }
            Stock::Redis(conn) => {
                let (stock_key, fence_key) = redis_keys(k);
                let mut conn = conn.clone();
                match fence {
                    Some(fence) => {
                        let done: i64 = redis::Script::new(FENCED_SET)
                            .key(stock_key)
                            .key(fence_key)
                            .arg(qty)
                            .arg(fence)
                            .invoke_async(&mut conn)
                            .await
                            .map_err(|e| e.to_string())?;
                        done == 1
                    }
                    None => {
                        redis::cmd("SET")
                            .arg(stock_key)
                            .arg(qty)
                            .query_async::<()>(&mut conn)
                            .await
                            .map_err(|e| e.to_string())?;
                        true
                    }
                }
            }
            Stock::Pg(pool) => {
                sqlx::query(
                    "UPDATE lockkit_load_stock SET qty = $2, fence = COALESCE($3, fence) \
                     WHERE k = $1 AND ($3 IS NULL OR fence < $3)",
                )
                .bind(k as i32)
                .bind(qty)
                .bind(fence)
                .execute(pool)
                .await
                .map_err(sql_error("write"))?
                .rows_affected()
                    == 1
            }
            Stock::My(pool) => {
                sqlx::query(
                    "UPDATE lockkit_load_stock SET qty = ?, fence = COALESCE(?, fence) \
                     WHERE k = ? AND (? IS NULL OR fence < ?)",
                )
                .bind(qty)
                .bind(fence)
                .bind(k as i32)
                .bind(fence)
                .bind(fence)
                .execute(pool)
                .await
                .map_err(sql_error("write"))?
                .rows_affected()
                    == 1
            }
            Stock::Sqlite(pool) => {
                sqlx::query(
                    "UPDATE lockkit_load_stock SET qty = ?2, fence = COALESCE(?3, fence) \
                     WHERE k = ?1 AND (?3 IS NULL OR fence < ?3)",
                )
                .bind(k as i64)
                .bind(qty)
                .bind(fence)
                .execute(pool)
                .await
                .map_err(sql_error("write"))?
                .rows_affected()
                    == 1
            }
            Stock::Zk(client) => {
                // A compare-and-set on the node's version, so that nothing
                // written since the read is overwritten either.
                let (_, stored_fence, version) = zk_read(client, k).await?;
                if fence.is_some_and(|f| f <= stored_fence) {
                    return Ok(false);
                }
                let data = format!("{qty} {}", fence.unwrap_or(stored_fence));
                match client
                    .set_data(&stock_path(k), data.as_bytes(), Some(version))
                    .await
                {
                    Ok(_) => true,
                    Err(ZkError::BadVersion) => false,
                    Err(e) => return Err(e.to_string()),
                }
            }
            Stock::Etcd(client) => {
                // A compare-and-set on the key's mod revision, as above.
                let (_, stored_fence, revision) = etcd_read(client, k).await?;
                if fence.is_some_and(|f| f <= stored_fence) {
                    return Ok(false);
                }
                let key = stock_path(k);
                let data = format!("{qty} {}", fence.unwrap_or(stored_fence));
                let txn = Txn::new()
                    .when([Compare::mod_revision(
                        key.clone(),
                        CompareOp::Equal,
                        revision,
                    )])
                    .and_then([TxnOp::put(key, data, None)]);
                client
                    .0
                    .clone()
                    .txn(txn)
                    .await
                    .map_err(|e| e.to_string())?
                    .succeeded()
            }
        })
    }

    /// The stock of keys `0..keys` in all.
    pub async fn total(&self, keys: usize) -> Result<i64, String> {
        Ok(match self {
            Stock::Memory(map) => map
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .map(|(qty, _)| qty)
                .sum(),
            Stock::Redis(_) | Stock::Zk(_) | Stock::Etcd(_) => {
                let mut sum = 0;
                for k in 0..keys {
                    sum += self.read(k).await?;
                }
                sum
            }
            Stock::Pg(pool) => sqlx::query_scalar(
                "SELECT CAST(COALESCE(SUM(qty), 0) AS bigint) FROM lockkit_load_stock",
            )
            .fetch_one(pool)
            .await
            .map_err(sql_error("sum"))?,
            Stock::My(pool) => sqlx::query_scalar(
                "SELECT CAST(COALESCE(SUM(qty), 0) AS SIGNED) FROM lockkit_load_stock",
            )
            .fetch_one(pool)
            .await
            .map_err(sql_error("sum"))?,
            Stock::Sqlite(pool) => {
                sqlx::query_scalar("SELECT COALESCE(SUM(qty), 0) FROM lockkit_load_stock")
                    .fetch_one(pool)
                    .await
                    .map_err(sql_error("sum"))?
            }
        })
    }
}

/// `<stock> <fence>` as numbers.
fn parse_stock(text: &str) -> Result<(i64, i64), String> {
    let mut parts = text.split(' ').map(|p| p.parse::<i64>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(qty), Some(fence)) => Ok((qty, fence)),
        _ => Err(format!("bad stock data {text:?}")),
    }
}

/// Key `k`'s stock, fence and mod revision.
async fn etcd_read(EtcdStock(client): &EtcdStock, k: usize) -> Result<(i64, i64, i64), String> {
    let answer = client
        .clone()
        .get(stock_path(k), None)
        .await
        .map_err(|e| e.to_string())?;
    let kv = answer
        .kvs()
        .first()
        .ok_or_else(|| format!("no stock key {}", stock_path(k)))?;
    let (qty, fence) = parse_stock(&String::from_utf8_lossy(kv.value()))?;
    Ok((qty, fence, kv.mod_revision()))
}

async fn zk_read(client: &Client, k: usize) -> Result<(i64, i64, i32), String> {
    let (data, stat) = client
        .get_data(&stock_path(k))
        .await
        .map_err(|e| e.to_string())?;
    let (qty, fence) = parse_stock(&String::from_utf8_lossy(&data))?;
    Ok((qty, fence, stat.version))
}
