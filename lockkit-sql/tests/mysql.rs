//! MySQL/MariaDB in every mode (`lease`, `row`, `named`): the conformance
//! suite and the session-mode behaviour, against real MariaDB servers started
//! by the testkit.
#![cfg(feature = "mysql")]

mod common;

use std::time::Duration;

use common::{SqlHarness, SqlServer, connect, opts};
use lockkit_core::DistributedLock;
use lockkit_sql::Mode;
use lockkit_testkit::MariaDbServer;
use lockkit_testkit::TestServer;
use sqlx::Connection;
use tokio::time::Instant;

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

/// How long `information_schema.INNODB_TRX` must go unread before InnoDB
/// refreshes it: the table is a cache, updated only when it was last read
/// more than 100 ms ago, so polling it faster keeps showing a stale picture.
const INNODB_TRX_REFRESH: Duration = Duration::from_millis(150);

/// The connection ids of the transactions holding row locks (granted, not
/// waiting). Waits first, so that the answer is fresh (see
/// [`INNODB_TRX_REFRESH`]).
async fn row_holders(server: &MariaDbServer) -> Vec<String> {
    tokio::time::sleep(INNODB_TRX_REFRESH).await;
    let out = server
        .sql(
            "SELECT trx_mysql_thread_id FROM information_schema.INNODB_TRX \
             WHERE trx_state = 'RUNNING' AND trx_rows_locked > 0",
        )
        .await
        .expect("find the row holders");
    out.lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

#[async_trait::async_trait]
impl SqlServer for MariaDbServer {
    /// The lease row's owner is cleared; a named lock's connection is
    /// killed (waiting until its lock is free).
    async fn revoke(&self, mode: Mode, name: &str) {
        if mode == Mode::Lease {
            let out = self
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
        let ids = match mode {
            Mode::Row => row_holders(self).await,
            _ => holders(self, name).await,
        };
        assert_eq!(ids.len(), 1, "holders of {name:?}: {ids:?}");
        self.sql(&format!("KILL {}", ids[0])).await.expect("KILL");
        // KILL returns before the connection is gone; wait until it no
        // longer holds the lock (a waiter may take it at once).
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = match mode {
                Mode::Row => row_holders(self).await,
                _ => holders(self, name).await,
            };
            if !left.contains(&ids[0]) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the killed holder still holds {name:?}: {left:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn waiting_statements(&self) -> String {
        // GET_LOCK waits show as `User lock`; a row-lock wait is a statement
        // whose text holds `FOR UPDATE` (spelt apart here, so that this
        // query does not count itself). PROCESSLIST is not cached.
        self.sql(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE STATE = 'User lock' OR INFO LIKE CONCAT('%FOR', ' UPDATE%')",
        )
        .await
        .unwrap()
    }

    async fn client_sql(&self, sql: &str) -> String {
        self.sql(sql).await.expect("the server's client")
    }

    fn name_contains(part: &str) -> String {
        format!("LOCATE({}, name) > 0", literal(part))
    }

    /// In `lease` mode, the clients whose release bell of `name` sleeps in
    /// the process list (one per waiting client; see the guide's MySQL
    /// section): `lockkit bell <table> <hash> <client>`, the hash being
    /// that of the name's bell mark row.
    async fn waiting_clients(&self, mode: Mode, name: &str) -> Option<usize> {
        if mode != Mode::Lease {
            return None;
        }
        let out = self
            .client_sql(&format!(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE INFO LIKE CONCAT('%''lockkit bell lockkit\\_locks ', \
                     LEFT(SHA2({}, 256), 40), ' %')",
                literal(name)
            ))
            .await;
        Some(
            out.trim()
                .parse()
                .unwrap_or_else(|_| panic!("a count: {out:?}")),
        )
    }
}

mod lease {
    use super::*;
    lockkit_conformance::conformance_suite!(SqlHarness::<MariaDbServer>::start(Mode::Lease).await);
}

mod named {
    use super::*;
    lockkit_conformance::conformance_suite!(SqlHarness::<MariaDbServer>::start(Mode::Named).await);
}

mod row {
    use super::*;
    lockkit_conformance::conformance_suite!(SqlHarness::<MariaDbServer>::start(Mode::Row).await);
}

mod named_tokenless {
    use super::*;
    common::tokenless_suite!(
        SqlHarness::<MariaDbServer>::start_with(Mode::Named, "&fencing=false").await
    );
}

mod row_tokenless {
    use super::*;
    common::tokenless_suite!(
        SqlHarness::<MariaDbServer>::start_with(Mode::Row, "&fencing=false").await
    );
}

/// `KILL` of the holder's connection in `row` mode: the transaction is rolled
/// back, its row lock freed, and the holder's lost signal fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_killed_holder() {
    common::killed_holder::<MariaDbServer>(Mode::Row).await;
}

/// A new client connects while a row lock is held: its schema check does
/// not wait for the holder's transaction (a `CREATE TABLE IF NOT EXISTS`
/// would, for the table's metadata lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_connects_while_held() {
    common::connects_while_held::<MariaDbServer>(Mode::Row).await;
}

/// The same in `named` and `lease` mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_and_lease_connect_while_held() {
    common::connects_while_held::<MariaDbServer>(Mode::Named).await;
    common::connects_while_held::<MariaDbServer>(Mode::Lease).await;
}

/// A cancelled `SELECT … FOR UPDATE` wait is killed on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_cancelled_wait_leaves_nothing_behind() {
    common::cancelled_wait_leaves_nothing_behind::<MariaDbServer>(Mode::Row).await;
}

