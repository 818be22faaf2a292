//! Every SQL text of one lock table on SQLite, built once from its
//! validated name.

use std::sync::Arc;

use crate::lease::Param::{Client, Name, Owner, To, Token, Ttl, Waiting};
use crate::lease::{LeaseSql, LeaseStatements, PlaceSql};

/// Milliseconds since the Unix epoch by SQLite's clock, stable within one
/// statement.
const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// The statements of one lock table, built once from the validated table name.
#[derive(Debug)]
pub(super) struct SqliteSql {
    /// The statements the lease engine runs as they are.
    pub(super) lease: LeaseStatements,
    /// After a writer's upsert that did not grant: the holder's remaining lease.
    pub(super) remaining: LeaseSql,
    /// After a reader's upsert that did not grant: the longer of the
    /// row's and the waiting record's remaining lease.
    pub(super) share_remaining: LeaseSql,
    /// The owner's release when other clients are in the name's line: the
    /// row reserved for [`RESERVED_MS`] for the client at the head of the
    /// line (other than this one, `?3`), whose place ends. Answers the
    /// owners it wrote: the row's (`\x01for:<client>`) and the place's;
    /// nothing when the line has emptied meanwhile.
    pub(super) reserve: LeaseSql,
    /// The owner's release that deletes the row whoever waits.
    pub(super) release_alone: LeaseSql,
    /// A waiting client's places (see [`FIRST`]). `enqueue`: its row in
    /// the line of a name (`?1`) made, or kept for `?3` ms more, `?2` being
    /// the client; a new place draws its order from the tokens' high-water
    /// mark. `dequeue`: the place of client `?2` in the line of name `?1`
    /// left, and the places there that ran out (clients that stopped
    /// without leaving) swept in passing. `leave_lines`: every place of
    /// client `?1` left.
    pub(super) places: PlaceSql,
    /// How many clients wait in the line of `?1`.
    pub(super) in_line: Arc<str>,
    pub(super) migrate: String,
}

/// The places of the clients that wait for name `?1` are rows
/// `\x01queue:<name>\x01<client>`, whose owner is the client: every one
/// of them sorts after this text and before [`PAST`]. Lock names cannot
/// contain `\x01`, so these rows are apart from every lock's row and from
/// every other name's line.
const FIRST: &str = "(char(1) || 'queue:' || ?1 || char(1))";

/// The text every place in the line of `?1` sorts before (see [`FIRST`]).
const PAST: &str = "(char(1) || 'queue:' || ?1 || char(2))";

/// Every place in every line (see [`FIRST`]).
const LINES: &str = "name > char(1) || 'queue:' AND name < char(1) || 'queue;'";

/// [`RESERVED_FOR`](crate::lease::RESERVED_FOR) in SQL: the owner of a
/// row reserved for a client is this followed by the client.
const FOR_SQL: &str = "(char(1) || 'for:')";

/// How long a released row stays reserved for the client at the head of
/// the line (ms): its bell wakes it and it asks at once, or, with no
/// waiter wanting the lock any longer, passes the turn on (see
/// `lease::line::Turns`); should it do neither within this time (its
/// process died), anyone may take the row.
pub(super) const RESERVED_MS: u32 = 500;

/// The prefix of a reader group's owner (see the `lease` module).
const GROUP: &str = "(char(1) || 'r')";

/// The reader count in a group's `owner`.
const COUNT: &str = "CAST(substr(owner, instr(owner, ':') + 1) AS INTEGER)";

/// Whether the row is a reader group that started at or before `?2`.
const IN_GROUP: &str = "substr(owner, 1, 2) = (char(1) || 'r') \
    AND CAST(substr(owner, 3, instr(owner, ':') - 3) AS INTEGER) <= ?2";

