//! The raw floors of the SQL lock modes: lockkit-sql's own statements, with
//! the same bound parameters, issued by hand on dedicated sqlx connections
//! (no pool, no lock engine, no guard), so that the gap to a lockkit cycle is
//! what lockkit adds on the client.
//!
//! They use lockkit-sql's default lock table, `lockkit_locks`, created by its
//! `migrate()`, with names of their own.
//!
//! The `lease` cycles send lockkit-sql's own statements
//! ([`lockkit_sql::lease_statements`]), so that they measure the engine
//! and cannot drift from what it sends. The session modes' statements are
//! written out here: the same guarantee as a careful user would write it by
//! hand (a row lock with its token, an advisory or named lock with its
//! token), so that a statement of lockkit's that costs a round trip more
//! shows up as a ratio.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lockkit_sql::{Database, LeaseStatements};
use sqlx::{AssertSqlSafe, Connection, MySqlConnection, PgConnection, SqliteConnection};
use tokio::sync::Mutex;

/// lockkit's `lease` statements on its default table, so that a raw floor
/// sends what lockkit sends.
fn lease_statements(database: Database) -> LeaseStatements {
    lockkit_sql::lease_statements(database, lockkit_sql::DEFAULT_TABLE)
        .expect("the lease statements of the default table")
}

/// The lease of every raw acquire, as lockkit's cycles use.
pub const RAW_TTL: Duration = Duration::from_secs(30);

/// Fresh owner tokens, as long as lockkit's (a UUID's 36 characters).
#[derive(Debug, Default)]
struct Owners(AtomicU64);

impl Owners {
    fn next(&self) -> String {
        let n = self.0.fetch_add(1, Ordering::Relaxed);
        format!("00000000-0000-4000-8000-{n:012x}")
    }
}

fn millis(d: Duration) -> i64 {
    d.as_millis() as i64
}

/// `select_one` and `scalar` on the dedicated connection `conn` of a raw
/// floor: the same code for every database, which sqlx's traits would only
/// let a generic function say with a page of bounds.
macro_rules! probe_queries {
    ($raw:ty) => {
        impl $raw {
            /// `SELECT 1`: one statement's round trip (on SQLite, no I/O).
            pub async fn select_one(&self) {
                let one: i32 = sqlx::query_scalar("SELECT 1")
                    .fetch_one(&mut *self.conn.lock().await)
                    .await
                    .expect("SELECT 1");
                assert_eq!(one, 1);
            }

            /// The 64-bit integer answer of `sql` with `args` bound (for
            /// probes and checks).
            pub async fn scalar(&self, sql: &'static str, args: &[i64]) -> i64 {
                let mut query = sqlx::query_scalar(sql);
                for arg in args {
                    query = query.bind(*arg);
                }
                query
                    .fetch_one(&mut *self.conn.lock().await)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
            }
        }
    };
}

probe_queries!(RawPg);
probe_queries!(RawMy);
probe_queries!(RawSqlite);

/// Postgres: the lease upsert and release, the row lock in a transaction,
/// and the advisory lock, each followed by its fencing token as lockkit
/// draws it.
#[derive(Debug)]
pub struct RawPg {
    conn: Mutex<PgConnection>,
    /// lockkit's own lease statements, sent by hand.
    lease: LeaseStatements,
    owners: Owners,
}

/// The name's gate first (a transaction-scoped advisory lock on the two
/// halves `$2`, `$3` of its key, see [`gate_halves`]), then its row: the
/// gate queues a reader behind a waiting writer, which row locks alone do
/// not, and lockkit's row mode takes it for that guarantee.
const PG_ROW_LOCK: &str = "WITH g AS MATERIALIZED (SELECT pg_advisory_xact_lock($2::int4, $3::int4)), \
    l AS MATERIALIZED (SELECT 1 FROM lockkit_locks AS t, g WHERE t.name = $1 FOR UPDATE OF t) \
    SELECT nextval('lockkit_locks_fence_seq') FROM l";
