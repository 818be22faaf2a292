//! Fenced writes inside the caller's own transaction or atomic write:
//! a stale write never lands, a rolled-back transaction records nothing,
//! and two fenced transactions on one resource commit in token order.
#![cfg(all(
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite",
    feature = "redis",
    feature = "etcd"
))]

use etcd_client::TxnOp;
use lockkit_core::FencingToken;
use lockkit_fence::redis::{FencedWrite, data_key};
use lockkit_fence::{FenceError, Store};
use lockkit_testkit::{
    EtcdServer, MariaDbServer, PostgresServer, RedisCluster, RedisServer, TestServer,
};
use sqlx::{Connection, Executor};

const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn token(value: u64) -> FencingToken {
    FencingToken::new(value)
}

async fn postgres() -> (PostgresServer, sqlx::PgPool) {
    let server = PostgresServer::start().await;
    let store = Store::open(&server.url(), TIMEOUT).await.expect("open");
    store.install().await.expect("install");
    let pool = sqlx::PgPool::connect(&server.url()).await.expect("connect");
    pool.execute(
        "CREATE TABLE report (id int PRIMARY KEY, body text NOT NULL, written_by bigint NOT NULL)",
    )
    .await
    .expect("create the data table");
    pool.execute("INSERT INTO report VALUES (1, 'nobody', 0)")
        .await
        .expect("seed");
    (server, pool)
}

async fn mariadb() -> (MariaDbServer, sqlx::MySqlPool) {
    let server = MariaDbServer::start().await;
    let store = Store::open(&server.url(), TIMEOUT).await.expect("open");
    store.install().await.expect("install");
    let pool = sqlx::MySqlPool::connect(&server.url())
        .await
        .expect("connect");
    pool.execute("CREATE TABLE report (id int PRIMARY KEY, body text NOT NULL, written_by bigint NOT NULL) ENGINE = InnoDB")
        .await
        .expect("create the data table");
    pool.execute("INSERT INTO report VALUES (1, 'nobody', 0)")
        .await
        .expect("seed");
    (server, pool)
}

/// The tests that read alike on PostgreSQL and MariaDB, for one of them:
/// its server and pool (`$setup`) and its fence module.
macro_rules! transactional_rules {
    ($name:ident, $setup:ident, $fence:path) => {
        mod $name {
            use super::*;
            use $fence as fence;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_rolled_back_transaction_records_nothing() {
                let (_server, pool) = $setup().await;
                let mut tx = pool.begin().await.expect("begin");
                fence::admit(&mut tx, "report", token(50)).await.expect("admitted");
                tx.rollback().await.expect("roll back");
                let mut tx = pool.begin().await.expect("begin");
                fence::admit(&mut tx, "report", token(40))
                    .await
                    .expect("50 was rolled back, so 40 is admitted");
                tx.commit().await.expect("commit");
            }

            /// Token 11 fences first and holds the resource; token 10 comes
            /// while 11's transaction is open. Whatever the timing, 10 is
            /// refused once 11 commits, and 11's write is what stays.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_smaller_token_waiting_behind_a_greater_is_refused() {
                let (_server, pool) = $setup().await;
                let mut eleven = pool.begin().await.expect("begin 11");
                fence::admit(&mut eleven, "report", token(11)).await.expect("11 admitted");
                let late = {
                    let pool = pool.clone();
                    tokio::spawn(async move {
                        let mut ten = pool.begin().await.expect("begin 10");
                        let fenced = fence::admit(&mut ten, "report", token(10)).await;
                        if fenced.is_ok() {
                            sqlx::query("UPDATE report SET body = 'ten', written_by = 10 WHERE id = 1")
                                .execute(&mut *ten)
                                .await
                                .expect("write 10");
                            ten.commit().await.expect("commit 10");
                        }
                        fenced
                    })
                };
                sqlx::query("UPDATE report SET body = 'eleven', written_by = 11 WHERE id = 1")
                    .execute(&mut *eleven)
                    .await
                    .expect("write 11");
                eleven.commit().await.expect("commit 11");
                let refused = late.await.expect("the task").unwrap_err();
                assert!(
                    matches!(refused, FenceError::Stale { greatest, .. } if greatest == token(11)),
                    "{refused:?}"
                );
                let (body, by): (String, i64) =
                    sqlx::query_as("SELECT body, written_by FROM report WHERE id = 1")
                        .fetch_one(&pool)
                        .await
                        .expect("read");
                assert_eq!((body.as_str(), by), ("eleven", 11));
            }
        }
    };
}

transactional_rules!(postgres_rules, postgres, lockkit_fence::postgres);
transactional_rules!(mariadb_rules, mariadb, lockkit_fence::mysql);

