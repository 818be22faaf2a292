//! PostgreSQL: lease rows woken by `LISTEN/NOTIFY`, `SELECT … FOR UPDATE` row
//! locks, and `pg_advisory_lock` session locks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::TryFutureExt;
use futures_util::future::BoxFuture;
use lockkit_core::backend::{Attempt, NotifyHub, ReleaseWatch};
use lockkit_core::{Capabilities, FencingToken, LockKind, LockStatus, Result};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, PgConnection};
use sqlx::{Connection, Postgres};
use tokio::task::AbortHandle;

use crate::error::is_lock_busy;
use crate::lease::permit_row_name;
use crate::lease::{Answer, LeaseDialect, LiveRow};
use crate::names::{advisory_key, check_slot_permits, semaphore_slot_key};
use crate::row_lock::{Answer as RowAnswer, RowLocking, lock_free_slot, lock_row, unlock_row};
use crate::session::{Locked, ServerWait, SessionDb};
use crate::settings::{
    ADVISORY_CAPABILITIES, NOTIFIED_LEASE_CAPABILITIES, PG_ROW_CAPABILITIES, Settings,
};
use crate::slots::SlotPlan;
use crate::statement::{millis, q};

/// How often a waiting session-lock statement checks that its client is still
/// connected (`client_connection_check_interval`, Postgres 14+): a cancelled
/// acquire closes its connection, and the server then drops the wait.
const CLIENT_CHECK: &str = "SET client_connection_check_interval = '100ms'";

/// The statements of one lock table, built once from the validated table name.
#[derive(Debug)]
pub(crate) struct PgSql {
    acquire: Arc<str>,
    extend: Arc<str>,
    release: Arc<str>,
    lease_status: Arc<str>,
    hand_over: Arc<str>,
    share: Arc<str>,
    extend_share: Arc<str>,
    leave: Arc<str>,
    mark_waiting: Arc<str>,
    unmark_waiting: Arc<str>,
    ensure_row: Arc<str>,
    advisory_lock: Arc<str>,
    advisory_try: Arc<str>,
    advisory_lock_shared: Arc<str>,
    advisory_try_shared: Arc<str>,
    row_lock: Arc<str>,
    row_try: Arc<str>,
    row_lock_shared: Arc<str>,
    row_try_shared: Arc<str>,
    row_free_slot: Arc<str>,
    ensure_rows: Arc<str>,
    row_release: Arc<str>,
    row_status: Arc<str>,
    /// The `LISTEN/NOTIFY` channel of releases: `lockkit_<table>`.
    channel: String,
    migrate: Vec<String>,
}

