//! Every SQL text of one lock table on PostgreSQL, built once from its
//! validated name.

use std::sync::Arc;

use crate::lease::Param::{Channel, Client, Name, Owner, To, Token, Ttl, Waiting, Woken};
use crate::lease::{LeaseSql, LeaseStatements, PlaceSql};
use lockkit_core::backend::Intent;

use crate::names::advisory_key;
use crate::session::LockingSql;

/// How a record's upsert takes over an earlier record of its row (a
/// crashed holder's, whose lease may still run): the lease rows' `record`
/// statement (a waiting writer's, a holder identity's) and
/// [`advisory_try_recording`]'s.
const RECORD_TAKEN_OVER: &str =
    "ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at";

/// The statements of one lock table, built once from the validated table name.
#[derive(Debug)]
pub(super) struct PgSql {
    /// The statements the lease engine runs as they are.
    pub(super) lease: LeaseStatements,
    /// A waiting client's places (see [`FIRST`]). `enqueue`: its row in
    /// the line of a name (`$1`) made, or kept for `$3` ms more (its place
    /// kept while it is live), `$2` being the client; places of the name
    /// that ran out (clients that stopped without leaving) are swept in
    /// passing. `dequeue`: the place of client `$2` in the line of name
    /// `$1` left. `leave_lines`: every place of client `$1` left.
    pub(super) places: PlaceSql,
    /// How many clients wait in the line of `$1`.
    pub(super) in_line: Arc<str>,
    /// A client's bell (see `bell`): the names of `$1` reserved for client
    /// `$2`, at once; or, with none, a sleep of `$3` seconds (one row,
    /// NULL), which a ring cuts short.
    pub(super) bell: Arc<str>,
    /// A ring of a client's bell, the sessions whose `application_name` is
    /// `$1` (see `bell`), for name `$3`: `'bell'` when one of them was
    /// signalled; else, the bell being away, the client is notified on its
    /// own channel `$2` (NULL).
    pub(super) ring: Arc<str>,
    /// The row of a name inserted unless it exists; never waits for a
    /// holder's row lock.
    pub(super) make_row: Arc<str>,
    /// `advisory` mode's lock, with its token.
    pub(super) advisory: LockingSql,
    /// `advisory` mode's try that also writes a holder identity's record
    /// when granted: exclusive, shared (see [`advisory_try_recording`]).
    pub(super) advisory_recording: [Arc<str>; 2],
    /// `advisory` mode's unlock that also deletes a holder identity's
    /// record if it is still the holding's: exclusive, shared (see
    /// [`advisory_unlock_forgetting`]).
    pub(super) advisory_forgetting: [Arc<str>; 2],
    /// `row` mode's lock, with its token.
    pub(super) row: LockingSql,
    pub(super) row_free_slot: Arc<str>,
    pub(super) ensure_rows: Arc<str>,
    pub(super) row_release: Arc<str>,
    pub(super) row_status: Arc<str>,
    pub(super) migrate: Vec<String>,
}

impl PgSql {
    /// The `LISTEN/NOTIFY` channel of releases.
    pub(super) fn channel(&self) -> &str {
        &self.lease.channel
    }