/// The release bells of `lease` mode (see the guide's MySQL section), on
/// MariaDB's path (the release deletes the lease row) and on MySQL's (it
/// clears it): while a client waits for a name, one connection of its own
/// sleeps on the name's bell and a row marks the name; another client's
/// release wakes the watch; once nobody waits, the bell and its connection
/// go, and at most the name's one mark stays (for its next release).
async fn bells_go_with_their_waiters(counter: bool) {
    let server = MariaDbServer::start().await;
    let client = || async {
        let url = common::url(&server, Mode::Lease);
        let builder = lockkit_sql::SqlLockBuilder::from_url(&url).unwrap();
        let lock = builder.mysql_counter_fencing(counter).connect().await;
        lock.expect("a lease-mode client")
    };
    let bells = || async {
        server
            .sql(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE INFO LIKE CONCAT('%''lockkit', ' bell %')",
            )
            .await
            .expect("count the bells")
    };
    // A name's mark is `\x01bell:<hash>`; a sleeper's row adds `\x01<client>`.
    let marks = || async {
        server
            .sql(
                "SELECT COUNT(*) FROM lockkit_locks \
                 WHERE name LIKE CONCAT(CHAR(1), 'bell:%') AND LOCATE(CHAR(1), name, 2) = 0 \
                   AND expires_at > UTC_TIMESTAMP(6)",
            )
            .await
            .expect("count the live marks")
    };
    let sleeper_rows = || async {
        server
            .sql(
                "SELECT COUNT(*) FROM lockkit_locks \
                 WHERE name LIKE CONCAT(CHAR(1), 'bell:%') AND LOCATE(CHAR(1), name, 2) > 0",
            )
            .await
            .expect("count the sleepers' rows")
    };
    let holder = client().await;
    let guard = holder.acquire("job", &opts()).await.unwrap();
    let watcher = client().await;
    let mut watch = watcher.watch_releases("job").await.unwrap();
    assert!(watch.is_active(), "a watch of a held name has a bell");
    assert_eq!(
        bells().await,
        "1",
        "one bell sleeps for the watching client"
    );
    assert_eq!(marks().await, "1", "and one row marks it");
    assert_eq!(
        sleeper_rows().await,
        "1",
        "and one holds the bell's connection"
    );
    guard.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), watch.changed())
        .await
        .expect("the release rang the watcher's bell");
    // The watcher's own release deletes its mark while its bell still
    // sleeps; a new watch of the running bell marks the name again.
    let own = watcher.acquire("job", &opts()).await.unwrap();
    own.release().await.unwrap();
    let guard = holder.acquire("job", &opts()).await.unwrap();
    let mut again = watcher.watch_releases("job").await.unwrap();
    assert_eq!(marks().await, "1", "the running bell marks the name again");
    guard.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), again.changed())
        .await
        .expect("the release rang the running bell");
    drop((watch, again));
    let gone = lockkit_testkit::eventually(Duration::from_secs(30), || async {
        bells().await == "0" && sleeper_rows().await == "0"
    })
    .await;
    assert!(
        gone,
        "the bell outlived its watcher: {} shown, {} sleeper rows",
        bells().await,
        sleeper_rows().await
    );
    let left: u32 = marks().await.parse().expect("a count");
    assert!(left <= 1, "{left} marks of one name");
    let last = holder.acquire("job", &opts()).await.unwrap();
    last.release().await.unwrap();
    assert_eq!(
        marks().await,
        "0",
        "the name's release deletes or ends its mark"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_bells_go_with_their_waiters() {
    bells_go_with_their_waiters(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_bells_go_with_their_waiters_on_mysqls_path() {
    bells_go_with_their_waiters(true).await;
}

/// `KILL` of the holder's connection frees the lock at once and fires the
/// holder's lost signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_killed_holder() {
    common::killed_holder::<MariaDbServer>(Mode::Named).await;
}

/// With the default liveness period, a killed holder is told within it
/// (1 s, or a third of the TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_detection_after_kills() {
    common::loss_detection_after_kills::<MariaDbServer>("mariadb", &[Mode::Row, Mode::Named]).await;
}

/// A cancelled `GET_LOCK` wait is killed on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_cancelled_wait_leaves_nothing_behind() {
    common::cancelled_wait_leaves_nothing_behind::<MariaDbServer>(Mode::Named).await;
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

/// A refused login is told as such, at once: the server's error code (1045)
/// makes it `Backend`, without the connect retries an unreachable server
/// gets, and the password is in no message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused_at_once() {
    let server = MariaDbServer::start().await;
    let url = server
        .url()
        .replacen("mysql://root@", "mysql://root:not-the-password@", 1)
        + "?connect_timeout=30s";
    let error = tokio::time::timeout(Duration::from_secs(20), lockkit_sql::connect(&url))
        .await
        .expect("a refused login ends before the connect timeout")
        .expect_err("a wrong password is refused");
    let text = error.to_string();
    assert!(
        matches!(error, lockkit_core::LockError::Backend { .. }),
        "{error:?}"
    );
    assert!(text.contains("authentication failed"), "{text}");
    assert!(!text.contains("not-the-password"), "{text}");
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
    common::connection_failures_are_typed(&server, |password| {
        format!("mysql://app:{password}@127.0.0.1:{port}/lockkit")
    })
    .await;
}

