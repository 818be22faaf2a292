#![allow(clippy::print_stdout)]
//! lockkit-sql against real PostgreSQL and MariaDB servers and an SQLite
//! file, every mode in one process and one run, so that the ratios between
//! the measurements are meaningful on a noisy machine.
//!
//! For each database:
//!
//! * `sql_cycle/<db>_select_1`: one `SELECT 1` on a dedicated sqlx
//!   connection: a single statement's round trip.
//! * `sql_cycle/<db>_raw_<mode>` (a): the raw floor of a lock cycle in that
//!   mode: lockkit-sql's own statements, issued by hand on dedicated
//!   connections (see `lockkit_benches::RawPg` and friends).
//! * `sql_cycle/<db>_lockkit_<mode>` (b): `acquire` + `release` of an
//!   uncontended lock through lockkit (watchdog renewal off).
//! * `sql_handoff_<db>_<mode>/handoff` (c): from the holder's `release()` call
//!   to the moment a waiter on another client, already parked inside
//!   `acquire`, gets the lock. Each handoff is paired with a `SELECT 1` timed
//!   just before it.
//!
//! The targets are judged on paired measurements: (b)/(a) ≤ 1.15 for every
//! mode over the interleaved rounds run after the criterion groups, and for
//! the session modes (`row`, `advisory`, `named`) the median handoff below
//! 2 × the median of the `SELECT 1`s paired with the handoffs. Lease-mode
//! handoffs are shown without a target: Postgres and MariaDB wake a waiting
//! client by ending a statement its bell session sleeps in
//! (`pg_cancel_backend`, `KILL QUERY`), SQLite by a bell file. After every batch of
//! cycles (outside the timing) the lock table is checked to hold no live
//! lease and no advisory or named lock to be left held.
//!
//! The benchmark's client runs on one CPU and the servers on the other
//! ([`lockkit_benches::cpu`]): left to the scheduler, each connection's
//! server thread landed on either, and a floor and the lockkit cycle paired
//! with it were each served at a speed of their own.
//!
//! The servers are the testkit's, tuned for tests: Postgres with
//! `fsync=off`, MariaDB with `innodb_flush_log_at_trx_commit=2`; SQLite in WAL
//! mode with `synchronous=NORMAL` (lockkit's settings) in a temporary
//! directory.
//!
//! Run with `cargo bench -p lockkit-benches --bench sql`; the summary is
//! printed at the end and written to `target/lockkit-bench/sql-summary.md`.
//! `LOCKKIT_BENCH_QUICK=1` shrinks everything to a smoke test, as does
//! criterion's `-- --test` (which runs each benchmark once and writes no
//! estimates, so the criterion table is left out).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use criterion::Criterion;
use lockkit_benches::{
    CycleFixture, CycleKind, Estimates, HandoffDiag, HandoffProbe, Handoffs, Interleaved, Limit,
    RawMy, RawPg, RawSessionHandoffs, RawSessionMode, RawSqlite, Row, RunMode, bench_then_pair,
    lockkit_cycle, save_summary,
};
use lockkit_core::LockOptions;
use lockkit_sql::SqlLock;
use lockkit_testkit::{FaultControl, TestServer};
use lockkit_testkit::{MariaDbServer, PostgresServer};
use tokio::runtime::Runtime;
use tokio::time::Instant;

const CYCLE_GROUP: &str = "sql_cycle";
const TTL: Duration = Duration::from_secs(30);
/// The target on every lockkit cycle, as a ratio to its raw floor.
const CYCLE_LIMIT: Limit = Limit::AtMost(1.15);
/// The target on a session mode's handoff, as a ratio to a `SELECT 1`.
const SESSION_HANDOFF_LIMIT: Limit = Limit::Below(2.0);

/// The lock names of the raw floors (their own rows and keys).
const RAW_LEASE: &str = "bench-raw-lease";
const RAW_ROW: &str = "bench-raw-row";
const RAW_ADVISORY: &str = "bench-raw-advisory";
const RAW_NAMED: &str = "bench-raw-named";
/// The lock name of lockkit's cycles (each mode has its own client).
const LOCKKIT_NAME: &str = "bench-lockkit";