impl PgSql {
    /// The `LISTEN/NOTIFY` channel of releases.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// `table` must have passed [`validate_table`](crate::validate_table).
    pub(crate) fn new(table: &str) -> Self {
        let seq = format!("{table}_fence_seq");
        PgSql {
            acquire: format!(
                "WITH {GATE}, \
                 taken AS (\
                    INSERT INTO {table} AS l (name, owner, fence, expires_at) \
                    SELECT $1, $2, nextval('{seq}'), now() + $3::bigint * interval '1 millisecond' FROM g \
                    ON CONFLICT (name) DO UPDATE \
                        SET owner = EXCLUDED.owner, fence = EXCLUDED.fence, expires_at = EXCLUDED.expires_at \
                        WHERE l.expires_at <= now() \
                    RETURNING l.fence) \
                 SELECT (SELECT fence FROM taken), \
                        (SELECT GREATEST(0, CEIL(EXTRACT(EPOCH FROM (expires_at - now())) * 1000))::bigint \
                         FROM {table} WHERE name = $1)"
            )
            .into(),
            extend: format!(
                "UPDATE {table} SET expires_at = now() + $3::bigint * interval '1 millisecond' \
                 WHERE name = $1 AND owner = $2 AND expires_at > now()"
            )
            .into(),
            release: format!(
                "DELETE FROM {table} \
                 WHERE name = $1 AND owner = $2 AND expires_at > now() \
                 RETURNING pg_notify($3, $1)::text"
            )
            .into(),
            hand_over: format!(
                "UPDATE {table} SET owner = $3, fence = nextval('{seq}'), \
                     expires_at = now() + $4::bigint * interval '1 millisecond' \
                 WHERE name = $1 AND owner = $2 AND expires_at > now() \
                 RETURNING fence"
            )
            .into(),
            lease_status: format!(
                "SELECT fence, GREATEST(0, CEIL(EXTRACT(EPOCH FROM (expires_at - now())) * 1000))::bigint, owner \
                 FROM {table} WHERE name = $1 AND expires_at > now()"
            )
            .into(),
            // Readers: see the `lease` module. `$3`: the waiting record's row.
            share: format!(
                "WITH {GATE}, \
                 d AS MATERIALIZED (SELECT nextval('{seq}') AS f FROM g), \
                 joined AS (\
                    INSERT INTO {table} AS l (name, owner, fence, expires_at) \
                    SELECT $1, {GROUP} || d.f || ':1', d.f, now() + $2::bigint * interval '1 millisecond' FROM d \
                    WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE name = $3 AND expires_at > now()) \
                    ON CONFLICT (name) DO UPDATE \
                        SET owner = CASE WHEN l.expires_at <= now() THEN EXCLUDED.owner \
                                ELSE split_part(l.owner, ':', 1) || ':' || ({COUNT} + 1) END, \
                            fence = EXCLUDED.fence, \
                            expires_at = GREATEST(l.expires_at, EXCLUDED.expires_at) \
                        WHERE l.expires_at <= now() OR left(l.owner, 2) = {GROUP} \
                    RETURNING l.fence) \
                 SELECT (SELECT fence FROM joined), \
                        (SELECT GREATEST(0, CEIL(EXTRACT(EPOCH FROM (MAX(expires_at) - now())) * 1000))::bigint \
                         FROM {table} WHERE name IN ($1, $3))",
                COUNT = group_count("l.owner"),
            )
            .into(),
            extend_share: format!(
                "UPDATE {table} SET expires_at = GREATEST(expires_at, now() + $3::bigint * interval '1 millisecond') \
                 WHERE name = $1 AND expires_at > now() AND {IN_GROUP}",
                IN_GROUP = in_group("$2"),
            )
            .into(),
            // The group's row, locked first (its latest version), then
            // counted down, or deleted with its last reader.
            leave: format!(
                "WITH cur AS MATERIALIZED (\
                    SELECT name, {COUNT} AS n FROM {table} \
                    WHERE name = $1 AND expires_at > now() AND {IN_GROUP} FOR UPDATE), \
                 fewer AS (\
                    UPDATE {table} AS t SET owner = split_part(t.owner, ':', 1) || ':' || (cur.n - 1) \
                    FROM cur WHERE t.name = cur.name AND cur.n > 1 RETURNING NULL::text AS woken), \
                 gone AS (\
                    DELETE FROM {table} AS t USING cur WHERE t.name = cur.name AND cur.n <= 1 \
                    RETURNING pg_notify($3, $1)::text AS woken) \
                 SELECT woken FROM fewer UNION ALL SELECT woken FROM gone",
                COUNT = group_count("owner"),
                IN_GROUP = in_group("$2"),
            )
            .into(),
            mark_waiting: format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) \
                 VALUES ($1, $2, 0, now() + $3::bigint * interval '1 millisecond') \
                 ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at"
            )
            .into(),
            unmark_waiting: format!(
                "DELETE FROM {table} WHERE name = $1 AND owner = COALESCE($2, owner) RETURNING pg_notify($3, $4)::text"
            )
            .into(),
            ensure_row: format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) VALUES ($1, NULL, 0, '-infinity') \
                 ON CONFLICT (name) DO NOTHING"
            )
            .into(),
            // The same sequence for both sides: readers' and writers' tokens
            // are one order.
            advisory_lock: advisory_lock(&seq, ""),
            advisory_try: advisory_try(&seq, ""),
            advisory_lock_shared: advisory_lock(&seq, "_shared"),
            advisory_try_shared: advisory_try(&seq, "_shared"),
            row_lock: row_lock(table, &seq, Side::Writer, false),
            row_try: row_lock(table, &seq, Side::Writer, true),
            row_lock_shared: row_lock(table, &seq, Side::Reader, false),
            row_try_shared: row_lock(table, &seq, Side::Reader, true),
            // A permit: the first slot row no one holds. MATERIALIZED: the
            // token is drawn for the locked row only.
            row_free_slot: format!(
                "WITH l AS MATERIALIZED (\
                    SELECT name FROM {table} WHERE name = ANY($1) LIMIT 1 FOR UPDATE SKIP LOCKED) \
                 SELECT name, nextval('{seq}') FROM l"
            )
            .into(),
            ensure_rows: format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) \
                 SELECT n, NULL, 0, '-infinity' FROM unnest($1::text[]) AS n ON CONFLICT (name) DO NOTHING"
            )
            .into(),
            // The row, unless someone holds it (`SKIP LOCKED` passes over
            // it then, and does not wait) or holds or waits for its gate
            // (see `row_lock`): the releasing transaction's end hands the
            // gate to the first waiter at once, but that waiter locks the
            // row only once it runs, and a row deleted meanwhile would send
            // it to the back of the queue to make the row again.
            row_release: format!(
                "WITH g AS MATERIALIZED (SELECT 1 WHERE pg_try_advisory_xact_lock($2::int4, $3::int4)) \
                 DELETE FROM {table} WHERE name IN \
                 (SELECT t.name FROM {table} AS t, g WHERE t.name = $1 FOR UPDATE OF t SKIP LOCKED)"
            )
            .into(),
            // Held: the row exists but cannot be locked. A free row is
            // locked for the instant of this statement only. Waiters: those
            // queued for the name's gate (see `row_lock`), which `pg_locks`
            // shows with the gate's two halves as `classid`/`objid`, and
            // `objsubid` 2.
            row_status: format!(
                "WITH free AS MATERIALIZED (SELECT 1 FROM {table} WHERE name = $1 FOR UPDATE SKIP LOCKED) \
                 SELECT EXISTS (SELECT 1 FROM {table} WHERE name = $1) AND NOT EXISTS (SELECT 1 FROM free), \
                 (SELECT count(*) FROM pg_locks \
                  WHERE locktype = 'advisory' AND objsubid = 2 AND NOT granted \
                    AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                    AND classid = (($2::int4)::bigint & 4294967295)::oid \
                    AND objid = (($3::int4)::bigint & 4294967295)::oid)"
            )
            .into(),
            channel: format!("lockkit_{table}"),
            migrate: vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {table} (\
                        name text COLLATE \"C\" PRIMARY KEY, \
                        owner text, \
                        fence bigint NOT NULL, \
                        expires_at timestamptz NOT NULL)"
                ),
                format!("CREATE SEQUENCE IF NOT EXISTS {seq}"),
                // A table of an earlier version kept a token per row,
                // counted apart from the sequence: raise the sequence above
                // them (only ever up).
                format!(
                    "SELECT setval('{seq}', x.m) FROM (SELECT MAX(fence) AS m FROM {table}) AS x, {seq} AS s \
                     WHERE x.m > s.last_value"
                ),
            ],
        }
    }
}

