//! The fence from other clients: `lockkit_fence` called from psql, the
//! mariadb client and Python's drivers (psycopg, PyMySQL), and the Redis
//! script run by redis-py; each sees the tokens the others admitted.
#![cfg(all(feature = "postgres", feature = "mysql", feature = "redis"))]

use std::time::Duration;

use lockkit_core::FencingToken;
use lockkit_fence::{FenceError, Store};
use lockkit_testkit::{MariaDbServer, PostgresServer, PythonPeer, RedisServer, TestServer};

const TIMEOUT: Duration = Duration::from_secs(10);

/// A Python loop: `write TOKEN` runs, in one transaction, the fence and an
/// update of the data row, and answers `ok`, or `refused MESSAGE` after a
/// rollback. `connect()` and the placeholder style come from the setup.
const SQL_PEER: &str = r#"
import sys
conn = connect()
for line in sys.stdin:
    token = int(line.split()[1])
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT lockkit_fence(" + P + ", " + P + ")", ("report", token))
            cur.execute("UPDATE report SET written_by = " + P + " WHERE id = 1", (token,))
        conn.commit()
        print("ok", flush=True)
    except Exception as error:
        conn.rollback()
        print("refused " + str(error).replace("\n", " "), flush=True)
"#;

async fn admit(store: &Store, token: u64) -> Result<(), FenceError> {
    store.check("report", FencingToken::new(token)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lockkit_fence_from_psql_and_psycopg() {
    let server = PostgresServer::start().await;
    let store = Store::open(&server.url(), TIMEOUT).await.expect("open");
    store.install().await.expect("install");
    server
        .psql("CREATE TABLE report (id int PRIMARY KEY, written_by bigint NOT NULL); INSERT INTO report VALUES (1, 0)")
        .await
        .expect("the data table");

    // psql: a fenced transaction commits; a stale one fails and writes nothing.
    let write = |token: u64| {
        format!(
            "BEGIN; SELECT lockkit_fence('report', {token}); \
             UPDATE report SET written_by = {token} WHERE id = 1; COMMIT;"
        )
    };
    server
        .psql(&write(11))
        .await
        .expect("psql writes with token 11");
    let refused = server
        .psql(&write(10))
        .await
        .expect_err("psql's stale write fails");
    let message = refused.to_string();
    assert!(
        message.contains("stale token 10") && message.contains("greatest admitted 11"),
        "{message}"
    );
    assert_eq!(
        server.psql("SELECT written_by FROM report").await.unwrap(),
        "11"
    );

    // The Rust API sees what psql admitted, and psql what Rust admitted.
    let stale = admit(&store, 10).await.unwrap_err();
    assert_eq!(stale.greatest(), Some(FencingToken::new(11)));
    admit(&store, 12).await.expect("12 admitted from Rust");
    server
        .psql(&write(11))
        .await
        .expect_err("11 is stale after Rust admitted 12");

    // psycopg, in its own transactions.
    let setup = format!(
        "import psycopg\nP = '%s'\ndef connect():\n    return psycopg.connect('host=127.0.0.1 port={} user=postgres dbname=postgres')\n",
        server
            .url()
            .rsplit_once(':')
            .unwrap()
            .1
            .split('/')
            .next()
            .unwrap()
    );
    let mut python = PythonPeer::start("psycopg", &format!("{setup}{SQL_PEER}"), &[]).await;
    assert_eq!(python.ask("write 13").await, "ok");
    let answer = python.ask("write 12").await;
    assert!(
        answer.starts_with("refused") && answer.contains("greatest admitted 13"),
        "{answer}"
    );
    assert_eq!(
        server.psql("SELECT written_by FROM report").await.unwrap(),
        "13"
    );
    let stale = admit(&store, 12).await.unwrap_err();
    assert_eq!(stale.greatest(), Some(FencingToken::new(13)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_lockkit_fence_from_the_client_and_pymysql() {
    let server = MariaDbServer::start().await;
    let store = Store::open(&server.url(), TIMEOUT).await.expect("open");
    store.install().await.expect("install");
    server
        .sql("CREATE TABLE report (id int PRIMARY KEY, written_by bigint NOT NULL) ENGINE = InnoDB; INSERT INTO report VALUES (1, 0)")
        .await
        .expect("the data table");

    let write = |token: u64| {
        format!(
            "START TRANSACTION; SELECT lockkit_fence('report', {token}); \
             UPDATE report SET written_by = {token} WHERE id = 1; COMMIT;"
        )
    };
    server
        .sql(&write(11))
        .await
        .expect("the client writes with token 11");
    let refused = server
        .sql(&write(10))
        .await
        .expect_err("a stale write fails");
    let message = refused.to_string();
    assert!(
        message.contains("stale token 10") && message.contains("greatest admitted 11"),
        "{message}"
    );
    let written = server.sql("SELECT written_by FROM report").await.unwrap();
    assert_eq!(written.lines().last(), Some("11"), "{written}");

    let stale = admit(&store, 10).await.unwrap_err();
    assert_eq!(stale.greatest(), Some(FencingToken::new(11)));
    admit(&store, 12).await.expect("12 admitted from Rust");

    let port = server
        .url()
        .rsplit_once(':')
        .unwrap()
        .1
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let database = server.url().rsplit_once('/').unwrap().1.to_owned();
    let setup = format!(
        "import pymysql\nP = '%s'\ndef connect():\n    return pymysql.connect(host='127.0.0.1', port={port}, user='root', database='{database}', autocommit=False)\n"
    );
    let mut python = PythonPeer::start("pymysql", &format!("{setup}{SQL_PEER}"), &[]).await;
    assert_eq!(python.ask("write 13").await, "ok");
    let answer = python.ask("write 12").await;
    assert!(
        answer.starts_with("refused") && answer.contains("greatest admitted 13"),
        "{answer}"
    );
    let written = server.sql("SELECT written_by FROM report").await.unwrap();
    assert_eq!(written.lines().last(), Some("13"), "{written}");
    let stale = admit(&store, 12).await.unwrap_err();
    assert_eq!(stale.greatest(), Some(FencingToken::new(13)));
}

/// redis-py runs the same script (read from the crate's source, as a user
/// copies it from the docs) with `EVAL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_the_script_from_redis_py() {
    let server = RedisServer::start().await;
    let store = Store::open(&server.url(), TIMEOUT).await.expect("open");
    let script_path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/redis/fence.lua");
    let peer = r#"
import sys, redis
r = redis.Redis.from_url(sys.argv[1])
fence = r.register_script(open(sys.argv[2]).read())
for line in sys.stdin:
    token = line.split()[1]
    try:
        fence(keys=["lockkit:fence:{report}"], args=[token, "report", 3, "SET", "{report}:body", "by " + token])
        print("ok", flush=True)
    except redis.exceptions.ResponseError as error:
        print("refused " + str(error), flush=True)
"#;
    let mut python = PythonPeer::start("redis", peer, &[&server.url(), script_path]).await;
    assert_eq!(python.ask("write 11").await, "ok");
    let answer = python.ask("write 10").await;
    assert!(
        answer.starts_with("refused STALE") && answer.contains("greatest admitted 11"),
        "{answer}"
    );
    assert_eq!(
        server.command(&["GET", "{report}:body"]).await.unwrap(),
        "by 11"
    );

    let stale = admit(&store, 10).await.unwrap_err();
    assert_eq!(stale.greatest(), Some(FencingToken::new(11)));
    admit(&store, 12).await.expect("12 admitted from Rust");
    let answer = python.ask("write 11").await;
    assert!(answer.contains("greatest admitted 12"), "{answer}");
    assert_eq!(
        server.command(&["GET", "{report}:body"]).await.unwrap(),
        "by 11"
    );
}