fn main() {
    let mode = RunMode::from_env();
    let runtime = lockkit_benches::runtime();
    // Estimates older than this belong to an earlier run.
    let run_started = SystemTime::now();
    // The servers start on every CPU, then move to a CPU of their own; this
    // process (its threads, and the SQLite pool's started later) pins
    // itself only then, so that the servers do not start on its one CPU.
    let (pg_server, my_server) =
        runtime.block_on(async { tokio::join!(PostgresServer::start(), MariaDbServer::start()) });
    for pid in [pg_server.pid(), my_server.pid()] {
        lockkit_benches::cpu::pin_server(pid.expect("a running server"));
    }
    let pinned = lockkit_benches::cpu::pin_client();
    let sqlite_dir = std::env::temp_dir().join(format!("lockkit-bench-sql-{}", std::process::id()));
    std::fs::create_dir_all(&sqlite_dir).expect("a directory for the SQLite file");
    let urls = Urls {
        pg: pg_server.url(),
        my: my_server.url(),
        sqlite: sqlite_dir.join("locks.db"),
    };

    let fixture = runtime.block_on(Fixture::new(&urls));

    let Some((handoffs, paired)) = bench_then_pair(&runtime, CYCLE_GROUP, &fixture, mode, |c| {
        HANDOFFS
            .iter()
            .map(|&(db, lock_mode, park)| {
                bench_handoff(c, &runtime, &urls, &fixture, mode, db, lock_mode, park)
            })
            .collect::<Vec<_>>()
    }) else {
        return;
    };

    let floors: Vec<Floor> = FLOORS
        .iter()
        .map(|&floor| handoff_floor(&runtime, &urls, &fixture, mode, floor))
        .collect();
    save_summary(
        mode,
        "sql",
        &summary(mode, run_started, &pinned, &paired, &handoffs, &floors),
    );
    // The connections end before the servers do.
    drop(fixture);
    drop((pg_server, my_server));
    let _ = std::fs::remove_dir_all(&sqlite_dir);
}

/// Where the databases are.
struct Urls {
    pg: String,
    my: String,
    sqlite: PathBuf,
}

impl Urls {
    /// lockkit's URL of `db` in `mode`.
    fn lockkit(&self, db: Db, mode: &str) -> String {
        match db {
            Db::Pg => format!("{}?mode={mode}", self.pg),
            Db::My => format!("{}?mode={mode}", self.my),
            Db::Sqlite => format!("sqlite://{}?mode={mode}", self.sqlite.display()),
        }
    }
}

/// The databases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Db {
    Pg,
    My,
    Sqlite,
}

impl Db {
    fn label(self) -> &'static str {
        match self {
            Db::Pg => "postgres",
            Db::My => "mariadb",
            Db::Sqlite => "sqlite",
        }
    }
}

/// One uncontended cycle of each kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cycle {
    PgSelect,
    PgRawLease,
    PgLease,
    PgRawRow,
    PgRow,
    PgRawAdvisory,
    PgAdvisory,
    MySelect,
    MyRawLease,
    MyLease,
    MyRawRow,
    MyRow,
    MyRawNamed,
    MyNamed,
    SqliteSelect,
    SqliteRawLease,
    SqliteLease,
}