/// A lease grant's *gate*: a transaction-scoped advisory lock on the name,
/// taken before its fencing token is drawn and held until the statement's
/// transaction ends. Released names' rows are deleted, so a grant may
/// insert a name's row afresh; the gate makes sure that a token drawn for
/// such an insert is drawn after every earlier grant of the name committed
/// (an insert's values are computed before it finds out whether the row is
/// there, and a grant and release by others may come between). Its key is
/// the pair (1818979429, `hashtext(name)`), where 1818979429 is the bytes
/// `lkle` ("lockkit lease") read as a big-endian `i32` ([`GATE_CLASS`]): a
/// key space apart from `advisory` mode's 64-bit keys; a collision with
/// another name's gate or `row` mode's only makes one statement wait for
/// another.
const GATE: &str = "g AS MATERIALIZED (SELECT pg_advisory_xact_lock(1818979429, hashtext($1)))";

/// The first half of a lease gate's key (written out in [`GATE`], whose
/// text must be a literal; a unit test keeps the two equal).
#[cfg(test)]
const GATE_CLASS: i32 = i32::from_be_bytes(*b"lkle");

/// The prefix of a reader group's owner (see the `lease` module).
const GROUP: &str = "(chr(1) || 'r')";

/// The reader count in a group's owner `column`.
fn group_count(column: &str) -> String {
    format!("split_part({column}, ':', 2)::bigint")
}

/// Whether the row is a reader group that started at or before `token`.
fn in_group(token: &str) -> String {
    format!(
        "CASE WHEN left(owner, 2) = {GROUP} \
         THEN substr(split_part(owner, ':', 1), 3)::bigint <= {token} ELSE false END"
    )
}

/// A side of `row` mode's reader-writer lock.
#[derive(Clone, Copy)]
enum Side {
    Writer,
    Reader,
}

/// `row` mode's locking statement: first the name's *gate*, a
/// transaction-scoped advisory lock on the two 32-bit halves (`$2`, `$3`) of
/// [`advisory_key`] (a key space apart from `advisory` mode's 64-bit keys),
/// exclusive for a writer and shared for a reader; then the row, `FOR
/// UPDATE` or `FOR SHARE`, and a token from `seq`. The row locks exclude;
/// the gate queues: Postgres' lock manager puts a new shared request behind
/// a waiting exclusive one, which row locks alone do not (a `FOR SHARE`
/// joins the current share-lockers even past a waiting `FOR UPDATE`). With
/// `no_wait`, the gate waits at most 1 ms (`lock_timeout`, for this
/// transaction only) and the row not at all: both end in `lock_not_available`.
fn row_lock(table: &str, seq: &str, side: Side, no_wait: bool) -> Arc<str> {
    let (gate, rows) = match side {
        Side::Writer => ("pg_advisory_xact_lock", "FOR UPDATE OF t"),
        Side::Reader => ("pg_advisory_xact_lock_shared", "FOR SHARE OF t"),
    };
    let (limit, nowait) = match no_wait {
        true => (
            "(SELECT set_config('lock_timeout', '1', true)) IS NOT NULL",
            " NOWAIT",
        ),
        false => ("true", ""),
    };
    format!(
        "WITH g AS MATERIALIZED (SELECT {gate}($2::int4, $3::int4) WHERE {limit}), \
              l AS MATERIALIZED (SELECT 1 FROM {table} AS t, g WHERE t.name = $1 {rows}{nowait}) \
         SELECT nextval('{seq}') FROM l"
    )
    .into()
}

