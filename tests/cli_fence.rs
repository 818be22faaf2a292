//! `lockkit fence install|check`, driven as a user drives them, and the
//! shell recipe that fences a job's write: `lockkit exec` hands the command
//! its token, and the command's own `psql` transaction calls `lockkit_fence`.
#![cfg(feature = "full")]

use lockkit_testkit::{MariaDbServer, PostgresServer, TestServer};

mod common;

use common::{code, run, sqlite_url, stderr, stdout};

#[tokio::test]
async fn check_admits_records_and_refuses_with_65() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let install = run(dir.path(), &["--url", &url, "fence", "install"]).await;
    assert_eq!(code(&install), 0, "{install:?}");
    let again = run(dir.path(), &["--url", &url, "fence", "install"]).await;
    assert_eq!(code(&again), 0, "install is idempotent: {again:?}");

    for (token, expected) in [("5", 0), ("7", 0), ("7", 0), ("6", 65)] {
        let check = run(
            dir.path(),
            &["--url", &url, "fence", "check", "report", token],
        )
        .await;
        assert_eq!(code(&check), expected, "token {token}: {check:?}");
    }
    let stale = run(
        dir.path(),
        &["--url", &url, "fence", "check", "report", "6"],
    )
    .await;
    let message = stderr(&stale);
    assert!(
        message.contains("stale fencing token 6") && message.contains("7 was admitted"),
        "{message}"
    );
    assert_eq!(stdout(&stale), "");

    // Bad input: a usage error, nothing recorded.
    let long = "r".repeat(256);
    for args in [
        vec!["fence", "check", "", "1"],
        vec!["fence", "check", long.as_str(), "1"],
        vec!["fence", "check", "report", "seven"],
        vec!["fence", "check", "report", "9223372036854775808"],
    ] {
        let mut full = vec!["--url", url.as_str()];
        full.extend(args.iter().copied());
        let out = run(dir.path(), &full).await;
        assert_eq!(code(&out), 64, "{args:?}: {out:?}");
    }
    let still = run(
        dir.path(),
        &["--url", &url, "fence", "check", "report", "7"],
    )
    .await;
    assert_eq!(code(&still), 0, "7 is still the greatest: {still:?}");

    let nowhere = run(
        dir.path(),
        &["--url", "zk://127.0.0.1:1", "fence", "check", "r", "1"],
    )
    .await;
    assert_eq!(code(&nowhere), 69, "no fence on ZooKeeper: {nowhere:?}");
    assert!(stderr(&nowhere).contains("no fence store"), "{nowhere:?}");
}

/// The recipe of the guide: the job's own psql transaction fences its write
/// with the token `lockkit exec` gave it; a former holder's token is
/// refused afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_and_psql_fence_a_shell_job() {
    let server = PostgresServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = server.url();
    let install = run(dir.path(), &["--url", &url, "fence", "install"]).await;
    assert_eq!(code(&install), 0, "{install:?}");
    server
        .psql("CREATE TABLE report (id int PRIMARY KEY, written_by bigint NOT NULL); INSERT INTO report VALUES (1, 0)")
        .await
        .unwrap();
    let psql = server.bin_dir().join("psql");
    let job = format!(
        r#"{psql} -X -q -v ON_ERROR_STOP=1 "{url}" -c "BEGIN; SELECT lockkit_fence('report', $LOCKKIT_FENCING_TOKEN); UPDATE report SET written_by = $LOCKKIT_FENCING_TOKEN WHERE id = 1; COMMIT" >/dev/null && echo $LOCKKIT_FENCING_TOKEN"#,
        psql = psql.display()
    );
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let out = run(
            dir.path(),
            &["--url", &url, "exec", "report", "--", "sh", "-c", &job],
        )
        .await;
        assert_eq!(code(&out), 0, "{out:?}");
        tokens.push(
            stdout(&out)
                .trim()
                .parse::<u64>()
                .expect("the job printed its token"),
        );
    }
    assert!(tokens[0] < tokens[1], "{tokens:?}");
    let written = server.psql("SELECT written_by FROM report").await.unwrap();
    assert_eq!(written, tokens[1].to_string());
    // The first holder, late: refused by the store.
    let late = run(
        dir.path(),
        &[
            "--url",
            &url,
            "fence",
            "check",
            "report",
            &tokens[0].to_string(),
        ],
    )
    .await;
    assert_eq!(code(&late), 65, "{late:?}");
}

/// `install --print` gives SQL that the databases' own clients run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_sql_installs_from_psql_and_mariadb() {
    let dir = tempfile::tempdir().unwrap();
    let postgres = PostgresServer::start().await;
    let printed = run(
        dir.path(),
        &["--url", &postgres.url(), "fence", "install", "--print"],
    )
    .await;
    assert_eq!(code(&printed), 0, "{printed:?}");
    postgres
        .psql(&stdout(&printed))
        .await
        .expect("psql runs the printed SQL");
    assert_eq!(
        postgres.psql("SELECT lockkit_fence('r', 3)").await.unwrap(),
        "3"
    );

    let mariadb = MariaDbServer::start().await;
    let printed = run(
        dir.path(),
        &["--url", &mariadb.url(), "fence", "install", "--print"],
    )
    .await;
    assert_eq!(code(&printed), 0, "{printed:?}");
    assert!(stdout(&printed).contains("DELIMITER"), "{printed:?}");
    mariadb
        .sql(&stdout(&printed))
        .await
        .expect("mariadb runs the printed SQL");
    let out = mariadb.sql("SELECT lockkit_fence('r', 3)").await.unwrap();
    assert_eq!(out.lines().last(), Some("3"), "{out}");

    let redis = run(
        dir.path(),
        &[
            "--url",
            "redis://127.0.0.1:1",
            "fence",
            "install",
            "--print",
        ],
    )
    .await;
    assert_eq!(code(&redis), 64, "nothing to print for Redis: {redis:?}");
}
