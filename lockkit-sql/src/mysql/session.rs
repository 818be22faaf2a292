//! The session modes on MySQL and MariaDB: their dedicated connections, and
//! `named` mode (`GET_LOCK` on the mapped name).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lockkit_core::{Capabilities, LockKind, LockStatus, Result};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool};
use sqlx::{AssertSqlSafe, ConnectOptions as _, MySqlConnection};

use super::batch::batch;
use super::statements::{FOREVER_SECS, MySql};
use crate::names::{check_slot_permits, hex_literal, named_lock_name, semaphore_slot_name};
use crate::session::{Locked, Record, ServerWait, SessionDb, SlotLocks, lock_any_slot};
use crate::settings::{NAMED_CAPABILITIES, Settings};
use crate::statement::{Answer, Bind as _, Value::Float, Value::Text, trusted, whole_micros};

/// MySQL/MariaDB session locks on dedicated connections: `named` mode, and
/// the connections of `row` mode (see the `row` module).
#[derive(Debug)]
pub(super) struct MySqlSession {
    pub(super) options: MySqlConnectOptions,
    pub(super) pool: MySqlPool,
    pub(super) sql: Arc<MySql>,
    pub(super) settings: Settings,
}

/// A dedicated connection, its server-side id (for `KILL QUERY`) and the
/// `innodb_lock_wait_timeout` currently set on it.
pub(super) struct MyConn {
    pub(super) conn: MySqlConnection,
    id: u64,
    lock_wait_secs: Option<u64>,
}

/// The key of a holding in `named` mode.
#[derive(Debug)]
pub(super) enum MyKey {
    /// The `GET_LOCK` name (see [`named_lock_name`](crate::named_lock_name)).
    Name(String),
    /// The `GET_LOCK` names of a semaphore's permit slots (see
    /// [`semaphore_slot_name`](crate::semaphore_slot_name)), and the slot
    /// taken, once granted.
    Slots {
        slots: Vec<String>,
        taken: AtomicUsize,
    },
}

impl MyKey {
    /// The `GET_LOCK` name this holding holds.
    fn held_name(&self) -> Option<&str> {
        match self {
            MyKey::Name(name) => Some(name),
            MyKey::Slots { slots, taken } => {
                slots.get(taken.load(Ordering::SeqCst)).map(String::as_str)
            }
        }
    }
}

impl MySqlSession {
    pub(super) fn new(
        options: MySqlConnectOptions,
        pool: MySqlPool,
        sql: Arc<MySql>,
        settings: &Settings,
    ) -> Self {
        MySqlSession {
            options,
            pool,
            sql,
            settings: settings.clone(),
        }
    }
}

impl MySqlSession {
    /// Draws a token from the counter (`Counter` only).
    pub(super) async fn next_fence(&self, conn: &mut MySqlConnection) -> sqlx::Result<u64> {
        let done = sqlx::query(trusted(&self.sql.next_fence))
            .execute(conn)
            .await?;
        Ok(done.last_insert_id())
    }

    async fn lock_named(
        &self,
        conn: &mut MyConn,
        name: &str,
        wait: ServerWait,
    ) -> sqlx::Result<Option<u64>> {
        // Sequence: the token, or 0 (timed out). Counter: 1 or 0.
        let got: Option<i64> = sqlx::query_scalar(trusted(&self.sql.named_lock))
            .bind_all(&[Text(name), Float(wait_seconds(wait))])
            .fetch_one(&mut conn.conn)
            .await?;
        self.named_token(conn, got).await
    }

    /// [`lock_named`](Self::lock_named) and `record`, a holder identity's
    /// record written if the lock was granted, in one message: the lock
    /// statement and the record's upsert, which checks that this
    /// connection holds the name (`IS_USED_LOCK`). Every error is one, never
    /// a refusal: the lock may have been granted before it.
    async fn lock_named_recording(
        &self,
        conn: &mut MyConn,
        name: &str,
        wait: ServerWait,
        record: Record<'_>,
    ) -> sqlx::Result<Option<u64>> {
        let name = text_literal(name);
        let lock = self.sql.named_lock.replacen('?', &name, 1).replacen(
            '?',
            &wait_seconds(wait).to_string(),
            1,
        );
        let write = self
            .sql
            .named_record
            .replace("{row}", &hex_literal(record.row))
            .replace("{owner}", &text_literal(record.owner))
            .replace("{ttl}", &whole_micros(record.ttl).to_string())
            .replace("{name}", &name);
        let got = batch(&mut conn.conn, format!("{lock}; {write}"))
            .await
            .answer()?;
        self.named_token(conn, got).await
    }