/// The two 32-bit halves of `name`'s gate key (see [`row_lock`]), bound as
/// the `$2`, `$3` of the statements that take or look at the gate.
fn gate_halves(name: &str) -> (i32, i32) {
    let gate = advisory_key(name);
    ((gate >> 32) as i32, gate as i32)
}

/// `pg_advisory_lock<side>($1)` (`side` "" or "_shared") drawing a token
/// from `seq`; MATERIALIZED: the token is drawn only once the lock is
/// granted.
fn advisory_lock(seq: &str, side: &str) -> Arc<str> {
    format!(
        "WITH l AS MATERIALIZED (SELECT pg_advisory_lock{side}($1)) SELECT nextval('{seq}') FROM l"
    )
    .into()
}

/// `pg_try_advisory_lock<side>($1)`, a token from `seq` only if granted.
fn advisory_try(seq: &str, side: &str) -> Arc<str> {
    format!(
        "WITH l AS MATERIALIZED (SELECT pg_try_advisory_lock{side}($1) AS ok) \
         SELECT CASE WHEN ok THEN nextval('{seq}') END FROM l"
    )
    .into()
}

/// Creates the table and the fencing sequence if they are missing, on a
/// connection of its own. Concurrent migrations are serialised by a
/// transaction-scoped advisory lock, as `CREATE … IF NOT EXISTS` alone can
/// race in Postgres.
pub(crate) async fn migrate(
    options: &PgConnectOptions,
    sql: &PgSql,
    settings: &Settings,
) -> Result<()> {
    let mut conn = settings.connecting("connect", options.connect()).await?;
    settings
        .migrating(async {
            let mut tx = conn.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(advisory_key("lockkit migrate"))
                .execute(&mut *tx)
                .await?;
            for statement in &sql.migrate {
                sqlx::query(AssertSqlSafe(statement.as_str()))
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await
        })
        .await
}

/// `lease` mode on Postgres, woken by `LISTEN/NOTIFY`.
#[derive(Debug)]
pub(crate) struct PgLease {
    pub(crate) sql: Arc<PgSql>,
    pub(crate) notifications: PgNotifications,
}

impl LeaseDialect for PgLease {
    type Db = Postgres;
    const CAPABILITIES: Capabilities = NOTIFIED_LEASE_CAPABILITIES;

    fn acquire<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Attempt<Option<FencingToken>>> {
        Box::pin(async move {
            let (fence, remaining): (Option<i64>, Option<i64>) =
                sqlx::query_as(q(&self.sql.acquire))
                    .bind(name)
                    .bind(owner)
                    .bind(millis(ttl))
                    .fetch_one(conn)
                    .await?;
            Ok(match fence {
                Some(fence) => Attempt::Acquired(Some(FencingToken::new(fence as u64))),
                None => Attempt::Busy {
                    retry_after: remaining.map(|ms| Duration::from_millis(ms.max(0) as u64)),
                },
            })
        })
    }

    fn extend<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, bool> {
        Box::pin(async move {
            let done = sqlx::query(q(&self.sql.extend))
                .bind(name)
                .bind(owner)
                .bind(millis(ttl))
                .execute(conn)
                .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn release<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
        owner: &'c str,
    ) -> Answer<'c, bool> {
        Box::pin(async move {
            let rows = sqlx::query(q(&self.sql.release))
                .bind(name)
                .bind(owner)
                .bind(&self.sql.channel)
                .fetch_all(conn)
                .await?;
            Ok(rows.len() == 1)
        })
    }

    fn hand_over<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
        from: &'c str,
        to: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Option<i64>> {
        Box::pin(
            sqlx::query_scalar(q(&self.sql.hand_over))
                .bind(name)
                .bind(from)
                .bind(to)
                .bind(millis(ttl))
                .fetch_optional(conn),
        )
    }

    fn status<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
    ) -> Answer<'c, Option<LiveRow>> {
        Box::pin(
            sqlx::query_as(q(&self.sql.lease_status))
                .bind(name)
                .fetch_optional(conn),
        )
    }

    fn share<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
        waiting: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Attempt<Option<FencingToken>>> {
        Box::pin(async move {
            let (fence, remaining): (Option<i64>, Option<i64>) = sqlx::query_as(q(&self.sql.share))
                .bind(name)
                .bind(millis(ttl))
                .bind(waiting)
                .fetch_one(conn)
                .await?;
            Ok(match fence {
                Some(fence) => Attempt::Acquired(Some(FencingToken::new(fence as u64))),
                None => Attempt::Busy {
                    retry_after: remaining.map(|ms| Duration::from_millis(ms.max(0) as u64)),
                },
            })
        })
    }

    fn extend_share<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
        token: i64,
        ttl: Duration,
    ) -> Answer<'c, bool> {
        Box::pin(async move {
            let done = sqlx::query(q(&self.sql.extend_share))
                .bind(name)
                .bind(token)
                .bind(millis(ttl))
                .execute(conn)
                .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn leave<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
        token: i64,
    ) -> Answer<'c, bool> {
        Box::pin(async move {
            let rows = sqlx::query(q(&self.sql.leave))
                .bind(name)
                .bind(token)
                .bind(&self.sql.channel)
                .fetch_all(conn)
                .await?;
            Ok(rows.len() == 1)
        })
    }

    fn mark_waiting<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        waiting: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, ()> {
        Box::pin(async move {
            sqlx::query(q(&self.sql.mark_waiting))
                .bind(waiting)
                .bind(owner)
                .bind(millis(ttl))
                .execute(conn)
                .await
                .map(drop)
        })
    }

    fn unmark_waiting<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        name: &'c str,
        waiting: &'c str,
        owner: Option<&'c str>,
    ) -> Answer<'c, ()> {
        Box::pin(async move {
            sqlx::query(q(&self.sql.unmark_waiting))
                .bind(waiting)
                .bind(owner)
                .bind(&self.sql.channel)
                .bind(name)
                .fetch_all(conn)
                .await
                .map(drop)
        })
    }

    fn watch<'a>(&'a self, settings: &'a Settings, name: &'a str) -> BoxFuture<'a, ReleaseWatch> {
        Box::pin(self.notifications.watch(self.sql.channel(), settings, name))
    }
}

