//! `exec --min-hold`, `--max-hold` and `--on-at-risk`, as a user runs them,
//! on a SQLite file (whose lease rows keep the bounds on the "server").
#![cfg(feature = "full")]

use sqlx::{Connection, SqliteConnection};

mod common;

use common::{code, finish, lockkit, run, sqlite_url, stderr, wait_for_file};

/// The cron recipe: a job that ends at once keeps its lock for its
/// `--min-hold`, so a late trigger elsewhere does not run it again.
#[tokio::test]
async fn min_hold_keeps_a_finished_job_from_running_again() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    let nightly = |marker: &std::path::Path| {
        let job = format!("touch {}", marker.display());
        let dir = dir.path().to_owned();
        let url = url.clone();
        async move {
            let args = [
                "--url",
                &url,
                "exec",
                "nightly",
                "--no-wait",
                "--min-hold",
                "1h",
                "--",
                "sh",
                "-c",
                &job,
            ];
            run(&dir, &args).await
        }
    };
    let ran = nightly(&first).await;
    assert_eq!(code(&ran), 0, "{ran:?}");
    assert!(first.exists());
    let late = nightly(&second).await;
    assert_eq!(code(&late), 75, "the late trigger finds it taken: {late:?}");
    assert!(!second.exists(), "the job ran twice");
}

/// `--max-hold` stops a command that runs too long, as a lost lock does
/// (exit 70), and frees the lock.
#[tokio::test]
async fn max_hold_stops_the_command_with_70() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let finished = dir.path().join("finished");
    // The shell waits in `wait`, where a SIGTERM reaches it at once.
    let script = format!(
        "sleep 60 >/dev/null 2>&1 & trap 'kill $!; exit 143' TERM; wait $!; touch {}",
        finished.display()
    );
    let stopped = run(
        dir.path(),
        &[
            "--url",
            &url,
            "exec",
            "long-job",
            "--ttl",
            "600ms",
            "--max-hold",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .await;
    assert_eq!(code(&stopped), 70, "{stopped:?}");
    assert!(
        stderr(&stopped).contains("max_hold"),
        "says why: {stopped:?}"
    );
    assert!(!finished.exists(), "the command was stopped");
    let next = run(
        dir.path(),
        &["--url", &url, "exec", "long-job", "--no-wait", "--", "true"],
    )
    .await;
    assert_eq!(code(&next), 0, "the lock is free again: {next:?}");
}

/// `--on-at-risk USR1` tells the command when renewals stop getting
/// through (here: another connection holds SQLite's write lock), and the
/// holding survives once they get through again.
#[tokio::test]
async fn on_at_risk_signals_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let (started, warned) = (dir.path().join("started"), dir.path().join("warned"));
    let script = format!(
        "trap 'touch {warned}' USR1; touch {started}; while [ ! -f {warned} ]; do sleep 0.05; done",
        warned = warned.display(),
        started = started.display(),
    );
    let child = lockkit(dir.path())
        .args([
            "--url",
            &url,
            "exec",
            "watched",
            "--ttl",
            "6s",
            "--on-at-risk",
            "USR1",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .spawn()
        .expect("start lockkit");
    wait_for_file(&started).await;
    let db = dir.path().join("locks.db");
    let mut blocker = SqliteConnection::connect(&format!("sqlite://{}", db.display()))
        .await
        .expect("a second connection");
    sqlx::raw_sql("BEGIN EXCLUSIVE")
        .execute(&mut blocker)
        .await
        .expect("take the write lock");
    wait_for_file(&warned).await;
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut blocker)
        .await
        .expect("give the write lock back");
    let done = finish(child).await;
    assert_eq!(
        code(&done),
        0,
        "warned, then confirmed and released: {done:?}"
    );
    assert!(stderr(&done).contains("at risk"), "{done:?}");
}
