//! The floor of a session-lock handoff: the database's own, by hand.
//!
//! A holder and a waiter on two dedicated sqlx connections pass a lock with
//! the statements lockkit sends (the waiter's lock statement draws its
//! fencing token as lockkit's does), with no lock engine, guard or pool in
//! between. The time from the holder's release statement to the waiter's
//! answer is what the server itself needs to hand a queued lock over; a
//! lockkit handoff can only add to it.

use std::time::Duration;

use sqlx::{Connection, MySqlConnection, PgConnection};
use tokio::time::Instant;

use crate::handoff::HandoffProbe;

/// Which session lock is passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawSessionMode {
    /// Postgres `SELECT … FOR UPDATE` in a transaction.
    PgRow,
    /// Postgres `pg_advisory_lock`.
    PgAdvisory,
    /// MariaDB `SELECT … FOR UPDATE` in a transaction.
    MyRow,
    /// MariaDB `GET_LOCK`.
    MyNamed,
}

const PG_ROW_HOLD: &str = "SELECT 1 FROM lockkit_locks WHERE name = $1 FOR UPDATE";
const PG_ROW_WAIT: &str = "WITH l AS MATERIALIZED (SELECT 1 FROM lockkit_locks WHERE name = $1 FOR UPDATE) \
    SELECT nextval('lockkit_locks_fence_seq') FROM l";
const PG_ADVISORY_HOLD: &str = "SELECT pg_advisory_lock($1)";
const PG_ADVISORY_WAIT: &str = "WITH l AS MATERIALIZED (SELECT pg_advisory_lock($1)) \
    SELECT nextval('lockkit_locks_fence_seq') FROM l";
const PG_ADVISORY_UNLOCK: &str = "SELECT pg_advisory_unlock($1)";
const MY_ROW_HOLD: &str = "SELECT 1 FROM lockkit_locks WHERE name = ? FOR UPDATE";
const MY_ROW_WAIT: &str = "SELECT CAST(NEXTVAL(lockkit_locks_fence_seq) AS SIGNED) \
    FROM lockkit_locks WHERE name = ? FOR UPDATE";
const MY_NAMED_HOLD: &str = "SELECT GET_LOCK(?, 3600)";
const MY_NAMED_WAIT: &str = "SELECT CASE GET_LOCK(?, 3600) \
    WHEN 1 THEN NEXTVAL(lockkit_locks_fence_seq) WHEN 0 THEN 0 END";
const MY_NAMED_UNLOCK: &str = "SELECT RELEASE_LOCK(?)";

/// The statements of one side of a raw handoff, on one database's connection.
#[allow(async_fn_in_trait)]
trait RawSide {
    /// Takes the lock (it is free).
    async fn hold(&mut self, mode: RawSessionMode, name: &str, key: i64);
    /// Queues for the lock with lockkit's lock statement (fencing token
    /// included) and returns once it is granted.
    async fn wait(&mut self, mode: RawSessionMode, name: &str, key: i64);
    /// Gives the lock up.
    async fn release(&mut self, mode: RawSessionMode, name: &str, key: i64);
}

impl RawSide for PgConnection {
    async fn hold(&mut self, mode: RawSessionMode, name: &str, key: i64) {
        if mode == RawSessionMode::PgRow {
            sqlx::raw_sql("BEGIN")
                .execute(&mut *self)
                .await
                .expect("BEGIN");
            sqlx::query(PG_ROW_HOLD)
                .bind(name)
                .fetch_one(self)
                .await
                .expect("hold the row");
        } else {
            sqlx::query(PG_ADVISORY_HOLD)
                .bind(key)
                .execute(self)
                .await
                .expect("hold");
        }
    }

    async fn wait(&mut self, mode: RawSessionMode, name: &str, key: i64) {
        let _token: i64 = if mode == RawSessionMode::PgRow {
            sqlx::raw_sql("BEGIN")
                .execute(&mut *self)
                .await
                .expect("BEGIN");
            sqlx::query_scalar(PG_ROW_WAIT)
                .bind(name)
                .fetch_one(self)
                .await
        } else {
            sqlx::query_scalar(PG_ADVISORY_WAIT)
                .bind(key)
                .fetch_one(self)
                .await
        }
        .expect("the waiter's lock");
    }

    async fn release(&mut self, mode: RawSessionMode, _name: &str, key: i64) {
        if mode == RawSessionMode::PgRow {
            sqlx::raw_sql("ROLLBACK")
                .execute(self)
                .await
                .expect("ROLLBACK");
        } else {
            sqlx::query(PG_ADVISORY_UNLOCK)
                .bind(key)
                .execute(self)
                .await
                .expect("unlock");
        }
    }
}

impl RawSide for MySqlConnection {
    async fn hold(&mut self, mode: RawSessionMode, name: &str, _key: i64) {
        if mode == RawSessionMode::MyRow {
            sqlx::raw_sql("BEGIN")
                .execute(&mut *self)
                .await
                .expect("BEGIN");
            sqlx::query(MY_ROW_HOLD)
                .bind(name.as_bytes())
                .fetch_one(self)
                .await
                .expect("hold the row");
        } else {
            sqlx::query(MY_NAMED_HOLD)
                .bind(name)
                .execute(self)
                .await
                .expect("hold");
        }
    }

