//! The fence rule on every store, against the real servers: admitted when
//! at least the greatest admitted token (and recorded), refused as stale
//! below it, with nothing written for bad input.
#![cfg(all(
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite",
    feature = "redis",
    feature = "etcd"
))]

use std::time::Duration;

use lockkit_core::FencingToken;
use lockkit_fence::{FenceError, Store};
use lockkit_testkit::{EtcdServer, MariaDbServer, PostgresServer, RedisServer, TestServer};

const TIMEOUT: Duration = Duration::from_secs(10);

/// A store under test and a way to count its fences from the server's side.
enum Server {
    Postgres(PostgresServer),
    MariaDb(MariaDbServer),
    Sqlite(tempfile::TempDir),
    Redis(RedisServer),
    Etcd(EtcdServer),
}

impl Server {
    fn url(&self) -> String {
        match self {
            Server::Postgres(server) => server.url(),
            Server::MariaDb(server) => server.url(),
            Server::Sqlite(dir) => format!("sqlite://{}", dir.path().join("fences.db").display()),
            Server::Redis(server) => server.url(),
            Server::Etcd(server) => server.url(),
        }
    }

    /// How many resources have a fence, as the server tells.
    async fn fences(&self) -> usize {
        let text = match self {
            Server::Postgres(server) => server.psql("SELECT count(*) FROM lockkit_fences").await,
            Server::MariaDb(server) => server
                .sql("SELECT count(*) FROM lockkit_fences")
                .await
                .map(|out| out.lines().last().unwrap_or_default().to_owned()),
            Server::Sqlite(_) => {
                let pool = sqlx::SqlitePool::connect(&self.url())
                    .await
                    .expect("open the SQLite file");
                let count: i64 = sqlx::query_scalar("SELECT count(*) FROM lockkit_fences")
                    .fetch_one(&pool)
                    .await
                    .expect("count fences");
                Ok(count.to_string())
            }
            Server::Redis(server) => server
                .count_keys("lockkit:fence:*")
                .await
                .map(|n| n.to_string()),
            Server::Etcd(server) => server
                .etcdctl(&["get", "--prefix", "lockkit/fence/", "--keys-only"])
                .await
                .map(|out| {
                    out.lines()
                        .filter(|line| !line.trim().is_empty())
                        .count()
                        .to_string()
                }),
        };
        let text = text.expect("count the fences on the server");
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("a count, got {text:?}"))
    }

    fn sql(&self) -> bool {
        matches!(
            self,
            Server::Postgres(_) | Server::MariaDb(_) | Server::Sqlite(_)
        )
    }
}

async fn open(server: &Server) -> Store {
    let store = Store::open(&server.url(), TIMEOUT)
        .await
        .expect("open the store");
    store.install().await.expect("install the fence");
    store
        .install()
        .await
        .expect("a second install changes nothing");
    store
}

fn token(value: u64) -> FencingToken {
    FencingToken::new(value)
}

/// Every rule of the fence, on one store.
async fn the_rule_holds(server: Server) {
    let store = open(&server).await;
    assert_eq!(server.fences().await, 0);

    // The first token is admitted; greater and equal ones too.
    store.check("report", token(10)).await.expect("first token");
    store
        .check("report", token(12))
        .await
        .expect("a greater token");
    store
        .check("report", token(12))
        .await
        .expect("the same holder again");
    // A smaller one is refused, naming the resource, token and greatest.
    match store.check("report", token(11)).await {
        Err(FenceError::Stale {
            resource,
            token: refused,
            greatest,
        }) => {
            assert_eq!(resource, "report");
            assert_eq!(refused, token(11));
            assert_eq!(greatest, token(12));
        }
        other => panic!("a stale token must be refused, got {other:?}"),
    }
    // The refusal recorded nothing: 12 is still the greatest.
    let again = store.check("report", token(11)).await.unwrap_err();
    assert_eq!(again.greatest(), Some(token(12)));
    store
        .check("report", token(12))
        .await
        .expect("12 is still admitted");

    // Resources are fenced apart.
    store
        .check("other", token(1))
        .await
        .expect("another resource starts afresh");
    assert_eq!(server.fences().await, 2);

    // Bad input: a typed error, nothing written.
    for bad in [String::new(), "x".repeat(256), "tab\there".to_owned()] {
        match store.check(&bad, token(1)).await {
            Err(FenceError::InvalidResource { .. }) => {}
            other => panic!("{bad:?} must be refused as a resource, got {other:?}"),
        }
    }
    let huge = token(u64::MAX);
    if server.sql() {
        match store.check("huge", huge).await {
            Err(FenceError::TokenOutOfRange { max, .. }) => assert_eq!(max, i64::MAX as u64),
            other => panic!("a token past BIGINT must be refused, got {other:?}"),
        }
        assert_eq!(server.fences().await, 2, "bad input wrote nothing");
    } else {
        assert_eq!(server.fences().await, 2, "bad input wrote nothing");
        store
            .check("huge", huge)
            .await
            .expect("Redis and etcd keep any u64");
        store
            .check("huge", token(u64::MAX - 1))
            .await
            .expect_err("below u64::MAX is stale");
        store
            .check("huge", token(9))
            .await
            .expect_err("a short number is smaller");
    }
    // A long resource name at the limit is fine.
    store
        .check(&"r".repeat(255), token(3))
        .await
        .expect("255 bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_the_rule() {
    the_rule_holds(Server::Postgres(PostgresServer::start().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_keeps_the_rule() {
    the_rule_holds(Server::MariaDb(MariaDbServer::start().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_keeps_the_rule() {
    the_rule_holds(Server::Sqlite(
        tempfile::tempdir().expect("a temporary directory"),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_the_rule() {
    the_rule_holds(Server::Redis(RedisServer::start().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_keeps_the_rule() {
    the_rule_holds(Server::Etcd(EtcdServer::start().await)).await;
}

#[tokio::test]
async fn a_store_without_the_install_says_how_to_fix_it() {
    let server = PostgresServer::start().await;
    let store = Store::open(&server.url(), TIMEOUT).await.expect("open");
    let error = store.check("report", token(1)).await.unwrap_err();
    assert!(
        error.to_string().contains("lockkit fence install"),
        "the error names the fix: {error}"
    );
}

#[tokio::test]
async fn an_unknown_scheme_is_a_typed_error() {
    let error = Store::open("ftp://127.0.0.1/x", TIMEOUT).await.unwrap_err();
    assert!(matches!(error, FenceError::Store { .. }), "{error:?}");
    assert!(
        error.to_string().contains("postgres"),
        "lists the schemes: {error}"
    );
}