/// The other order: 10 fences first; 11 waits for 10's transaction and then
/// writes on top of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_greater_token_writes_after_a_smaller_one() {
    let (_server, pool) = postgres().await;
    let mut ten = pool.begin().await.expect("begin 10");
    lockkit_fence::postgres::admit(&mut ten, "report", token(10))
        .await
        .expect("10 admitted");
    let next = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut eleven = pool.begin().await.expect("begin 11");
            lockkit_fence::postgres::admit(&mut eleven, "report", token(11)).await?;
            sqlx::query("UPDATE report SET body = 'eleven', written_by = 11 WHERE id = 1")
                .execute(&mut *eleven)
                .await
                .expect("write 11");
            eleven.commit().await.expect("commit 11");
            Ok::<_, FenceError>(())
        })
    };
    sqlx::query("UPDATE report SET body = 'ten', written_by = 10 WHERE id = 1")
        .execute(&mut *ten)
        .await
        .expect("write 10");
    ten.commit().await.expect("commit 10");
    next.await.expect("the task").expect("11 admitted after 10");
    let by: i64 = sqlx::query_scalar("SELECT written_by FROM report WHERE id = 1")
        .fetch_one(&pool)
        .await
        .expect("read");
    assert_eq!(by, 11);
}

/// The fence inside MariaDB's `UPDATE`, in its `WHERE` (a row found by key)
/// and in a derived table: a stale statement fails and writes nothing, an
/// admitted one writes, and a key that finds no row writes nothing and
/// admits nothing. Bad input sent as SQL (which `admit` would refuse before
/// sending) is refused by the function and recorded nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_the_fence_rides_in_the_update() {
    let (server, pool) = mariadb().await;
    const KEYED: &str =
        "UPDATE report SET written_by = ? WHERE id = ? AND lockkit_fence(?, ?) IS NOT NULL";
    const DERIVED: &str = "UPDATE report JOIN (SELECT lockkit_fence(?, ?) AS admitted) AS fence \
                           SET written_by = ? WHERE id = ?";
    let write = |statement: &'static str, id: i64, by: u64| {
        let pool = pool.clone();
        async move {
            let value = lockkit_fence::bigint(token(by)).expect("a BIGINT token");
            let query = if statement == KEYED {
                sqlx::query(statement)
                    .bind(value)
                    .bind(id)
                    .bind("report")
                    .bind(value)
            } else {
                sqlx::query(statement)
                    .bind("report")
                    .bind(value)
                    .bind(value)
                    .bind(id)
            };
            let mut tx = pool.begin().await.expect("begin");
            let written = query
                .execute(&mut *tx)
                .await
                .map_err(|error| lockkit_fence::mysql::refusal(error, "report", token(by)))?;
            tx.commit().await.expect("commit");
            Ok::<_, FenceError>(written.rows_affected())
        }
    };
    let greatest = || async {
        let row: Option<i64> =
            sqlx::query_scalar("SELECT token FROM lockkit_fences WHERE resource = 'report'")
                .fetch_optional(&pool)
                .await
                .expect("read the fence");
        row
    };
    let written_by = || async {
        let by: i64 = sqlx::query_scalar("SELECT written_by FROM report WHERE id = 1")
            .fetch_one(&pool)
            .await
            .expect("read");
        by
    };

    // No row for the key: nothing written, and the fence never ran.
    assert_eq!(write(KEYED, 2, 5).await.expect("no row, no fence"), 0);
    assert_eq!(greatest().await, None);

    // The first token records the resource; the same and greater ones write.
    assert_eq!(write(KEYED, 1, 5).await.expect("5 admitted"), 1);
    assert_eq!(write(KEYED, 1, 5).await.expect("5 again"), 1);
    assert_eq!(write(DERIVED, 1, 7).await.expect("7 admitted"), 1);
    assert_eq!((greatest().await, written_by().await), (Some(7), 7));

    // Stale in either form: refused, nothing written, 7 still the greatest.
    for statement in [KEYED, DERIVED] {
        let refused = write(statement, 1, 6).await.unwrap_err();
        assert!(
            matches!(refused, FenceError::Stale { greatest, .. } if greatest == token(7)),
            "{refused:?}"
        );
    }
    assert_eq!((greatest().await, written_by().await), (Some(7), 7));
    assert_eq!(write(KEYED, 1, 8).await.expect("8 admitted"), 1);
    assert_eq!((greatest().await, written_by().await), (Some(8), 8));

    // Bad input as SQL: the function's own refusal, nothing recorded.
    for (call, expected) in [
        (
            "lockkit_fence('', 1)",
            "the resource must be 1 to 255 bytes",
        ),
        (
            "lockkit_fence(NULL, 1)",
            "the resource must be 1 to 255 bytes",
        ),
        (
            "lockkit_fence('report', -1)",
            "the token must be a number from 0",
        ),
        (
            "lockkit_fence('fresh', -1)",
            "the token must be a number from 0",
        ),
        (
            "lockkit_fence('report', NULL)",
            "the token must be a number from 0",
        ),
    ] {
        let refused = server.sql(&format!("SELECT {call}")).await.expect_err(call);
        assert!(refused.to_string().contains(expected), "{call}: {refused}");
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM lockkit_fences")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!((count, greatest().await), (1, Some(8)));
}

