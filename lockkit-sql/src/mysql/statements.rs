//! Every SQL text of one lock table on MySQL and MariaDB, built once from
//! its validated name and where the server draws tokens from.

use std::sync::Arc;

use lockkit_core::backend::Intent;

use crate::lease::Param::{Client, Name, Owner, To, Token, Ttl, Waiting};
use crate::lease::{LeaseSql, LeaseStatements};
use crate::session::LockingSql;

/// How a record's upsert takes over an earlier record of its row (a
/// crashed holder's, whose lease may still run): the lease rows' `record`
/// statement (a waiting writer's, a holder identity's) and the one a
/// `named` lock sends with it.
const RECORD_TAKEN_OVER: &str =
    "ON DUPLICATE KEY UPDATE owner = VALUES(owner), expires_at = VALUES(expires_at)";

/// The prefix of a reader group's owner (see the `lease` module).
const GROUP: &str = "CONCAT(CHAR(1), 'r')";

/// The reader count in a group's `owner`.
const COUNT: &str = "CAST(SUBSTRING_INDEX(owner, ':', -1) AS UNSIGNED)";

/// Whether the row is a reader group that started at or before the bound
/// token.
const IN_GROUP: &str = "LEFT(owner, 2) = CONCAT(CHAR(1), 'r') \
    AND CAST(SUBSTRING(SUBSTRING_INDEX(owner, ':', 1), 3) AS UNSIGNED) <= ?";

/// The release bell mark of the bound name (see `bells`): the row
/// `\x01bell:<hash>`, `<hash>` being the name's side-row hash
/// (`lease::bell_mark_row`), found by its key alone (a range would lock
/// the row after it, which may be another name's, and deadlock concurrent
/// releases).
const BELL_MARK: &str = "b.name = CONCAT(CHAR(1), 'bell:', LEFT(SHA2(?, 256), 40))";

/// How long a release bell mark lasts without being renewed (s): well
/// beyond one sleep of the bell, which renews it.
pub(super) const BELL_MARK_SECS: u32 = 5;

/// How many sleepers a release wakes at most (see `bells`).
pub(super) const RUNG: u32 = 2;

/// The owner of a row that a release left to the other clients (followed
/// by the releasing client, see `MyLease::release`): no owner token starts
/// with `\x01`.
const NOT_FOR: &str = "CONCAT(CHAR(1), 'not:')";

/// Whether the row may be taken by the client bound here: its lease ran
/// out, or a release left it to the other clients and this is one of them.
const FREE: &str = "(expires_at <= UTC_TIMESTAMP(6) \
    OR (LEFT(owner, 5) = CONCAT(CHAR(1), 'not:') AND owner <> CONCAT(CHAR(1), 'not:', ?)))";

/// How long a row that a release left to the other clients stays theirs
/// (ms): the clients it wakes ask at once; should none of them ask within
/// this time (they stopped waiting meanwhile), the releasing client may
/// take the row again.
pub(super) const RESERVED_MS: u32 = 500;

/// Added to the holder's remaining lease (in µs) to tell a busy answer from
/// a fencing token in `LAST_INSERT_ID` (tokens stay far below it).
pub(super) const BUSY_FLAG: u64 = 1 << 62;

/// The server-side wait of an `acquire` that waits forever: a year.
pub(super) const FOREVER_SECS: f64 = 365.0 * 24.0 * 3600.0;

/// Where `row` and `named` mode draw their fencing tokens from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FenceSource {
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
    pub(super) fn for_version(version: &str) -> FenceSource {
        let mut numbers = version.split(['.', '-']).map(|n| n.parse::<u32>().ok());
        let (major, minor) = (numbers.next().flatten(), numbers.next().flatten());
        match (is_mariadb(version), major, minor) {
            (true, Some(major), Some(minor)) if (major, minor) >= (10, 3) => FenceSource::Sequence,
            _ => FenceSource::Counter,
        }
    }
}

/// Whether `SELECT VERSION()`'s answer is a MariaDB server's.
pub(super) fn is_mariadb(version: &str) -> bool {
    version.contains("MariaDB")
}

