//! The real stores beside the in-process resource: every fenced write a
//! worker makes is also written, fenced, to PostgreSQL (a history row whose
//! `INSERT` calls `lockkit_fence`) and to Redis (an `RPUSH` through the
//! fence script), and what each store admitted is recorded with when the
//! write was sent and when it was answered. The checker then counts stale
//! writes those stores accepted ([`crate::check::StoreOutcome`]).

use std::time::Duration;

use lockkit::FencingToken;
use lockkit::fence::{self, FenceError};
use lockkit_testkit::{PostgresServer, RedisServer, TestServer};

use crate::record::{Micros, Store, StoreWrite};

/// Bound of one write to a store.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The stores, started once for a suite; each run fences its own resource.
pub struct FenceStores {
    pg: sqlx::PgPool,
    redis: redis::aio::MultiplexedConnection,
    /// Taken by [`stop`](Self::stop).
    servers: std::sync::Mutex<Option<(PostgresServer, RedisServer)>>,
}

impl std::fmt::Debug for FenceStores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceStores").finish_non_exhaustive()
    }
}

impl FenceStores {
    /// Starts a PostgreSQL and a Redis server and prepares them.
    pub async fn start() -> Result<FenceStores, String> {
        let (postgres, redis) = tokio::join!(
            PostgresServer::builder().try_start(),
            RedisServer::builder().try_start()
        );
        let (postgres, redis) = (
            postgres.map_err(|e| e.to_string())?,
            redis.map_err(|e| e.to_string())?,
        );
        let store = fence::Store::open(&postgres.url(), WRITE_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        store.install().await.map_err(|e| e.to_string())?;
        let pg = sqlx::PgPool::connect(&postgres.url())
            .await
            .map_err(|e| e.to_string())?;
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS faults_history (id bigserial PRIMARY KEY, \
             resource text NOT NULL, client int NOT NULL, section int NOT NULL, token bigint NOT NULL)",
        )
        .execute(&pg)
        .await
        .map_err(|e| e.to_string())?;
        let redis_conn = redis::Client::open(redis.url())
            .map_err(|e| e.to_string())?
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        Ok(FenceStores {
            pg,
            redis: redis_conn,
            servers: std::sync::Mutex::new(Some((postgres, redis))),
        })
    }

    /// Stops both servers now (a run's tasks may still hold this), before
    /// the suite looks for processes left behind.
    pub fn stop(&self) {
        let servers = self
            .servers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        drop(servers);
    }

    /// Writes to every store, fenced by `token` for `resource`; `now`
    /// stamps each write's start and end.
    pub async fn write(
        &self,
        resource: &str,
        client: u32,
        section: u32,
        token: u64,
        now: impl Fn() -> Micros,
    ) -> Vec<StoreWrite> {
        let token = FencingToken::new(token);
        let mut writes = Vec::with_capacity(Store::ALL.len());
        for store in Store::ALL {
            let sent = now();
            let outcome = tokio::time::timeout(WRITE_TIMEOUT, async {
                match store {
                    Store::Postgres => self.write_pg(resource, client, section, token).await,
                    Store::Redis => self.write_redis(resource, client, section, token).await,
                }
            })
            .await;
            let admitted = match outcome {
                Ok(Ok(())) => Some(true),
                Ok(Err(FenceError::Stale { .. })) => Some(false),
                Ok(Err(error)) => {
                    tracing::warn!("{}: {error}", store.name());
                    None
                }
                Err(_) => {
                    tracing::warn!("{}: no answer within {WRITE_TIMEOUT:?}", store.name());
                    None
                }
            };
            writes.push(StoreWrite {
                store,
                sent,
                done: now(),
                admitted,
            });
        }
        writes
    }

    async fn write_pg(
        &self,
        resource: &str,
        client: u32,
        section: u32,
        token: FencingToken,
    ) -> Result<(), FenceError> {
        let failed = |e: sqlx::Error| fence::postgres::refusal(e, resource, token);
        let mut tx = self.pg.begin().await.map_err(failed)?;
        sqlx::query(
            "INSERT INTO faults_history (resource, client, section, token) \
             SELECT $1, $3, $4, $2 FROM lockkit_fence($1, $2) AS fence",
        )
        .bind(resource)
        .bind(fence::bigint(token)?)
        .bind(i32::try_from(client).unwrap_or(i32::MAX))
        .bind(i32::try_from(section).unwrap_or(i32::MAX))
        .execute(&mut *tx)
        .await
        .map_err(failed)?;
        tx.commit().await.map_err(failed)
    }

    async fn write_redis(
        &self,
        resource: &str,
        client: u32,
        section: u32,
        token: FencingToken,
    ) -> Result<(), FenceError> {
        let mut conn = self.redis.clone();
        fence::redis::FencedWrite::new(resource, token)?
            .command(
                redis::cmd("RPUSH")
                    .arg(fence::redis::data_key(resource, "history"))
                    .arg(format!("{token}:{client}:{section}")),
            )
            .run(&mut conn)
            .await
            .map(drop)
    }
}
