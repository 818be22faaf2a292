//! MySQL and MariaDB: lease rows, `SELECT … FOR UPDATE` row locks, and
//! `GET_LOCK` named locks.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockkit_core::backend::Attempt;
use lockkit_core::{Capabilities, FencingToken, LockKind, LockStatus, Result};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool};
use sqlx::{AssertSqlSafe, ConnectOptions, MySqlConnection};

use crate::lease::permit_row_name;
use crate::lease::{Answer, LeaseDialect, LiveRow};
use crate::names::{check_slot_permits, named_lock_name, semaphore_slot_name};
use crate::row_lock::{Answer as RowAnswer, RowLocking, lock_free_slot, lock_row, unlock_row};
use crate::session::{Locked, ServerWait, SessionDb};
use crate::settings::{
    MYSQL_ROW_CAPABILITIES, NAMED_CAPABILITIES, POLLED_LEASE_CAPABILITIES, Settings,
};
use crate::slots::SlotPlan;
use crate::statement::{micros, q};

/// The prefix of a reader group's owner (see the `lease` module).
const GROUP: &str = "CONCAT(CHAR(1), 'r')";

/// The reader count in a group's `owner`.
const COUNT: &str = "CAST(SUBSTRING_INDEX(owner, ':', -1) AS UNSIGNED)";

/// Whether the row is a reader group that started at or before the bound
/// token.
const IN_GROUP: &str = "LEFT(owner, 2) = CONCAT(CHAR(1), 'r') \
    AND CAST(SUBSTRING(SUBSTRING_INDEX(owner, ':', 1), 3) AS UNSIGNED) <= ?";

/// Added to the holder's remaining lease (in µs) to tell a busy answer from
/// a fencing token in `LAST_INSERT_ID` (tokens stay far below it).
const BUSY_FLAG: u64 = 1 << 62;

/// The server-side wait of an `acquire` that waits forever: a year.
const FOREVER_SECS: f64 = 365.0 * 24.0 * 3600.0;

/// Where `row` and `named` mode draw their fencing tokens from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FenceSource {
    /// A MariaDB `SEQUENCE` (10.3+), drawn inside the lock statement itself
    /// once the lock is granted: no rollback undoes `NEXTVAL`.
    Sequence,
    /// A one-row counter table bumped by an autocommitted `UPDATE` after the
    /// grant (MySQL, which has no sequences).
    Counter,
}

impl FenceSource {
    /// Sequences on MariaDB 10.3 and later, from `SELECT VERSION()`;
    /// otherwise the counter.
    pub(crate) fn for_version(version: &str) -> FenceSource {
        let mut numbers = version.split(['.', '-']).map(|n| n.parse::<u32>().ok());
        let (major, minor) = (numbers.next().flatten(), numbers.next().flatten());
        match (version.contains("MariaDB"), major, minor) {
            (true, Some(major), Some(minor)) if (major, minor) >= (10, 3) => FenceSource::Sequence,
            _ => FenceSource::Counter,
        }
    }
}

/// The statements of one lock table, built once from the validated table name.
#[derive(Debug)]
pub(crate) struct MySql {
    acquire: Arc<str>,
    extend: Arc<str>,
    release: Arc<str>,
    lease_status: Arc<str>,
    hand_over: Arc<str>,
    share: Arc<str>,
    extend_share: Arc<str>,
    leave: Arc<str>,
    leave_last: Option<Arc<str>>,
    mark_waiting: Arc<str>,
    unmark_waiting: Arc<str>,
    ensure_row: Arc<str>,
    row_lock: Arc<str>,
    row_try: Arc<str>,
    row_lock_shared: Arc<str>,
    row_try_shared: Arc<str>,
    row_free: Arc<str>,
    row_delete: Arc<str>,
    row_exists: Arc<str>,
    /// With `{slots}` to replace by one placeholder per slot.
    row_free_slot: String,
    /// With `{slots}` to replace by one placeholder per slot.
    rows_present: String,
    /// With `{rows}` to replace by one `VALUES` row per name.
    ensure_rows: String,
    named_lock: Arc<str>,
    /// `Counter` only: the `UPDATE` that draws a token.
    next_fence: Arc<str>,
    fence_source: FenceSource,
    /// Queries that each answer a row only when the schema is in place.
    migrated: Vec<String>,
    migrate: Vec<String>,
    /// `Sequence` only: the highest token stored in the table, and the
    /// sequence to raise to it (a table of an earlier version kept a token
    /// per row, counted apart from the sequence).
    sequence_floor: Option<(String, String)>,
}