/// This session's connection id, as a signed integer.
pub(super) const CONNECTION_ID: &str = "SELECT CAST(CONNECTION_ID() AS SIGNED)";

/// The statements of one lock table, built once from the validated table name.
#[derive(Debug)]
pub(super) struct MySql {
    /// The statements the lease engine runs as they are.
    pub(super) lease: LeaseStatements,
    /// The row of a name inserted where it is missing, in two forms (see
    /// [`make_row`](Self::make_row)): for an attempt that waits, then for a
    /// try.
    make_rows: [Arc<str>; 2],
    /// `row` mode's lock, with its token.
    pub(super) row: LockingSql,
    pub(super) row_free: Arc<str>,
    pub(super) row_delete: Arc<str>,
    pub(super) row_exists: Arc<str>,
    /// With `{slots}` to replace by one placeholder per slot.
    pub(super) row_free_slot: String,
    /// One slot's row and its token, unless someone holds it: `?` the
    /// slot's name (see [`row_free_slot`](Self::row_free_slot)).
    pub(super) row_free_one: String,
    /// With `{slots}` to replace by one placeholder per slot.
    pub(super) rows_present: String,
    /// With `{rows}` to replace by one `VALUES` row per name.
    pub(super) ensure_rows: String,
    pub(super) named_lock: Arc<str>,
    /// A holder identity's record written with a `named` lock, in the same
    /// message (see `session`): the upsert of a lease record (see `lease`)
    /// of row `{row}`, owner `{owner}`, for `{ttl}` µs, made only if this
    /// connection holds the `GET_LOCK` name `{name}`. With the literals in
    /// place of `{…}`.
    pub(super) named_record: String,
    /// A holder identity's record deleted with a `named` unlock, in the same
    /// message, if it is still the holding's: row `{row}`, owner `{owner}`.
    pub(super) named_forget: String,
    /// The release bell marks of a name (see `bells`), made or renewed for
    /// [`BELL_MARK_SECS`]: the name's mark (binds its row name), and the
    /// row of this client's sleeper (binds its row name and the sleeper's
    /// connection id, kept as the row's `fence`).
    pub(super) bell_mark: Arc<str>,
    /// The name's release bell mark alone, made or renewed for
    /// [`BELL_MARK_SECS`] (binds its row name): a sleeper's row is made
    /// only by [`bell_mark`](Self::bell_mark), so that a row a release
    /// claimed is never made again unseen.
    pub(super) bell_mark_name: Arc<str>,
    /// A sleeper's row renewed for [`BELL_MARK_SECS`], if it is there (binds
    /// its row name): one changed row, or none once a release claimed it.
    pub(super) bell_renew: Arc<str>,
    /// The connection ids of up to [`RUNG`] sleepers of other clients on a
    /// name's bell, the one that marked least recently (the longest asleep)
    /// first: binds the first and the past row name of the name's sleeper
    /// rows, then this client's own. With a `SEQUENCE` (MariaDB), the rows
    /// are claimed: deleted, their ids returned (`DELETE … RETURNING`), so
    /// that two releases never wake the same sleeper (it marks again before
    /// it sleeps again); elsewhere (MySQL has no `RETURNING`) a plain read.
    pub(super) bell_sleepers: Arc<str>,
    /// A sleeper's row deleted as it stops; binds the row name.
    pub(super) bell_unmark: Arc<str>,
    /// The sleeper rows of a name that ran out (their clients stopped
    /// without deleting them) deleted; binds the first and the past row
    /// name of the name's sleeper rows.
    pub(super) bell_sweep: Arc<str>,
    /// The owner's release that also clears the name's live release bell
    /// mark: what a release runs when the mark's sleepers are all this
    /// client's.
    pub(super) release_marked: LeaseSql,
    /// The owner's release that leaves the row to the other clients for
    /// [`RESERVED_MS`] (see `MyLease::release`).
    pub(super) reserve: LeaseSql,
    /// `Counter` only: the `UPDATE` that draws a token.
    pub(super) next_fence: Arc<str>,
    pub(super) fence_source: FenceSource,
    /// Whether the session modes' grants draw tokens: without, their lock
    /// statements answer 1 for a grant (see [`draws_after_grant`](Self::draws_after_grant)).
    pub(super) tokens: bool,
    /// Queries that each answer a row only when the schema is in place.
    pub(super) migrated: Vec<String>,
    pub(super) migrate: Vec<String>,
    /// `Sequence` only: the highest token stored in the table, and the
    /// sequence to raise to it (a table of an earlier version kept a token
    /// per row, counted apart from the sequence).
    pub(super) sequence_floor: Option<(String, String)>,
}

