//! Every example runs to completion against a real server and prints what
//! its docs promise. The examples are built by `cargo test` (and nextest)
//! next to the test binaries; this runs those binaries.
#![cfg(feature = "full")]

use std::path::PathBuf;
use std::time::Duration;

use lockkit_testkit::TestServer;
use lockkit_testkit::{MariaDbServer, PostgresServer, RedisServer, ZkServer};
use tokio::process::Command;

/// `target/<profile>/examples/<name>`, beside `target/<profile>/deps/` where
/// this test runs from.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("tests run from target/<profile>/deps");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is not built; run `cargo build --examples --all-features` (cargo test builds it)",
        path.display()
    );
    path
}

/// Runs an example with `args` in a fresh directory; returns its stdout.
async fn run(name: &str, args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let run = Command::new(example(name))
        .args(args)
        .current_dir(dir.path())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .unwrap_or_else(|_| panic!("example {name} hung"))
        .expect("the example starts");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "example {name} failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn assert_has(out: &str, line: &str) {
    assert!(
        out.lines().any(|l| l.contains(line)),
        "no {line:?} in:\n{out}"
    );
}

#[tokio::test]
async fn quickstart_and_sqlite_need_no_server() {
    let out = run("quickstart", &[]).await;
    assert_has(&out, "done: counter = 6");
    let out = run("sqlite", &[]).await;
    assert_has(&out, "holding \"invoices/close-month\", fencing token 1");
    assert_has(&out, "status: held, fencing token 1");
    assert_has(&out, "second client got it: false");
    assert_has(&out, "released; status: free");
}

#[tokio::test]
async fn cron_once_runs_each_slot_exactly_once() {
    let out = run("cron_once", &[]).await;
    for slot in 0..3 {
        assert_has(&out, &format!("slot {slot}: the report ran 1 time(s)"));
    }
    let redis = RedisServer::start().await;
    let out = run("cron_once", &[&redis.url()]).await;
    for slot in 0..3 {
        assert_has(&out, &format!("slot {slot}: the report ran 1 time(s)"));
    }
}

#[tokio::test]
async fn redis_and_redlock_examples() {
    let servers = [
        RedisServer::start().await,
        RedisServer::start().await,
        RedisServer::start().await,
    ];
    let out = run("redis", &[&servers[0].url()]).await;
    assert_has(&out, "holding stock/sku-42 with fencing token 1");
    assert_has(&out, "work done, lock still held: true");
    assert_has(&out, "status: held, fencing token 1");
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let out = run("redlock", &[&format!("redlock://{}", hosts.join(","))]).await;
    assert_has(&out, "survives a minority down: true, fencing: false");
    assert_has(&out, "holding billing/run on a quorum");
    assert_has(&out, "status: held");
}

#[tokio::test]
async fn zookeeper_example_serves_waiters_in_order() {
    let zk = ZkServer::start().await;
    let out = run("zookeeper", &[&zk.url_at("/example")]).await;
    let order: Vec<&str> = out.lines().filter(|l| l.contains(" got deploy")).collect();
    assert_eq!(
        order,
        [
            "waiter 1 got deploy",
            "waiter 2 got deploy",
            "waiter 3 got deploy"
        ],
        "{out}"
    );
    assert_has(&out, "status: held, fencing token");
    assert_has(&out, "3 waiting");
}

#[tokio::test]
async fn sql_examples() {
    let (pg, my) = tokio::join!(PostgresServer::start(), MariaDbServer::start());
    let out = run("postgres", &[&pg.url()]).await;
    assert_has(&out, "a holds migrate, fencing token");
    assert_has(&out, "1 waiting");
    assert_has(&out, "b got migrate");

    let out = run("fenced_write", &[&pg.url()]).await;
    assert_has(&out, "B's write accepted: true");
    assert_has(&out, "the fence refused token");
    assert_has(&out, "A's stale write accepted: false");
    assert_has(&out, "A's guard says lost: true");
    assert_has(&out, "quantity is 90 (B's write survived)");

    let out = run("mysql", &[&my.url()]).await;
    assert_has(&out, "GET_LOCK name of \"nightly-export\": nightly-export");
    assert_has(&out, "GET_LOCK name of \"Nightly-Export\": LK#");
    assert_has(&out, "status: held");
    assert_has(&out, "status after release: free");
}
