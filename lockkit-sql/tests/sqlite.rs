//! SQLite `lease` mode: the conformance suite on a temporary database file,
//! and mutual exclusion with fencing across OS processes sharing that file.
#![cfg(feature = "sqlite")]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lockkit_conformance::{Disposable, Harness};
use lockkit_core::{DistributedLock, LockOptions, Result};
use sqlx::{Connection, SqliteConnection};
use tempfile::TempDir;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

fn url(path: &Path) -> String {
    format!(
        "sqlite://{}?command_timeout=1s&connect_timeout=1s",
        path.display()
    )
}

async fn connect(path: &Path) -> Result<Arc<dyn DistributedLock>> {
    Ok(Arc::new(lockkit_sql::connect(&url(path)).await?))
}

struct SqliteHarness {
    _dir: TempDir,
    db: PathBuf,
}

impl SqliteHarness {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("locks.db");
        SqliteHarness { _dir: dir, db }
    }
}

#[async_trait::async_trait]
impl Harness for SqliteHarness {
    async fn client(&self) -> Arc<dyn DistributedLock> {
        connect(&self.db).await.expect("open the database")
    }

    /// Deletes the lease row's owner, as an operator would.
    async fn revoke(&self, name: &str) {
        let mut conn = SqliteConnection::connect(&format!("sqlite://{}", self.db.display()))
            .await
            .expect("admin connection");
        let done = sqlx::query("UPDATE lockkit_locks SET owner = NULL, expires_at = 0 WHERE name = ?1 AND owner IS NOT NULL")
            .bind(name)
            .execute(&mut conn)
            .await
            .expect("revoke");
        assert_eq!(done.rows_affected(), 1, "no lease on {name:?} to revoke");
    }

    async fn disposable(&self) -> Box<dyn Disposable> {
        Box::new(DisposableFile::new())
    }

    fn connect_timeout(&self) -> Duration {
        CONNECT_TIMEOUT
    }

    async fn stored_entries(&self, prefix: &str) -> usize {
        let mut conn = SqliteConnection::connect(&format!("sqlite://{}", self.db.display()))
            .await
            .expect("admin connection");
        let count: i64 =
            sqlx::query_scalar("SELECT count(*) FROM lockkit_locks WHERE instr(name, ?1) > 0")
                .bind(prefix)
                .fetch_one(&mut conn)
                .await
                .expect("count rows");
        count as usize
    }
}

/// A database file that can be made unavailable: "pause" holds its write
/// lock from another connection (statements then fail after the busy
/// timeout), "kill" also removes its directory, so it cannot be opened again.
struct DisposableFile {
    dir: Option<TempDir>,
    db: PathBuf,
    blocker: Option<SqliteConnection>,
}

impl DisposableFile {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("locks.db");
        DisposableFile {
            dir: Some(dir),
            db,
            blocker: None,
        }
    }

    async fn block(&mut self) {
        if self.blocker.is_some() {
            return;
        }
        let mut conn =
            SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", self.db.display()))
                .await
                .expect("blocking connection");
        sqlx::raw_sql("BEGIN EXCLUSIVE")
            .execute(&mut conn)
            .await
            .expect("take the write lock");
        self.blocker = Some(conn);
    }
}

#[async_trait::async_trait]
impl Disposable for DisposableFile {
    async fn connect(&self) -> Result<Arc<dyn DistributedLock>> {
        connect(&self.db).await
    }

    async fn kill(&mut self) {
        self.block().await;
        drop(self.dir.take());
    }

    async fn pause(&mut self) {
        self.block().await;
    }

    async fn resume(&mut self) {
        if let Some(mut conn) = self.blocker.take() {
            sqlx::raw_sql("ROLLBACK")
                .execute(&mut conn)
                .await
                .expect("give the write lock back");
        }
    }

    /// A new, empty database file where the old one was (the blocker, if
    /// any, holds the old file's write lock, not this one's).
    async fn restart(&self) {
        if let Some(dir) = self.db.parent() {
            std::fs::create_dir_all(dir).expect("recreate the database's directory");
        }
    }

    async fn connect_within(&self, timeout: Duration) -> Result<Arc<dyn DistributedLock>> {
        let url = format!(
            "sqlite://{}?command_timeout=1s&connect_timeout={}ms",
            self.db.display(),
            timeout.as_millis()
        );
        Ok(Arc::new(lockkit_sql::connect(&url).await?))
    }
}