    /// `table` must have passed [`validate_table`](crate::validate_table).
    /// With `tokens` false, the session modes' lock statements draw no
    /// token: a grant answers 1 (see
    /// [`Settings::fencing`](crate::settings::Settings)).
    pub(super) fn new(table: &str, tokens: bool) -> Self {
        let seq = format!("{table}_fence_seq");
        // The session modes' token, drawn once granted.
        let token = match tokens {
            true => format!("nextval('{seq}')"),
            false => "1::int8".to_owned(),
        };
        PgSql {
            lease: LeaseStatements {
                // Also granted on a row its release reserved for this
                // client (see `release`).
                acquire: LeaseSql::new(format!(
                "WITH {GATE}, \
                 taken AS (\
                    INSERT INTO {table} AS l (name, owner, fence, expires_at) \
                    SELECT $1, $2, nextval('{seq}'), now() + $3::bigint * interval '1 millisecond' FROM g \
                    ON CONFLICT (name) DO UPDATE \
                        SET owner = EXCLUDED.owner, fence = EXCLUDED.fence, expires_at = EXCLUDED.expires_at \
                        WHERE l.expires_at <= now() OR l.owner = {FOR} || $4 \
                    RETURNING l.fence) \
                 SELECT (SELECT fence FROM taken), \
                        (SELECT {REMAINING} FROM {table} WHERE name = $1)"
            ), &[Name, Owner, Ttl, Client]),
                hand_over: LeaseSql::new(format!(
                "UPDATE {table} SET owner = $3, fence = nextval('{seq}'), \
                     expires_at = now() + $4::bigint * interval '1 millisecond' \
                 WHERE name = $1 AND owner = $2 AND expires_at > now() \
                 RETURNING fence"
            ), &[Name, Owner, To, Ttl]),
                // Readers: see the `lease` module. `$3`: the waiting record's
                // row; a row reserved for this client (`$4`) starts a group.
                share: LeaseSql::new(format!(
                "WITH {GATE}, \
                 d AS MATERIALIZED (SELECT nextval('{seq}') AS f FROM g), \
                 joined AS (\
                    INSERT INTO {table} AS l (name, owner, fence, expires_at) \
                    SELECT $1, {GROUP} || d.f || ':1', d.f, now() + $2::bigint * interval '1 millisecond' FROM d \
                    WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE name = $3 AND expires_at > now()) \
                    ON CONFLICT (name) DO UPDATE \
                        SET owner = CASE WHEN l.expires_at <= now() OR l.owner = {FOR} || $4 THEN EXCLUDED.owner \
                                ELSE split_part(l.owner, ':', 1) || ':' || ({COUNT} + 1) END, \
                            fence = EXCLUDED.fence, \
                            expires_at = CASE WHEN l.owner = {FOR} || $4 THEN EXCLUDED.expires_at \
                                ELSE GREATEST(l.expires_at, EXCLUDED.expires_at) END \
                        WHERE l.expires_at <= now() OR left(l.owner, 2) = {GROUP} OR l.owner = {FOR} || $4 \
                    RETURNING l.fence) \
                 SELECT (SELECT fence FROM joined), \
                        (SELECT GREATEST(0, CEIL(EXTRACT(EPOCH FROM (MAX(expires_at) - now())) * 1000))::bigint \
                         FROM {table} WHERE name IN ($1, $3))",
                COUNT = group_count("l.owner"),
            ), &[Name, Ttl, Waiting, Client]),
                extend: LeaseSql::new(format!(
                "UPDATE {table} SET expires_at = now() + $3::bigint * interval '1 millisecond' \
                 WHERE name = $1 AND owner = $2 AND expires_at > now()"
            ), &[Name, Owner, Ttl]),
                // With nobody in the name's line (see [`FIRST`]), the row
                // goes and every client is woken on the table's channel.
                // Otherwise the second statement runs: the row is not
                // deleted but reserved, for [`RESERVED_MS`], for the client
                // at the head of the line, which leaves the line; the
                // statement answers that client, whom the releaser then
                // wakes (its bell, see `bell`, or its own channel,
                // `lockkit-<client>`, see `notify`); or the row is deleted,
                // should the line have emptied meanwhile (answering NULL,
                // with every client woken on the table's channel).
                release: vec![
                    LeaseSql::new(format!(
                "DELETE FROM {table} WHERE name = $1 AND owner = $2 AND expires_at > now() \
                    AND NOT EXISTS (SELECT 1 FROM {table} WHERE {IN_LINE}) \
                 RETURNING pg_notify($3, $1)::text"
            ), &[Name, Owner, Channel]),
                    LeaseSql::new(format!(
                "WITH head AS MATERIALIZED (\
                    SELECT owner FROM {table} WHERE {IN_LINE} ORDER BY fence LIMIT 1), \
                 gone AS (\
                    DELETE FROM {table} WHERE name = $1 AND owner = $2 AND expires_at > now() \
                        AND NOT EXISTS (SELECT 1 FROM head) \
                    RETURNING $3::text AS channel), \
                 kept AS (\
                    UPDATE {table} SET owner = {FOR} || head.owner, \
                        expires_at = now() + interval '{RESERVED_MS} milliseconds' \
                    FROM head WHERE name = $1 AND {table}.owner = $2 AND expires_at > now() \
                    RETURNING head.owner AS client), \
                 served AS (\
                    DELETE FROM {table} WHERE name = {FIRST} || (SELECT head.owner FROM kept, head)) \
                 SELECT NULLIF(pg_notify(channel, $1)::text, '') FROM gone UNION ALL SELECT client FROM kept"
            ), &[Name, Owner, Channel]),
                ],
                purge: LeaseSql::new(format!(
                "DELETE FROM {table} WHERE name = $1 AND owner = $2 AND expires_at <= now()"
            ), &[Name, Owner]),
                status: LeaseSql::new(format!(
                "SELECT fence, GREATEST(0, CEIL(EXTRACT(EPOCH FROM (expires_at - now())) * 1000))::bigint, owner \
                 FROM {table} WHERE name = $1 AND expires_at > now()"
            ), &[Name]),
                extend_share: LeaseSql::new(format!(
                "UPDATE {table} SET expires_at = GREATEST(expires_at, now() + $3::bigint * interval '1 millisecond') \
                 WHERE name = $1 AND expires_at > now() AND {IN_GROUP}",
                IN_GROUP = in_group("$2"),
            ), &[Name, Token, Ttl]),
                // A reader alone in the group it started deletes the row
                // (tried first: one probe of the name). Otherwise the
                // group's row, locked first (its latest version), then
                // counted down, or deleted with its last reader.
                leave: vec![LeaseSql::new(format!(
                "DELETE FROM {table} WHERE name = $1 AND expires_at > now() \
                    AND owner = {GROUP} || $2::bigint || ':1' \
                 RETURNING pg_notify($3, $1)::text"
            ), &[Name, Token, Channel]), LeaseSql::new(format!(
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
            ), &[Name, Token, Channel])],
                record: LeaseSql::new(format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) \
                 VALUES ($1, $2, 0, now() + $3::bigint * interval '1 millisecond') \
                 {RECORD_TAKEN_OVER}"
            ), &[Name, Owner, Ttl]),
                // Notifies only with a name to wake (`$4` not empty): every
                // listening session's server process reads each `NOTIFY`.
                forget: LeaseSql::new(format!(
                "DELETE FROM {table} WHERE name = $1 AND owner = COALESCE($2, owner) \
                 RETURNING CASE WHEN $4 <> '' THEN pg_notify($3, $4)::text END"
            ), &[Name, Owner, Channel, Woken]),
                channel: format!("lockkit_{table}"),
                client: format!("{:016x}", fastrand::u64(..)),
            },
            places: PlaceSql {
                enqueue: format!(
                    "WITH swept AS (\
                        DELETE FROM {table} \
                        WHERE name > {FIRST} AND name < {PAST} AND name <> {FIRST} || $2 \
                          AND expires_at <= now()) \
                     INSERT INTO {table} AS l (name, owner, fence, expires_at) \
                     VALUES ({FIRST} || $2, $2, nextval('{seq}'), now() + $3::bigint * interval '1 millisecond') \
                     ON CONFLICT (name) DO UPDATE \
                        SET fence = CASE WHEN l.expires_at <= now() THEN EXCLUDED.fence ELSE l.fence END, \
                            expires_at = EXCLUDED.expires_at"
                )
                .into(),
                dequeue: format!("DELETE FROM {table} WHERE name = {FIRST} || $2").into(),
                leave_lines: format!("DELETE FROM {table} WHERE {LINES} AND owner = $1").into(),
            },
            in_line: format!("SELECT count(*) FROM {table} WHERE {IN_LINE}").into(),
            // The check first, in the statement's snapshot: a reservation
            // committed before it is answered at once, and one committed
            // after it comes with a ring (sent once it has committed)
            // while the statement runs, or before the next one starts.
            bell: format!(
                "WITH r AS MATERIALIZED (\
                    SELECT name FROM {table} WHERE name = ANY($1::text[]) AND owner = {FOR} || $2 \
                      AND expires_at > now()) \
                 SELECT name FROM r \
                 UNION ALL SELECT NULL FROM pg_sleep($3::float8) WHERE NOT EXISTS (SELECT 1 FROM r)"
            )
            .into(),
            // Only the sessions of that name are signalled (a materialized
            // list: the cancel is never evaluated for another session).
            ring: "WITH bell AS MATERIALIZED (\
                    SELECT pid FROM pg_stat_activity \
                    WHERE application_name = $1 AND datname = current_database()) \
                 SELECT CASE WHEN (SELECT bool_or(pg_cancel_backend(pid)) FROM bell) THEN 'bell' \
                        ELSE NULLIF((SELECT pg_notify($2, $3))::text, '') END"
                .into(),
            make_row: format!(
                "INSERT INTO {table} (name, owner, fence, expires_at) VALUES ($1, NULL, 0, '-infinity') \
                 ON CONFLICT (name) DO NOTHING"
            )
            .into(),
            // The same sequence for both sides: readers' and writers' tokens
            // are one order.
            advisory: LockingSql::of(|shared, intent| advisory_lock(&token, shared, intent)),
            advisory_recording: [false, true]
                .map(|shared| advisory_try_recording(table, &token, shared).into()),
            advisory_forgetting: [false, true]
                .map(|shared| advisory_unlock_forgetting(table, shared).into()),
            row: LockingSql::of(|shared, intent| row_lock(table, &token, shared, intent)),
            // A permit: the first slot row no one holds. MATERIALIZED: the
            // token is drawn for the locked row only.
            row_free_slot: format!(
                "WITH l AS MATERIALIZED (\
                    SELECT name FROM {table} WHERE name = ANY($1) LIMIT 1 FOR UPDATE SKIP LOCKED) \
                 SELECT name, {token} FROM l"
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

/// The places of the clients that wait for name `$1` in `lease` mode are
/// rows `\x01queue:<name>\x01<client>`, whose owner is the client and whose
/// fence (drawn from the sequence) orders them: every one of them sorts
/// after this text and before [`PAST`]. Lock names cannot contain `\x01`,
/// so these rows are apart from every lock's row and from every other
/// name's line.
const FIRST: &str = "(chr(1) || 'queue:' || $1 || chr(1))";

/// The text every place in the line of `$1` sorts before (see [`FIRST`]).
const PAST: &str = "(chr(1) || 'queue:' || $1 || chr(2))";

/// The places in the line of `$1` that are live (see [`FIRST`]).
const IN_LINE: &str = "name > (chr(1) || 'queue:' || $1 || chr(1)) \
                       AND name < (chr(1) || 'queue:' || $1 || chr(2)) AND expires_at > now()";

/// How long a row's lease still runs, in whole milliseconds (0 once run out).
const REMAINING: &str =
    "GREATEST(0, CEIL(EXTRACT(EPOCH FROM (expires_at - now())) * 1000))::bigint";

/// Every place in every line (see [`FIRST`]).
const LINES: &str = "name > chr(1) || 'queue:' AND name < chr(1) || 'queue;'";

/// [`RESERVED_FOR`](crate::lease::RESERVED_FOR) in SQL: the owner of a
/// row reserved for a client is this followed by the client.
const FOR: &str = "(chr(1) || 'for:')";

/// How long a released row stays reserved for the client at the head of
/// the line (ms): its waiter is woken and asks at once, or, with none
/// waiting any longer, the client passes the turn on (see
/// `lease::line::Turns`); should it do neither within this time (its
/// process died), anyone may take the row.
pub(super) const RESERVED_MS: u32 = 2000;

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

/// `row` mode's locking statement: first the name's *gate*, a
/// transaction-scoped advisory lock on the two 32-bit halves (`$2`, `$3`) of
/// [`advisory_key`] (a key space apart from `advisory` mode's 64-bit keys),
/// exclusive for a writer and shared for a reader; then the row, `FOR
/// UPDATE` or `FOR SHARE`, and `token` (see [`PgSql::new`]). The row locks exclude;
/// the gate queues: Postgres' lock manager puts a new shared request behind
/// a waiting exclusive one, which row locks alone do not (a `FOR SHARE`
/// joins the current share-lockers even past a waiting `FOR UPDATE`). With
/// [`Intent::Try`], the gate waits at most 1 ms (`lock_timeout`, for this
/// transaction only) and the row not at all: both end in `lock_not_available`.
fn row_lock(table: &str, token: &str, shared: bool, intent: Intent) -> String {
    let (gate, rows) = match shared {
        false => ("pg_advisory_xact_lock", "FOR UPDATE OF t"),
        true => ("pg_advisory_xact_lock_shared", "FOR SHARE OF t"),
    };
    let (limit, nowait) = match intent {
        Intent::Try => (
            "(SELECT set_config('lock_timeout', '1', true)) IS NOT NULL",
            " NOWAIT",
        ),
        Intent::Wait => ("true", ""),
    };
    format!(
        "WITH g AS MATERIALIZED (SELECT {gate}($2::int4, $3::int4) WHERE {limit}), \
              l AS MATERIALIZED (SELECT 1 FROM {table} AS t, g WHERE t.name = $1 {rows}{nowait}) \
         SELECT {token} FROM l"
    )
}

/// The two 32-bit halves of `name`'s gate key (see [`row_lock`]), bound as
/// the `$2`, `$3` of the statements that take or look at the gate.
pub(super) fn gate_halves(name: &str) -> (i32, i32) {
    let gate = advisory_key(name);
    ((gate >> 32) as i32, gate as i32)
}

/// `pg_advisory_lock($1)`, or `pg_try_advisory_lock` for [`Intent::Try`]
/// (`_shared` for a shared holding), drawing `token` (see [`PgSql::new`]) only once
/// granted (MATERIALIZED); a try that is refused answers `NULL`. A wait
/// first sets the session's `lock_timeout` to `$2` (ms as text, `0` for no
/// limit) in the same statement, so that a wait with a deadline costs no
/// round trip of its own: the lock is taken after the setting (the CTE it
/// reads comes first), and the server reads the setting when its wait
/// begins. (A wait that times out aborts the statement, which puts the
/// setting back.)
fn advisory_lock(token: &str, shared: bool, intent: Intent) -> String {
    let side = if shared { "_shared" } else { "" };
    match intent {
        Intent::Wait => format!(
            "WITH t AS MATERIALIZED (SELECT set_config('lock_timeout', $2, false)), \
             l AS MATERIALIZED (SELECT pg_advisory_lock{side}($1) FROM t) \
             SELECT {token} FROM l"
        ),
        Intent::Try => format!(
            "WITH l AS MATERIALIZED (SELECT pg_try_advisory_lock{side}($1) AS ok) \
             SELECT CASE WHEN ok THEN {token} END FROM l"
        ),
    }
}

/// [`advisory_lock`]'s try, which also writes a holder identity's record
/// once granted: the record's row `$2` made or taken over for owner `$3`,
/// for `$4` ms (the upsert of a lease record, see `lease`), in the same
/// statement, from the token's row (none when refused). The answer is the
/// try's: the token, or `NULL` when refused.
fn advisory_try_recording(table: &str, token: &str, shared: bool) -> String {
    let side = if shared { "_shared" } else { "" };
    format!(
        "WITH l AS MATERIALIZED (SELECT pg_try_advisory_lock{side}($1) AS ok), \
         f AS MATERIALIZED (SELECT {token} AS fence FROM l WHERE ok), \
         r AS (INSERT INTO {table} (name, owner, fence, expires_at) \
               SELECT $2, $3, 0, now() + $4::bigint * interval '1 millisecond' FROM f \
               {RECORD_TAKEN_OVER}) \
         SELECT (SELECT fence FROM f)"
    )
}

/// `pg_advisory_unlock($1)` (`_shared`), which also deletes a holder
/// identity's record, row `$2`, if its owner is still `$3`: the record of a
/// next holder, which may be written meanwhile, is left alone.
fn advisory_unlock_forgetting(table: &str, shared: bool) -> String {
    let side = if shared { "_shared" } else { "" };
    format!(
        "WITH d AS (DELETE FROM {table} WHERE name = $2 AND owner = $3) \
         SELECT pg_advisory_unlock{side}($1)"
    )
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