    /// The token of a lock statement's answer `got`: `None` when it timed
    /// out; drawn now from the counter where the statement drew none (and
    /// the answer, 1, without tokens).
    async fn named_token(&self, conn: &mut MyConn, got: Option<i64>) -> sqlx::Result<Option<u64>> {
        match got {
            Some(0) => Ok(None),
            Some(_) if self.sql.draws_after_grant() => {
                self.next_fence(&mut conn.conn).await.map(Some)
            }
            Some(token) => Ok(Some(token as u64)),
            None => Err(sqlx::Error::Protocol(
                "GET_LOCK returned NULL (the wait was killed or failed)".into(),
            )),
        }
    }

    /// Sets `innodb_lock_wait_timeout` on `conn` if it differs: whole
    /// seconds, at least 1 (the client cuts the wait at the deadline when
    /// the server would wait longer).
    pub(super) async fn set_lock_wait(
        &self,
        conn: &mut MyConn,
        wait: ServerWait,
    ) -> sqlx::Result<()> {
        const MAX_SECS: u64 = 1_073_741_824;
        let seconds = match wait {
            ServerWait::NoWait => return Ok(()),
            ServerWait::For(left) => left.as_secs() + u64::from(left.subsec_nanos() > 0),
            ServerWait::Forever => MAX_SECS,
        }
        .clamp(1, MAX_SECS);
        if conn.lock_wait_secs != Some(seconds) {
            conn.lock_wait_secs = None;
            // An integer we formatted ourselves: no name is in this SQL.
            sqlx::raw_sql(AssertSqlSafe(format!(
                "SET SESSION innodb_lock_wait_timeout = {seconds}"
            )))
            .execute(&mut conn.conn)
            .await?;
            conn.lock_wait_secs = Some(seconds);
        }
        Ok(())
    }
}

/// `KILL QUERY` of connection `id`, on a pooled connection. (An integer
/// we formatted ourselves: no name is in this SQL.)
async fn kill_query(pool: &MySqlPool, id: u64) -> sqlx::Result<()> {
    let kill = format!("KILL QUERY {id}");
    sqlx::raw_sql(AssertSqlSafe(kill))
        .execute(pool)
        .await
        .map(drop)
}

/// How long `GET_LOCK` waits, in seconds.
fn wait_seconds(wait: ServerWait) -> f64 {
    match wait {
        ServerWait::NoWait => 0.0,
        ServerWait::For(left) => left.as_secs_f64(),
        // MariaDB answers NULL to a negative (MySQL: infinite) timeout.
        ServerWait::Forever => FOREVER_SECS,
    }
}

/// `text` as a `utf8mb4` string literal of hexadecimal digits (see
/// [`hex_literal`]): a `GET_LOCK` name, an owner.
fn text_literal(text: &str) -> String {
    format!("_utf8mb4 {}", hex_literal(text))
}

impl SlotLocks for MySqlSession {
    type Slot = String;

    fn lock_slot<'c>(
        &'c self,
        conn: &'c mut MyConn,
        slot: &'c String,
        wait: ServerWait,
    ) -> Answer<'c, Option<u64>> {
        Box::pin(self.lock_named(conn, slot, wait))
    }
}

#[lockkit_core::async_trait]
impl SessionDb for MySqlSession {
    type Conn = MyConn;
    type Key = MyKey;

    fn settings(&self) -> &Settings {
        &self.settings
    }

    fn capabilities(&self) -> Capabilities {
        NAMED_CAPABILITIES
    }

    fn key(&self, name: &str, kind: LockKind) -> Result<MyKey> {
        Ok(match kind {
            LockKind::Semaphore { permits } => {
                check_slot_permits(self.settings.backend, permits)?;
                MyKey::Slots {
                    slots: (0..permits)
                        .map(|slot| semaphore_slot_name(name, slot))
                        .collect(),
                    taken: AtomicUsize::new(0),
                }
            }
            _ => MyKey::Name(named_lock_name(name).into_owned()),
        })
    }

    async fn connect(&self) -> Result<MyConn> {
        let mut conn = self
            .settings
            .connecting("open a lock connection", self.options.connect())
            .await?;
        let id: u64 = self
            .settings
            .bounded(
                "read the connection id",
                sqlx::query_scalar("SELECT CONNECTION_ID()").fetch_one(&mut conn),
            )
            .await?;
        self.settings
            .bounded("set the isolation level", super::read_committed(&mut conn))
            .await?;
        Ok(MyConn {
            conn,
            id,
            lock_wait_secs: None,
        })
    }

    /// A name's holding (not a permit's: its slots are tried one by one).
    fn carries_records(&self, key: &MyKey) -> bool {
        matches!(key, MyKey::Name(_))
    }