impl Drop for DisposableFile {
    /// A restarted file's directory is no longer the `TempDir`'s to remove.
    fn drop(&mut self) {
        if self.dir.is_none()
            && let Some(dir) = self.db.parent()
        {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

lockkit_conformance::conformance_suite!(SqliteHarness::new());

/// Environment of a worker process (see `sqlite_worker`).
const WORKER_DB: &str = "LOCKKIT_SQLITE_WORKER_DB";
const WORKER_LOG: &str = "LOCKKIT_SQLITE_WORKER_LOG";
const WORKER_COUNTER: &str = "LOCKKIT_SQLITE_WORKER_COUNTER";
const ROUNDS: u64 = 40;
const PROCESSES: usize = 3;

/// The body of one worker process: `ROUNDS` critical sections, each a
/// read-modify-write of a counter file, logged with its fencing token and its
/// start and end on the shared system clock. Run by
/// `lease_mode_across_processes`, not on its own.
#[tokio::test]
#[ignore = "a worker process of lease_mode_across_processes"]
async fn sqlite_worker() {
    use std::io::Write;
    let db = std::env::var(WORKER_DB).expect("run by lease_mode_across_processes");
    let log_path = std::env::var(WORKER_LOG).unwrap();
    let counter = std::env::var(WORKER_COUNTER).unwrap();
    let locks = lockkit_sql::connect(&format!("sqlite://{db}"))
        .await
        .unwrap();
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_for(Duration::from_secs(30));
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .open(&log_path)
        .unwrap();
    for _ in 0..ROUNDS {
        let guard = locks.acquire("shared", &opts).await.unwrap();
        let start = now_ns();
        let value: u64 = std::fs::read_to_string(&counter)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        std::fs::write(&counter, (value + 1).to_string()).unwrap();
        let end = now_ns();
        let token = guard.fencing_token().unwrap().get();
        writeln!(log, "{token} {start} {end}").unwrap();
        guard.release().await.unwrap();
    }
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Several OS processes take the same lease lock on one SQLite file: their
/// critical sections never overlap, no update is lost, and fencing tokens
/// increase in the order the sections ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let log = dir.path().join("sections.log");
    let counter = dir.path().join("counter");
    std::fs::write(&log, "").unwrap();
    std::fs::write(&counter, "0").unwrap();
    // Create the table once, before the workers race to.
    drop(
        lockkit_sql::connect(&format!("sqlite://{}", db.display()))
            .await
            .unwrap(),
    );
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            tokio::process::Command::new(&exe)
                .args(["sqlite_worker", "--exact", "--ignored", "--test-threads=1"])
                .env(WORKER_DB, &db)
                .env(WORKER_LOG, &log)
                .env(WORKER_COUNTER, &counter)
                .kill_on_drop(true)
                .output()
        })
        .collect();
    for output in futures_util::future::join_all(children).await {
        let output = output.expect("run a worker");
        assert!(
            output.status.success(),
            "worker failed: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            stdout.contains("1 passed"),
            "the worker did not run: {stdout}"
        );
    }
    let total = ROUNDS * PROCESSES as u64;
    let value: u64 = std::fs::read_to_string(&counter)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        value, total,
        "lost updates: the critical sections overlapped"
    );
    let mut sections: Vec<(u64, u128, u128)> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|line| {
            let mut parts = line.split(' ').map(|p| p.parse::<u128>().unwrap());
            let token = parts.next().unwrap() as u64;
            (token, parts.next().unwrap(), parts.next().unwrap())
        })
        .collect();
    assert_eq!(sections.len() as u64, total);
    sections.sort_by_key(|&(_, start, _)| start);
    for pair in sections.windows(2) {
        let ((t1, _, end1), (t2, start2, _)) = (pair[0], pair[1]);
        assert!(
            end1 <= start2,
            "sections overlap: {:?} and {:?}",
            pair[0],
            pair[1]
        );
        assert!(t2 > t1, "fencing token {t2} follows {t1}");
    }
}

