//! The session modes on PostgreSQL: their dedicated connections, and
//! `advisory` mode (`pg_advisory_lock` on the name's 64-bit key).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use lockkit_core::{Capabilities, LockKind, LockStatus, Result};
use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{AssertSqlSafe, ConnectOptions as _, PgConnection};

use super::statements::PgSql;
use crate::error::is_lock_busy;
use crate::names::{advisory_key, check_slot_permits, semaphore_slot_key};
use crate::session::{Locked, Record, ServerWait, SessionDb, SlotLocks, lock_any_slot};
use crate::settings::{ADVISORY_CAPABILITIES, Settings};
use crate::statement::Value::{Int, Text};
use crate::statement::{Answer, Bind as _, millis, trusted, whole_millis};

/// How often a waiting session-lock statement checks that its client is still
/// connected (`client_connection_check_interval`, Postgres 14+): a cancelled
/// acquire closes its connection, and the server then drops the wait.
/// First, no `lock_timeout` (a try that writes a holder identity's record
/// may wait for that row's lock, as a statement of its own would; see
/// [`PgSession::lock_advisory`]). Both settings go back when the second
/// fails (one implicit transaction): see [`NO_LOCK_TIMEOUT`].
const CLIENT_CHECK: &str = "SET lock_timeout = 0; SET client_connection_check_interval = '100ms'";

/// The first setting of [`CLIENT_CHECK`], for servers without the second.
const NO_LOCK_TIMEOUT: &str = "SET lock_timeout = 0";

/// How many acquires that may wait go straight to the waiting statement
/// after a try of this client was refused (see
/// [`PgSession::lock_advisory`]).
const WAITS_AFTER_REFUSAL: u32 = 16;

/// Postgres session locks on dedicated connections: `advisory` mode, and
/// the connections of `row` mode (see the `row` module).
#[derive(Debug)]
pub(super) struct PgSession {
    pub(super) options: PgConnectOptions,
    pub(super) pool: PgPool,
    pub(super) sql: Arc<PgSql>,
    pub(super) settings: Settings,
    /// Acquires left to send the waiting statement without a try first:
    /// set to [`WAITS_AFTER_REFUSAL`] when a try is refused.
    waits_untried: AtomicU32,
}

/// A dedicated connection and the `lock_timeout` currently set on it.
pub(super) struct PgConn {
    pub(super) conn: PgConnection,
    lock_timeout_ms: Option<i64>,
}

/// The key of a holding in `advisory` mode.
#[derive(Debug)]
pub(super) enum PgKey {
    Exclusive(i64),
    Shared(i64),
    /// The permit slots of a semaphore, and the slot taken (its key), once
    /// granted.
    Slots {
        slots: Vec<i64>,
        taken: AtomicUsize,
    },
}

impl PgSession {
    pub(super) fn new(
        options: PgConnectOptions,
        pool: PgPool,
        sql: Arc<PgSql>,
        settings: &Settings,
    ) -> Self {
        PgSession {
            options,
            pool,
            sql,
            settings: settings.clone(),
            waits_untried: AtomicU32::new(0),
        }
    }
}

impl PgSession {
    /// Sets the session's `lock_timeout` (0: wait forever) if it differs.
    pub(super) async fn set_lock_timeout(
        &self,
        conn: &mut PgConn,
        wait: ServerWait,
    ) -> sqlx::Result<()> {
        let Some(ms) = lock_timeout_ms(wait) else {
            return Ok(());
        };
        if conn.lock_timeout_ms != Some(ms) {
            conn.lock_timeout_ms = None;
            // An integer we formatted ourselves: no name is in this SQL.
            sqlx::raw_sql(AssertSqlSafe(format!("SET lock_timeout = {ms}")))
                .execute(&mut conn.conn)
                .await?;
            conn.lock_timeout_ms = Some(ms);
        }
        Ok(())
    }