impl MySql {
    /// `table` must have passed [`validate_table`](crate::validate_table).
    pub(crate) fn new(table: &str, fence_source: FenceSource) -> Self {
        let counter = format!("{table}_fence");
        let seq = format!("{table}_fence_seq");
        let gate = format!("{table}_gate");
        let lease = LeaseTokens::new(fence_source, table, &seq, &gate);
        // The token is computed only for a granted lock: a row is returned
        // (and its select list evaluated) once its lock is granted, and CASE
        // evaluates NEXTVAL only when GET_LOCK answered 1.
        let (row_token, named_lock) = match fence_source {
            FenceSource::Sequence => (
                format!("NEXTVAL({seq})"),
                format!(
                    "SELECT CAST(CASE GET_LOCK(?, ?) WHEN 1 THEN NEXTVAL({seq}) WHEN 0 THEN 0 END AS SIGNED)"
                ),
            ),
            FenceSource::Counter => (
                "0".to_owned(),
                "SELECT CAST(GET_LOCK(?, ?) AS SIGNED)".to_owned(),
            ),
        };
        // Plain reads: they wait for no lock a holder may keep. (A `CREATE …
        // IF NOT EXISTS` of an existing table waits for the metadata lock of
        // every open transaction that used it, such as a row-mode holder's.)
        let mut migrated = vec![format!("SELECT COUNT(*) FROM {table} WHERE 1 = 0")];
        migrated.push(match fence_source {
            FenceSource::Sequence => format!("SELECT COUNT(*) FROM {seq} WHERE 1 = 0"),
            FenceSource::Counter => format!("SELECT n FROM {counter} WHERE id = 1"),
        });
        if fence_source == FenceSource::Sequence {
            migrated.push(format!("SELECT 1 FROM {gate} WHERE id = {}", GATES - 1));
        }
        // The owner column holds an owner token and a holder identity (36 +
        // 1 + at most 255 bytes); tables made before identities were stored
        // had VARCHAR(64), and are widened.
        migrated.push(format!(
            "SELECT 1 FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() \
             AND TABLE_NAME = '{table}' AND COLUMN_NAME = 'owner' \
             AND CHARACTER_MAXIMUM_LENGTH >= {OWNER_CHARS}"
        ));
        let owner_column =
            format!("owner VARCHAR({OWNER_CHARS}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL");
        let mut migrate = vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                    name VARBINARY(255) NOT NULL PRIMARY KEY, \
                    {owner_column}, \
                    fence BIGINT UNSIGNED NOT NULL, \
                    expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB"
            ),
            format!("ALTER TABLE {table} MODIFY {owner_column}"),
        ];
        match fence_source {
            FenceSource::Sequence => migrate.extend([
                format!("CREATE SEQUENCE IF NOT EXISTS {seq}"),
                format!(
                    "CREATE TABLE IF NOT EXISTS {gate} (\
                        id SMALLINT UNSIGNED NOT NULL PRIMARY KEY) ENGINE=InnoDB"
                ),
                format!(
                    "INSERT IGNORE INTO {gate} (id) VALUES {}",
                    (0..GATES)
                        .map(|id| format!("({id})"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ]),
            FenceSource::Counter => migrate.extend([
                format!(
                    "CREATE TABLE IF NOT EXISTS {counter} (\
                        id TINYINT UNSIGNED NOT NULL PRIMARY KEY, \
                        n BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"
                ),
                format!(
                    "INSERT INTO {counter} (id, n) VALUES (1, 0) ON DUPLICATE KEY UPDATE id = id"
                ),
            ]),
        }
        // One statement, and the row stays locked while it runs. The answer
        // comes back in LAST_INSERT_ID (in the OK packet, as MySQL has no
        // RETURNING): the new fence when the lease was free or expired,
        // BUSY_FLAG + the holder's remaining µs otherwise. Every condition
        // reads `expires_at`, which is assigned last.
        let LeaseTokens {
            first,
            next,
            hand_over: handed,
            release,
            leave_last,
        } = &lease;
        MySql {
            acquire: format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) \
                 VALUES (?, ?, {first}, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
                 ON DUPLICATE KEY UPDATE \
                   owner = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(owner), owner), \
                   fence = IF(expires_at <= UTC_TIMESTAMP(6), {next}, \
                       IF(LAST_INSERT_ID({BUSY_FLAG} + GREATEST(0, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at))) > 0, fence, fence)), \
                   expires_at = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(expires_at), expires_at)"
            )
            .into(),
            extend: format!(
                "UPDATE {table} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
                 WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
            )
            .into(),
            release: format!("{release} WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)")
                .into(),
            // The new fence comes back in LAST_INSERT_ID; `expires_at` is
            // assigned last (later assignments see earlier ones).
            hand_over: format!(
                "UPDATE {table} SET owner = ?, fence = {handed}, \
                     expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
                 WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
            )
            .into(),
            lease_status: format!(
                "SELECT CAST(fence AS SIGNED), \
                        CAST(CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000) AS SIGNED), \
                        owner \
                 FROM {table} WHERE name = ? AND expires_at > UTC_TIMESTAMP(6)"
            )
            .into(),
            // Readers: see the `lease` module. As in `acquire`, the answer
            // comes back in LAST_INSERT_ID, and the assignments run in
            // order: `fence` first decides (and the other two read the
            // decision back from LAST_INSERT_ID(), below BUSY_FLAG when the
            // reader joined); `owner` then sees the new fence, which is a
            // new group's epoch (a new row's group starts at its token, read
            // back the same way: the values are computed in order). While a
            // writer waits, the `SELECT` has no row: nothing is inserted or
            // updated (no row affected) and `LAST_INSERT_ID` is left as it
            // was. Binds: name, name (the gate), ttl, the waiting record's
            // row three times.
            share: format!(
                "INSERT INTO {table} (name, fence, owner, expires_at) \
                 SELECT ?, {first}, CONCAT({GROUP}, LAST_INSERT_ID(), ':1'), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
                 FROM DUAL WHERE NOT EXISTS \
                     (SELECT 1 FROM (SELECT expires_at FROM {table} WHERE name = ?) AS w \
                      WHERE w.expires_at > UTC_TIMESTAMP(6)) \
                 ON DUPLICATE KEY UPDATE \
                   fence = IF((expires_at <= UTC_TIMESTAMP(6) OR LEFT(owner, 2) = {GROUP}) AND NOT EXISTS \
                         (SELECT 1 FROM (SELECT expires_at FROM {table} WHERE name = ?) AS w \
                          WHERE w.expires_at > UTC_TIMESTAMP(6)), \
                       {next}, \
                       IF(LAST_INSERT_ID({BUSY_FLAG} + GREATEST(0, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), \
                           IFNULL((SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), w.expires_at) \
                                   FROM (SELECT expires_at FROM {table} WHERE name = ?) AS w), 0))) > 0, fence, fence)), \
                   owner = IF(LAST_INSERT_ID() < {BUSY_FLAG}, \
                       IF(expires_at <= UTC_TIMESTAMP(6), CONCAT({GROUP}, fence, ':1'), \
                          CONCAT(SUBSTRING_INDEX(owner, ':', 1), ':', {COUNT} + 1)), owner), \
                   expires_at = IF(LAST_INSERT_ID() < {BUSY_FLAG}, GREATEST(expires_at, VALUES(expires_at)), expires_at)"
            )
            .into(),
            extend_share: format!(
                "UPDATE {table} SET expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
                 WHERE name = ? AND expires_at > UTC_TIMESTAMP(6) AND {IN_GROUP}"
            )
            .into(),
            // `expires_at` first: both assignments read the old `owner`.
            leave: format!(
                "UPDATE {table} \
                 SET expires_at = IF({COUNT} > 1, expires_at, UTC_TIMESTAMP(6)), \
                     owner = IF({COUNT} > 1, CONCAT(SUBSTRING_INDEX(owner, ':', 1), ':', {COUNT} - 1), NULL) \
                 WHERE name = ? AND expires_at > UTC_TIMESTAMP(6) AND {IN_GROUP}"
            )
            .into(),
            leave_last: leave_last.as_deref().map(Arc::from),
            mark_waiting: format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) \
                 VALUES (?, ?, 0, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
                 ON DUPLICATE KEY UPDATE owner = VALUES(owner), expires_at = VALUES(expires_at)"
            )
            .into(),
            unmark_waiting: format!("DELETE FROM {table} WHERE name = ? AND owner = COALESCE(?, owner)").into(),
            ensure_row: format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) \
                 VALUES (?, NULL, 0, '1000-01-01 00:00:00') ON DUPLICATE KEY UPDATE name = name"
            )
            .into(),
            row_lock: format!(
                "SELECT CAST({row_token} AS SIGNED) FROM {table} WHERE name = ? FOR UPDATE"
            )
            .into(),
            row_try: format!(
                "SELECT CAST({row_token} AS SIGNED) FROM {table} WHERE name = ? FOR UPDATE NOWAIT"
            )
            .into(),
            // MariaDB spells the share lock `LOCK IN SHARE MODE` (with
            // NOWAIT); MySQL 8, whose tokens come from the counter, `FOR SHARE`.
            row_lock_shared: format!(
                "SELECT CAST({row_token} AS SIGNED) FROM {table} WHERE name = ? {share}",
                share = share_clause(fence_source, false)
            )
            .into(),
            row_try_shared: format!(
                "SELECT CAST({row_token} AS SIGNED) FROM {table} WHERE name = ? {share}",
                share = share_clause(fence_source, true)
            )
            .into(),
            row_free: format!("SELECT 1 FROM {table} WHERE name = ? FOR UPDATE SKIP LOCKED").into(),
            // The row, unless someone holds it (`SKIP LOCKED` passes over
            // it then, and does not wait); the derived table is MariaDB's
            // way to read the table a `DELETE` deletes from.
            row_delete: format!(
                "DELETE t FROM {table} AS t JOIN \
                 (SELECT name FROM {table} WHERE name = ? FOR UPDATE SKIP LOCKED) AS free USING (name)"
            )
            .into(),
            row_exists: format!("SELECT 1 FROM {table} WHERE name = ?").into(),
            row_free_slot: format!(
                "SELECT name, CAST({row_token} AS SIGNED) FROM {table} \
                 WHERE name IN ({{slots}}) LIMIT 1 FOR UPDATE SKIP LOCKED"
            ),
            rows_present: format!("SELECT name FROM {table} WHERE name IN ({{slots}})"),
            ensure_rows: format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) VALUES {{rows}} \
                 ON DUPLICATE KEY UPDATE name = name"
            ),
            named_lock: named_lock.into(),
            // The classic sequence of MySQL's manual; committed at once, so
            // no rollback can undo it.
            next_fence: format!("UPDATE {counter} SET n = LAST_INSERT_ID(n + 1) WHERE id = 1")
                .into(),
            fence_source,
            migrated,
            migrate,
            sequence_floor: (fence_source == FenceSource::Sequence).then(|| {
                (format!("SELECT CAST(COALESCE(MAX(fence), 0) AS SIGNED) FROM {table}"), seq)
            }),
        }
    }
}