impl CycleKind for Cycle {
    const ALL: &'static [Cycle] = &[
        Cycle::PgSelect,
        Cycle::PgRawLease,
        Cycle::PgLease,
        Cycle::PgRawRow,
        Cycle::PgRow,
        Cycle::PgRawAdvisory,
        Cycle::PgAdvisory,
        Cycle::MySelect,
        Cycle::MyRawLease,
        Cycle::MyLease,
        Cycle::MyRawRow,
        Cycle::MyRow,
        Cycle::MyRawNamed,
        Cycle::MyNamed,
        Cycle::SqliteSelect,
        Cycle::SqliteRawLease,
        Cycle::SqliteLease,
    ];

    /// The criterion benchmark id within [`CYCLE_GROUP`].
    fn bench(self) -> &'static str {
        match self {
            Cycle::PgSelect => "postgres_select_1",
            Cycle::PgRawLease => "postgres_raw_lease",
            Cycle::PgLease => "postgres_lockkit_lease",
            Cycle::PgRawRow => "postgres_raw_row",
            Cycle::PgRow => "postgres_lockkit_row",
            Cycle::PgRawAdvisory => "postgres_raw_advisory",
            Cycle::PgAdvisory => "postgres_lockkit_advisory",
            Cycle::MySelect => "mariadb_select_1",
            Cycle::MyRawLease => "mariadb_raw_lease",
            Cycle::MyLease => "mariadb_lockkit_lease",
            Cycle::MyRawRow => "mariadb_raw_row",
            Cycle::MyRow => "mariadb_lockkit_row",
            Cycle::MyRawNamed => "mariadb_raw_named",
            Cycle::MyNamed => "mariadb_lockkit_named",
            Cycle::SqliteSelect => "sqlite_select_1",
            Cycle::SqliteRawLease => "sqlite_raw_lease",
            Cycle::SqliteLease => "sqlite_lockkit_lease",
        }
    }
}

impl Cycle {
    fn db(self) -> Db {
        match self {
            Cycle::PgSelect
            | Cycle::PgRawLease
            | Cycle::PgLease
            | Cycle::PgRawRow
            | Cycle::PgRow
            | Cycle::PgRawAdvisory
            | Cycle::PgAdvisory => Db::Pg,
            Cycle::MySelect
            | Cycle::MyRawLease
            | Cycle::MyLease
            | Cycle::MyRawRow
            | Cycle::MyRow
            | Cycle::MyRawNamed
            | Cycle::MyNamed => Db::My,
            Cycle::SqliteSelect | Cycle::SqliteRawLease | Cycle::SqliteLease => Db::Sqlite,
        }
    }
}

/// lockkit clients, one per (database, mode).
struct Locks {
    pg_lease: SqlLock,
    pg_row: SqlLock,
    pg_advisory: SqlLock,
    my_lease: SqlLock,
    my_row: SqlLock,
    my_named: SqlLock,
    sqlite_lease: SqlLock,
}

/// The raw connections and lockkit clients of the uncontended cycles, shared
/// by the criterion group and the interleaved rounds; the raw connections are
/// also the handoffs' probes and yardsticks.
struct Fixture {
    pg: RawPg,
    my: RawMy,
    sqlite: RawSqlite,
    locks: Locks,
}

async fn lockkit(urls: &Urls, db: Db, mode: &str) -> SqlLock {
    let url = urls.lockkit(db, mode);
    lockkit_sql::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("lockkit-sql connects to {url}: {e}"))
}

impl Fixture {
    async fn new(urls: &Urls) -> Fixture {
        // lockkit's clients first: their `connect` creates the lock tables.
        let locks = Locks {
            pg_lease: lockkit(urls, Db::Pg, "lease").await,
            pg_row: lockkit(urls, Db::Pg, "row").await,
            pg_advisory: lockkit(urls, Db::Pg, "advisory").await,
            my_lease: lockkit(urls, Db::My, "lease").await,
            my_row: lockkit(urls, Db::My, "row").await,
            my_named: lockkit(urls, Db::My, "named").await,
            sqlite_lease: lockkit(urls, Db::Sqlite, "lease").await,
        };
        let fixture = Fixture {
            pg: RawPg::connect(&urls.pg).await,
            my: RawMy::connect(&urls.my).await,
            sqlite: RawSqlite::connect(&urls.sqlite).await,
            locks,
        };
        // Outside every measurement: lockkit creates the rows of its row
        // locks and opens its connections on the first acquires.
        for &kind in Cycle::ALL {
            for _ in 0..3 {
                fixture.run(kind).await;
            }
            fixture.after_batch(kind).await;
        }
        fixture
    }

    /// The lockkit client of a lockkit cycle.
    fn client(&self, kind: Cycle) -> Option<&SqlLock> {
        let l = &self.locks;
        Some(match kind {
            Cycle::PgLease => &l.pg_lease,
            Cycle::PgRow => &l.pg_row,
            Cycle::PgAdvisory => &l.pg_advisory,
            Cycle::MyLease => &l.my_lease,
            Cycle::MyRow => &l.my_row,
            Cycle::MyNamed => &l.my_named,
            Cycle::SqliteLease => &l.sqlite_lease,
            _ => return None,
        })
    }
}