    /// The advisory lock on `key`: one try first, then, if it was refused
    /// and `wait` allows, a wait. A free lock, the common case, is then
    /// taken by the try, which sets no `lock_timeout`: the wait form's
    /// setting costs the server more than the lock itself. A busy one
    /// costs a statement more before its wait, which is queued on the
    /// server all the same; so once a try of this client was refused, its
    /// next [`WAITS_AFTER_REFUSAL`] acquires that may wait send the waiting
    /// statement alone (granted at once if the lock is free, at the price
    /// of the setting): under contention an acquire is one statement, as
    /// a hand-written `pg_advisory_lock` is, and a client whose contention
    /// has passed goes back to trying first soon after.
    ///
    /// The try also writes `record`, a holder identity's record, when it is
    /// granted, on a connection without a `lock_timeout` (the record's
    /// upsert may wait a moment for a release deleting that row, which a
    /// `lock_timeout` left by a wait could turn into a refusal after the
    /// lock was granted); the answer says whether it did.
    async fn lock_advisory(
        &self,
        conn: &mut PgConn,
        key: i64,
        shared: bool,
        wait: ServerWait,
        record: Option<Record<'_>>,
    ) -> sqlx::Result<Option<(i64, bool)>> {
        if wait != ServerWait::NoWait && self.take_untried_wait() {
            let granted = self.lock_advisory_once(conn, key, shared, wait).await?;
            return Ok(granted.map(|fence| (fence, false)));
        }
        let tried = match record.filter(|_| conn.lock_timeout_ms == Some(0)) {
            Some(record) => self
                .try_advisory_recording(conn, key, shared, record)
                .await?
                .map(|fence| (fence, true)),
            None => self
                .lock_advisory_once(conn, key, shared, ServerWait::NoWait)
                .await?
                .map(|fence| (fence, false)),
        };
        if tried.is_some() || wait == ServerWait::NoWait {
            return Ok(tried);
        }
        self.waits_untried
            .store(WAITS_AFTER_REFUSAL, Ordering::Relaxed);
        let granted = self.lock_advisory_once(conn, key, shared, wait).await?;
        Ok(granted.map(|fence| (fence, false)))
    }

    /// The try for the advisory lock on `key` that also writes `record`
    /// when granted: the token, `None` when refused. Every error is one
    /// (never a refusal): the lock may have been granted before it.
    async fn try_advisory_recording(
        &self,
        conn: &mut PgConn,
        key: i64,
        shared: bool,
        record: Record<'_>,
    ) -> sqlx::Result<Option<i64>> {
        let statement = &self.sql.advisory_recording[usize::from(shared)];
        sqlx::query_scalar(trusted(statement))
            .bind_all(&[
                Int(key),
                Text(record.row),
                Text(record.owner),
                millis(record.ttl),
            ])
            .fetch_one(&mut conn.conn)
            .await
    }

    /// Whether this acquire goes straight to the waiting statement (see
    /// [`lock_advisory`](Self::lock_advisory)), counting it if so.
    fn take_untried_wait(&self) -> bool {
        self.waits_untried
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(1)
            })
            .is_ok()
    }

    /// One statement for the advisory lock on `key`: the try form for
    /// [`ServerWait::NoWait`], else the waiting form with its
    /// `lock_timeout`; the token when granted, `None` when refused.
    async fn lock_advisory_once(
        &self,
        conn: &mut PgConn,
        key: i64,
        shared: bool,
        wait: ServerWait,
    ) -> sqlx::Result<Option<i64>> {
        let statement = self.sql.advisory.form(shared, wait.intent());
        // A wait sets its `lock_timeout` in the same statement (`$2`).
        let timeout = lock_timeout_ms(wait);
        let text = timeout.map(|ms| ms.to_string()).unwrap_or_default();
        let all = [Int(key), Text(&text)];
        // A wait's setting stays when the statement succeeds; a failed one
        // puts the session's back, which `set_lock_timeout` then no longer
        // knows. A try leaves the setting as it was.
        let (values, known_after) = match timeout {
            Some(ms) => {
                conn.lock_timeout_ms = None;
                (&all[..], Some(ms))
            }
            None => (&all[..1], conn.lock_timeout_ms),
        };
        // A try answers NULL when busy; a wait, `lock_not_available`.
        match sqlx::query_scalar(trusted(statement))
            .bind_all(values)
            .fetch_one(&mut conn.conn)
            .await
        {
            Ok(fence) => {
                conn.lock_timeout_ms = known_after;
                Ok(fence)
            }
            Err(error) if is_lock_busy(&error) => Ok(None),
            Err(error) => Err(error),
        }
    }
}