/// One `LISTEN` connection per client, started on first use, that wakes the
/// waiters of a name when its holder's release sends `NOTIFY`. It comes from
/// a pool of its own, so that it never takes a connection from the
/// statements.
#[derive(Debug)]
pub(crate) struct PgNotifications {
    options: PgConnectOptions,
    hub: NotifyHub,
    /// `true` once `LISTEN` is in place; the task behind it.
    state: Mutex<Option<(tokio::sync::watch::Receiver<bool>, AbortHandle)>>,
}

impl PgNotifications {
    pub(crate) fn new(options: PgConnectOptions) -> Self {
        PgNotifications {
            options,
            hub: NotifyHub::new(),
            state: Mutex::new(None),
        }
    }

    /// A watch on `name`; inactive (the waiter falls back to backoff and the
    /// holder's expiry) when `LISTEN` cannot be set up in time.
    pub(crate) async fn watch(
        &self,
        channel: &str,
        settings: &Settings,
        name: &str,
    ) -> ReleaseWatch {
        let mut listening = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let (listening, _) = state.get_or_insert_with(|| {
                let (tx, rx) = tokio::sync::watch::channel(false);
                let pool = PgPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(settings.connect_timeout)
                    .connect_lazy_with(self.options.clone());
                let task = tokio::spawn(listen(pool, channel.to_owned(), self.hub.clone(), tx));
                (rx, task.abort_handle())
            });
            listening.clone()
        };
        let (watch, _) = self.hub.watch(name);
        let ready = tokio::time::timeout(settings.command_timeout, listening.wait_for(|on| *on));
        match ready.await {
            Ok(Ok(_)) => watch,
            _ => {
                tracing::warn!(postgres.address = %settings.address, "LISTEN is not set up; waiting by polling");
                ReleaseWatch::none()
            }
        }
    }
}

impl Drop for PgNotifications {
    fn drop(&mut self) {
        if let Some((_, task)) = self.state.lock().unwrap_or_else(|p| p.into_inner()).take() {
            task.abort();
        }
    }
}