/// Creates the lock table and the fencing counter if they are missing, on a
/// connection of its own. When they are all there it only reads: creating
/// them again, even `IF NOT EXISTS`, would wait for the holders of row locks.
pub(crate) async fn migrate(
    options: &MySqlConnectOptions,
    sql: &MySql,
    settings: &Settings,
) -> Result<()> {
    let mut conn = settings.connecting("connect", options.connect()).await?;
    settings
        .migrating(async {
            let mut in_place = true;
            for probe in &sql.migrated {
                let answer = sqlx::query(AssertSqlSafe(probe.as_str()))
                    .fetch_optional(&mut conn)
                    .await;
                if !matches!(answer, Ok(Some(_))) {
                    in_place = false;
                    break;
                }
            }
            if in_place {
                return Ok(());
            }
            for statement in &sql.migrate {
                sqlx::query(AssertSqlSafe(statement.as_str()))
                    .execute(&mut conn)
                    .await?;
            }
            if let Some((highest, seq)) = &sql.sequence_floor {
                let highest: i64 = sqlx::query_scalar(AssertSqlSafe(highest.as_str()))
                    .fetch_one(&mut conn)
                    .await?;
                // SETVAL takes a literal, and never lowers a sequence.
                if highest > 0 {
                    sqlx::query(AssertSqlSafe(format!("SELECT SETVAL({seq}, {highest})")))
                        .execute(&mut conn)
                        .await?;
                }
            }
            Ok(())
        })
        .await
}

