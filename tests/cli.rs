//! The `lockkit` binary, driven as a user drives it, against real servers
//! (SQLite files, and Redis, ZooKeeper, PostgreSQL and MariaDB started by
//! the testkit): the environment it gives the command, exit statuses, two
//! `exec`s on one name, a lock lost behind its back, forwarded signals and
//! `status`.
#![cfg(feature = "full")]

use std::path::Path;
use std::time::{Duration, Instant};

use lockkit::LockOptions;
use lockkit_testkit::TestServer;
use lockkit_testkit::{MariaDbServer, PostgresServer, RedisServer, ZkServer};
use tokio::process::Child;

mod common;

use common::{Held, code, finish, held_on_sqlite, lockkit, run, sqlite_url, stderr, stdout};

#[tokio::test]
async fn exec_gives_the_command_its_lock_and_passes_its_status_on() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let script = r#"echo "$LOCKKIT_LOCK_NAME $LOCKKIT_FENCING_TOKEN"; exit 3"#;
    let first = run(
        dir.path(),
        &["--url", &url, "exec", "job", "--", "sh", "-c", script],
    )
    .await;
    assert_eq!(code(&first), 3, "{first:?}");
    assert_eq!(stdout(&first), "job 1\n");
    assert_eq!(stderr(&first), "", "stderr stays quiet on success");
    let second = run(
        dir.path(),
        &["--url", &url, "exec", "job", "--", "sh", "-c", script],
    )
    .await;
    assert_eq!(
        stdout(&second),
        "job 2\n",
        "the next holder gets a larger token"
    );

    // An outer token does not leak into a backend without tokens.
    let memory = lockkit(dir.path())
        .env("LOCKKIT_FENCING_TOKEN", "999")
        .args(["--url", "memory://", "exec", "m", "--", "sh", "-c"])
        .arg(r#"echo "[${LOCKKIT_FENCING_TOKEN-unset}]""#)
        .spawn()
        .unwrap();
    let memory = finish(memory).await;
    assert_eq!(code(&memory), 0, "{memory:?}");
    assert_eq!(stdout(&memory), "[1]\n", "memory:// fences too");

    let killed = run(
        dir.path(),
        &["--url", &url, "exec", "job", "--", "sh", "-c", "kill -9 $$"],
    )
    .await;
    assert_eq!(code(&killed), 128 + 9, "a command killed by SIGKILL");
    let missing = run(
        dir.path(),
        &["--url", &url, "exec", "job", "--", "/no/such/command"],
    )
    .await;
    assert_eq!(code(&missing), 127, "{missing:?}");
    assert!(stderr(&missing).contains("/no/such/command"), "{missing:?}");
    let status = run(dir.path(), &["--url", &url, "status", "job"]).await;
    assert_eq!(
        stdout(&status),
        "job: free\n",
        "every run released the lock"
    );
}

#[tokio::test]
async fn the_url_defaults_to_lockkit_url_then_to_sqlite_in_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &["exec", "job", "--", "true"]).await;
    assert_eq!(code(&out), 0, "{out:?}");
    assert!(
        dir.path().join("lockkit.db").exists(),
        "the embedded default"
    );

    let from_env = lockkit(dir.path())
        .env("LOCKKIT_URL", "sqlite://from-env.db")
        .args(["exec", "job", "--", "true"])
        .spawn()
        .unwrap();
    assert_eq!(code(&finish(from_env).await), 0);
    assert!(dir.path().join("from-env.db").exists(), "LOCKKIT_URL");
}

/// Runs `count` copies of `exec NAME --ttl 5s <extra> -- sh -c <script>` in
/// `dir` at once; each must exit 0.
async fn run_execs(dir: &Path, url: &str, name: &str, extra: &[&str], count: usize, script: &str) {
    let children: Vec<Child> = (0..count)
        .map(|_| {
            lockkit(dir)
                .args(["--url", url, "exec", name, "--ttl", "5s"])
                .args(extra)
                .args(["--", "sh", "-c", script])
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = finish(child).await;
        assert_eq!(code(&out), 0, "{url} {extra:?}: {out:?}");
    }
}

/// Three `exec`s at once on one name, each appending `start <token>` and
/// `end` around a pause: the lines must pair up, with increasing tokens.
async fn execs_never_overlap(url: &str, fenced: bool) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!(
        r#"echo "start ${{LOCKKIT_FENCING_TOKEN-none}}" >> {log}; sleep 0.3; echo end >> {log}"#,
        log = log.display()
    );
    run_execs(dir.path(), url, "shared-job", &[], 3, &script).await;
    let lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 6, "{url}: {lines:?}");
    let mut last_token = 0;
    for pair in lines.chunks(2) {
        assert!(
            pair[0].starts_with("start ") && pair[1] == "end",
            "{url}: overlap in {lines:?}"
        );
        let token = &pair[0]["start ".len()..];
        if fenced {
            let token: u64 = token.parse().unwrap_or_else(|_| panic!("{url}: {lines:?}"));
            assert!(token > last_token, "{url}: tokens must increase: {lines:?}");
            last_token = token;
        } else {
            assert_eq!(token, "none", "{url}");
        }
    }
}