/// The listener task: `LISTEN channel`, then dispatch each notification's
/// payload (the lock name). After a lost connection every waiter is woken, as
/// notifications may have been missed; sqlx reconnects and listens again.
async fn listen(
    pool: PgPool,
    channel: String,
    hub: NotifyHub,
    listening: tokio::sync::watch::Sender<bool>,
) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::debug!(%error, "cannot open the LISTEN connection; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(error) = listener.listen(&channel).await {
            tracing::debug!(%error, "LISTEN failed; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        listening.send_replace(true);
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    hub.notify(notification.payload());
                }
                Ok(None) => {
                    // The connection was lost; the next call reconnects.
                    hub.notify_all();
                }
                Err(error) => {
                    tracing::debug!(%error, "the LISTEN connection failed; reconnecting");
                    hub.notify_all();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            }
        }
    }
}

/// Which session mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PgSessionMode {
    /// `pg_advisory_lock` on the name's 64-bit key.
    Advisory,
    /// `SELECT … FOR UPDATE` on the name's row, in an open transaction.
    Row,
}

/// Postgres session locks on dedicated connections.
#[derive(Debug)]
pub(crate) struct PgSession {
    pub(crate) options: PgConnectOptions,
    pub(crate) pool: PgPool,
    pub(crate) sql: Arc<PgSql>,
    pub(crate) mode: PgSessionMode,
    pub(crate) settings: Settings,
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

/// A dedicated connection and the `lock_timeout` currently set on it.
pub(crate) struct PgConn {
    conn: PgConnection,
    lock_timeout_ms: Option<i64>,
}

/// The key of a holding in a session mode.
#[derive(Debug)]
pub(crate) enum PgKey {
    Advisory(i64),
    AdvisoryShared(i64),
    /// The permit slots of a semaphore, and the slot taken (its key), once
    /// granted.
    AdvisorySlots {
        slots: Vec<i64>,
        taken: AtomicUsize,
    },
    /// The name's row (and gate, see [`row_lock`]), shared for a reader.
    Row {
        name: String,
        shared: bool,
    },
    /// The rows of a semaphore's permit slots (see
    /// [`permit_row_name`](crate::lease::permit_row_name)), and the slot
    /// taken, once granted.
    RowSlots {
        slots: Vec<String>,
        taken: AtomicUsize,
    },
}

impl PgSession {
    /// Sets the session's `lock_timeout` (0: wait forever) if it differs.
    async fn set_lock_timeout(&self, conn: &mut PgConn, wait: ServerWait) -> sqlx::Result<()> {
        let ms = match wait {
            ServerWait::NoWait => return Ok(()),
            // lock_timeout = 0 disables the timeout, so never round down to it.
            ServerWait::For(left) => millis(left).max(1),
            ServerWait::Forever => 0,
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

    async fn lock_advisory(
        &self,
        conn: &mut PgConn,
        key: i64,
        shared: bool,
        wait: ServerWait,
    ) -> sqlx::Result<Option<i64>> {
        let (try_lock, lock) = if shared {
            (
                &self.sql.advisory_try_shared,
                &self.sql.advisory_lock_shared,
            )
        } else {
            (&self.sql.advisory_try, &self.sql.advisory_lock)
        };
        if wait == ServerWait::NoWait {
            return sqlx::query_scalar(q(try_lock))
                .bind(key)
                .fetch_one(&mut conn.conn)
                .await;
        }
        self.set_lock_timeout(conn, wait).await?;
        match sqlx::query_scalar(q(lock))
            .bind(key)
            .fetch_one(&mut conn.conn)
            .await
        {
            Ok(fence) => Ok(Some(fence)),
            Err(error) if is_lock_busy(&error) => Ok(None),
            Err(error) => Err(error),
        }
    }
}

impl PgSession {
    /// A permit: the slots' keys as [`SlotPlan`] says.
    async fn lock_slot(
        &self,
        conn: &mut PgConn,
        slots: &[i64],
        taken: &AtomicUsize,
        wait: ServerWait,
    ) -> sqlx::Result<Option<i64>> {
        let plan = SlotPlan::new(slots.len());
        for slot in plan.order() {
            let granted = self.lock_advisory(conn, slots[slot], false, ServerWait::NoWait);
            if let Some(fence) = granted.await? {
                taken.store(slot, Ordering::SeqCst);
                return Ok(Some(fence));
            }
        }
        let (slot, Some(slice)) = (plan.first(), wait.slice()) else {
            return Ok(None);
        };
        let fence = self.lock_advisory(conn, slots[slot], false, slice).await?;
        if fence.is_some() {
            taken.store(slot, Ordering::SeqCst);
        }
        Ok(fence)
    }
}

impl PgSession {
    /// A permit in `row` mode: a free slot row if there is one, otherwise a
    /// wait on one slot for a slice, as [`SlotPlan`] says.
    async fn lock_row_slot(
        &self,
        conn: &mut PgConn,
        slots: &[String],
        taken: &AtomicUsize,
        wait: ServerWait,
    ) -> sqlx::Result<Option<i64>> {
        let plan = SlotPlan::new(slots.len());
        if let Some((slot, token)) = lock_free_slot(self, conn, slots, plan.first()).await? {
            taken.store(slot, Ordering::SeqCst);
            return Ok(Some(token));
        }
        let (slot, Some(slice)) = (plan.first(), wait.slice()) else {
            return Ok(None);
        };
        self.set_lock_timeout(conn, slice).await?;
        let token = lock_row(self, conn, &slots[slot], false, false).await?;
        if token.is_some() {
            taken.store(slot, Ordering::SeqCst);
        }
        Ok(token)
    }

    /// Whether `name`'s row exists and cannot be locked, and how many wait
    /// for its gate.
    async fn row_status(&self, name: &str) -> Result<(bool, i64)> {
        let (high, low) = gate_halves(name);
        self.settings
            .bounded(
                "read the lock's status",
                sqlx::query_as(q(&self.sql.row_status))
                    .bind(name)
                    .bind(high)
                    .bind(low)
                    .fetch_one(&self.pool),
            )
            .await
    }
}

impl RowLocking for PgSession {
    type Db = Postgres;
    type Conn = PgConn;

    fn connection(conn: &mut PgConn) -> &mut <Postgres as sqlx::Database>::Connection {
        &mut conn.conn
    }

    fn select<'c>(
        &'c self,
        conn: &'c mut PgConn,
        name: &'c str,
        no_wait: bool,
        shared: bool,
    ) -> RowAnswer<'c, Option<i64>> {
        let statement = match (shared, no_wait) {
            (false, false) => &self.sql.row_lock,
            (false, true) => &self.sql.row_try,
            (true, false) => &self.sql.row_lock_shared,
            (true, true) => &self.sql.row_try_shared,
        };
        let (high, low) = gate_halves(name);
        Box::pin(
            sqlx::query_scalar(q(statement))
                .bind(name)
                .bind(high)
                .bind(low)
                .fetch_optional(&mut conn.conn),
        )
    }