/// How many gate rows a lock table has (see [`LeaseTokens`]).
const GATES: u32 = 64;

/// How `lease` mode draws tokens, and what a release leaves.
///
/// With a `SEQUENCE` (MariaDB), every token comes from it and released rows
/// are deleted, so names leave nothing behind. A grant's statement first
/// locks one of [`GATES`] gate rows (the name's, by `CRC32`) until it ends,
/// then draws: an insert computes its values before it learns whether the
/// row exists, and without the gate a grant and release of the same name by
/// others could come between a drawn token and the insert, which would
/// then store a token below theirs.
///
/// With the counter (MySQL), a row keeps its name's last token and counts
/// on from it, so released rows stay (a name's first token is 1). The gate's
/// bind is taken and ignored, so that both bind alike.
struct LeaseTokens {
    /// A new row's token, set as `LAST_INSERT_ID`; binds the name.
    first: String,
    /// The token of a row taken over, set as `LAST_INSERT_ID`.
    next: String,
    /// The token of a hand-over, set as `LAST_INSERT_ID`.
    hand_over: String,
    /// A release's statement up to its `WHERE`.
    release: String,
    /// Where rows are deleted: the last reader's leave (binds as `leave`),
    /// tried first; `leave` then counts a group down.
    leave_last: Option<String>,
}

impl LeaseTokens {
    fn new(source: FenceSource, table: &str, seq: &str, gate: &str) -> LeaseTokens {
        match source {
            FenceSource::Sequence => LeaseTokens {
                first: format!(
                    "LAST_INSERT_ID((SELECT NEXTVAL({seq}) FROM {gate} \
                     WHERE id = CRC32(?) % {GATES} FOR UPDATE))"
                ),
                next: "LAST_INSERT_ID(VALUES(fence))".to_owned(),
                hand_over: format!("LAST_INSERT_ID(NEXTVAL({seq}))"),
                release: format!("DELETE FROM {table}"),
                leave_last: Some(format!(
                    "DELETE FROM {table} \
                     WHERE name = ? AND expires_at > UTC_TIMESTAMP(6) AND {IN_GROUP} AND {COUNT} = 1"
                )),
            },
            FenceSource::Counter => LeaseTokens {
                first: "LAST_INSERT_ID(1 + 0 * CRC32(?))".to_owned(),
                next: "LAST_INSERT_ID(fence + 1)".to_owned(),
                hand_over: "LAST_INSERT_ID(fence + 1)".to_owned(),
                release: format!("UPDATE {table} SET owner = NULL, expires_at = UTC_TIMESTAMP(6)"),
                leave_last: None,
            },
        }
    }
}

/// The width of the owner column, in characters: an owner token, the
/// separator and a holder identity of at most 255 bytes.
const OWNER_CHARS: usize = 320;

/// What a lease upsert answered in `LAST_INSERT_ID`: the new fence, or
/// [`BUSY_FLAG`] plus the remaining wait in µs.
fn upsert_answer(answer: u64) -> sqlx::Result<Attempt<Option<FencingToken>>> {
    if answer >= BUSY_FLAG {
        Ok(Attempt::Busy {
            retry_after: Some(Duration::from_micros(answer - BUSY_FLAG)),
        })
    } else if answer > 0 {
        Ok(Attempt::Acquired(Some(FencingToken::new(answer))))
    } else {
        Err(sqlx::Error::Protocol(
            "the server returned no LAST_INSERT_ID for the lease upsert".into(),
        ))
    }
}

/// `lease` mode on MySQL/MariaDB.
#[derive(Debug)]
pub(crate) struct MyLease {
    pub(crate) sql: Arc<MySql>,
}

impl LeaseDialect for MyLease {
    type Db = sqlx::MySql;
    const CAPABILITIES: Capabilities = POLLED_LEASE_CAPABILITIES;

    /// Prepares the upsert, at no cost once the connection has it cached:
    /// sqlx-mysql does not keep track of a prepare it gave up.
    fn ready_acquire<'c>(&'c self, conn: &'c mut MySqlConnection) -> Answer<'c, ()> {
        Box::pin(async move {
            let sql = sqlx::SqlSafeStr::into_sql_str(q(&self.sql.acquire));
            sqlx::Executor::prepare(conn, sql).await.map(drop)
        })
    }

    fn acquire<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        name: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Attempt<Option<FencingToken>>> {
        Box::pin(async move {
            let done = sqlx::query(q(&self.sql.acquire))
                .bind(name.as_bytes())
                .bind(owner)
                .bind(name.as_bytes())
                .bind(micros(ttl))
                .execute(conn)
                .await?;
            upsert_answer(done.last_insert_id())
        })
    }

    fn extend<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        name: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, bool> {
        Box::pin(async move {
            let done = sqlx::query(q(&self.sql.extend))
                .bind(micros(ttl))
                .bind(name.as_bytes())
                .bind(owner)
                .execute(conn)
                .await?;
            Ok(done.rows_affected() >= 1)
        })
    }