#[tokio::test]
async fn sqlite_a_stale_write_in_a_transaction_is_refused() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("data.db").display());
    let store = Store::open(&url, TIMEOUT).await.expect("open");
    store.install().await.expect("install");
    let pool = sqlx::SqlitePool::connect(&url).await.expect("connect");
    pool.execute("CREATE TABLE report (id INTEGER PRIMARY KEY, written_by INTEGER NOT NULL)")
        .await
        .expect("create");
    pool.execute("INSERT INTO report VALUES (1, 0)")
        .await
        .expect("seed");
    for (by, admitted) in [(5, true), (7, true), (6, false), (7, true)] {
        let mut conn = pool.acquire().await.expect("a connection");
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.expect("begin");
        match lockkit_fence::sqlite::admit(&mut tx, "report", token(by)).await {
            Ok(()) => {
                sqlx::query("UPDATE report SET written_by = ?1 WHERE id = 1")
                    .bind(i64::try_from(by).expect("small"))
                    .execute(&mut *tx)
                    .await
                    .expect("write");
                tx.commit().await.expect("commit");
                assert!(admitted, "{by} must be refused");
            }
            Err(error) => {
                assert!(!admitted, "{by} must be admitted: {error}");
                assert_eq!(error.greatest(), Some(token(7)));
            }
        }
    }
    let by: i64 = sqlx::query_scalar("SELECT written_by FROM report WHERE id = 1")
        .fetch_one(&pool)
        .await
        .expect("read");
    assert_eq!(by, 7);
}

#[tokio::test]
async fn redis_a_stale_write_runs_none_of_its_commands() {
    let server = RedisServer::start().await;
    let client = redis::Client::open(server.url()).expect("a client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let write = |by: u64| {
        FencedWrite::new("report", token(by))
            .expect("a valid resource")
            .command(
                redis::cmd("SET")
                    .arg(data_key("report", "body"))
                    .arg(format!("by {by}")),
            )
            .command(
                redis::cmd("RPUSH")
                    .arg(data_key("report", "history"))
                    .arg(by),
            )
    };
    let replies = write(20).run(&mut conn).await.expect("20 admitted");
    assert_eq!(replies.len(), 2, "one reply per command: {replies:?}");
    write(21).run(&mut conn).await.expect("21 admitted");
    let refused = write(20).run(&mut conn).await.unwrap_err();
    assert!(
        matches!(refused, FenceError::Stale { greatest, .. } if greatest == token(21)),
        "{refused:?}"
    );
    let body = server
        .command(&["GET", "{report}:body"])
        .await
        .expect("GET");
    assert_eq!(body, "by 21");
    let history = server
        .command(&["LRANGE", "{report}:history", "0", "-1"])
        .await
        .expect("LRANGE");
    assert_eq!(
        history.split_whitespace().collect::<Vec<_>>(),
        ["20", "21"],
        "{history}"
    );
    assert!(matches!(
        FencedWrite::new("a{b}", token(1)),
        Err(FenceError::InvalidResource { .. })
    ));
}

#[tokio::test]
async fn etcd_a_stale_transaction_applies_nothing() {
    let server = EtcdServer::start().await;
    let client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .expect("connect");
    let mut kv = client.kv_client();
    for (by, admitted) in [(30_u64, true), (31, true), (30, false)] {
        let outcome = lockkit_fence::etcd::write(
            &mut kv,
            "report",
            token(by),
            vec![TxnOp::put("data/report", format!("by {by}"), None)],
        )
        .await;
        assert_eq!(outcome.is_ok(), admitted, "{by}: {outcome:?}");
        if let Err(error) = outcome {
            assert_eq!(error.greatest(), Some(token(31)));
        }
    }
    let body = server
        .etcdctl(&["get", "data/report", "--print-value-only"])
        .await
        .expect("get");
    assert_eq!(body.trim(), "by 31");
}

/// On Redis Cluster the script runs on the master of the fence key's slot,
/// and the data keys named by `data_key` live there too: the write is one
/// atomic step on one node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_fences_in_the_datas_slot() {
    let cluster = RedisCluster::start(3).await;
    let nodes: Vec<String> = cluster
        .ports()
        .iter()
        .map(|port| format!("redis://127.0.0.1:{port}"))
        .collect();
    let client = redis::cluster::ClusterClient::new(nodes).expect("a cluster client");
    let mut conn = client.get_async_connection().await.expect("connect");
    for resource in ["report", "orders/42", "stock"] {
        let write = |by: u64| {
            FencedWrite::new(resource, token(by))
                .expect("a valid resource")
                .command(
                    redis::cmd("SET")
                        .arg(data_key(resource, "body"))
                        .arg(format!("by {by}")),
                )
        };
        write(5).run(&mut conn).await.expect("5 admitted");
        write(6).run(&mut conn).await.expect("6 admitted");
        let refused = write(5).run(&mut conn).await.unwrap_err();
        assert_eq!(refused.greatest(), Some(token(6)), "{refused:?}");
        let body: String = redis::cmd("GET")
            .arg(data_key(resource, "body"))
            .query_async(&mut conn)
            .await
            .expect("GET");
        assert_eq!(body, "by 6");
    }
}
