//! MySQL/MariaDB in every available mode (`lease`, `named`): the conformance
//! suite and the session-mode behaviour, against real MariaDB servers started
//! by the testkit.
#![cfg(feature = "mysql")]

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{DistributedLock, LockError, LockOptions, LostReason, Result};
use lockkit_sql::Mode;
use lockkit_testkit::MariaDbServer;
use lockkit_testkit::conformance::{Disposable, Harness};
use sqlx::Connection;
use tokio::time::Instant;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

fn url(server: &MariaDbServer, mode: Mode) -> String {
    format!(
        "{}?mode={mode}&connect_timeout=1s&command_timeout=2s&liveness=200ms",
        server.url()
    )
}

async fn connect(server: &MariaDbServer, mode: Mode) -> Result<Arc<dyn DistributedLock>> {
    Ok(Arc::new(lockkit_sql::connect(&url(server, mode)).await?))
}

/// A string literal for the mariadb client (test names only).
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

/// The connection id holding named lock `name`, if any.
async fn holders(server: &MariaDbServer, name: &str) -> Vec<String> {
    let sql = format!(
        "SELECT IS_USED_LOCK({})",
        literal(&lockkit_sql::named_lock_name(name))
    );
    let out = server.sql(&sql).await.expect("find the holder");
    out.lines()
        .filter(|l| *l != "NULL" && !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Ends the lock `name` behind its holder's back: the lease row's owner is
/// cleared; a session lock's connection is killed.
async fn revoke(server: &MariaDbServer, mode: Mode, name: &str) {
    if mode == Mode::Lease {
        let out = server
            .sql(&format!(
                "UPDATE lockkit_locks SET owner = NULL, expires_at = UTC_TIMESTAMP(6) \
                 WHERE name = {} AND owner IS NOT NULL; SELECT ROW_COUNT()",
                literal(name)
            ))
            .await
            .expect("revoke");
        assert_eq!(out, "1", "no lease on {name:?} to revoke");
        return;
    }
    let ids = holders(server, name).await;
    assert_eq!(ids.len(), 1, "holders of {name:?}: {ids:?}");
    server.sql(&format!("KILL {}", ids[0])).await.expect("KILL");
    // KILL returns before the connection is gone; wait until its lock is free.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !holders(server, name).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the killed holder still holds {name:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

struct MyHarness {
    server: MariaDbServer,
    mode: Mode,
}

impl MyHarness {
    async fn start(mode: Mode) -> Self {
        MyHarness {
            server: MariaDbServer::start().await,
            mode,
        }
    }
}

#[async_trait::async_trait]
impl Harness for MyHarness {
    async fn client(&self) -> Arc<dyn DistributedLock> {
        connect(&self.server, self.mode).await.expect("connect")
    }

    async fn revoke(&self, name: &str) {
        revoke(&self.server, self.mode, name).await;
    }

    async fn disposable(&self) -> Box<dyn Disposable> {
        Box::new(DisposableMy {
            server: MariaDbServer::start().await,
            mode: self.mode,
        })
    }

    fn connect_timeout(&self) -> Duration {
        CONNECT_TIMEOUT
    }
}

struct DisposableMy {
    server: MariaDbServer,
    mode: Mode,
}

#[async_trait::async_trait]
impl Disposable for DisposableMy {
    async fn connect(&self) -> Result<Arc<dyn DistributedLock>> {
        connect(&self.server, self.mode).await
    }

    async fn kill(&mut self) {
        self.server.kill();
    }

    async fn pause(&mut self) {
        self.server.pause();
    }

    async fn resume(&mut self) {
        self.server.resume();
    }
}

mod lease {
    use super::*;
    lockkit_testkit::conformance_suite!(MyHarness::start(Mode::Lease).await);
}

mod named {
    use super::*;
    lockkit_testkit::conformance_suite!(MyHarness::start(Mode::Named).await);
}

fn opts() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(30))
}

/// `KILL` of the holder's connection: the server frees the lock at once, so
/// another client takes it without waiting for any TTL, and the holder's lost
/// signal fires within the liveness period.
async fn killed_holder(mode: Mode) {
    let server = MariaDbServer::start().await;
    let (a, b) = (
        connect(&server, mode).await.unwrap(),
        connect(&server, mode).await.unwrap(),
    );
    let name = format!("kill-{mode}");
    let guard = a.acquire(&name, &opts()).await.unwrap();
    let lost = guard.lost();
    revoke(&server, mode, &name).await;
    let killed = Instant::now();
    let taken = b
        .acquire(&name, &opts().wait_for(Duration::from_secs(2)))
        .await
        .expect("the server frees a killed holder's lock");
    assert!(
        killed.elapsed() < Duration::from_secs(1),
        "{:?}",
        killed.elapsed()
    );
    let reason = tokio::time::timeout(Duration::from_secs(2), lost)
        .await
        .expect("the liveness check notices the killed connection");
    assert_eq!(reason, LostReason::ConnectionLost);
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    taken.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_killed_holder() {
    killed_holder(Mode::Named).await;
}

/// How many statements wait for a lock on the server.
async fn waiting_statements(server: &MariaDbServer) -> String {
    server
        .sql(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE STATE IN ('User lock', 'Sending data', 'Statistics', 'Updating') \
             AND INFO LIKE '%lockkit_locks%FOR UPDATE%' OR STATE = 'User lock'",
        )
        .await
        .unwrap()
}

/// An acquire cancelled while the server waits leaves no waiting statement
/// behind: once the holder releases, nobody holds the lock.
async fn cancelled_wait_leaves_nothing_behind(mode: Mode) {
    let server = MariaDbServer::start().await;
    let (a, b, c) = (
        connect(&server, mode).await.unwrap(),
        connect(&server, mode).await.unwrap(),
        connect(&server, mode).await.unwrap(),
    );
    let name = format!("cancel-{mode}");
    let holder = a.acquire(&name, &opts()).await.unwrap();
    let waiting = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move { b.acquire(&name, &opts()).await }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while waiting_statements(&server).await == "0" {
        assert!(
            Instant::now() < deadline,
            "the waiter never queued on the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    let deadline = Instant::now() + Duration::from_secs(2);
    while waiting_statements(&server).await != "0" {
        assert!(
            Instant::now() < deadline,
            "the cancelled wait is still on the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    holder.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let guard = c
        .try_acquire(&name, &opts())
        .await
        .unwrap()
        .expect("free after the holder released: the cancelled waiter did not get it");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_cancelled_wait_leaves_nothing_behind() {
    cancelled_wait_leaves_nothing_behind(Mode::Named).await;
}

/// While lockkit holds `named` lock `job`, a plain client's
/// `SELECT GET_LOCK('job', 0)` returns 0; after the release it returns 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_lock_interoperates_with_get_lock() {
    let server = MariaDbServer::start().await;
    let locks = connect(&server, Mode::Named).await.unwrap();
    let guard = locks.acquire("job", &opts()).await.unwrap();
    assert_eq!(server.sql("SELECT GET_LOCK('job', 0)").await.unwrap(), "0");
    guard.release().await.unwrap();
    assert_eq!(server.sql("SELECT GET_LOCK('job', 0)").await.unwrap(), "1");
    // And the other way round: a plain client's lock keeps lockkit out.
    let mut plain = sqlx::mysql::MySqlConnection::connect(&server.url())
        .await
        .unwrap();
    let got: i64 = sqlx::query_scalar("SELECT CAST(GET_LOCK('job', 0) AS SIGNED)")
        .fetch_one(&mut plain)
        .await
        .unwrap();
    assert_eq!(got, 1);
    assert!(locks.try_acquire("job", &opts()).await.unwrap().is_none());
    drop(plain);
}

/// Mixed-case and long names take the hashed `LK#` form, and stay distinct.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_locks_keep_case_and_length() {
    let server = MariaDbServer::start().await;
    let locks = connect(&server, Mode::Named).await.unwrap();
    let long = "x".repeat(200);
    let names = ["Job", "job", "JOB", long.as_str()];
    let mut guards = Vec::new();
    for name in names {
        guards.push(locks.acquire(name, &opts().no_wait()).await.unwrap());
    }
    for name in names {
        let mapped = lockkit_sql::named_lock_name(name);
        assert_ne!(
            server
                .sql(&format!("SELECT IS_USED_LOCK({})", literal(&mapped)))
                .await
                .unwrap(),
            "NULL",
            "{name:?} as {mapped:?}"
        );
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// Bad credentials and unreachable servers give typed errors without secrets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_failures_are_typed() {
    let server = MariaDbServer::start().await;
    server
        .sql("CREATE USER 'app'@'127.0.0.1' IDENTIFIED BY 'right-pw'; GRANT ALL ON lockkit.* TO 'app'@'127.0.0.1'")
        .await
        .unwrap();
    let port = server.port();
    let right = format!("mysql://app:right-pw@127.0.0.1:{port}/lockkit");
    drop(
        lockkit_sql::connect(&right)
            .await
            .expect("the right password"),
    );
    let wrong = format!("mysql://app:wrong-pw@127.0.0.1:{port}/lockkit");
    let err = lockkit_sql::connect(&wrong).await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("authentication failed"), "{shown}");
    assert!(!shown.contains("wrong-pw"), "{shown}");
    server.kill();
    let start = Instant::now();
    let err = lockkit_sql::connect(&format!("{}?connect_timeout=1s", server.url()))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    assert!(start.elapsed() < Duration::from_secs(2));
}
