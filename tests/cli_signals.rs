//! The `lockkit` binary and the command it runs: a lock lost behind its
//! back stops the command, and signals reach it, as a user meets them
//! (SQLite files and Redis started by the testkit).
#![cfg(feature = "full")]

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use lockkit_testkit::{RedisServer, TestServer};
use nix::sys::signal::{Signal, kill};
use tokio::process::Command;

mod common;

use common::{
    Held, code, finish, held_on_sqlite, lockkit, pid, run, sqlite_url, stderr, stdout,
    wait_for_file,
};

/// Starts `exec` on Redis with a 1.5 s lease and the given options and
/// command, waits until the command runs, then deletes the lock key behind
/// its back. Returns the run's output and the time from the deletion to its
/// end.
async fn lose_the_lock(options: &[&str], script: &str, started: &Path) -> (Output, Duration) {
    let redis = RedisServer::start().await;
    let dir = started.parent().unwrap();
    let child = lockkit(dir)
        .args(["--url", &redis.url(), "exec", "lose-me", "--ttl", "1500ms"])
        .args(options)
        .args(["--", "sh", "-c", script])
        .spawn()
        .unwrap();
    wait_for_file(started).await;
    assert_eq!(
        redis.command(&["DEL", "lockkit:lose-me"]).await.unwrap(),
        "1"
    );
    let deleted = Instant::now();
    let out = finish(child).await;
    (out, deleted.elapsed())
}

#[tokio::test]
async fn a_lost_lock_stops_the_command_and_gives_70() {
    let dir = tempfile::tempdir().unwrap();
    let (started, got) = (dir.path().join("started"), dir.path().join("got"));
    let script = format!(
        r#"trap 'echo TERM > {got}; exit 0' TERM; touch {started}; while :; do sleep 0.05; done"#,
        got = got.display(),
        started = started.display()
    );
    let (out, took) = lose_the_lock(&[], &script, &started).await;
    assert_eq!(code(&out), 70, "{out:?}");
    assert!(stderr(&out).contains("lost"), "{out:?}");
    assert_eq!(std::fs::read_to_string(&got).unwrap(), "TERM\n");
    assert!(
        took < Duration::from_secs(5),
        "noticed within a renewal: {took:?}"
    );
}

#[tokio::test]
async fn a_command_that_ignores_sigterm_gets_sigkill_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let script = format!(
        r#"trap '' TERM; touch {started}; while :; do sleep 0.05; done"#,
        started = started.display()
    );
    let (out, took) = lose_the_lock(&["--grace", "700ms"], &script, &started).await;
    assert_eq!(code(&out), 70, "{out:?}");
    assert!(stderr(&out).contains("SIGKILL"), "{out:?}");
    assert!(
        took >= Duration::from_millis(700),
        "the grace period is honoured: {took:?}"
    );
    assert!(took < Duration::from_secs(6), "{took:?}");
}

#[tokio::test]
async fn on_lost_ignore_lets_the_command_finish_and_still_gives_70() {
    let dir = tempfile::tempdir().unwrap();
    let (started, done) = (dir.path().join("started"), dir.path().join("done"));
    let script = format!(
        r#"touch {started}; sleep 3; echo finished > {done}"#,
        started = started.display(),
        done = done.display()
    );
    let (out, _) = lose_the_lock(&["--on-lost", "ignore"], &script, &started).await;
    assert_eq!(code(&out), 70, "{out:?}");
    assert_eq!(std::fs::read_to_string(&done).unwrap(), "finished\n");
}