    fn release<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        name: &'c str,
        owner: &'c str,
    ) -> Answer<'c, bool> {
        Box::pin(async move {
            let done = sqlx::query(q(&self.sql.release))
                .bind(name.as_bytes())
                .bind(owner)
                .execute(conn)
                .await?;
            Ok(done.rows_affected() >= 1)
        })
    }

    fn hand_over<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        name: &'c str,
        from: &'c str,
        to: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Option<i64>> {
        Box::pin(async move {
            let done = sqlx::query(q(&self.sql.hand_over))
                .bind(to)
                .bind(micros(ttl))
                .bind(name.as_bytes())
                .bind(from)
                .execute(conn)
                .await?;
            // Matched rows (sqlx asks for found rows): 1 when it was `from`'s.
            Ok((done.rows_affected() == 1).then(|| done.last_insert_id() as i64))
        })
    }

    fn status<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        name: &'c str,
    ) -> Answer<'c, Option<LiveRow>> {
        Box::pin(
            sqlx::query_as(q(&self.sql.lease_status))
                .bind(name.as_bytes())
                .fetch_optional(conn),
        )
    }

    fn share<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        name: &'c str,
        waiting: &'c str,
        ttl: Duration,
    ) -> Answer<'c, Attempt<Option<FencingToken>>> {
        Box::pin(async move {
            let done = sqlx::query(q(&self.sql.share))
                .bind(name.as_bytes())
                .bind(name.as_bytes())
                .bind(micros(ttl))
                .bind(waiting.as_bytes())
                .bind(waiting.as_bytes())
                .bind(waiting.as_bytes())
                .execute(conn)
                .await?;
            if done.rows_affected() == 0 {
                // A writer waits (see the statement).
                return Ok(Attempt::Busy { retry_after: None });
            }
            upsert_answer(done.last_insert_id())
        })
    }

    fn extend_share<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        name: &'c str,
        token: i64,
        ttl: Duration,
    ) -> Answer<'c, bool> {
        Box::pin(async move {
            let done = sqlx::query(q(&self.sql.extend_share))
                .bind(micros(ttl))
                .bind(name.as_bytes())
                .bind(token)
                .execute(conn)
                .await?;
            Ok(done.rows_affected() >= 1)
        })
    }

    fn leave<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        name: &'c str,
        token: i64,
    ) -> Answer<'c, bool> {
        Box::pin(async move {
            if let Some(last) = &self.sql.leave_last {
                let done = sqlx::query(q(last))
                    .bind(name.as_bytes())
                    .bind(token)
                    .execute(&mut *conn)
                    .await?;
                if done.rows_affected() >= 1 {
                    return Ok(true);
                }
            }
            let done = sqlx::query(q(&self.sql.leave))
                .bind(name.as_bytes())
                .bind(token)
                .execute(conn)
                .await?;
            Ok(done.rows_affected() >= 1)
        })
    }

    fn mark_waiting<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        waiting: &'c str,
        owner: &'c str,
        ttl: Duration,
    ) -> Answer<'c, ()> {
        Box::pin(async move {
            sqlx::query(q(&self.sql.mark_waiting))
                .bind(waiting.as_bytes())
                .bind(owner)
                .bind(micros(ttl))
                .execute(conn)
                .await
                .map(drop)
        })
    }

    fn unmark_waiting<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        _name: &'c str,
        waiting: &'c str,
        owner: Option<&'c str>,
    ) -> Answer<'c, ()> {
        Box::pin(async move {
            sqlx::query(q(&self.sql.unmark_waiting))
                .bind(waiting.as_bytes())
                .bind(owner)
                .execute(conn)
                .await
                .map(drop)
        })
    }
}

/// Which session mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MySqlSessionMode {
    /// `GET_LOCK` on the mapped name.
    Named,
    /// `SELECT … FOR UPDATE` on the name's row, in an open transaction.
    Row,
}

/// MySQL/MariaDB session locks on dedicated connections.
#[derive(Debug)]
pub(crate) struct MySqlSession {
    pub(crate) options: MySqlConnectOptions,
    pub(crate) pool: MySqlPool,
    pub(crate) sql: Arc<MySql>,
    pub(crate) mode: MySqlSessionMode,
    pub(crate) settings: Settings,
}

/// A dedicated connection, its server-side id (for `KILL QUERY`) and the
/// `innodb_lock_wait_timeout` currently set on it.
pub(crate) struct MyConn {
    conn: MySqlConnection,
    id: u64,
    lock_wait_secs: Option<u64>,
}

/// The share-lock clause of a locking read.
fn share_clause(fence_source: FenceSource, no_wait: bool) -> &'static str {
    match (fence_source, no_wait) {
        (FenceSource::Sequence, false) => "LOCK IN SHARE MODE",
        (FenceSource::Sequence, true) => "LOCK IN SHARE MODE NOWAIT",
        (FenceSource::Counter, false) => "FOR SHARE",
        (FenceSource::Counter, true) => "FOR SHARE NOWAIT",
    }
}

/// The key of a holding in a session mode.
#[derive(Debug)]
pub(crate) enum MyKey {
    /// The `GET_LOCK` name (see [`named_lock_name`](crate::named_lock_name)).
    Named(String),
    /// The `GET_LOCK` names of a semaphore's permit slots (see
    /// [`semaphore_slot_name`](crate::semaphore_slot_name)), and the slot
    /// taken, once granted.
    NamedSlots {
        slots: Vec<String>,
        taken: AtomicUsize,
    },
    /// The row's name, and whether the lock is the share lock.
    Row { name: String, shared: bool },
    /// The rows of a semaphore's permit slots (see
    /// [`permit_row_name`](crate::lease::permit_row_name)), and the slot
    /// taken, once granted.
    RowSlots {
        slots: Vec<String>,
        taken: AtomicUsize,
    },
}

