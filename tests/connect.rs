//! `lockkit::connect`: a table of good and bad URLs.

use lockkit::{LockError, LockOptions};
#[cfg(any(feature = "redis", feature = "redlock", feature = "zk"))]
use lockkit_testkit::TestServer;

fn assert_invalid_url(url: &str, err: &LockError) {
    assert!(matches!(err, LockError::InvalidUrl { .. }), "{url}: {err}");
}

#[tokio::test]
async fn memory_urls() {
    let locks = lockkit::connect("memory://").await.unwrap();
    let guard = locks
        .acquire("facade/memory", &LockOptions::new())
        .await
        .unwrap();
    // Every memory:// connection of the process shares one store.
    let other = lockkit::connect("memory://").await.unwrap();
    assert!(
        other
            .try_acquire("facade/memory", &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    guard.release().await.unwrap();
    for bad in ["memory://somewhere", "memory:///path", "memory://?x=1"] {
        assert_invalid_url(bad, &lockkit::connect(bad).await.unwrap_err());
    }
}

#[tokio::test]
async fn unknown_and_malformed_urls() {
    for bad in [
        "",
        "localhost:6379",
        "carrier-pigeon://coop",
        "://nothing",
        "1redis://h",
    ] {
        assert_invalid_url(bad, &lockkit::connect(bad).await.unwrap_err());
    }
}

#[tokio::test]
async fn backends_not_compiled_name_their_feature() {
    let mut expected = vec![];
    if cfg!(not(feature = "postgres")) {
        expected.push(("postgres://u:p@localhost/db", "postgres"));
        expected.push(("postgresql://localhost/db", "postgres"));
    }
    if cfg!(not(feature = "mysql")) {
        expected.push(("mysql://localhost/db", "mysql"));
        expected.push(("mariadb://localhost/db", "mysql"));
    }
    if cfg!(not(feature = "sqlite")) {
        expected.push(("sqlite://lockkit.db", "sqlite"));
    }
    if cfg!(not(feature = "zk")) {
        expected.push(("zk://127.0.0.1:2181/locks", "zk"));
    }
    if cfg!(not(feature = "etcd")) {
        expected.push(("etcd://127.0.0.1:2379/locks", "etcd"));
    }
    if cfg!(not(feature = "redlock")) {
        expected.push(("redlock://a:1,b:2,c:3", "redlock"));
    }
    if cfg!(not(feature = "redis")) {
        expected.push(("redis://127.0.0.1:6379", "redis"));
        expected.push(("rediss://127.0.0.1:6379", "redis"));
        expected.push(("redis+cluster://127.0.0.1:7000,127.0.0.1:7001", "redis"));
        expected.push(("redis+sentinel://127.0.0.1:26379/mymaster", "redis"));
    }
    for (url, feature) in expected {
        match lockkit::connect(url).await.unwrap_err() {
            LockError::BackendNotCompiled { feature: named, .. } => {
                assert_eq!(named, feature, "{url}")
            }
            other => panic!("{url}: {other}"),
        }
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_urls() {
    for bad in [
        "redis://:pw@",
        "redis://h:99999",
        "redis://h/notadb",
        "redis://h?prefx=typo",
        "redis://h?connect_timeout=soon",
        "redis://h?command_timeout=0ms",
        "rediss://h?ca_file=/nonexistent/ca.pem",
    ] {
        let err = lockkit::connect(bad).await.unwrap_err();
        assert_invalid_url(bad, &err);
    }
    // A closed port: unavailable, quickly, and the password stays out of the error.
    let closed = lockkit_testkit::ClosedPort::reserve();
    let port = closed.port();
    let url = format!("redis://:hunter2@127.0.0.1:{port}?connect_timeout=500ms");
    let start = std::time::Instant::now();
    let err = lockkit::connect(&url).await.unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(10),
        "not refused: hung"
    );
    assert!(!format!("{err} {err:?}").contains("hunter2"));
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_through_the_facade() {
    let server = lockkit_testkit::RedisServer::start().await;
    let locks = lockkit::connect(&format!("{}?prefix=facade:", server.url()))
        .await
        .unwrap();
    assert!(locks.capabilities().fencing);
    let guard = locks.acquire("job", &LockOptions::new()).await.unwrap();
    assert_eq!(
        server.command(&["EXISTS", "facade:job"]).await.unwrap(),
        "1"
    );
    guard.release().await.unwrap();
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_cluster_and_sentinel_urls() {
    for bad in [
        "redis+cluster://",
        "redis+cluster://:hunter2@h:0",
        "redis+cluster://h:1,h:1",
        "redis+cluster://h:1/2",
        "redis+cluster://h:1?prefx=typo",
        "redis+sentinel://:hunter2@h:1",
        "redis+sentinel://h:1/",
        "redis+sentinel:///master",
        "redis+sentinel://h:0/master",
        "redis+sentinel://h:1/master?sentinel_password=hunter2&bogus=1",
    ] {
        let err = lockkit::connect(bad).await.unwrap_err();
        assert_invalid_url(bad, &err);
        assert!(!format!("{err} {err:?}").contains("hunter2"), "{err}");
    }
    // Nobody listens: unavailable within the connect timeout, secret-free.
    let closed = [
        lockkit_testkit::ClosedPort::reserve(),
        lockkit_testkit::ClosedPort::reserve(),
    ];
    let (a, b) = (closed[0].port(), closed[1].port());
    for url in [
        format!("redis+cluster://:hunter2@127.0.0.1:{a},127.0.0.1:{b}?connect_timeout=500ms"),
        format!(
            "redis+sentinel://:hunter2@127.0.0.1:{a},127.0.0.1:{b}/m?connect_timeout=500ms&sentinel_password=hunter2"
        ),
    ] {
        let start = std::time::Instant::now();
        let err = lockkit::connect(&url).await.unwrap_err();
        assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "not refused: hung"
        );
        assert!(!format!("{err} {err:?}").contains("hunter2"), "{err}");
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_through_the_facade() {
    let cluster = lockkit_testkit::RedisCluster::start(1).await;
    let locks = lockkit::connect(&format!("{}?prefix=facade:", cluster.url()))
        .await
        .unwrap();
    // A cluster's replicas may be promoted: no fencing without WAIT.
    assert!(!locks.capabilities().fencing);
    let guard = locks.acquire("job", &LockOptions::new()).await.unwrap();
    assert_eq!(guard.fencing_token(), None);
    assert_eq!(
        cluster.command(&["EXISTS", "facade:job"]).await.unwrap(),
        "1"
    );
    guard.release().await.unwrap();
}

#[cfg(feature = "redlock")]
#[tokio::test]
async fn redlock_urls() {
    for bad in [
        "redlock://",
        "redlock://a:1,a:1",
        "redlock://a:1?instance_timeout=never",
        "redlock://a:1?prefx=typo",
    ] {
        assert_invalid_url(bad, &lockkit::connect(bad).await.unwrap_err());
    }
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(lockkit_testkit::RedisServer::start().await);
    }
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let locks = lockkit::connect(&format!("redlock://{}?prefix=facade:", hosts.join(",")))
        .await
        .unwrap();
    let caps = locks.capabilities();
    assert!(!caps.fencing && caps.survives_minority_failure);
    let guard = locks.acquire("job", &LockOptions::new()).await.unwrap();
    assert_eq!(guard.fencing_token(), None);
    for server in &servers {
        assert_eq!(
            server.command(&["EXISTS", "facade:job"]).await.unwrap(),
            "1"
        );
    }
    guard.release().await.unwrap();
}

#[cfg(feature = "zk")]
#[tokio::test]
async fn zk_urls() {
    for bad in [
        "zk://",
        "zk://a:1,a:1/locks",
        "zk://h/a//b",
        "zk://h?session_timeout=never",
        "zk://h?root=typo",
    ] {
        assert_invalid_url(bad, &lockkit::connect(bad).await.unwrap_err());
    }
    let server = lockkit_testkit::ZkServer::start().await;
    let locks = lockkit::connect(&server.url_at("facade")).await.unwrap();
    let caps = locks.capabilities();
    assert!(caps.fencing && caps.fifo && caps.survives_minority_failure);
    let guard = locks.acquire("job", &LockOptions::new()).await.unwrap();
    assert!(guard.fencing_token().is_some());
    assert_eq!(
        server
            .four_letter("srvr")
            .await
            .map(|s| s.contains("Mode:"))
            .ok(),
        Some(true)
    );
    guard.release().await.unwrap();
}

/// SQLite needs no server: a database file in a temporary directory.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_urls() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/locks.db", dir.path().display());
    let locks = lockkit::connect(&url).await.unwrap();
    let guard = locks
        .acquire("facade/sqlite", &LockOptions::new())
        .await
        .unwrap();
    assert!(guard.fencing_token().is_some());
    guard.release().await.unwrap();
    for bad in [
        "sqlite://x.db?mode=advisory",
        "sqlite://",
        "sqlite://x.db?table=a-b",
    ] {
        assert_invalid_url(bad, &lockkit::connect(bad).await.unwrap_err());
    }
}

/// Bad URLs of every backend: the feature that compiles it in (`any`:
/// always), the URL, and a word the reason must contain.
const BAD_URLS: &str = "
redis    | redis://                                       | host
redis    | redis://127.0.0.1:0                            | port
redis    | redis://127.0.0.1:65536                        | port
redis    | redis://127.0.0.1:http                         | port
redis    | redis://127.0.0.1?command_timeout=fast         | command_timeout
redis    | redis://127.0.0.1?connect_timeout=0s           | connect_timeout
redlock  | redlock://                                     | host
redlock  | redlock://127.0.0.1:1,127.0.0.2:99999          | port
redlock  | redlock://127.0.0.1:1?instance_timeout=-1s     | instance_timeout
redlock  | redlock://127.0.0.1:0,127.0.0.1:1,127.0.0.1:2  | port
zk       | zk://                                          | host
zk       | zk://127.0.0.1:0/locks                         | port
zk       | zk://127.0.0.1:123456/locks                    | port
zk       | zk://127.0.0.1/locks?session_timeout=1         | session_timeout
postgres | postgres:///db                                 | host
postgres | postgres://127.0.0.1:99999/db                  | port
postgres | postgres://127.0.0.1:0/db                      | port
postgres | postgres://127.0.0.1/db?mode=named             | mode
postgres | postgresql://127.0.0.1/db?mode=exclusive       | mode
postgres | postgres://127.0.0.1/db?command_timeout=soon   | command_timeout
mysql    | mysql:///db                                    | host
mysql    | mysql://127.0.0.1:-1/db                        | port
mysql    | mysql://127.0.0.1:0/db                         | port
mysql    | mysql://127.0.0.1/db?mode=advisory             | mode
mysql    | mariadb://127.0.0.1/db?connect_timeout=forever | connect_timeout
sqlite   | sqlite://x.db?mode=row                         | mode
sqlite   | sqlite://x.db?command_timeout=0ms              | command_timeout
any      | memory://host                                  | memory
any      | nosuch://127.0.0.1                             | unknown scheme
";

/// Whether the backend of `feature` is compiled in (`any`: always).
fn compiled(feature: &str) -> bool {
    match feature {
        "redis" => cfg!(feature = "redis"),
        "redlock" => cfg!(feature = "redlock"),
        "zk" => cfg!(feature = "zk"),
        "etcd" => cfg!(feature = "etcd"),
        "postgres" => cfg!(feature = "postgres"),
        "mysql" => cfg!(feature = "mysql"),
        "sqlite" => cfg!(feature = "sqlite"),
        "any" => true,
        other => panic!("no feature {other:?}"),
    }
}

/// The URL table: for every backend compiled in, a missing host, a bad port,
/// a bad mode and bad durations are `InvalidUrl`, and say what is wrong;
/// never a panic, a hang or a connection attempt.
#[tokio::test]
async fn bad_urls_of_every_backend() {
    let mut wrong = Vec::new();
    for line in BAD_URLS.lines().filter(|line| !line.trim().is_empty()) {
        let [feature, url, why] = line.split('|').map(str::trim).collect::<Vec<_>>()[..] else {
            panic!("a row of three columns: {line:?}");
        };
        if !compiled(feature) {
            continue;
        }
        let started = std::time::Instant::now();
        match lockkit::connect(url).await {
            Err(LockError::InvalidUrl { reason, .. }) if reason.to_lowercase().contains(why) => {}
            Err(LockError::InvalidUrl { reason, .. }) => wrong.push(format!(
                "{url}: the reason {reason:?} should mention {why:?}"
            )),
            Err(other) => wrong.push(format!("{url}: expected InvalidUrl, got {other}")),
            Ok(_) => wrong.push(format!("{url}: accepted")),
        }
        if started.elapsed() > std::time::Duration::from_secs(5) {
            wrong.push(format!("{url}: not refused before a connection attempt"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