/// Tokens of `row` and `named` mode on the table `table` of `server`, from
/// clients built by `builder`: four acquisitions alternating between two
/// clients (each shut out while the other holds), returned in order.
async fn alternating_tokens(
    server: &MariaDbServer,
    table: &str,
    builder: impl Fn(lockkit_sql::SqlLockBuilder) -> lockkit_sql::SqlLockBuilder,
) -> Vec<u64> {
    let mut tokens = Vec::new();
    for mode in [Mode::Row, Mode::Named] {
        let url = format!("{}?table={table}&connect_timeout=1s", server.url());
        let mut clients = Vec::new();
        for _ in 0..2 {
            let b = builder(
                lockkit_sql::SqlLockBuilder::from_url(&url)
                    .unwrap()
                    .mode(mode),
            );
            clients.push(b.connect().await.unwrap());
        }
        for round in 0..4 {
            let (holder, other) = (&clients[round % 2], &clients[(round + 1) % 2]);
            let guard = holder.acquire("tokens", &opts().no_wait()).await.unwrap();
            assert!(
                other
                    .try_acquire("tokens", &opts())
                    .await
                    .unwrap()
                    .is_none()
            );
            tokens.push(guard.fencing_token().expect("a token").get());
            guard.release().await.unwrap();
        }
    }
    assert!(tokens.is_sorted_by(|a, b| a < b), "{tokens:?}");
    tokens
}

/// On MariaDB the session modes draw tokens from the sequence inside the
/// lock statement: the sequence's next value follows the last token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_tokens_come_from_the_sequence() {
    let server = MariaDbServer::start().await;
    let tokens = alternating_tokens(&server, "lockkit_seq_check", |b| b).await;
    let next = server
        .sql("SELECT NEXTVAL(lockkit_seq_check_fence_seq)")
        .await
        .unwrap();
    assert_eq!(next, (tokens.last().unwrap() + 1).to_string());
}

/// MySQL's path (no sequences), run on MariaDB: tokens from the counter
/// table, which ends at the last token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_tokens_from_the_counter_table() {
    let server = MariaDbServer::start().await;
    let tokens = alternating_tokens(&server, "lockkit_counter_check", |b| {
        b.mysql_counter_fencing(true)
    })
    .await;
    let n = server
        .sql("SELECT n FROM lockkit_counter_check_fence WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(n, tokens.last().unwrap().to_string());
}