#[tokio::test]
async fn two_execs_never_overlap_on_sqlite_and_redis() {
    let dir = tempfile::tempdir().unwrap();
    execs_never_overlap(&sqlite_url(dir.path()), true).await;
    let redis = RedisServer::start().await;
    execs_never_overlap(&redis.url(), true).await;
}

#[tokio::test]
async fn two_execs_never_overlap_on_zookeeper() {
    let zk = ZkServer::start().await;
    execs_never_overlap(&zk.url_at("/cli"), true).await;
}

#[tokio::test]
async fn two_execs_never_overlap_on_postgres_and_mariadb() {
    let (pg, my) = tokio::join!(PostgresServer::start(), MariaDbServer::start());
    execs_never_overlap(&format!("{}?mode=advisory", pg.url()), true).await;
    execs_never_overlap(&pg.url(), true).await;
    execs_never_overlap(&format!("{}?mode=named", my.url()), true).await;
}

#[tokio::test]
async fn a_held_lock_gives_75_after_the_wait_without_running_the_command() {
    let Held {
        dir,
        url,
        guard,
        marker,
    } = held_on_sqlite("busy").await;
    let touch = format!("touch {}", marker.display());

    let start = Instant::now();
    let waited = run(
        dir.path(),
        &[
            "--url", &url, "exec", "busy", "--wait", "300ms", "--", "sh", "-c", &touch,
        ],
    )
    .await;
    assert_eq!(code(&waited), 75, "{waited:?}");
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(
        stderr(&waited).contains("\"busy\""),
        "names the lock: {waited:?}"
    );
    let at_once = run(
        dir.path(),
        &[
            "--url",
            &url,
            "exec",
            "busy",
            "--no-wait",
            "--",
            "sh",
            "-c",
            &touch,
        ],
    )
    .await;
    assert_eq!(code(&at_once), 75, "{at_once:?}");
    assert!(
        !marker.exists(),
        "the command must not run without the lock"
    );

    let status = run(dir.path(), &["--url", &url, "status", "busy", "--json"]).await;
    let json: serde_json::Value = serde_json::from_str(&stdout(&status)).unwrap();
    assert_eq!(json["held"], true);
    assert_eq!(json["fencing_token"], guard.fencing_token().unwrap().get());
    let left = json["remaining_ms"]
        .as_u64()
        .expect("lease rows know the remaining lease");
    assert!(left > 0 && left <= 30_000, "{json}");
    guard.release().await.unwrap();

    let free = run(dir.path(), &["--url", &url, "status", "busy", "--json"]).await;
    let json: serde_json::Value = serde_json::from_str(&stdout(&free)).unwrap();
    assert_eq!(json["held"], false, "{json}");
    assert!(
        json["fencing_token"].is_null() && json["remaining_ms"].is_null(),
        "{json}"
    );
}

#[tokio::test]
async fn an_unavailable_backend_gives_69_without_its_password() {
    let dir = tempfile::tempdir().unwrap();
    let closed = lockkit_testkit::ClosedPort::reserve();
    let port = closed.port();
    let url = format!("redis://:hunter2@127.0.0.1:{port}?connect_timeout=300ms");
    let start = Instant::now();
    let out = run(dir.path(), &["--url", &url, "exec", "job", "--", "true"]).await;
    assert_eq!(code(&out), 69, "{out:?}");
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(!stderr(&out).contains("hunter2"), "{out:?}");
    let status = run(dir.path(), &["--url", &url, "status", "job"]).await;
    assert_eq!(code(&status), 69, "{status:?}");
}