impl MySql {
    /// The statement that inserts a name's row where it is missing, for an
    /// attempt with `intent`. An attempt that waits makes it from a plain
    /// read, which does not wait for the row's holder: on MariaDB, a
    /// statement that gave up a lock wait on the held row (the upsert
    /// that a try sends) before the locking `SELECT` queued made the
    /// handoff to that waiter about one and a half times the server's own
    /// (the MariaDB `row` handoff of docs/reports/sql.md, up to 5464ecd).
    pub(super) fn make_row(&self, intent: Intent) -> &Arc<str> {
        &self.make_rows[usize::from(intent == Intent::Try)]
    }

    /// Whether a session-mode grant draws its token after the lock
    /// statement, from the counter: with tokens, on MySQL (a sequence draws
    /// inside the statement).
    pub(super) fn draws_after_grant(&self) -> bool {
        self.tokens && self.fence_source == FenceSource::Counter
    }

    /// `table` must have passed [`validate_table`](crate::validate_table).
    /// With `tokens` false, the session modes' lock statements draw no
    /// token (see [`Settings::fencing`](crate::settings::Settings)).
    pub(super) fn new(table: &str, fence_source: FenceSource, tokens: bool) -> Self {
        let counter = format!("{table}_fence");
        let seq = format!("{table}_fence_seq");
        let gate = format!("{table}_gate");
        let lease = LeaseTokens::new(fence_source, table, &seq, &gate);
        // The token is computed only for a granted lock: a row is returned
        // (and its select list evaluated) once its lock is granted, and CASE
        // evaluates NEXTVAL only when GET_LOCK answered 1. Both forms answer
        // a signed integer (`GET_LOCK`'s, or the `BIGINT` of a sequence),
        // which sqlx reads as an `i64` of any width: no `CAST`, which the
        // server would evaluate on every grant.
        let (row_token, named_lock) = match fence_source {
            _ if !tokens => ("1".to_owned(), "SELECT GET_LOCK(?, ?)".to_owned()),
            FenceSource::Sequence => (
                format!("NEXTVAL({seq})"),
                format!("SELECT CASE GET_LOCK(?, ?) WHEN 1 THEN NEXTVAL({seq}) WHEN 0 THEN 0 END"),
            ),
            FenceSource::Counter => ("0".to_owned(), "SELECT GET_LOCK(?, ?)".to_owned()),
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
            release_free,
            release_marked,
            leave_last,
        } = &lease;
        MySql {
            lease: LeaseStatements {
                // The new fence comes back in LAST_INSERT_ID; `expires_at` is
                // assigned last (later assignments see earlier ones).
                hand_over: LeaseSql::new(format!(
                "UPDATE {table} SET owner = ?, fence = {handed}, \
                     expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
                 WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
            ), &[To, Ttl, Name, Owner]),
                acquire: LeaseSql::new(format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) \
                 VALUES (?, ?, {first}, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
                 ON DUPLICATE KEY UPDATE \
                   fence = IF({FREE}, {next}, \
                       IF(LAST_INSERT_ID({BUSY_FLAG} + GREATEST(0, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at))) > 0, fence, fence)), \
                   owner = IF(LAST_INSERT_ID() < {BUSY_FLAG}, VALUES(owner), owner), \
                   expires_at = IF(LAST_INSERT_ID() < {BUSY_FLAG}, VALUES(expires_at), expires_at)"
            ), &[Name, Owner, Name, Ttl, Client]),
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
                share: LeaseSql::new(format!(
                "INSERT INTO {table} (name, fence, owner, expires_at) \
                 SELECT ?, {first}, CONCAT({GROUP}, LAST_INSERT_ID(), ':1'), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
                 FROM DUAL WHERE NOT EXISTS \
                     (SELECT 1 FROM (SELECT expires_at FROM {table} WHERE name = ?) AS w \
                      WHERE w.expires_at > UTC_TIMESTAMP(6)) \
                 ON DUPLICATE KEY UPDATE \
                   fence = IF(({FREE} OR LEFT(owner, 2) = {GROUP}) AND NOT EXISTS \
                         (SELECT 1 FROM (SELECT expires_at FROM {table} WHERE name = ?) AS w \
                          WHERE w.expires_at > UTC_TIMESTAMP(6)), \
                       {next}, \
                       IF(LAST_INSERT_ID({BUSY_FLAG} + GREATEST(0, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), \
                           IFNULL((SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), w.expires_at) \
                                   FROM (SELECT expires_at FROM {table} WHERE name = ?) AS w), 0))) > 0, fence, fence)), \
                   owner = IF(LAST_INSERT_ID() < {BUSY_FLAG}, \
                       IF(LEFT(owner, 2) = {GROUP} AND expires_at > UTC_TIMESTAMP(6), \
                          CONCAT(SUBSTRING_INDEX(owner, ':', 1), ':', {COUNT} + 1), CONCAT({GROUP}, fence, ':1')), owner), \
                   expires_at = IF(LAST_INSERT_ID() < {BUSY_FLAG}, GREATEST(expires_at, VALUES(expires_at)), expires_at)"
            ), &[Name, Name, Ttl, Waiting, Client, Waiting, Waiting]),
                extend: LeaseSql::new(format!(
                "UPDATE {table} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
                 WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
            ), &[Ttl, Name, Owner]),
                // With a live release bell mark, nothing: `MyLease::release`
                // then runs `reserve` or `release_marked`.
                release: vec![LeaseSql::new(release_free.clone(), &[Name, Name, Owner])],
                purge: LeaseSql::new(format!("{release} WHERE name = ? AND owner = ? AND expires_at <= UTC_TIMESTAMP(6)"), &[Name, Owner]),
                status: LeaseSql::new(format!(
                "SELECT CAST(fence AS SIGNED), \
                        CAST(CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000) AS SIGNED), \
                        owner \
                 FROM {table} WHERE name = ? AND expires_at > UTC_TIMESTAMP(6) \
                   AND (owner IS NULL OR LEFT(owner, 5) <> {NOT_FOR})"
            ), &[Name]),
                extend_share: LeaseSql::new(format!(
                "UPDATE {table} SET expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
                 WHERE name = ? AND expires_at > UTC_TIMESTAMP(6) AND {IN_GROUP}"
            ), &[Ttl, Name, Token]),
                // The last reader deletes the row where rows are deleted
                // (tried first); `expires_at` first: both assignments read
                // the old `owner`.
                leave: leave_last.iter().map(|last| LeaseSql::new(last.clone(), &[Name, Token])).chain([LeaseSql::new(format!(
                "UPDATE {table} \
                 SET expires_at = IF({COUNT} > 1, expires_at, UTC_TIMESTAMP(6)), \
                     owner = IF({COUNT} > 1, CONCAT(SUBSTRING_INDEX(owner, ':', 1), ':', {COUNT} - 1), NULL) \
                 WHERE name = ? AND expires_at > UTC_TIMESTAMP(6) AND {IN_GROUP}"
            ), &[Name, Token])]).collect(),
                record: LeaseSql::new(format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) \
                 VALUES (?, ?, 0, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
                 {RECORD_TAKEN_OVER}"
            ), &[Name, Owner, Ttl]),
                forget: LeaseSql::new(format!("DELETE FROM {table} WHERE name = ? AND owner = COALESCE(?, owner)"), &[Name, Owner]),
                channel: String::new(),
                client: format!("{:016x}", fastrand::u64(..)),
            },

            make_rows: {
                // A plain read that finds no row, then the insert (under
                // `READ COMMITTED` the read takes no lock). Its duplicate
                // check, of a row that appeared after the read, waits for
                // that row's holder, as an upsert would for any.
                let from_read = format!(
                    "INSERT INTO {table} (name, owner, fence, expires_at) \
                     SELECT ?, NULL, 0, '1000-01-01 00:00:00' FROM DUAL \
                     WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE name = ?) \
                     ON DUPLICATE KEY UPDATE name = {table}.name"
                );
                let to_try = match fence_source {
                    // An upsert whose duplicate check gives up at once on a
                    // held row (lock wait timeout 0, MariaDB 10.3 and
                    // later): a try that finds the row held fails without
                    // a wait.
                    FenceSource::Sequence => format!(
                        "SET STATEMENT innodb_lock_wait_timeout = 0 FOR \
                         INSERT INTO {table} (name, owner, fence, expires_at) \
                         VALUES (?, NULL, 0, '1000-01-01 00:00:00') \
                         ON DUPLICATE KEY UPDATE name = name"
                    ),
                    // MySQL's least wait is a second.
                    FenceSource::Counter => from_read.clone(),
                };
                [from_read.into(), to_try.into()]
            },
            // MariaDB spells the share lock `LOCK IN SHARE MODE` (with
            // NOWAIT); MySQL 8, whose tokens come from the counter, `FOR SHARE`.
            row: LockingSql::of(|shared, intent| {
                let lock = lock_clause(fence_source, shared, intent);
                format!("SELECT CAST({row_token} AS SIGNED) FROM {table} WHERE name = ? {lock}")
            }),
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
            row_free_one: format!(
                "SELECT CAST({row_token} AS SIGNED) FROM {table} \
                 WHERE name = ? FOR UPDATE SKIP LOCKED"
            ),
            rows_present: format!("SELECT name FROM {table} WHERE name IN ({{slots}})"),
            ensure_rows: format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) VALUES {{rows}} \
                 ON DUPLICATE KEY UPDATE name = name"
            ),
            named_lock: named_lock.into(),
            named_record: format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) \
                 SELECT {{row}}, {{owner}}, 0, UTC_TIMESTAMP(6) + INTERVAL {{ttl}} MICROSECOND \
                 FROM DUAL WHERE IS_USED_LOCK({{name}}) = CONNECTION_ID() \
                 {RECORD_TAKEN_OVER}"
            ),
            named_forget: format!("DELETE FROM {table} WHERE name = {{row}} AND owner = {{owner}}"),
            bell_mark: format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) \
                 VALUES (?, NULL, 0, UTC_TIMESTAMP(6) + INTERVAL {BELL_MARK_SECS} SECOND), \
                        (?, NULL, ?, UTC_TIMESTAMP(6) + INTERVAL {BELL_MARK_SECS} SECOND) \
                 ON DUPLICATE KEY UPDATE fence = VALUES(fence), expires_at = VALUES(expires_at)"
            )
            .into(),
            bell_sleepers: match fence_source {
                FenceSource::Sequence => format!(
                    "DELETE FROM {table} \
                     WHERE name > ? AND name < ? AND name <> ? AND expires_at > UTC_TIMESTAMP(6) \
                     ORDER BY expires_at LIMIT {RUNG} RETURNING CAST(fence AS SIGNED)"
                ),
                FenceSource::Counter => format!(
                    "SELECT CAST(fence AS SIGNED) FROM {table} \
                     WHERE name > ? AND name < ? AND name <> ? AND expires_at > UTC_TIMESTAMP(6) \
                     ORDER BY expires_at LIMIT {RUNG}"
                ),
            }
            .into(),
            bell_mark_name: format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) \
                 VALUES (?, NULL, 0, UTC_TIMESTAMP(6) + INTERVAL {BELL_MARK_SECS} SECOND) \
                 ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at)"
            )
            .into(),
            bell_renew: format!(
                "UPDATE {table} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL {BELL_MARK_SECS} SECOND \
                 WHERE name = ?"
            )
            .into(),
            bell_unmark: format!("DELETE FROM {table} WHERE name = ?").into(),
            bell_sweep: format!(
                "DELETE FROM {table} WHERE name > ? AND name < ? AND expires_at <= UTC_TIMESTAMP(6)"
            )
            .into(),
            release_marked: LeaseSql::new(release_marked.clone(), &[Name, Name, Owner]),
            reserve: LeaseSql::new(format!(
                "UPDATE {table} SET owner = CONCAT({NOT_FOR}, ?), \
                     expires_at = UTC_TIMESTAMP(6) + INTERVAL {} MICROSECOND \
                 WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)",
                RESERVED_MS * 1000
            ), &[Client, Name, Owner]),
            // The classic sequence of MySQL's manual; committed at once, so
            // no rollback can undo it.
            next_fence: format!("UPDATE {counter} SET n = LAST_INSERT_ID(n + 1) WHERE id = 1")
                .into(),
            fence_source,
            tokens,
            migrated,
            migrate,
            sequence_floor: (fence_source == FenceSource::Sequence).then(|| {
                (format!("SELECT CAST(COALESCE(MAX(fence), 0) AS SIGNED) FROM {table}"), seq)
            }),
        }
    }
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
    /// The owner's release, unless a live release bell mark says that a
    /// client sleeps on the name (see [`BELL_MARK`]); an expired mark goes
    /// with it. Binds the name twice, then the owner.
    release_free: String,
    /// The owner's release, which also clears the name's release bell mark
    /// (see [`BELL_MARK`]), live or not. Binds the name twice, then the
    /// owner.
    release_marked: String,
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
                release_free: format!(
                    "DELETE t, b FROM {table} AS t LEFT JOIN {table} AS b ON {BELL_MARK} \
                     WHERE t.name = ? AND t.owner = ? AND t.expires_at > UTC_TIMESTAMP(6) \
                       AND (b.name IS NULL OR b.expires_at <= UTC_TIMESTAMP(6))"
                ),
                release_marked: format!(
                    "DELETE t, b FROM {table} AS t LEFT JOIN {table} AS b ON {BELL_MARK} \
                     WHERE t.name = ? AND t.owner = ? AND t.expires_at > UTC_TIMESTAMP(6)"
                ),
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
                release_free: format!(
                    "UPDATE {table} AS t LEFT JOIN {table} AS b ON {BELL_MARK} \
                     SET t.owner = NULL, t.expires_at = UTC_TIMESTAMP(6) \
                     WHERE t.name = ? AND t.owner = ? AND t.expires_at > UTC_TIMESTAMP(6) \
                       AND (b.name IS NULL OR b.expires_at <= UTC_TIMESTAMP(6))"
                ),
                release_marked: format!(
                    "UPDATE {table} AS t LEFT JOIN {table} AS b ON {BELL_MARK} \
                     SET t.owner = NULL, t.expires_at = UTC_TIMESTAMP(6), \
                         b.expires_at = LEAST(b.expires_at, UTC_TIMESTAMP(6)) \
                     WHERE t.name = ? AND t.owner = ? AND t.expires_at > UTC_TIMESTAMP(6)"
                ),
                leave_last: None,
            },
        }
    }
}

/// The width of the owner column, in characters: an owner token, the
/// separator and a holder identity of at most 255 bytes.
const OWNER_CHARS: usize = 320;

/// The locking clause of a locking read.
fn lock_clause(fence_source: FenceSource, shared: bool, intent: Intent) -> &'static str {
    match (shared, fence_source, intent) {
        (false, _, Intent::Wait) => "FOR UPDATE",
        (false, _, Intent::Try) => "FOR UPDATE NOWAIT",
        (true, FenceSource::Sequence, Intent::Wait) => "LOCK IN SHARE MODE",
        (true, FenceSource::Sequence, Intent::Try) => "LOCK IN SHARE MODE NOWAIT",
        (true, FenceSource::Counter, Intent::Wait) => "FOR SHARE",
        (true, FenceSource::Counter, Intent::Try) => "FOR SHARE NOWAIT",
    }
}
