//! The fence race: writers on several client processes take one lock in
//! turn and write to real stores, fenced: PostgreSQL through
//! `lockkit_fence` (inside the `INSERT` of a history row) and Redis through
//! the fence script (an `RPUSH` to a history list). The test that drives it
//! (`tests/fence_race.rs`) pauses holders with SIGSTOP past their lease and
//! lets them write when resumed; the stores' histories must never show a
//! smaller token after a greater one.
//!
//! A worker process (`lockkit-faults fence-worker`) runs `writers` tasks.
//! Each takes the lock, prints `holding CLIENT WRITER TOKEN`, waits for the
//! line `write WRITER` on its stdin, writes to both stores, prints `wrote
//! CLIENT WRITER TOKEN pg=ok|stale redis=ok|stale`, releases (a lost lock's
//! release fails, which is fine) and starts over, until stdin closes.

use std::collections::HashMap;
use std::io;
use std::time::Duration;

use lockkit::fence::{self, FenceError};
use lockkit::{DistributedLock, FencingToken, LockOptions};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, mpsc};

/// The lock every writer takes, and the resource it fences.
pub const RESOURCE: &str = "race";

/// The history table on PostgreSQL.
pub const PG_HISTORY: &str = "fence_race_history";

/// The history list on Redis (in the fence's hash slot).
pub fn redis_history() -> String {
    fence::redis::data_key(RESOURCE, "history")
}

/// Creates the fence and the history table on PostgreSQL, and empties the
/// Redis history.
pub async fn prepare(pg_url: &str, redis_url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let store = fence::Store::open(pg_url, Duration::from_secs(10)).await?;
    store.install().await?;
    let pool = sqlx::PgPool::connect(pg_url).await?;
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS fence_race_history; \
         CREATE TABLE fence_race_history (id bigserial PRIMARY KEY, client int NOT NULL, \
         writer int NOT NULL, token bigint NOT NULL)",
    )
    .execute(&pool)
    .await?;
    let client = redis::Client::open(redis_url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    redis::cmd("DEL")
        .arg(redis_history())
        .arg(fence::redis::fence_key(RESOURCE))
        .query_async::<()>(&mut conn)
        .await?;
    Ok(())
}

/// What one worker process does.
#[derive(Clone, Debug)]
pub struct RacePlan {
    /// The lock's URL.
    pub lock_url: String,
    /// The PostgreSQL store.
    pub pg_url: String,
    /// The Redis store.
    pub redis_url: String,
    /// This process's number.
    pub client: u32,
    /// Writer tasks in this process.
    pub writers: u32,
    /// The lease.
    pub ttl: Duration,
}

struct Stores {
    pg: sqlx::PgPool,
    redis: redis::aio::MultiplexedConnection,
}

/// Runs the worker until its stdin closes.
pub async fn run(plan: RacePlan) -> Result<(), Box<dyn std::error::Error>> {
    let locks = lockkit::connect(&plan.lock_url).await?;
    let stores = std::sync::Arc::new(Stores {
        pg: sqlx::PgPool::connect(&plan.pg_url).await?,
        redis: redis::Client::open(plan.redis_url.as_str())?
            .get_multiplexed_async_connection()
            .await?,
    });
    let out = std::sync::Arc::new(Mutex::new(tokio::io::stdout()));
    let mut gates = HashMap::new();
    let mut tasks = Vec::new();
    for writer in 0..plan.writers {
        let (tx, rx) = mpsc::unbounded_channel::<()>();
        gates.insert(writer, tx);
        tasks.push(tokio::spawn(writer_loop(
            plan.clone(),
            writer,
            locks.clone(),
            std::sync::Arc::clone(&stores),
            std::sync::Arc::clone(&out),
            rx,
        )));
    }
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let writer = line
            .strip_prefix("write ")
            .and_then(|w| w.trim().parse::<u32>().ok());
        match writer.and_then(|w| gates.get(&w)) {
            Some(gate) => {
                let _ = gate.send(());
            }
            None => tracing::warn!("fence worker: bad line {line:?}"),
        }
    }
    for task in tasks {
        task.abort();
    }
    Ok(())
}

async fn say(out: &Mutex<tokio::io::Stdout>, line: String) -> io::Result<()> {
    let mut out = out.lock().await;
    out.write_all(format!("{line}\n").as_bytes()).await?;
    out.flush().await
}

async fn writer_loop(
    plan: RacePlan,
    writer: u32,
    locks: std::sync::Arc<dyn DistributedLock>,
    stores: std::sync::Arc<Stores>,
    out: std::sync::Arc<Mutex<tokio::io::Stdout>>,
    mut gate: mpsc::UnboundedReceiver<()>,
) -> io::Result<()> {
    let opts = LockOptions::new()
        .ttl(plan.ttl)
        .wait_for(Duration::from_secs(600));
    loop {
        let guard = match locks.acquire(RESOURCE, &opts).await {
            Ok(guard) => guard,
            Err(error) => {
                tracing::warn!("fence worker {}/{writer}: {error}", plan.client);
                continue;
            }
        };
        let Some(token) = guard.fencing_token() else {
            return Err(io::Error::other("the race needs a fencing backend"));
        };
        say(&out, format!("holding {} {writer} {token}", plan.client)).await?;
        if gate.recv().await.is_none() {
            return Ok(());
        }
        let pg = verdict(write_pg(&stores.pg, plan.client, writer, token).await)?;
        let redis = verdict(write_redis(&stores.redis, plan.client, writer, token).await)?;
        say(
            &out,
            format!(
                "wrote {} {writer} {token} pg={pg} redis={redis}",
                plan.client
            ),
        )
        .await?;
        let _ = guard.release().await;
    }
}

fn verdict(outcome: Result<(), FenceError>) -> io::Result<&'static str> {
    match outcome {
        Ok(()) => Ok("ok"),
        Err(FenceError::Stale { .. }) => Ok("stale"),
        Err(other) => Err(io::Error::other(other.to_string())),
    }
}

/// One history row, fenced inside its own `INSERT`.
async fn write_pg(
    pool: &sqlx::PgPool,
    client: u32,
    writer: u32,
    token: FencingToken,
) -> Result<(), FenceError> {
    let value = fence::bigint(token)?;
    let failed = |e: sqlx::Error| fence::postgres::refusal(e, RESOURCE, token);
    let mut tx = pool.begin().await.map_err(failed)?;
    sqlx::query(
        "INSERT INTO fence_race_history (client, writer, token) \
         SELECT $3, $4, $2 FROM lockkit_fence($1, $2) AS fence",
    )
    .bind(RESOURCE)
    .bind(value)
    .bind(i32::try_from(client).unwrap_or(i32::MAX))
    .bind(i32::try_from(writer).unwrap_or(i32::MAX))
    .execute(&mut *tx)
    .await
    .map_err(failed)?;
    tx.commit().await.map_err(failed)
}

/// One history entry, pushed by the fence script.
async fn write_redis(
    conn: &redis::aio::MultiplexedConnection,
    client: u32,
    writer: u32,
    token: FencingToken,
) -> Result<(), FenceError> {
    let mut conn = conn.clone();
    fence::redis::FencedWrite::new(RESOURCE, token)?
        .command(
            redis::cmd("RPUSH")
                .arg(redis_history())
                .arg(format!("{token}:{client}:{writer}")),
        )
        .run(&mut conn)
        .await
        .map(drop)
}