impl SqliteSql {
    /// `table` must have passed [`validate_table`](crate::validate_table).
    ///
    /// Released rows are deleted. Tokens come from the table's high-water
    /// mark, `<table>_fence`, which triggers raise to every token stored:
    /// the next token is one above it, so a name's row made afresh still
    /// counts on from every earlier token. (SQLite runs one write at a
    /// time, and a statement's read and write are one step.)
    pub(super) fn new(table: &str) -> Self {
        let fence = format!("{table}_fence");
        let next = format!("(SELECT n + 1 FROM {fence} WHERE id = 1)");
        SqliteSql {
            lease: LeaseStatements {
                acquire: LeaseSql::new(
                    format!(
                        "INSERT INTO {table} (name, owner, fence, expires_at) VALUES (?1, ?2, {next}, {NOW_MS} + ?3) \
                 ON CONFLICT (name) DO UPDATE \
                     SET owner = excluded.owner, fence = excluded.fence, expires_at = excluded.expires_at \
                     WHERE expires_at <= {NOW_MS} OR owner = {FOR_SQL} || ?4 \
                 RETURNING fence"
                    ),
                    &[Name, Owner, Ttl, Client],
                ),
                hand_over: LeaseSql::new(
                    format!(
                        "UPDATE {table} SET owner = ?3, fence = {next}, expires_at = {NOW_MS} + ?4 \
                 WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS} \
                 RETURNING fence"
                    ),
                    &[Name, Owner, To, Ttl],
                ),
                // Readers: see the `lease` module. `?3`: the waiting record's
                // row; a row reserved for this client (`?4`) starts a group.
                share: LeaseSql::new(
                    format!(
                        "INSERT INTO {table} (name, owner, fence, expires_at) \
                 SELECT ?1, {GROUP} || t.f || ':1', t.f, {NOW_MS} + ?2 FROM (SELECT {next} AS f) AS t \
                 WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE name = ?3 AND expires_at > {NOW_MS}) \
                 ON CONFLICT (name) DO UPDATE \
                     SET owner = CASE WHEN expires_at <= {NOW_MS} OR owner = {FOR_SQL} || ?4 THEN excluded.owner \
                             ELSE substr(owner, 1, instr(owner, ':')) || ({COUNT} + 1) END, \
                         fence = excluded.fence, \
                         expires_at = CASE WHEN owner = {FOR_SQL} || ?4 THEN excluded.expires_at \
                             ELSE MAX(expires_at, excluded.expires_at) END \
                     WHERE expires_at <= {NOW_MS} OR substr(owner, 1, 2) = {GROUP} OR owner = {FOR_SQL} || ?4 \
                 RETURNING fence"
                    ),
                    &[Name, Ttl, Waiting, Client],
                ),
                extend: LeaseSql::new(
                    format!(
                        "UPDATE {table} SET expires_at = {NOW_MS} + ?3 \
                 WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS}"
                    ),
                    &[Name, Owner, Ttl],
                ),
                // With no other client in the name's line (see [`FIRST`]),
                // the row goes; otherwise `reserve` runs (see
                // `SqliteLease::release`).
                release: vec![LeaseSql::new(
                    format!(
                        "DELETE FROM {table} WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS} \
                         AND NOT EXISTS (SELECT 1 FROM {table} \
                             WHERE name > {FIRST} AND name < {PAST} AND name <> {FIRST} || ?3 \
                               AND expires_at > {NOW_MS})"
                    ),
                    &[Name, Owner, Client],
                )],
                purge: LeaseSql::new(
                    format!(
                        "DELETE FROM {table} WHERE name = ?1 AND owner = ?2 AND expires_at <= {NOW_MS}"
                    ),
                    &[Name, Owner],
                ),
                status: LeaseSql::new(
                    format!(
                        "SELECT fence, expires_at - {NOW_MS}, owner FROM {table} WHERE name = ?1 AND expires_at > {NOW_MS} \
                         AND (owner IS NULL OR substr(owner, 1, 5) <> {FOR_SQL})"
                    ),
                    &[Name],
                ),
                extend_share: LeaseSql::new(
                    format!(
                        "UPDATE {table} SET expires_at = MAX(expires_at, {NOW_MS} + ?3) \
                 WHERE name = ?1 AND expires_at > {NOW_MS} AND {IN_GROUP}"
                    ),
                    &[Name, Token, Ttl],
                ),
                // The last reader deletes the row; the others count it down.
                leave: vec![
                    LeaseSql::new(
                        format!(
                            "DELETE FROM {table} WHERE name = ?1 AND expires_at > {NOW_MS} AND {IN_GROUP} AND {COUNT} = 1"
                        ),
                        &[Name, Token],
                    ),
                    LeaseSql::new(
                        format!(
                            "UPDATE {table} \
                         SET owner = CASE WHEN {COUNT} > 1 THEN substr(owner, 1, instr(owner, ':')) || ({COUNT} - 1) END, \
                             expires_at = CASE WHEN {COUNT} > 1 THEN expires_at ELSE {NOW_MS} END \
                         WHERE name = ?1 AND expires_at > {NOW_MS} AND {IN_GROUP}"
                        ),
                        &[Name, Token],
                    ),
                ],
                record: LeaseSql::new(
                    format!(
                        "INSERT INTO {table} (name, owner, fence, expires_at) VALUES (?1, ?2, 0, {NOW_MS} + ?3) \
                 ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at"
                    ),
                    &[Name, Owner, Ttl],
                ),
                forget: LeaseSql::new(
                    format!("DELETE FROM {table} WHERE name = ?1 AND owner = COALESCE(?2, owner)"),
                    &[Name, Owner],
                ),
                channel: String::new(),
                client: format!("{:016x}", fastrand::u64(..)),
            },
            remaining: LeaseSql::new(
                format!("SELECT MAX(0, expires_at - {NOW_MS}) FROM {table} WHERE name = ?1"),
                &[Name],
            ),
            share_remaining: LeaseSql::new(
                format!(
                    "SELECT MAX(0, MAX(expires_at) - {NOW_MS}) FROM {table} WHERE name IN (?1, ?2)"
                ),
                &[Name, Waiting],
            ),
            // The lock's row and the head's place, in one statement: the
            // place runs out at once (a place that ran out is no place; a
            // new one, should the client wait again, goes to the back).
            reserve: LeaseSql::new(
                format!(
                    "UPDATE {table} \
                     SET owner = CASE WHEN {table}.name = ?1 THEN {FOR_SQL} || h.owner ELSE {table}.owner END, \
                         expires_at = CASE WHEN {table}.name = ?1 THEN {NOW_MS} + {RESERVED_MS} ELSE 0 END \
                     FROM (SELECT owner FROM {table} \
                           WHERE name > {FIRST} AND name < {PAST} AND name <> {FIRST} || ?3 \
                             AND expires_at > {NOW_MS} \
                             AND EXISTS (SELECT 1 FROM {table} \
                                 WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS}) \
                           ORDER BY fence LIMIT 1) AS h \
                     WHERE {table}.name IN (?1, {FIRST} || h.owner) \
                     RETURNING owner"
                ),
                &[Name, Owner, Client],
            ),
            release_alone: LeaseSql::new(
                format!(
                    "DELETE FROM {table} WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW_MS}"
                ),
                &[Name, Owner],
            ),
            places: PlaceSql {
                enqueue: format!(
                    "INSERT INTO {table} (name, owner, fence, expires_at) VALUES ({FIRST} || ?2, ?2, {next}, {NOW_MS} + ?3) \
                     ON CONFLICT (name) DO UPDATE \
                         SET fence = CASE WHEN expires_at <= {NOW_MS} THEN excluded.fence ELSE fence END, \
                             expires_at = excluded.expires_at"
                ).into(),
                dequeue: format!(
                    "DELETE FROM {table} WHERE name > {FIRST} AND name < {PAST} \
                     AND (name = {FIRST} || ?2 OR expires_at <= {NOW_MS})"
                )
                .into(),
                leave_lines: format!("DELETE FROM {table} WHERE {LINES} AND owner = ?1").into(),
            },
            in_line: format!(
                "SELECT count(*) FROM {table} WHERE name > {FIRST} AND name < {PAST} AND expires_at > {NOW_MS}"
            ).into(),
            // The high-water mark starts at the highest token stored (a
            // table of an earlier version keeps a token per row).
            migrate: format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                    name TEXT NOT NULL PRIMARY KEY, \
                    owner TEXT, \
                    fence INTEGER NOT NULL, \
                    expires_at INTEGER NOT NULL); \
                 CREATE TABLE IF NOT EXISTS {fence} (\
                    id INTEGER NOT NULL PRIMARY KEY CHECK (id = 1), \
                    n INTEGER NOT NULL); \
                 INSERT OR IGNORE INTO {fence} (id, n) SELECT 1, COALESCE(MAX(fence), 0) FROM {table}; \
                 CREATE TRIGGER IF NOT EXISTS {table}_fence_insert AFTER INSERT ON {table} \
                 BEGIN UPDATE {fence} SET n = MAX(n, NEW.fence) WHERE id = 1; END; \
                 CREATE TRIGGER IF NOT EXISTS {table}_fence_update AFTER UPDATE OF fence ON {table} \
                 BEGIN UPDATE {fence} SET n = MAX(n, NEW.fence) WHERE id = 1; END;"
            ),
        }
    }
}