/// The row of a name, made if missing (a released name has none).
const PG_ROW_ENSURE: &str = "INSERT INTO lockkit_locks (name, owner, fence, expires_at) \
    VALUES ($1, NULL, 0, '-infinity') ON CONFLICT (name) DO NOTHING";
/// After the release, the row goes unless someone holds it or holds or
/// waits for its gate (a waiter the release let through locks the row a
/// moment later).
const PG_ROW_DELETE: &str = "WITH g AS MATERIALIZED (SELECT 1 WHERE pg_try_advisory_xact_lock($2::int4, $3::int4)) \
    DELETE FROM lockkit_locks WHERE name IN \
    (SELECT t.name FROM lockkit_locks AS t, g WHERE t.name = $1 FOR UPDATE OF t SKIP LOCKED)";
const PG_ADVISORY_LOCK: &str = "WITH l AS MATERIALIZED (SELECT pg_advisory_lock($1)) \
    SELECT nextval('lockkit_locks_fence_seq') FROM l";

/// The two 32-bit halves of `name`'s gate key in `row` mode: its
/// advisory key ([`lockkit_sql::advisory_key`]) split, a key space apart
/// from `advisory` mode's 64-bit keys.
fn gate_halves(name: &str) -> (i32, i32) {
    let key = lockkit_sql::advisory_key(name);
    ((key >> 32) as i32, key as i32)
}

impl RawPg {
    /// A connection to `url` (whose lock table lockkit has migrated).
    pub async fn connect(url: &str) -> RawPg {
        let conn = PgConnection::connect(url)
            .await
            .expect("a Postgres connection");
        RawPg {
            conn: Mutex::new(conn),
            lease: lease_statements(Database::Postgres),
            owners: Owners::default(),
        }
    }

    /// The lease upsert, then the conditional release with its `NOTIFY`.
    pub async fn lease_cycle(&self, name: &str) {
        let owner = self.owners.next();
        let mut conn = self.conn.lock().await;
        let (fence, _): (Option<i64>, Option<i64>) =
            sqlx::query_as(AssertSqlSafe(self.lease.acquire.as_str()))
                .bind(name)
                .bind(&owner)
                .bind(millis(RAW_TTL))
                .bind("raw-floor")
                .fetch_one(&mut *conn)
                .await
                .expect("lease upsert");
        assert!(fence.is_some(), "raw lease: {name:?} was not free");
        let released = sqlx::query(AssertSqlSafe(self.lease.release.as_str()))
            .bind(name)
            .bind(&owner)
            .bind("lockkit_lockkit_locks")
            .fetch_all(&mut *conn)
            .await
            .expect("lease release");
        assert_eq!(released.len(), 1, "raw lease: release missed");
    }

    /// The row made if missing, `BEGIN`, the name's gate and the row lock
    /// with its token, `ROLLBACK`, the row deleted unless someone holds it
    /// or its gate: a released name leaves no row. These are the statements
    /// of lockkit's row mode.
    pub async fn row_cycle(&self, name: &str) {
        let (high, low) = gate_halves(name);
        let mut conn = self.conn.lock().await;
        sqlx::query(PG_ROW_ENSURE)
            .bind(name)
            .execute(&mut *conn)
            .await
            .expect("row made");
        sqlx::raw_sql("BEGIN")
            .execute(&mut *conn)
            .await
            .expect("BEGIN");
        let fence: Option<i64> = sqlx::query_scalar(PG_ROW_LOCK)
            .bind(name)
            .bind(high)
            .bind(low)
            .fetch_optional(&mut *conn)
            .await
            .expect("row lock");
        assert!(fence.is_some(), "raw row: no row for {name:?}");
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut *conn)
            .await
            .expect("ROLLBACK");
        sqlx::query(PG_ROW_DELETE)
            .bind(name)
            .bind(high)
            .bind(low)
            .execute(&mut *conn)
            .await
            .expect("row deleted");
    }

    /// `pg_advisory_lock` with its token, then `pg_advisory_unlock`.
    pub async fn advisory_cycle(&self, key: i64) {
        let mut conn = self.conn.lock().await;
        let _fence: i64 = sqlx::query_scalar(PG_ADVISORY_LOCK)
            .bind(key)
            .fetch_one(&mut *conn)
            .await
            .expect("advisory lock");
        let unlocked: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .fetch_one(&mut *conn)
            .await
            .expect("advisory unlock");
        assert!(unlocked, "raw advisory: the lock was not held");
    }
}