/// Live leases, and advisory locks held, on Postgres.
const PG_LEFT: &str = "SELECT (SELECT count(*) FROM lockkit_locks WHERE expires_at > now()) \
    + (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory')";
/// Live leases, and the named locks of the cycles held, on MariaDB (the
/// release bells' rows, which a bell keeps for a few seconds after its last
/// waiter, are none).
const MY_LEFT: &str = "SELECT CAST((SELECT COUNT(*) FROM lockkit_locks WHERE expires_at > UTC_TIMESTAMP(6) \
        AND name NOT LIKE CONCAT(CHAR(1), 'bell:%')) \
    + (IS_USED_LOCK('bench-raw-named') IS NOT NULL) + (IS_USED_LOCK('bench-lockkit') IS NOT NULL) AS SIGNED)";
/// Live leases in the SQLite file.
const SQLITE_LEFT: &str = "SELECT count(*) FROM lockkit_locks \
    WHERE expires_at > CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

impl CycleFixture for Fixture {
    type Kind = Cycle;

    async fn run(&self, kind: Cycle) {
        if let Some(locks) = self.client(kind) {
            let opts = LockOptions::new().ttl(TTL).auto_renew(false);
            lockkit_cycle(locks, LOCKKIT_NAME, &opts).await;
            return;
        }
        match kind {
            Cycle::PgSelect => self.pg.select_one().await,
            Cycle::PgRawLease => self.pg.lease_cycle(RAW_LEASE).await,
            Cycle::PgRawRow => self.pg.row_cycle(RAW_ROW).await,
            Cycle::PgRawAdvisory => {
                self.pg
                    .advisory_cycle(lockkit_sql::advisory_key(RAW_ADVISORY))
                    .await;
            }
            Cycle::MySelect => self.my.select_one().await,
            Cycle::MyRawLease => self.my.lease_cycle(RAW_LEASE).await,
            Cycle::MyRawRow => self.my.row_cycle(RAW_ROW).await,
            Cycle::MyRawNamed => self.my.named_cycle(RAW_NAMED).await,
            Cycle::SqliteSelect => self.sqlite.select_one().await,
            Cycle::SqliteRawLease => self.sqlite.lease_cycle(RAW_LEASE).await,
            lockkit => unreachable!("{lockkit:?} has a client"),
        }
    }

    /// Checks that the cycles left no live lease and no advisory or named
    /// lock behind. (A row lock left behind would stall the next cycle.)
    /// On SQLite it also
    /// empties the write-ahead log: the checkpoint its growth sets off
    /// (every 1000 pages, a few batches) would otherwise fall on the
    /// batches of one kind, as the phase of the rounds has it, and cost it
    /// tens of µs a cycle (the raw floor and lockkit share the file).
    async fn after_batch(&self, kind: Cycle) {
        let left = match kind.db() {
            Db::Pg => self.pg.scalar(PG_LEFT, &[]).await,
            Db::My => self.my.scalar(MY_LEFT, &[]).await,
            Db::Sqlite => {
                self.sqlite
                    .scalar("PRAGMA wal_checkpoint(TRUNCATE)", &[])
                    .await;
                self.sqlite.scalar(SQLITE_LEFT, &[]).await
            }
        };
        assert_eq!(left, 0, "{}: locks left behind", kind.bench());
    }
}

/// How a handoff knows that its waiter is parked inside `acquire`.
#[derive(Clone, Copy, Debug)]
enum Park {
    /// Postgres lease: the waiter's upsert has run since the mark (its pool
    /// connection went idle after it, `pg_stat_activity`) and its client's
    /// bell sleeps (a session named `lockkit-bell-<client>` runs a
    /// statement); a release ends that sleep with `pg_cancel_backend`.
    PgAttempt,
    /// Postgres session modes: a lock request waits (`pg_locks`).
    PgLockWait,
    /// MariaDB lease: the waiter's upsert has run (`Com_insert` went up) and
    /// its release bell sleeps (the process list shows it); a release ends
    /// that sleep with `KILL QUERY`.
    MyAttempt,
    /// MariaDB session modes: a statement waits for the lock (`GET_LOCK` shows
    /// `User lock`; a row lock, its `FOR UPDATE` statement).
    MyLockWait,
    /// SQLite: no server to ask; the waiter has been waiting this long (it
    /// then waits for its bell file to ring).
    For(Duration),
}