/// A client used on one runtime and dropped after that runtime is gone
/// (its kept connections cannot be handed back to a runtime any more) does
/// not panic; an in-memory database lives as long as its client.
#[test]
fn clients_outlive_their_runtime() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("locks.db");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (file, memory) = runtime.block_on(async {
        let file = connect(&db).await.unwrap();
        let memory = lockkit_sql::connect("sqlite::memory:").await.unwrap();
        for locks in [file.as_ref(), &memory as &dyn DistributedLock] {
            let opts = LockOptions::new().ttl(Duration::from_secs(5));
            let guard = locks.acquire("outlive", &opts).await.unwrap();
            let token = guard.fencing_token().expect("a fencing token");
            guard.release().await.unwrap();
            let again = locks.acquire("outlive", &opts).await.unwrap();
            assert!(
                again.fencing_token().unwrap() > token,
                "the database persisted"
            );
            again.release().await.unwrap();
        }
        (file, memory)
    });
    drop(runtime);
    drop(file);
    drop(memory);
}

/// A database of an earlier version kept a token per row (and released
/// rows): the high-water mark starts above them, so tokens keep rising for
/// that name and a new one.
#[tokio::test]
async fn tokens_rise_above_an_earlier_table() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("locks.db");
    let mut conn = SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", db.display()))
        .await
        .expect("create the database");
    sqlx::raw_sql(
        "CREATE TABLE lockkit_locks (name TEXT NOT NULL PRIMARY KEY, owner TEXT, \
             fence INTEGER NOT NULL, expires_at INTEGER NOT NULL); \
         INSERT INTO lockkit_locks VALUES ('old', NULL, 1000000, 0);",
    )
    .execute(&mut conn)
    .await
    .expect("make the earlier table");
    conn.close().await.expect("close");
    let locks = connect(&db).await.expect("connect");
    let mut last = 1_000_000;
    for name in ["old", "new", "old"] {
        let guard = locks
            .acquire(name, &LockOptions::new().ttl(Duration::from_secs(30)))
            .await
            .expect("acquire");
        let token = guard.fencing_token().expect("a token").get();
        assert!(token > last, "{name}: token {token} after {last}");
        last = token;
        guard.release().await.expect("release");
    }
}

/// A client that waits for a name (here: watches its releases, as its
/// waiters do) has a place in the name's line
/// (`\x01queue:<name>\x01<client>`); the holder's release, finding it,
/// reserves the row for that client (`\x01for:<client>`) instead of
/// deleting it, and ends its place; the releasing client takes the row
/// again only once the reservation ran out. Places that ended or ran out
/// (a client that died) are swept as a place of the line goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn places_in_line_come_and_go_with_their_waiters() {
    let harness = SqliteHarness::new();
    let admin = format!("sqlite://{}", harness.db.display());
    let count = |sql: &'static str| {
        let admin = admin.clone();
        async move {
            let mut conn = SqliteConnection::connect(&admin)
                .await
                .expect("admin connection");
            let n: i64 = sqlx::query_scalar(sql)
                .bind("in-line")
                .fetch_one(&mut conn)
                .await
                .expect("count rows");
            n
        }
    };
    const PLACES: &str = "SELECT count(*) FROM lockkit_locks \
        WHERE name > char(1) || 'queue:' || ?1 || char(1) AND name < char(1) || 'queue:' || ?1 || char(2)";
    const LIVE_PLACES: &str = "SELECT count(*) FROM lockkit_locks \
        WHERE name > char(1) || 'queue:' || ?1 || char(1) AND name < char(1) || 'queue:' || ?1 || char(2) \
          AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";
    const RESERVED: &str = "SELECT count(*) FROM lockkit_locks \
        WHERE name = ?1 AND substr(owner, 1, 5) = char(1) || 'for:'";
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(20))
        .wait_for(Duration::from_secs(30));
    let holder = harness.client().await;
    let held = holder.acquire("in-line", &opts).await.unwrap();
    // A place of a client that died, run out already.
    let mut conn = SqliteConnection::connect(&admin).await.unwrap();
    sqlx::query(
        "INSERT INTO lockkit_locks (name, owner, fence, expires_at) \
         VALUES (char(1) || 'queue:' || ?1 || char(1) || 'gone', 'gone', 0, 0)",
    )
    .bind("in-line")
    .execute(&mut conn)
    .await
    .unwrap();
    let watcher = harness.client().await;
    let watch = watcher.watch_releases("in-line").await.unwrap();
    assert!(watch.is_active(), "a watch of a held name on Linux rings");
    assert_eq!(count(PLACES).await, 2, "the watching client took a place");
    assert_eq!(
        holder.status("in-line").await.unwrap().waiters,
        Some(1),
        "status counts the live place, not the one that ran out"
    );
    held.release().await.unwrap();
    assert_eq!(
        count(RESERVED).await,
        1,
        "the release reserved the row for the client in line"
    );
    assert_eq!(count(LIVE_PLACES).await, 0, "the served place ended");
    assert!(
        !holder.status("in-line").await.unwrap().held,
        "a reserved row shows as free"
    );
    let again = holder
        .acquire("in-line", &opts)
        .await
        .expect("the releasing client takes the lock once the reservation ran out");
    drop(watch);
    assert!(
        lockkit_testkit::eventually(Duration::from_secs(30), || async {
            count(PLACES).await == 0
        })
        .await,
        "the places that ended or ran out stayed after the watching client left the line"
    );
    again.release().await.unwrap();
    assert_eq!(
        count("SELECT count(*) FROM lockkit_locks WHERE name = ?1").await,
        0,
        "a release nobody waits for deletes the row"
    );
}