    async fn wait(&mut self, mode: RawSessionMode, name: &str, _key: i64) {
        let _token: i64 = if mode == RawSessionMode::MyRow {
            sqlx::raw_sql("BEGIN")
                .execute(&mut *self)
                .await
                .expect("BEGIN");
            sqlx::query_scalar(MY_ROW_WAIT)
                .bind(name.as_bytes())
                .fetch_one(self)
                .await
        } else {
            sqlx::query_scalar(MY_NAMED_WAIT)
                .bind(name)
                .fetch_one(self)
                .await
        }
        .expect("the waiter's lock");
    }

    async fn release(&mut self, mode: RawSessionMode, name: &str, _key: i64) {
        if mode == RawSessionMode::MyRow {
            sqlx::raw_sql("ROLLBACK")
                .execute(self)
                .await
                .expect("ROLLBACK");
        } else {
            sqlx::query(MY_NAMED_UNLOCK)
                .bind(name)
                .execute(self)
                .await
                .expect("unlock");
        }
    }
}

/// Two dedicated connections of one database: the holder's and the waiter's.
#[derive(Debug)]
enum Pair {
    Pg(PgConnection, PgConnection),
    My(MySqlConnection, MySqlConnection),
}

/// One measured raw handoff.
#[derive(Clone, Copy, Debug)]
pub struct RawHandoff {
    /// The holder's release statement sent → the waiter's answer received.
    pub handoff: Duration,
    /// How long the holder's release statement took.
    pub release_call: Duration,
    /// The waiter had its answer before the release statement returned.
    pub waiter_first: bool,
    /// The probe's yardstick, timed just before the release.
    pub yardstick: Duration,
}

/// A session lock passed by hand between a holder and a waiter; see the
/// module docs.
#[derive(Debug)]
pub struct RawSessionHandoffs {
    mode: RawSessionMode,
    /// The lock name (row and named modes).
    name: String,
    /// The advisory key.
    key: i64,
    pair: Pair,
}

impl RawSessionHandoffs {
    /// Opens the holder's and the waiter's connections to `url` (whose lock
    /// table and sequence lockkit has created) and, for row locks, the row
    /// of `name`.
    pub async fn connect(url: &str, mode: RawSessionMode, name: &str) -> RawSessionHandoffs {
        let pair = match mode {
            RawSessionMode::PgRow | RawSessionMode::PgAdvisory => {
                let open = || async { PgConnection::connect(url).await.expect("Postgres") };
                let mut holder = open().await;
                sqlx::query(
                    "INSERT INTO lockkit_locks (name, owner, fence, expires_at) \
                     VALUES ($1, NULL, 0, '-infinity') ON CONFLICT (name) DO NOTHING",
                )
                .bind(name)
                .execute(&mut holder)
                .await
                .expect("the row of the raw handoff");
                Pair::Pg(holder, open().await)
            }
            RawSessionMode::MyRow | RawSessionMode::MyNamed => {
                let open = || async { MySqlConnection::connect(url).await.expect("MariaDB") };
                let mut holder = open().await;
                sqlx::query(
                    "INSERT INTO lockkit_locks (name, owner, fence, expires_at) \
                     VALUES (?, NULL, 0, '1000-01-01 00:00:00') ON DUPLICATE KEY UPDATE name = name",
                )
                .bind(name.as_bytes())
                .execute(&mut holder)
                .await
                .expect("the row of the raw handoff");
                Pair::My(holder, open().await)
            }
        };
        RawSessionHandoffs {
            mode,
            name: name.to_owned(),
            key: lockkit_sql::advisory_key(name),
            pair,
        }
    }

    /// One handoff: the holder locks; the waiter's lock statement queues
    /// (`probe` says when); the yardstick; then the holder's release, timed
    /// to the waiter's answer. The waiter then releases too.
    pub async fn once(&mut self, probe: &impl HandoffProbe) -> RawHandoff {
        let (mode, name, key) = (self.mode, self.name.as_str(), self.key);
        match &mut self.pair {
            Pair::Pg(holder, waiter) => pass(holder, waiter, mode, name, key, probe).await,
            Pair::My(holder, waiter) => pass(holder, waiter, mode, name, key, probe).await,
        }
    }
}

/// The handoff of [`RawSessionHandoffs::once`] on one database. The waiter
/// runs in this task, polled alongside the probe and the release, and notes
/// the moment its lock statement answers.
async fn pass<C: RawSide>(
    holder: &mut C,
    waiter: &mut C,
    mode: RawSessionMode,
    name: &str,
    key: i64,
    probe: &impl HandoffProbe,
) -> RawHandoff {
    holder.hold(mode, name, key).await;
    let mark = probe.mark().await;
    let (yardstick, start, released, got) = {
        let waiting = async {
            waiter.wait(mode, name, key).await;
            Instant::now()
        };
        tokio::pin!(waiting);
        tokio::select! {
            biased;
            _ = &mut waiting => panic!("the raw waiter got the lock while it was held"),
            () = probe.until_parked(mark) => {}
        }
        let yardstick = tokio::select! {
            biased;
            _ = &mut waiting => panic!("the raw waiter got the lock while it was held"),
            yardstick = probe.yardstick() => yardstick,
        };
        let start = Instant::now();
        let release = async {
            holder.release(mode, name, key).await;
            Instant::now()
        };
        let (released, got) = tokio::join!(release, waiting);
        (yardstick, start, released, got)
    };
    waiter.release(mode, name, key).await;
    RawHandoff {
        handoff: got.saturating_duration_since(start),
        release_call: released - start,
        waiter_first: got < released,
        yardstick,
    }
}