/// The handoffs: database, mode, and how the waiter is known to be parked.
const HANDOFFS: &[(Db, &str, Park)] = &[
    (Db::Pg, "lease", Park::PgAttempt),
    (Db::Pg, "row", Park::PgLockWait),
    (Db::Pg, "advisory", Park::PgLockWait),
    (Db::My, "lease", Park::MyAttempt),
    (Db::My, "row", Park::MyLockWait),
    (Db::My, "named", Park::MyLockWait),
    (Db::Sqlite, "lease", Park::For(Duration::from_millis(30))),
];

/// The lock name of the handoffs in `mode` (modes sharing a table must not
/// share a name).
fn handoff_name(mode: &str) -> &'static str {
    match mode {
        "lease" => "bench-handoff-lease",
        "row" => "bench-handoff-row",
        "advisory" => "bench-handoff-advisory",
        "named" => "bench-handoff-named",
        other => unreachable!("no handoff in mode {other}"),
    }
}

const PG_NOW_US: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint";
/// An idle connection whose last statement, since the mark, was a grant's
/// upsert, the waiting writer's record that follows a refused one, or (a
/// waiting writer reads before it writes again) the read of the lease row.
/// (A waiter whose client watches the name already, from the handoff
/// before, makes one attempt and then sleeps until its turn: its record is
/// its last statement.)
const PG_ATTEMPTS_SINCE: &str = "SELECT count(*) FROM pg_stat_activity \
    WHERE state = 'idle' \
      AND (query LIKE 'WITH g AS MATERIALIZED (SELECT pg_advisory_xact_lock%' \
           OR query LIKE 'INSERT INTO lockkit_locks (name, owner, fence, expires_at) VALUES ($1, $2, 0,%' \
           OR query LIKE 'SELECT fence, GREATEST(0, CEIL(%') \
      AND state_change > to_timestamp($1::double precision / 1000000)";
const PG_WAITING: &str = "SELECT count(*) FROM pg_locks WHERE NOT granted";
/// A waiting client's bell, in its statement.
const PG_BELLS: &str = "SELECT count(*) FROM pg_stat_activity \
    WHERE application_name LIKE 'lockkit-bell-%' AND state = 'active'";
const MY_INSERTS: &str = "SELECT CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS \
    WHERE VARIABLE_NAME = 'COM_INSERT'";
/// The release bells that wait (see lockkit-sql's `mysql::bells`).
const MY_BELLS: &str = "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
    WHERE INFO LIKE CONCAT('%''lockkit', ' bell %')";
/// `FOR UPDATE` spelt apart, so that this statement does not count itself.
const MY_WAITING: &str = "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
    WHERE STATE = 'User lock' OR INFO LIKE CONCAT('%FOR', ' UPDATE%')";

/// The handoff's view of one database.
struct SqlProbe<'a> {
    fixture: &'a Fixture,
    db: Db,
    park: Park,
}

impl SqlProbe<'_> {
    /// Whether the waiter is parked, given the mark.
    async fn parked(&self, (mark, started): (i64, Instant)) -> bool {
        let f = self.fixture;
        match self.park {
            Park::PgAttempt => {
                f.pg.scalar(PG_ATTEMPTS_SINCE, &[mark]).await > 0
                    && f.pg.scalar(PG_BELLS, &[]).await > 0
            }
            Park::PgLockWait => f.pg.scalar(PG_WAITING, &[]).await > 0,
            Park::MyAttempt => {
                f.my.scalar(MY_INSERTS, &[]).await > mark && f.my.scalar(MY_BELLS, &[]).await > 0
            }
            Park::MyLockWait => f.my.scalar(MY_WAITING, &[]).await > 0,
            Park::For(wait) => {
                self.select_one().await;
                started.elapsed() >= wait
            }
        }
    }

    async fn select_one(&self) {
        match self.db {
            Db::Pg => self.fixture.pg.select_one().await,
            Db::My => self.fixture.my.select_one().await,
            Db::Sqlite => self.fixture.sqlite.select_one().await,
        }
    }
}