    /// `ON CONFLICT DO NOTHING` never waits for a holder's row lock.
    fn make_missing_row<'c>(&'c self, name: &'c str) -> RowAnswer<'c, ()> {
        self.ensure_row(name)
    }

    fn delete_if_free<'c>(&'c self, conn: &'c mut PgConn, name: &'c str) -> RowAnswer<'c, ()> {
        let (high, low) = gate_halves(name);
        Box::pin(
            sqlx::query(q(&self.sql.row_release))
                .bind(name)
                .bind(high)
                .bind(low)
                .execute(&mut conn.conn)
                .map_ok(drop),
        )
    }

    fn ensure_row<'c>(&'c self, name: &'c str) -> RowAnswer<'c, ()> {
        Box::pin(async move {
            sqlx::query(q(&self.sql.ensure_row))
                .bind(name)
                .execute(&self.pool)
                .await
                .map(drop)
        })
    }

    fn select_free<'c>(
        &'c self,
        conn: &'c mut PgConn,
        names: &'c [String],
    ) -> RowAnswer<'c, Option<(String, i64)>> {
        Box::pin(
            sqlx::query_as(q(&self.sql.row_free_slot))
                .bind(names)
                .fetch_optional(&mut conn.conn),
        )
    }

    fn ensure_rows<'c>(&'c self, names: &'c [String]) -> RowAnswer<'c, ()> {
        Box::pin(async move {
            sqlx::query(q(&self.sql.ensure_rows))
                .bind(names)
                .execute(&self.pool)
                .await
                .map(drop)
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
        match self.mode {
            PgSessionMode::Advisory => ADVISORY_CAPABILITIES,
            PgSessionMode::Row => PG_ROW_CAPABILITIES,
        }
    }

    fn key(&self, name: &str, kind: LockKind) -> Result<PgKey> {
        if let LockKind::Semaphore { permits } = kind {
            check_slot_permits(self.settings.backend, permits)?;
        }
        Ok(match (self.mode, kind) {
            (PgSessionMode::Row, LockKind::Semaphore { permits }) => PgKey::RowSlots {
                slots: (0..permits)
                    .map(|slot| permit_row_name(name, slot))
                    .collect(),
                taken: AtomicUsize::new(0),
            },
            (PgSessionMode::Row, kind) => PgKey::Row {
                name: name.to_owned(),
                shared: kind == LockKind::Shared,
            },
            (_, LockKind::Shared) => PgKey::AdvisoryShared(advisory_key(name)),
            (_, LockKind::Semaphore { permits }) => PgKey::AdvisorySlots {
                slots: (0..permits)
                    .map(|slot| semaphore_slot_key(name, slot))
                    .collect(),
                taken: AtomicUsize::new(0),
            },
            _ => PgKey::Advisory(advisory_key(name)),
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
        }
        Ok(PgConn {
            conn,
            lock_timeout_ms: None,
        })
    }

    async fn lock(&self, conn: &mut PgConn, key: &PgKey, wait: ServerWait) -> Result<Locked> {
        let locked = match key {
            PgKey::Advisory(key) => self.lock_advisory(conn, *key, false, wait).await,
            PgKey::AdvisoryShared(key) => self.lock_advisory(conn, *key, true, wait).await,
            PgKey::AdvisorySlots { slots, taken } => self.lock_slot(conn, slots, taken, wait).await,
            PgKey::RowSlots { slots, taken } => self.lock_row_slot(conn, slots, taken, wait).await,
            PgKey::Row { name, shared } => match self.set_lock_timeout(conn, wait).await {
                Ok(()) => lock_row(self, conn, name, wait == ServerWait::NoWait, *shared).await,
                Err(error) => Err(error),
            },
        };
        match locked {
            Ok(Some(fence)) => Ok(Locked::Granted(FencingToken::new(fence as u64))),
            Ok(None) => Ok(Locked::Busy),
            Err(error) => Err(self.settings.error("lock", error)),
        }
    }

    async fn unlock(&self, conn: &mut PgConn, key: &PgKey) -> Result<bool> {
        let unlocked = match key {
            PgKey::Advisory(key) => {
                unlock_advisory(conn, "SELECT pg_advisory_unlock($1)", *key).await
            }
            PgKey::AdvisoryShared(key) => {
                unlock_advisory(conn, "SELECT pg_advisory_unlock_shared($1)", *key).await
            }
            PgKey::AdvisorySlots { slots, taken } => {
                let slot = slots[taken.load(Ordering::SeqCst)];
                unlock_advisory(conn, "SELECT pg_advisory_unlock($1)", slot).await
            }
            PgKey::Row { name, .. } => unlock_row(self, conn, name).await,
            PgKey::RowSlots { slots, taken } => {
                unlock_row(self, conn, &slots[taken.load(Ordering::SeqCst)]).await
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

    /// Advisory: `pg_locks`, which also counts the waiters. Row: whether the
    /// row exists and cannot be locked (`FOR UPDATE SKIP LOCKED`), and the
    /// waiters queued for its gate in `pg_locks`.
    async fn status(&self, key: &PgKey) -> Result<LockStatus> {
        let what = "read the lock's status";
        match key {
            PgKey::Advisory(key) | PgKey::AdvisoryShared(key) => {
                let counts = sqlx::query_as(ADVISORY_STATUS)
                    .bind(*key)
                    .fetch_one(&self.pool);
                Ok(advisory_status(self.settings.bounded(what, counts).await?))
            }
            PgKey::AdvisorySlots { slots, .. } => {
                let counts = sqlx::query_as(ADVISORY_SLOTS_STATUS)
                    .bind(slots)
                    .fetch_one(&self.pool);
                Ok(advisory_status(self.settings.bounded(what, counts).await?))
            }
            PgKey::Row { name, .. } => Ok(match self.row_status(name).await? {
                (true, waiting) => LockStatus::held().with_waiters(Some(waiting.max(0) as usize)),
                (false, _) => LockStatus::free(),
            }),
            PgKey::RowSlots { slots, .. } => {
                let mut holders = 0;
                for slot in slots {
                    holders += usize::from(self.row_status(slot).await?.0);
                }
                Ok(match holders {
                    0 => LockStatus::free(),
                    n => LockStatus::held().with_holders(Some(n)),
                })
            }
        }
    }

    fn abandon(&self, conn: PgConn) {
        // Closing the socket ends the session and its locks; a wait still in
        // progress is dropped by the client connection check.
        drop(conn);
    }
}

/// `pg_advisory_unlock(key)` or its `_shared` twin on the holding connection.
async fn unlock_advisory(
    conn: &mut PgConn,
    statement: &'static str,
    key: i64,
) -> sqlx::Result<bool> {
    sqlx::query_scalar(statement)
        .bind(key)
        .fetch_one(&mut conn.conn)
        .await
}

/// The status from the granted and waiting counts of `pg_locks`.
fn advisory_status((granted, waiting): (i64, i64)) -> LockStatus {
    if granted > 0 {
        LockStatus::held()
            .with_holders(Some(granted as usize))
            .with_waiters(Some(waiting.max(0) as usize))
    } else {
        LockStatus::free()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_gate_class_is_the_one_written_out_in_the_gate() {
        assert_eq!(super::GATE_CLASS, 1_818_979_429);
        assert!(
            super::GATE.contains(&format!("pg_advisory_xact_lock({}, ", super::GATE_CLASS)),
            "{}",
            super::GATE
        );
    }
}