/// A release may reserve a name for a client just as its last waiter stops
/// (gives up, or is cancelled), before the client has left the line. When
/// that client's bell rings, it finds no waiter for the name and passes
/// the turn on: here, with nobody else in line, the reserved row goes at
/// once rather than when the reservation runs out (a minute, here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_no_waiter_wants_is_passed_on() {
    let harness = SqliteHarness::new();
    let admin = format!("sqlite://{}", harness.db.display());
    let name = "unwanted";
    let opts = LockOptions::new().ttl(Duration::from_secs(60));
    let holder = harness.client().await;
    let held = holder.acquire(name, &opts).await.unwrap();
    let mut conn = SqliteConnection::connect(&admin).await.unwrap();
    let client = harness.client().await;
    let watch = client.watch_releases(name).await.unwrap();
    let place: String = sqlx::query_scalar(
        "SELECT owner FROM lockkit_locks \
         WHERE name > char(1) || 'queue:' || ?1 || char(1) AND name < char(1) || 'queue:' || ?1 || char(2)",
    )
    .bind(name)
    .fetch_one(&mut conn)
    .await
    .expect("the watching client's place in line");
    drop(watch);
    let rows = |sql: &'static str| {
        let admin = admin.clone();
        async move {
            let mut conn = SqliteConnection::connect(&admin).await.unwrap();
            let n: i64 = sqlx::query_scalar(sql)
                .bind(name)
                .fetch_one(&mut conn)
                .await
                .unwrap();
            n
        }
    };
    assert!(
        lockkit_testkit::eventually(Duration::from_secs(30), || async {
            rows(
                "SELECT count(*) FROM lockkit_locks \
                 WHERE name > char(1) || 'queue:' || ?1 || char(1) AND name < char(1) || 'queue:' || ?1 || char(2)"
            )
            .await
                == 0
        })
        .await,
        "the client left the line when its waiter stopped"
    );

    // The holder's release, had it come a moment earlier: the row reserved
    // for the client that was in line, and its bell rung.
    let reserved = sqlx::query(
        "UPDATE lockkit_locks SET owner = char(1) || 'for:' || ?2, \
             expires_at = CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + 60000 \
         WHERE name = ?1",
    )
    .bind(name)
    .bind(&place)
    .execute(&mut conn)
    .await
    .unwrap();
    assert_eq!(reserved.rows_affected(), 1);
    let bells = format!("{}-lockkit-bells", harness.db.display());
    for bucket in 0..64 {
        std::fs::write(format!("{bells}/client-{bucket}"), [1]).expect("ring a client's bell");
    }
    assert!(
        lockkit_testkit::eventually(Duration::from_secs(30), || async {
            rows("SELECT count(*) FROM lockkit_locks WHERE name = ?1").await == 0
        })
        .await,
        "the client did not pass on the turn nobody wanted"
    );
    assert!(
        held.release().await.is_err(),
        "the holder's lease was taken from it"
    );
    let again = holder
        .acquire(name, &opts.wait_for(Duration::from_secs(30)))
        .await
        .expect("the name is free");
    again.release().await.unwrap();
}