impl HandoffProbe for SqlProbe<'_> {
    /// The server's count before the waiter starts (Postgres lease: its
    /// clock in µs; MariaDB lease: `Com_insert`; otherwise unused), and when
    /// it starts.
    type Mark = (i64, Instant);

    async fn mark(&self) -> (i64, Instant) {
        let count = match self.park {
            Park::PgAttempt => self.fixture.pg.scalar(PG_NOW_US, &[]).await,
            Park::MyAttempt => self.fixture.my.scalar(MY_INSERTS, &[]).await,
            Park::For(_) | Park::PgLockWait | Park::MyLockWait => 0,
        };
        (count, Instant::now())
    }

    /// Polls until the waiter is parked, then a few more times, so that the
    /// waiter's client has the answer to its attempt and is waiting.
    async fn until_parked(&self, mark: (i64, Instant)) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.parked(mark).await {
            assert!(
                Instant::now() < deadline,
                "{} {:?}: the waiter never parked",
                self.db.label(),
                self.park
            );
        }
        for _ in 0..3 {
            self.select_one().await;
        }
    }

    /// A `SELECT 1` on the raw connection, timed just before the release.
    async fn yardstick(&self) -> Duration {
        let started = Instant::now();
        self.select_one().await;
        started.elapsed()
    }
}

/// (c): release by client A to acquisition by a waiting client B (another
/// `connect`, its own connections).
#[allow(clippy::too_many_arguments)]
fn bench_handoff(
    c: &mut Criterion,
    runtime: &Runtime,
    urls: &Urls,
    fixture: &Fixture,
    mode: RunMode,
    db: Db,
    lock_mode: &'static str,
    park: Park,
) -> HandoffDiag {
    let url = urls.lockkit(db, lock_mode);
    let probe = SqlProbe { fixture, db, park };
    let group = format!("sql_handoff_{}_{lock_mode}", db.label());
    Handoffs::connect(
        runtime,
        || lockkit_sql::connect(&url),
        handoff_name(lock_mode),
        LockOptions::new().ttl(TTL),
        probe,
    )
    .bench(c, runtime, &group, mode)
}

/// The session modes whose handoff is also measured against the server's own
/// (by hand, [`RawSessionHandoffs`]): database, mode, the raw equivalent, and
/// how a waiter is known to be parked.
const FLOORS: &[(Db, &str, RawSessionMode, Park)] = &[
    (Db::Pg, "row", RawSessionMode::PgRow, Park::PgLockWait),
    (
        Db::Pg,
        "advisory",
        RawSessionMode::PgAdvisory,
        Park::PgLockWait,
    ),
    (Db::My, "row", RawSessionMode::MyRow, Park::MyLockWait),
    (Db::My, "named", RawSessionMode::MyNamed, Park::MyLockWait),
];

/// A session mode's handoff floor: the raw handoffs, and the ratio of each
/// lockkit handoff to the raw one measured right before it.
struct Floor {
    raw: HandoffDiag,
    ratios: Vec<f64>,
}