#[tokio::test]
async fn usage_errors_give_64() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    for args in [
        vec!["exec", "job", "--ttl", "soon", "--", "true"],
        vec!["exec", "job", "--ttl", "0s", "--", "true"],
        vec!["exec", "job"],
        vec!["exec", "job", "--wait", "1s", "--no-wait", "--", "true"],
        vec!["exec", "job", "--on-lost", "shrug", "--", "true"],
        vec!["exec", "bad\nname", "--", "true"],
        vec!["status"],
        vec!["frobnicate"],
    ] {
        let mut full = vec!["--url", url.as_str()];
        full.extend(args.iter().copied());
        let out = run(dir.path(), &full).await;
        assert_eq!(code(&out), 64, "{args:?}: {out:?}");
        assert!(!stderr(&out).is_empty(), "{args:?} says why");
    }
    let out = run(
        dir.path(),
        &["--url", "carrier-pigeon://coop", "status", "job"],
    )
    .await;
    assert_eq!(code(&out), 64, "{out:?}");
    let help = run(dir.path(), &["exec", "--help"]).await;
    assert_eq!(code(&help), 0);
    assert!(
        stdout(&help).contains("75"),
        "the help lists the exit statuses"
    );
}

#[tokio::test]
async fn status_reports_holder_token_and_lease_on_redis() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = redis.url();
    let free = run(dir.path(), &["--url", &url, "status", "report"]).await;
    assert_eq!(
        (code(&free), stdout(&free)),
        (0, "report: free\n".to_owned())
    );

    let locks = lockkit::connect(&url).await.unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(20));
    let guard = locks.acquire("report", &opts).await.unwrap();
    let token = guard.fencing_token().unwrap();
    let held = run(dir.path(), &["--url", &url, "status", "report"]).await;
    let text = stdout(&held);
    assert!(
        text.starts_with(&format!("report: held, fencing token {token}, "))
            && text.ends_with("s left, 0 waiting\n"),
        "{text:?}"
    );
    let json = run(dir.path(), &["--url", &url, "status", "report", "--json"]).await;
    let json: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(json["name"], "report");
    assert_eq!(json["fencing_token"], token.get());
    assert!(json["remaining_ms"].as_u64().unwrap() <= 20_000, "{json}");
    guard.release().await.unwrap();
}

/// Runs `count` copies of `exec NAME <extra> -- <log start, sleep 1s, log end>`
/// at once, and returns the most that were inside at the same time.
async fn most_at_once(url: &str, name: &str, extra: &[&str], count: usize) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!(
        "echo start >> {log}; sleep 1; echo end >> {log}",
        log = log.display()
    );
    run_execs(dir.path(), url, name, extra, count, &script).await;
    let (mut inside, mut most, mut lines) = (0_usize, 0, 0);
    for line in std::fs::read_to_string(&log).unwrap().lines() {
        lines += 1;
        if line == "start" {
            inside += 1;
            most = most.max(inside);
        } else {
            inside -= 1;
        }
    }
    assert_eq!(lines, 2 * count, "{url} {extra:?}: every command ran");
    most
}

#[tokio::test]
async fn shared_execs_run_together_and_permits_bound_them_on_redis() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    assert_eq!(most_at_once(&url, "readers", &["--shared"], 3).await, 3);
    assert_eq!(most_at_once(&url, "writers", &[], 2).await, 1);
    assert_eq!(
        most_at_once(&url, "transcoders", &["--permits", "2"], 4).await,
        2
    );

    let dir = tempfile::tempdir().unwrap();
    let locks = lockkit::connect(&url).await.unwrap();
    let reader = LockOptions::new().ttl(Duration::from_secs(20)).shared();
    let guards = [
        locks.acquire("report", &reader).await.unwrap(),
        locks.acquire("report", &reader).await.unwrap(),
    ];
    let held = run(dir.path(), &["--url", &url, "status", "report", "--json"]).await;
    let json: serde_json::Value = serde_json::from_str(&stdout(&held)).unwrap();
    assert_eq!(
        (json["held"].as_bool(), json["holders"].as_u64()),
        (Some(true), Some(2)),
        "{json}"
    );
    let held = run(dir.path(), &["--url", &url, "status", "report"]).await;
    assert!(stdout(&held).contains(", 2 holders"), "{}", stdout(&held));
    let semaphore = run(
        dir.path(),
        &["--url", &url, "status", "report", "--semaphore"],
    )
    .await;
    assert_eq!(
        stdout(&semaphore),
        "report: free\n",
        "the semaphore is another thing"
    );
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// A permit is seen whichever slot it took: SQL lease mode keeps each permit
/// in one of `permits` slots, picked at random (`status --semaphore` once
/// looked at the first slot alone, and called a held semaphore free).
#[tokio::test]
async fn status_sees_a_permit_in_any_slot() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let locks = lockkit::connect(&url).await.unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(20)).semaphore(8);
    let mut permits = Vec::new();
    for _ in 0..3 {
        permits.push(locks.acquire("transcoders", &opts).await.unwrap());
    }
    for args in [
        &[
            "--url",
            &url,
            "status",
            "transcoders",
            "--semaphore",
            "--json",
        ][..],
        &[
            "--url",
            &url,
            "status",
            "transcoders",
            "--permits",
            "8",
            "--json",
        ][..],
    ] {
        let out = run(dir.path(), args).await;
        let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(
            (json["held"].as_bool(), json["holders"].as_u64()),
            (Some(true), Some(3)),
            "{args:?}: {json}"
        );
    }
    for permit in permits {
        permit.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_kind_the_backend_cannot_hold_gives_69_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &[
            "--url",
            &sqlite_url(dir.path()),
            "exec",
            "job",
            "--permits",
            "257",
            "--",
            "sh",
            "-c",
            "echo ran",
        ],
    )
    .await;
    assert_eq!(code(&out), 69, "{out:?}");
    assert!(stdout(&out).is_empty(), "{out:?}");
    assert!(stderr(&out).contains("256 permits"), "{out:?}");
}