/// SIGTERM or SIGINT to `lockkit` reaches the command, whose exit status
/// then becomes lockkit's; the lock is released.
async fn signal_is_forwarded(signal: Signal, trap: &str, expect: i32) {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let (started, got) = (dir.path().join("started"), dir.path().join("got"));
    let script = format!(
        r#"trap 'echo {trap} > {got}; exit {expect}' {trap}; touch {started}; while :; do sleep 0.05; done"#,
        got = got.display(),
        started = started.display()
    );
    let child = lockkit(dir.path())
        .args(["--url", &url, "exec", "sig", "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    wait_for_file(&started).await;
    kill(pid(&child), signal).unwrap();
    let out = finish(child).await;
    assert_eq!(code(&out), expect, "{out:?}");
    assert_eq!(std::fs::read_to_string(&got).unwrap(), format!("{trap}\n"));
    let status = run(dir.path(), &["--url", &url, "status", "sig"]).await;
    assert_eq!(stdout(&status), "sig: free\n");
}

#[tokio::test]
async fn sigterm_and_sigint_reach_the_command() {
    signal_is_forwarded(Signal::SIGTERM, "TERM", 3).await;
    signal_is_forwarded(Signal::SIGINT, "INT", 4).await;
}

/// Ctrl-C in a terminal: the kernel sends SIGINT to the whole foreground
/// process group, the command included, so `lockkit` does not pass it on a
/// second time. (`lockkit` runs as the leader of a new session whose
/// controlling terminal is a pseudo-terminal; writing `^C` to its master
/// side is what a user's keyboard does.) A `kill -INT` to `lockkit` alone is
/// still passed on: `sigterm_and_sigint_reach_the_command`.
#[tokio::test]
async fn ctrl_c_in_a_terminal_reaches_the_command_once() {
    use tokio::io::AsyncWriteExt;

    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let (started, got) = (dir.path().join("started"), dir.path().join("got"));
    // Counts the SIGINTs it gets, and keeps running a second after the
    // first one so that a second one would be counted.
    let script = format!(
        r#"n=0; trap 'n=$((n+1)); echo INT >> {got}' INT; touch {started}; k=0; while [ $k -lt 20 ]; do sleep 0.05; if [ $n -gt 0 ]; then k=$((k+1)); fi; done; exit 4"#,
        got = got.display(),
        started = started.display()
    );
    let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
    // util-linux's setsid (an essential Debian package) starts lockkit as
    // the leader of a new session with the pseudo-terminal as its
    // controlling terminal, and exits with lockkit's status.
    let mut command = Command::new("setsid");
    command
        .args(["--ctty", "--wait", env!("CARGO_BIN_EXE_lockkit")])
        .args(["--url", &url, "exec", "ctrl-c", "--", "sh", "-c", &script])
        .current_dir(dir.path())
        .env_remove("LOCKKIT_URL")
        .env_remove("LOCKKIT_LOG")
        .stdin(Stdio::from(pty.slave))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command.spawn().expect("start lockkit");
    wait_for_file(&started).await;
    let mut master = tokio::fs::File::from_std(std::fs::File::from(pty.master));
    master.write_all(&[0x03]).await.expect("type ^C");
    master.flush().await.unwrap();
    let out = finish(child).await;
    assert_eq!(code(&out), 4, "{out:?}");
    assert_eq!(
        std::fs::read_to_string(&got).unwrap(),
        "INT\n",
        "the command got SIGINT once; lockkit said: {}",
        stderr(&out)
    );
    let status = run(dir.path(), &["--url", &url, "status", "ctrl-c"]).await;
    assert_eq!(stdout(&status), "ctrl-c: free\n");
}

#[tokio::test]
async fn a_signal_while_waiting_ends_the_wait_without_running_the_command() {
    let Held {
        dir,
        url,
        guard,
        marker,
    } = held_on_sqlite("waiting").await;
    let child = lockkit(dir.path())
        .args(["--url", &url, "exec", "waiting", "--", "touch"])
        .arg(&marker)
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    kill(pid(&child), Signal::SIGTERM).unwrap();
    let out = finish(child).await;
    assert_eq!(code(&out), 128 + 15, "{out:?}");
    assert!(!marker.exists());
    guard.release().await.unwrap();
}