/// The `lock_timeout` of a wait (0: no limit); `None` for a try.
fn lock_timeout_ms(wait: ServerWait) -> Option<i64> {
    match wait {
        ServerWait::NoWait => None,
        // lock_timeout = 0 disables the timeout, so never round down to it.
        ServerWait::For(left) => Some(whole_millis(left).max(1)),
        ServerWait::Forever => Some(0),
    }
}

impl SlotLocks for PgSession {
    type Slot = i64;

    fn lock_slot<'c>(
        &'c self,
        conn: &'c mut PgConn,
        slot: &'c i64,
        wait: ServerWait,
    ) -> Answer<'c, Option<u64>> {
        Box::pin(async move {
            let token = self.lock_advisory_once(conn, *slot, false, wait).await?;
            Ok(token.map(|t| t as u64))
        })
    }
}

#[lockkit_core::async_trait]
impl SessionDb for PgSession {
    type Conn = PgConn;
    type Key = PgKey;

    fn settings(&self) -> &Settings {
        &self.settings
    }

    fn capabilities(&self) -> Capabilities {
        ADVISORY_CAPABILITIES
    }

    fn key(&self, name: &str, kind: LockKind) -> Result<PgKey> {
        Ok(match kind {
            LockKind::Shared => PgKey::Shared(advisory_key(name)),
            LockKind::Semaphore { permits } => {
                check_slot_permits(self.settings.backend, permits)?;
                PgKey::Slots {
                    slots: (0..permits)
                        .map(|slot| semaphore_slot_key(name, slot))
                        .collect(),
                    taken: AtomicUsize::new(0),
                }
            }
            _ => PgKey::Exclusive(advisory_key(name)),
        })
    }

    async fn connect(&self) -> Result<PgConn> {
        let mut conn = self
            .settings
            .connecting("open a lock connection", self.options.connect())
            .await?;
        // Best effort: servers before Postgres 14 do not have the setting.
        if let Err(error) = sqlx::raw_sql(CLIENT_CHECK).execute(&mut conn).await {
            tracing::debug!(%error, "client_connection_check_interval is not available; a cancelled wait ends when its lock is granted");
            self.settings
                .bounded(
                    "clear the lock timeout",
                    sqlx::raw_sql(NO_LOCK_TIMEOUT).execute(&mut conn),
                )
                .await?;
        }
        Ok(PgConn {
            conn,
            lock_timeout_ms: Some(0),
        })
    }

    /// An exclusive or shared holding's (not a permit's: its slots are
    /// tried one by one).
    fn carries_records(&self, key: &PgKey) -> bool {
        matches!(key, PgKey::Exclusive(_) | PgKey::Shared(_))
    }

    async fn lock(
        &self,
        conn: &mut PgConn,
        key: &PgKey,
        wait: ServerWait,
        record: Option<Record<'_>>,
    ) -> Result<Locked> {
        let granted = match key {
            PgKey::Exclusive(advisory) | PgKey::Shared(advisory) => {
                let shared = matches!(key, PgKey::Shared(_));
                self.lock_advisory(conn, *advisory, shared, wait, record)
                    .await
                    .map(|locked| locked.map(|(drawn, recorded)| (drawn as u64, recorded)))
            }
            PgKey::Slots { slots, taken } => lock_any_slot(self, conn, slots, taken, wait)
                .await
                .map(|drawn| drawn.map(|drawn| (drawn, false))),
        };
        Locked::of(&self.settings, granted)
    }