#[tokio::test]
async fn exec_records_its_holder_and_status_prints_it_on_redis() {
    let redis = RedisServer::start().await;
    let (url, dir) = (redis.url(), tempfile::tempdir().unwrap());
    let bin = env!("CARGO_BIN_EXE_lockkit");
    let show = r#""$0" --url "$1" status job --json"#;
    let out = run(
        dir.path(),
        &[
            "--url", &url, "exec", "job", "--", "sh", "-c", show, bin, &url,
        ],
    )
    .await;
    assert_eq!(code(&out), 0, "{out:?}");
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let holder = json["holder"].as_str().expect("a holder").to_owned();
    let (host, pid) = holder.rsplit_once(':').expect("<hostname>:<pid>");
    assert!(!host.is_empty() && pid.parse::<u32>().is_ok(), "{holder}");

    let out = run(
        dir.path(),
        &[
            "--url",
            &url,
            "exec",
            "job",
            "--holder",
            "nightly-report",
            "--",
            "sh",
            "-c",
            show,
            bin,
            &url,
        ],
    )
    .await;
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["holder"], "nightly-report", "{json}");

    // SQLite records it in the lock table (every built-in backend can).
    let sqlite = sqlite_url(dir.path());
    let out = run(
        dir.path(),
        &[
            "--url", &sqlite, "exec", "job", "--holder", "me", "--", "sh", "-c", show, bin, &sqlite,
        ],
    )
    .await;
    assert_eq!(code(&out), 0, "{out:?}");
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["holder"], "me", "{json}");
}

#[tokio::test]
async fn elect_runs_one_leader_at_a_time_and_leader_names_it_on_redis() {
    let redis = RedisServer::start().await;
    let (url, dir) = (redis.url(), tempfile::tempdir().unwrap());
    let nobody = run(dir.path(), &["--url", &url, "leader", "sched"]).await;
    assert_eq!(code(&nobody), 1, "{nobody:?}");
    assert!(stdout(&nobody).is_empty());

    // Two candidates, two terms each; every term logs its start and end.
    let bin = env!("CARGO_BIN_EXE_lockkit");
    let log = dir.path().join("terms.log");
    let term = r#"echo "start $LOCKKIT_LEADER $LOCKKIT_TERM $("$0" --url "$1" leader sched)" >> "$2"; sleep 0.3; echo "end $LOCKKIT_LEADER" >> "$2""#;
    let log_path = log.display().to_string();
    let candidates: Vec<Child> = ["a", "b"]
        .iter()
        .map(|id| {
            lockkit(dir.path())
                .args(["--url", &url, "elect", "sched", "--id", id, "--terms", "2"])
                .args(["--", "sh", "-c", term, bin, &url, &log_path])
                .spawn()
                .expect("start a candidate")
        })
        .collect();
    for candidate in candidates {
        let out = finish(candidate).await;
        assert_eq!(code(&out), 0, "{out:?}");
    }
    let lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 8, "{lines:?}");
    let mut last_term = 0u64;
    for pair in lines.chunks(2) {
        let start: Vec<&str> = pair[0].split(' ').collect();
        assert_eq!(start[0], "start", "terms overlap: {lines:?}");
        assert_eq!(
            pair[1],
            format!("end {}", start[1]),
            "terms overlap: {lines:?}"
        );
        assert_eq!(
            start[3], start[1],
            "`leader` names the one running: {lines:?}"
        );
        let term: u64 = start[2].parse().expect("LOCKKIT_TERM");
        assert!(term > last_term, "terms increase: {lines:?}");
        last_term = term;
    }
}