/// MariaDB: the lease upsert and release, the row lock in a transaction, and
/// `GET_LOCK`, each with its fencing token as lockkit draws it on MariaDB
/// (`NEXTVAL` of the sequence, inside the lock statement).
#[derive(Debug)]
pub struct RawMy {
    conn: Mutex<MySqlConnection>,
    /// lockkit's own lease statements, sent by hand.
    lease: LeaseStatements,
    owners: Owners,
}

/// The row of a name, made if missing (a released name has none), as
/// lockkit's waiting attempt makes it: from a plain read that finds no row.
const MY_ROW_ENSURE: &str = "INSERT INTO lockkit_locks (name, owner, fence, expires_at) \
    SELECT ?, NULL, 0, '1000-01-01 00:00:00' FROM DUAL \
    WHERE NOT EXISTS (SELECT 1 FROM lockkit_locks WHERE name = ?) \
    ON DUPLICATE KEY UPDATE name = lockkit_locks.name";
/// After the release, the row goes unless someone holds it.
const MY_ROW_DELETE: &str = "DELETE t FROM lockkit_locks AS t JOIN \
    (SELECT name FROM lockkit_locks WHERE name = ? FOR UPDATE SKIP LOCKED) AS free USING (name)";
const MY_ROW_LOCK: &str = "SELECT CAST(NEXTVAL(lockkit_locks_fence_seq) AS SIGNED) \
    FROM lockkit_locks WHERE name = ? FOR UPDATE";
const MY_NAMED_LOCK: &str = "SELECT CASE GET_LOCK(?, ?) \
    WHEN 1 THEN NEXTVAL(lockkit_locks_fence_seq) WHEN 0 THEN 0 END";
/// lockkit's server-side wait of an acquire that waits forever: a year.
const MY_FOREVER_SECS: f64 = 365.0 * 24.0 * 3600.0;

impl RawMy {
    /// A connection to `url` (whose lock table lockkit has migrated), with a
    /// lock wait as long as lockkit's and its isolation level (`READ
    /// COMMITTED`, under which the row's insert reads without a lock).
    pub async fn connect(url: &str) -> RawMy {
        let mut conn = MySqlConnection::connect(url)
            .await
            .expect("a MySQL connection");
        sqlx::raw_sql(
            "SET SESSION innodb_lock_wait_timeout = 1073741824; \
             SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        )
        .execute(&mut conn)
        .await
        .expect("the session's lock wait and isolation level");
        RawMy {
            conn: Mutex::new(conn),
            lease: lease_statements(Database::MySql),
            owners: Owners::default(),
        }
    }

    /// The lease upsert, then the conditional release.
    pub async fn lease_cycle(&self, name: &str) {
        let owner = self.owners.next();
        let mut conn = self.conn.lock().await;
        let done = sqlx::query(AssertSqlSafe(self.lease.acquire.as_str()))
            .bind(name.as_bytes())
            .bind(&owner)
            .bind(name.as_bytes())
            .bind(RAW_TTL.as_micros() as i64)
            .bind("raw-floor")
            .execute(&mut *conn)
            .await
            .expect("lease upsert");
        let fence = done.last_insert_id();
        assert!(
            fence > 0 && fence < 1 << 62,
            "raw lease: {name:?} was not free"
        );
        // The release when no bell marks the name (it binds the name
        // twice): the wake-up's whole cost when nobody waits.
        let released = sqlx::query(AssertSqlSafe(self.lease.release.as_str()))
            .bind(name.as_bytes())
            .bind(name.as_bytes())
            .bind(&owner)
            .execute(&mut *conn)
            .await
            .expect("lease release");
        assert_eq!(released.rows_affected(), 1, "raw lease: release missed");
    }

    /// The row made if missing, `BEGIN`, the row lock with its token,
    /// `ROLLBACK`, the row deleted unless someone holds it: a released name
    /// leaves no row.
    pub async fn row_cycle(&self, name: &str) {
        let mut conn = self.conn.lock().await;
        sqlx::query(MY_ROW_ENSURE)
            .bind(name.as_bytes())
            .bind(name.as_bytes())
            .execute(&mut *conn)
            .await
            .expect("row made");
        sqlx::raw_sql("BEGIN")
            .execute(&mut *conn)
            .await
            .expect("BEGIN");
        let token: Option<i64> = sqlx::query_scalar(MY_ROW_LOCK)
            .bind(name.as_bytes())
            .fetch_optional(&mut *conn)
            .await
            .expect("row lock");
        assert!(token > Some(0), "raw row: no row for {name:?}");
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut *conn)
            .await
            .expect("ROLLBACK");
        sqlx::query(MY_ROW_DELETE)
            .bind(name.as_bytes())
            .execute(&mut *conn)
            .await
            .expect("row deleted");
    }