impl MyKey {
    /// The `GET_LOCK` name this holding holds, for a named one.
    fn held_name(&self) -> Option<&str> {
        match self {
            MyKey::Named(name) => Some(name),
            MyKey::NamedSlots { slots, taken } => {
                slots.get(taken.load(Ordering::SeqCst)).map(String::as_str)
            }
            MyKey::Row { .. } | MyKey::RowSlots { .. } => None,
        }
    }
}

impl MySqlSession {
    async fn next_fence(&self, conn: &mut MySqlConnection) -> sqlx::Result<u64> {
        let done = sqlx::query(q(&self.sql.next_fence)).execute(conn).await?;
        Ok(done.last_insert_id())
    }

    async fn lock_named(
        &self,
        conn: &mut MyConn,
        name: &str,
        wait: ServerWait,
    ) -> sqlx::Result<Option<u64>> {
        let seconds = match wait {
            ServerWait::NoWait => 0.0,
            ServerWait::For(left) => left.as_secs_f64(),
            // MariaDB answers NULL to a negative (MySQL: infinite) timeout.
            ServerWait::Forever => FOREVER_SECS,
        };
        // Sequence: the token, or 0 (timed out). Counter: 1 or 0.
        let got: Option<i64> = sqlx::query_scalar(q(&self.sql.named_lock))
            .bind(name)
            .bind(seconds)
            .fetch_one(&mut conn.conn)
            .await?;
        match (got, self.sql.fence_source) {
            (Some(0), _) => Ok(None),
            (Some(token), FenceSource::Sequence) => Ok(Some(token as u64)),
            (Some(_), FenceSource::Counter) => self.next_fence(&mut conn.conn).await.map(Some),
            (None, _) => Err(sqlx::Error::Protocol(
                "GET_LOCK returned NULL (the wait was killed or failed)".into(),
            )),
        }
    }

    /// A permit: the slots' `GET_LOCK` names as [`SlotPlan`] says.
    async fn lock_slot(
        &self,
        conn: &mut MyConn,
        slots: &[String],
        taken: &AtomicUsize,
        wait: ServerWait,
    ) -> sqlx::Result<Option<u64>> {
        let plan = SlotPlan::new(slots.len());
        for slot in plan.order() {
            let granted = self.lock_named(conn, &slots[slot], ServerWait::NoWait);
            if let Some(fence) = granted.await? {
                taken.store(slot, Ordering::SeqCst);
                return Ok(Some(fence));
            }
        }
        let (slot, Some(slice)) = (plan.first(), wait.slice()) else {
            return Ok(None);
        };
        let fence = self.lock_named(conn, &slots[slot], slice).await?;
        if fence.is_some() {
            taken.store(slot, Ordering::SeqCst);
        }
        Ok(fence)
    }

    /// Sets the server's wait for the row lock: whole seconds, at least 1
    /// (the client cuts the wait at the deadline when the server would wait
    /// longer).
    async fn set_row_wait(&self, conn: &mut MyConn, wait: ServerWait) -> sqlx::Result<()> {
        match wait {
            ServerWait::NoWait => Ok(()),
            ServerWait::For(left) => {
                self.set_lock_wait(conn, left.as_secs() + u64::from(left.subsec_nanos() > 0))
                    .await
            }
            ServerWait::Forever => self.set_lock_wait(conn, 1_073_741_824).await,
        }
    }

    async fn next_fence_on_pool(&self) -> sqlx::Result<u64> {
        let mut conn = self.pool.acquire().await?;
        self.next_fence(&mut conn).await
    }

    async fn set_lock_wait(&self, conn: &mut MyConn, seconds: u64) -> sqlx::Result<()> {
        let seconds = seconds.clamp(1, 1_073_741_824);
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

impl MySqlSession {
    /// Whether `name`'s row exists and cannot be locked.
    async fn row_held(&self, name: &str) -> Result<bool> {
        self.settings
            .bounded("read the lock's status", async {
                let mut tx = self.pool.begin().await?;
                let free: Option<i32> = sqlx::query_scalar(q(&self.sql.row_free))
                    .bind(name.as_bytes())
                    .fetch_optional(&mut *tx)
                    .await?;
                let held = match free {
                    Some(_) => false,
                    None => sqlx::query_scalar::<_, i32>(q(&self.sql.row_exists))
                        .bind(name.as_bytes())
                        .fetch_optional(&mut *tx)
                        .await?
                        .is_some(),
                };
                tx.rollback().await?;
                Ok(held)
            })
            .await
    }
}

/// `n` comma-separated placeholders.
fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

impl MySqlSession {
    /// A permit in `row` mode: a free slot row if there is one, otherwise a
    /// wait on one slot for a slice, as [`SlotPlan`] says.
    async fn lock_row_slot(
        &self,
        conn: &mut MyConn,
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
        self.set_row_wait(conn, slice).await?;
        let token = lock_row(self, conn, &slots[slot], false, false).await?;
        if token.is_some() {
            taken.store(slot, Ordering::SeqCst);
        }
        Ok(token)
    }
}

impl RowLocking for MySqlSession {
    type Db = sqlx::MySql;
    type Conn = MyConn;

    fn connection(conn: &mut MyConn) -> &mut <sqlx::MySql as sqlx::Database>::Connection {
        &mut conn.conn
    }

    fn select<'c>(
        &'c self,
        conn: &'c mut MyConn,
        name: &'c str,
        no_wait: bool,
        shared: bool,
    ) -> RowAnswer<'c, Option<i64>> {
        let statement = match (shared, no_wait) {
            (false, true) => &self.sql.row_try,
            (false, false) => &self.sql.row_lock,
            (true, true) => &self.sql.row_try_shared,
            (true, false) => &self.sql.row_lock_shared,
        };
        Box::pin(
            sqlx::query_scalar(q(statement))
                .bind(name.as_bytes())
                .fetch_optional(&mut conn.conn),
        )
    }