/// (c0): the server's own handoff of a session lock, by hand, interleaved
/// with lockkit's handoffs of the same mode (new clients, outside criterion):
/// one raw, one lockkit, and so on.
fn handoff_floor(
    runtime: &Runtime,
    urls: &Urls,
    fixture: &Fixture,
    mode: RunMode,
    (db, lock_mode, raw_mode, park): (Db, &'static str, RawSessionMode, Park),
) -> Floor {
    let pairs = match mode {
        RunMode::Bench => 300,
        RunMode::Quick => 30,
        _ => 2,
    };
    let url = urls.lockkit(db, lock_mode);
    let probe = SqlProbe { fixture, db, park };
    let lockkit = Handoffs::connect(
        runtime,
        || lockkit_sql::connect(&url),
        handoff_name(lock_mode),
        LockOptions::new().ttl(TTL),
        SqlProbe { fixture, db, park },
    );
    let server = match db {
        Db::Pg => &urls.pg,
        Db::My => &urls.my,
        Db::Sqlite => unreachable!("SQLite has no session locks"),
    };
    runtime.block_on(async {
        let mut raw = RawSessionHandoffs::connect(
            server,
            raw_mode,
            &format!("bench-raw-handoff-{lock_mode}"),
        )
        .await;
        // Warm both up: first waits open connections.
        for _ in 0..2 {
            raw.once(&probe).await;
            lockkit.once().await;
        }
        let mut floor = Floor {
            raw: HandoffDiag::default(),
            ratios: Vec::with_capacity(pairs),
        };
        for _ in 0..pairs {
            let r = raw.once(&probe).await;
            floor
                .raw
                .record(r.release_call, r.waiter_first, r.handoff, r.yardstick);
            let handoff = lockkit.once().await;
            floor
                .ratios
                .push(handoff.as_secs_f64() / r.handoff.as_secs_f64().max(1e-9));
        }
        floor.ratios.sort_by(f64::total_cmp);
        floor
    })
}

/// The summary rows of the cycles: per database, its `SELECT 1`, then each
/// mode's raw floor (ratio to `SELECT 1`) and lockkit cycle (ratio to the
/// raw floor, judged).
fn cycle_rows() -> Vec<Row<'static, Cycle>> {
    use Cycle::*;
    let judged = Some(CYCLE_LIMIT);
    vec![
        ("postgres: SELECT 1", PgSelect, PgSelect, None),
        (
            "postgres lease (a) raw floor: gated upsert with nextval + delete with NOTIFY; ratio to SELECT 1",
            PgRawLease,
            PgSelect,
            None,
        ),
        (
            "postgres lease (b) lockkit acquire+release; ratio (b)/(a)",
            PgLease,
            PgRawLease,
            judged,
        ),
        (
            "postgres row (a) raw floor: row made if missing + BEGIN + the name's gate and FOR UPDATE with nextval + ROLLBACK + row deleted if free; ratio to SELECT 1",
            PgRawRow,
            PgSelect,
            None,
        ),
        (
            "postgres row (b) lockkit acquire+release; ratio (b)/(a)",
            PgRow,
            PgRawRow,
            judged,
        ),
        (
            "postgres advisory (a) raw floor: pg_advisory_lock with nextval + pg_advisory_unlock; ratio to SELECT 1",
            PgRawAdvisory,
            PgSelect,
            None,
        ),
        (
            "postgres advisory (b) lockkit acquire+release; ratio (b)/(a)",
            PgAdvisory,
            PgRawAdvisory,
            judged,
        ),
        ("mariadb: SELECT 1", MySelect, MySelect, None),
        (
            "mariadb lease (a) raw floor: gated upsert with NEXTVAL + delete with the name's bell mark; ratio to SELECT 1",
            MyRawLease,
            MySelect,
            None,
        ),
        (
            "mariadb lease (b) lockkit acquire+release; ratio (b)/(a)",
            MyLease,
            MyRawLease,
            judged,
        ),
        (
            "mariadb row (a) raw floor: row made if missing + BEGIN + NEXTVAL … FOR UPDATE + ROLLBACK + row deleted if free; ratio to SELECT 1",
            MyRawRow,
            MySelect,
            None,
        ),
        (
            "mariadb row (b) lockkit acquire+release; ratio (b)/(a)",
            MyRow,
            MyRawRow,
            judged,
        ),
        (
            "mariadb named (a) raw floor: GET_LOCK with NEXTVAL + RELEASE_LOCK; ratio to SELECT 1",
            MyRawNamed,
            MySelect,
            None,
        ),
        (
            "mariadb named (b) lockkit acquire+release; ratio (b)/(a)",
            MyNamed,
            MyRawNamed,
            judged,
        ),
        ("sqlite: SELECT 1", SqliteSelect, SqliteSelect, None),
        (
            "sqlite lease (a) raw floor: upsert above the high-water mark + delete + a byte to a bell file; ratio to SELECT 1",
            SqliteRawLease,
            SqliteSelect,
            None,
        ),
        (
            "sqlite lease (b) lockkit acquire+release; ratio (b)/(a)",
            SqliteLease,
            SqliteRawLease,
            judged,
        ),
    ]
}