    /// `GET_LOCK` with its token, `RELEASE_LOCK`.
    pub async fn named_cycle(&self, name: &str) {
        let mut conn = self.conn.lock().await;
        let token: Option<i64> = sqlx::query_scalar(MY_NAMED_LOCK)
            .bind(name)
            .bind(MY_FOREVER_SECS)
            .fetch_one(&mut *conn)
            .await
            .expect("GET_LOCK");
        assert!(token > Some(0), "raw named: GET_LOCK({name:?})");
        let released: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
            .bind(name)
            .fetch_one(&mut *conn)
            .await
            .expect("RELEASE_LOCK");
        assert_eq!(released, Some(1), "raw named: RELEASE_LOCK({name:?})");
    }
}

/// SQLite: the lease upsert and release on one connection to the database
/// file, opened as lockkit opens it (WAL, `synchronous = NORMAL`), and the
/// release's wake-up of other processes' waiters: one byte written to a file
/// of the bells' directory beside the database, which they watch (as the
/// PostgreSQL floor's release sends its `NOTIFY`).
#[derive(Debug)]
pub struct RawSqlite {
    conn: Mutex<SqliteConnection>,
    /// lockkit's own lease statements, sent by hand.
    lease: LeaseStatements,
    owners: Owners,
    /// The floor's bell, in `<database>-lockkit-bells/`.
    bell: std::fs::File,
}

impl RawSqlite {
    /// A connection to the database file at `path` (which lockkit has
    /// migrated).
    pub async fn connect(path: &std::path::Path) -> RawSqlite {
        use sqlx::ConnectOptions;
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
        let conn = SqliteConnectOptions::new()
            .filename(path)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("an SQLite connection");
        let bells = lockkit_sql::sqlite_bells_dir(path);
        std::fs::create_dir_all(&bells).expect("the bells' directory");
        let bell = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(bells.join("raw-floor"))
            .expect("the raw floor's bell");
        RawSqlite {
            conn: Mutex::new(conn),
            lease: lease_statements(Database::Sqlite),
            owners: Owners::default(),
            bell,
        }
    }

    /// The lease upsert, then the conditional release.
    pub async fn lease_cycle(&self, name: &str) {
        let owner = self.owners.next();
        let mut conn = self.conn.lock().await;
        let fence: Option<i64> = sqlx::query_scalar(AssertSqlSafe(self.lease.acquire.as_str()))
            .bind(name)
            .bind(&owner)
            .bind(millis(RAW_TTL))
            .bind("raw-floor")
            .fetch_optional(&mut *conn)
            .await
            .expect("lease upsert");
        assert!(fence.is_some(), "raw lease: {name:?} was not free");
        // The release when no other client waits in the name's line: the
        // check for them is its whole cost then.
        let released = sqlx::query(AssertSqlSafe(self.lease.release.as_str()))
            .bind(name)
            .bind(&owner)
            .bind("raw-floor")
            .execute(&mut *conn)
            .await
            .expect("lease release");
        assert_eq!(released.rows_affected(), 1, "raw lease: release missed");
        std::os::unix::fs::FileExt::write_at(&self.bell, &[1], 0).expect("ring the bell");
    }
}