    fn delete_if_free<'c>(&'c self, conn: &'c mut MyConn, name: &'c str) -> RowAnswer<'c, ()> {
        Box::pin(async move {
            sqlx::query(q(&self.sql.row_delete))
                .bind(name.as_bytes())
                .execute(&mut conn.conn)
                .await
                .map(drop)
        })
    }

    /// The upsert waits for a holder's row lock, so a plain (consistent)
    /// read, which waits for none, first finds out whether the row is
    /// missing.
    fn make_missing_row<'c>(&'c self, name: &'c str) -> RowAnswer<'c, ()> {
        Box::pin(async move {
            let found: Option<i32> = sqlx::query_scalar(q(&self.sql.row_exists))
                .bind(name.as_bytes())
                .fetch_optional(&self.pool)
                .await?;
            if found.is_none() {
                self.ensure_row(name).await?;
            }
            Ok(())
        })
    }

    fn ensure_row<'c>(&'c self, name: &'c str) -> RowAnswer<'c, ()> {
        Box::pin(async move {
            sqlx::query(q(&self.sql.ensure_row))
                .bind(name.as_bytes())
                .execute(&self.pool)
                .await
                .map(drop)
        })
    }

    /// The `IN` list has one placeholder per slot (at most
    /// [`MAX_SLOT_PERMITS`](crate::MAX_SLOT_PERMITS)).
    fn select_free<'c>(
        &'c self,
        conn: &'c mut MyConn,
        names: &'c [String],
    ) -> RowAnswer<'c, Option<(String, i64)>> {
        Box::pin(async move {
            let sql = self
                .sql
                .row_free_slot
                .replace("{slots}", &placeholders(names.len()));
            let mut query = sqlx::query_as::<_, (Vec<u8>, i64)>(AssertSqlSafe(sql));
            for name in names {
                query = query.bind(name.as_bytes());
            }
            let row = query.fetch_optional(&mut conn.conn).await?;
            row.map(|(name, token)| {
                String::from_utf8(name)
                    .map(|name| (name, token))
                    .map_err(|error| sqlx::Error::Decode(Box::new(error)))
            })
            .transpose()
        })
    }

    /// Only the rows missing from a plain read: InnoDB's duplicate check of
    /// an `INSERT` waits for the row lock of a held slot.
    fn ensure_rows<'c>(&'c self, names: &'c [String]) -> RowAnswer<'c, ()> {
        Box::pin(async move {
            let sql = self
                .sql
                .rows_present
                .replace("{slots}", &placeholders(names.len()));
            let mut present = sqlx::query_scalar::<_, Vec<u8>>(AssertSqlSafe(sql));
            for name in names {
                present = present.bind(name.as_bytes());
            }
            let present = present.fetch_all(&self.pool).await?;
            let missing: Vec<&String> = names
                .iter()
                .filter(|name| !present.iter().any(|p| p == name.as_bytes()))
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            let rows = vec!["(?, NULL, 0, '1000-01-01 00:00:00')"; missing.len()].join(", ");
            let sql = self.sql.ensure_rows.replace("{rows}", &rows);
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for name in missing {
                query = query.bind(name.as_bytes());
            }
            query.execute(&self.pool).await.map(drop)
        })
    }

    /// With a sequence the `SELECT` drew the token. With the counter it is
    /// drawn now, on the pool, so the counter's row lock is not held for
    /// the whole holding and a rollback cannot undo it.
    fn granted<'c>(&'c self, _conn: &'c mut MyConn, token: i64) -> RowAnswer<'c, i64> {
        Box::pin(async move {
            match self.sql.fence_source {
                FenceSource::Sequence => Ok(token),
                FenceSource::Counter => self.next_fence_on_pool().await.map(|n| n as i64),
            }
        })
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
        match self.mode {
            MySqlSessionMode::Named => NAMED_CAPABILITIES,
            MySqlSessionMode::Row => MYSQL_ROW_CAPABILITIES,
        }
    }

    fn key(&self, name: &str, kind: LockKind) -> Result<MyKey> {
        if let LockKind::Semaphore { permits } = kind {
            check_slot_permits(self.settings.backend, permits)?;
        }
        Ok(match (self.mode, kind) {
            (MySqlSessionMode::Row, LockKind::Semaphore { permits }) => MyKey::RowSlots {
                slots: (0..permits)
                    .map(|slot| permit_row_name(name, slot))
                    .collect(),
                taken: AtomicUsize::new(0),
            },
            (MySqlSessionMode::Row, kind) => MyKey::Row {
                name: name.to_owned(),
                shared: kind == LockKind::Shared,
            },
            (_, LockKind::Semaphore { permits }) => MyKey::NamedSlots {
                slots: (0..permits)
                    .map(|slot| semaphore_slot_name(name, slot))
                    .collect(),
                taken: AtomicUsize::new(0),
            },
            _ => MyKey::Named(named_lock_name(name).into_owned()),
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
        // Row locks only, no gap locks: under InnoDB's default REPEATABLE
        // READ, the scan of a semaphore's slot rows (`SKIP LOCKED`) locks the
        // gaps around them for as long as a permit is held, and an insert of
        // another name's row into such a gap (a lock's first use) would wait
        // for the permit.
        self.settings
            .bounded(
                "set the isolation level",
                sqlx::raw_sql("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .execute(&mut conn),
            )
            .await?;
        Ok(MyConn {
            conn,
            id,
            lock_wait_secs: None,
        })
    }

    async fn lock(&self, conn: &mut MyConn, key: &MyKey, wait: ServerWait) -> Result<Locked> {
        let locked = match key {
            MyKey::Named(name) => self.lock_named(conn, name, wait).await,
            MyKey::NamedSlots { slots, taken } => self.lock_slot(conn, slots, taken, wait).await,
            MyKey::RowSlots { slots, taken } => self
                .lock_row_slot(conn, slots, taken, wait)
                .await
                .map(|token| token.map(|t| t as u64)),
            MyKey::Row { name, shared } => match self.set_row_wait(conn, wait).await {
                Ok(()) => lock_row(self, conn, name, wait == ServerWait::NoWait, *shared)
                    .await
                    .map(|token| token.map(|t| t as u64)),
                Err(error) => Err(error),
            },
        };
        match locked {
            Ok(Some(fence)) => Ok(Locked::Granted(FencingToken::new(fence))),
            Ok(None) => Ok(Locked::Busy),
            Err(error) => Err(self.settings.error("lock", error)),
        }
    }

    async fn unlock(&self, conn: &mut MyConn, key: &MyKey) -> Result<bool> {
        let unlocked = match key {
            MyKey::Named(_) | MyKey::NamedSlots { .. } => match key.held_name() {
                Some(name) => {
                    sqlx::query_scalar::<_, Option<i64>>("SELECT CAST(RELEASE_LOCK(?) AS SIGNED)")
                        .bind(name)
                        .fetch_one(&mut conn.conn)
                        .await
                        .map(|released| released == Some(1))
                }
                None => Ok(false),
            },
            MyKey::Row { name, .. } => unlock_row(self, conn, name).await,
            MyKey::RowSlots { slots, taken } => {
                unlock_row(self, conn, &slots[taken.load(Ordering::SeqCst)]).await
            }
        };
        unlocked.map_err(|error| self.settings.error("unlock", error))
    }

    async fn ping(&self, conn: &mut MyConn, key: &MyKey) -> Result<bool> {
        let alive = match key.held_name() {
            // Also proves that this connection still owns the lock.
            Some(name) => sqlx::query_scalar::<_, Option<i64>>(
                "SELECT CAST(IS_USED_LOCK(?) = CONNECTION_ID() AS SIGNED)",
            )
            .bind(name)
            .fetch_one(&mut conn.conn)
            .await
            .map(|owned| owned == Some(1)),
            None => sqlx::raw_sql("SELECT 1")
                .execute(&mut conn.conn)
                .await
                .map(|_| true),
        };
        alive.map_err(|error| self.settings.error("liveness check", error))
    }

    /// Named: `IS_USED_LOCK`. Row: whether the row exists and cannot be
    /// locked (`FOR UPDATE SKIP LOCKED`, MySQL 8 / MariaDB 10.6), in a
    /// transaction that is rolled back at once.
    async fn status(&self, key: &MyKey) -> Result<LockStatus> {
        let what = "read the lock's status";
        let held = match key {
            MyKey::NamedSlots { slots, .. } => {
                // One query: the number of slots whose name is in use.
                let sql = vec!["(IS_USED_LOCK(?) IS NOT NULL)"; slots.len()].join(" + ");
                let query = format!("SELECT CAST({sql} AS SIGNED)");
                let mut count = sqlx::query_scalar::<_, i64>(AssertSqlSafe(query));
                for slot in slots {
                    count = count.bind(slot);
                }
                let holders = self
                    .settings
                    .bounded(what, count.fetch_one(&self.pool))
                    .await?;
                return Ok(if holders > 0 {
                    LockStatus::held().with_holders(Some(holders as usize))
                } else {
                    LockStatus::free()
                });
            }
            MyKey::Named(name) => {
                let held: Option<i64> = self
                    .settings
                    .bounded(
                        what,
                        sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) IS NOT NULL AS SIGNED)")
                            .bind(name)
                            .fetch_one(&self.pool),
                    )
                    .await?;
                held == Some(1)
            }
            MyKey::Row { name, .. } => self.row_held(name).await?,
            MyKey::RowSlots { slots, .. } => {
                let mut holders = 0;
                for slot in slots {
                    holders += usize::from(self.row_held(slot).await?);
                }
                return Ok(match holders {
                    0 => LockStatus::free(),
                    n => LockStatus::held().with_holders(Some(n)),
                });
            }
        };
        Ok(if held {
            LockStatus::held()
        } else {
            LockStatus::free()
        })
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
            let kill = sqlx::raw_sql(AssertSqlSafe(format!("KILL QUERY {id}"))).execute(&pool);
            match tokio::time::timeout(limit, kill).await {
                Ok(Ok(_)) => tracing::debug!(connection = id, "killed an abandoned lock wait"),
                // Unknown thread id: the connection is already gone.
                Ok(Err(error)) => tracing::trace!(connection = id, %error, "KILL QUERY"),
                Err(_) => tracing::warn!(connection = id, "KILL QUERY got no answer"),
            }
        });
    }
}