    async fn lock(
        &self,
        conn: &mut MyConn,
        key: &MyKey,
        wait: ServerWait,
        record: Option<Record<'_>>,
    ) -> Result<Locked> {
        let recorded = record.is_some();
        let drawn = match (key, record) {
            (MyKey::Name(name), Some(record)) => {
                self.lock_named_recording(conn, name, wait, record).await
            }
            (MyKey::Name(name), None) => self.lock_named(conn, name, wait).await,
            (MyKey::Slots { slots, taken }, _) => {
                lock_any_slot(self, conn, slots, taken, wait).await
            }
        };
        let granted = drawn.map(|drawn| drawn.map(|drawn| (drawn, recorded)));
        Locked::of(&self.settings, granted)
    }

    /// With `record`, one message: the record's delete, then the unlock
    /// (the next holder's record can only come after it).
    async fn unlock(
        &self,
        conn: &mut MyConn,
        key: &MyKey,
        record: Option<Record<'_>>,
    ) -> Result<bool> {
        // A signed integer or NULL: read as an `Option<i64>`, no `CAST`.
        const UNLOCK: &str = "SELECT RELEASE_LOCK(?)";
        let Some(name) = key.held_name() else {
            return Ok(false);
        };
        let released = match record {
            Some(record) => {
                let forget = self
                    .sql
                    .named_forget
                    .replace("{row}", &hex_literal(record.row))
                    .replace("{owner}", &text_literal(record.owner));
                let unlock = UNLOCK.replacen('?', &text_literal(name), 1);
                batch(&mut conn.conn, format!("{forget}; {unlock}"))
                    .await
                    .answer()
            }
            None => {
                sqlx::query_scalar::<_, Option<i64>>(UNLOCK)
                    .bind(name)
                    .fetch_one(&mut conn.conn)
                    .await
            }
        };
        released
            .map(|released| released == Some(1))
            .map_err(|error| self.settings.error("unlock", error))
    }

    /// Also proves that this connection still owns the lock.
    async fn ping(&self, conn: &mut MyConn, key: &MyKey) -> Result<bool> {
        let Some(name) = key.held_name() else {
            return Ok(false);
        };
        sqlx::query_scalar::<_, Option<i64>>(
            "SELECT CAST(IS_USED_LOCK(?) = CONNECTION_ID() AS SIGNED)",
        )
        .bind(name)
        .fetch_one(&mut conn.conn)
        .await
        .map(|owned| owned == Some(1))
        .map_err(|error| self.settings.error("liveness check", error))
    }

    /// `IS_USED_LOCK`: one query, the number of the names in use.
    async fn status(&self, key: &MyKey) -> Result<LockStatus> {
        let names = match key {
            MyKey::Name(name) => std::slice::from_ref(name),
            MyKey::Slots { slots, .. } => slots,
        };
        let sum = vec!["(IS_USED_LOCK(?) IS NOT NULL)"; names.len()].join(" + ");
        let mut count =
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!("SELECT CAST({sum} AS SIGNED)")));
        for name in names {
            count = count.bind(name);
        }
        let holders = self
            .settings
            .bounded("read the lock's status", count.fetch_one(&self.pool))
            .await?;
        Ok(match (holders, key) {
            (0, _) => LockStatus::free(),
            (_, MyKey::Name(_)) => LockStatus::held(),
            (n, MyKey::Slots { .. }) => LockStatus::held().with_holders(Some(n as usize)),
        })
    }

    /// The connection id (`CONNECTION_ID()`), for `KILL QUERY`.
    fn session_id(&self, conn: &MyConn) -> Option<u64> {
        Some(conn.id)
    }

    /// `KILL QUERY`, on a pooled connection: the server cancels a lock wait
    /// of the killed statement before it answers (a `KILL QUERY` that comes
    /// between two statements is dropped, so it cannot stop the next one).
    async fn interrupt(&self, id: u64) -> Result<()> {
        self.settings
            .bounded("stop a lock wait", kill_query(&self.pool, id))
            .await
    }

    /// MySQL keeps a `GET_LOCK` or row-lock wait going after its client has
    /// gone, so the wait is killed from another connection before this one is
    /// closed. Connection ids are not reused, so the `KILL` can only hit this
    /// connection's statement.
    fn abandon(&self, conn: MyConn) {
        let pool = self.pool.clone();
        let limit = self.settings.command_timeout;
        let id = conn.id;
        drop(conn);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            match tokio::time::timeout(limit, kill_query(&pool, id)).await {
                Ok(Ok(_)) => tracing::debug!(connection = id, "killed an abandoned lock wait"),
                // Unknown thread id: the connection is already gone.
                Ok(Err(error)) => tracing::trace!(connection = id, %error, "KILL QUERY"),
                Err(_) => tracing::warn!(connection = id, "KILL QUERY got no answer"),
            }
        });
    }
}