/// Clients without tokens (`fencing=false`) draw none, in `named` and
/// `row` mode: not from the sequence, nor, on MySQL's path, from the
/// counter table (whose `row` mode readers use MySQL's `FOR SHARE`, which
/// MariaDB does not have).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenless_grants_draw_nothing() {
    let server = MariaDbServer::start().await;
    let (permit, reader) = (opts().semaphore(2), opts().shared());
    for (mode, others) in [
        (Mode::Named, vec![permit.clone()]),
        (Mode::Row, vec![permit.clone(), reader]),
    ] {
        common::tokenless_grants_draw_nothing(&server, mode, &others, |b| b).await;
    }
    for mode in [Mode::Named, Mode::Row] {
        common::tokenless_grants_draw_nothing(&server, mode, std::slice::from_ref(&permit), |b| {
            b.table("lockkit_counter_none").mysql_counter_fencing(true)
        })
        .await;
    }
}

/// A lock's first use (its row inserted) while permits of a semaphore are
/// held in `row` mode does not wait for them: the permits' transactions
/// lock their slot rows, not the gaps between rows.
#[tokio::test]
async fn row_mode_permits_lock_no_gaps() {
    let server = MariaDbServer::start().await;
    let locks = connect(&server, Mode::Row).await.unwrap();
    let permits = opts().semaphore(4);
    // Slot rows sort before every lock name: each new lock row goes into
    // the gap after them. Taking every permit makes some take theirs by
    // scanning the slots.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(locks.acquire("gap-sem", &permits).await.unwrap());
    }
    for i in 0..3 {
        let name = format!("gap-lock-{i}-{:x}", fastrand::u64(..));
        let started = Instant::now();
        let guard = locks
            .try_acquire(&name, &opts())
            .await
            .expect("a new lock beside held permits")
            .expect("free");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "waited {:?}",
            started.elapsed()
        );
        guard.release().await.unwrap();
    }
    for guard in held {
        guard.release().await.unwrap();
    }
}

/// A lock table made before holder identities were stored (owner
/// `VARCHAR(64)`) is widened by `migrate`, and then records the longest
/// identity whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_widens_an_old_owner_column() {
    let server = MariaDbServer::start().await;
    server
        .sql(
            "CREATE TABLE lockkit_old_owner (name VARBINARY(255) NOT NULL PRIMARY KEY, \
             owner VARCHAR(64) NULL, fence BIGINT UNSIGNED NOT NULL, \
             expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB; \
             CREATE SEQUENCE lockkit_old_owner_fence_seq",
        )
        .await
        .unwrap();
    let url = format!("{}?table=lockkit_old_owner&mode=lease", server.url());
    let locks = lockkit_sql::connect(&url).await.unwrap();
    let width = server
        .sql(
            "SELECT CHARACTER_MAXIMUM_LENGTH FROM information_schema.COLUMNS \
             WHERE TABLE_NAME = 'lockkit_old_owner' AND COLUMN_NAME = 'owner'",
        )
        .await
        .unwrap();
    assert_eq!(width, "320");
    let longest = format!("{}x", "é".repeat(127));
    let guard = locks
        .acquire("widened", &opts().holder(longest.clone()))
        .await
        .unwrap();
    let status = locks.status("widened").await.unwrap();
    assert_eq!(status.holder.as_deref(), Some(longest.as_str()));
    guard.release().await.unwrap();
}

/// A table of an earlier version: the first connect raises the sequence
/// above its rows' tokens.
#[tokio::test]
async fn tokens_rise_above_an_earlier_table() {
    let server = MariaDbServer::start().await;
    server
        .sql(&format!(
            "CREATE TABLE {t} (name VARBINARY(255) NOT NULL PRIMARY KEY, \
                 owner VARCHAR(320) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, \
                 fence BIGINT UNSIGNED NOT NULL, expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB; \
             CREATE SEQUENCE {t}_fence_seq; \
             INSERT INTO {t} VALUES ('old', NULL, {token}, UTC_TIMESTAMP(6))",
            t = common::UPGRADED_TABLE,
            token = common::EARLIER_TOKEN
        ))
        .await
        .expect("make the earlier table");
    common::tokens_rise_above_an_earlier_table(&server).await;
}