fn summary(
    mode: RunMode,
    run_started: SystemTime,
    pinned: &str,
    paired: &Interleaved<Cycle>,
    handoffs: &[HandoffDiag],
    floors: &[Floor],
) -> String {
    let mut out = paired.summary(
        mode,
        "lockkit-sql on PostgreSQL, MariaDB and SQLite",
        "",
        &format!("Targets, from paired measurements: each cycle ratio is the median over rounds of the ratio of two cycles run in the same round, and each handoff is compared with a `SELECT 1` on the same database timed just before it, so that the shared machine's slow and fast phases cancel out. lockkit's cycles run with auto-renew off. {pinned}"),
        &cycle_rows(),
    );
    for (&(db, lock_mode, park), diag) in HANDOFFS.iter().zip(handoffs) {
        let session = lock_mode != "lease";
        let how = match park {
            Park::PgAttempt => "woken by its bell",
            Park::MyAttempt => "woken by KILL QUERY",
            Park::For(_) => "woken by a bell file",
            Park::PgLockWait | Park::MyLockWait => "the server's queue",
        };
        let label = format!(
            "{} {lock_mode} (c) handoff release→waiter acquired ({how}); ratio to SELECT 1",
            db.label()
        );
        let limit = session.then_some(SESSION_HANDOFF_LIMIT);
        let _ = writeln!(out, "{}", diag.row(&label, "SELECT 1", limit));
    }
    for (&(db, lock_mode, _, _), floor) in FLOORS.iter().zip(floors) {
        let label = format!(
            "{} {lock_mode} (c0) the server's own handoff, by hand (release statement → waiting lock statement answered); ratio to SELECT 1",
            db.label()
        );
        let _ = writeln!(out, "{}", floor.raw.row(&label, "SELECT 1", None));
        // Sorted; the middle one (the upper of two).
        let ratio = floor
            .ratios
            .get(floor.ratios.len() / 2)
            .map_or("n/a".to_owned(), |r| format!("{r:.3}"));
        let _ = writeln!(
            out,
            "| {} {lock_mode} (c)/(c0): lockkit's handoff over the server's own, median of {} interleaved pairs | — | {ratio} | — |",
            db.label(),
            floor.ratios.len()
        );
    }
    let _ = writeln!(
        out,
        "\nRounds in which lockkit's cycle was faster than its raw floor: postgres lease {}, row {}, advisory {}; mariadb lease {}, row {}, named {}; sqlite lease {} (of {}).\n",
        paired.rounds_faster(Cycle::PgLease, Cycle::PgRawLease),
        paired.rounds_faster(Cycle::PgRow, Cycle::PgRawRow),
        paired.rounds_faster(Cycle::PgAdvisory, Cycle::PgRawAdvisory),
        paired.rounds_faster(Cycle::MyLease, Cycle::MyRawLease),
        paired.rounds_faster(Cycle::MyRow, Cycle::MyRawRow),
        paired.rounds_faster(Cycle::MyNamed, Cycle::MyRawNamed),
        paired.rounds_faster(Cycle::SqliteLease, Cycle::SqliteRawLease),
        paired.rounds(),
    );
    for (&(db, lock_mode, _), diag) in HANDOFFS.iter().zip(handoffs) {
        if let Some(line) = diag.describe() {
            let _ = writeln!(out, "{} {lock_mode} (c) detail: {line}.\n", db.label());
        }
    }

    // Informational: criterion's medians, one benchmark after the other.
    let others: Vec<(String, &str)> = HANDOFFS
        .iter()
        .map(|&(db, lock_mode, _)| (format!("sql_handoff_{}_{lock_mode}", db.label()), "handoff"))
        .collect();
    let others: Vec<(&str, &str)> = others.iter().map(|(g, b)| (g.as_str(), *b)).collect();
    Estimates::new(run_started).write_table(&mut out, CYCLE_GROUP, Cycle::PgSelect, &others);
    out
}