    async fn unlock(
        &self,
        conn: &mut PgConn,
        key: &PgKey,
        record: Option<Record<'_>>,
    ) -> Result<bool> {
        let (shared, key) = match key {
            PgKey::Exclusive(key) => (false, *key),
            PgKey::Shared(key) => (true, *key),
            PgKey::Slots { slots, taken } => (false, slots[taken.load(Ordering::SeqCst)]),
        };
        let unlocked = match record {
            Some(record) => {
                sqlx::query_scalar(trusted(&self.sql.advisory_forgetting[usize::from(shared)]))
                    .bind_all(&[Int(key), Text(record.row), Text(record.owner)])
                    .fetch_one(&mut conn.conn)
                    .await
            }
            None => {
                let statement = match shared {
                    false => "SELECT pg_advisory_unlock($1)",
                    true => "SELECT pg_advisory_unlock_shared($1)",
                };
                sqlx::query_scalar(statement)
                    .bind(key)
                    .fetch_one(&mut conn.conn)
                    .await
            }
        };
        unlocked.map_err(|error| self.settings.error("unlock", error))
    }

    async fn ping(&self, conn: &mut PgConn, _key: &PgKey) -> Result<bool> {
        sqlx::raw_sql("SELECT 1")
            .execute(&mut conn.conn)
            .await
            .map(|_| true)
            .map_err(|error| self.settings.error("liveness check", error))
    }

    /// `pg_locks`, which also counts the waiters.
    async fn status(&self, key: &PgKey) -> Result<LockStatus> {
        let counts = match key {
            PgKey::Exclusive(key) | PgKey::Shared(key) => sqlx::query_as(ADVISORY_STATUS)
                .bind(*key)
                .fetch_one(&self.pool),
            PgKey::Slots { slots, .. } => sqlx::query_as(ADVISORY_SLOTS_STATUS)
                .bind(slots)
                .fetch_one(&self.pool),
        };
        let (granted, waiting): (i64, i64) = self
            .settings
            .bounded("read the lock's status", counts)
            .await?;
        Ok(if granted > 0 {
            LockStatus::held()
                .with_holders(Some(granted as usize))
                .with_waiters(Some(waiting.max(0) as usize))
        } else {
            LockStatus::free()
        })
    }

    fn abandon(&self, conn: PgConn) {
        // Closing the socket ends the session and its locks; a wait still in
        // progress is dropped by the client connection check.
        drop(conn);
    }
}

/// Holders and waiters of an advisory lock on a 64-bit key in this database
/// (`pg_locks` shows the key's high and low halves as `classid`/`objid`, and
/// `objsubid` 1).
const ADVISORY_STATUS: &str = "SELECT count(*) FILTER (WHERE granted), count(*) FILTER (WHERE NOT granted) \
     FROM pg_locks \
     WHERE locktype = 'advisory' AND objsubid = 1 \
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
       AND classid = (($1::bigint >> 32) & 4294967295)::oid \
       AND objid = ($1::bigint & 4294967295)::oid";

/// Holders and waiters of advisory locks on any of the 64-bit keys `$1`
/// (the permit slots of a semaphore).
const ADVISORY_SLOTS_STATUS: &str = "SELECT count(*) FILTER (WHERE granted), count(*) FILTER (WHERE NOT granted) \
     FROM pg_locks \
     WHERE locktype = 'advisory' AND objsubid = 1 \
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
       AND (classid, objid) IN \
           (SELECT ((k >> 32) & 4294967295)::oid, (k & 4294967295)::oid FROM unnest($1::bigint[]) AS k)";
