//! What the command-line tests share: the `lockkit` binary run as a user
//! runs it, and what its runs answer.
#![allow(dead_code, reason = "each test file uses some of these")]

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use lockkit::{DistributedLock, LockGuard, LockOptions};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// Longest any single `lockkit` run in these tests may take.
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// The binary, with no lockkit variables inherited from the test's
/// environment.
pub(crate) fn lockkit(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockkit"));
    command
        .current_dir(dir)
        .env_remove("LOCKKIT_URL")
        .env_remove("LOCKKIT_LOG")
        .env_remove("LOCKKIT_LOCK_NAME")
        .env_remove("LOCKKIT_FENCING_TOKEN")
        .env_remove("LOCKKIT_TERM")
        .env_remove("LOCKKIT_LEADER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

pub(crate) async fn finish(child: Child) -> Output {
    tokio::time::timeout(RUN_LIMIT, child.wait_with_output())
        .await
        .expect("lockkit ran too long")
        .expect("lockkit's output")
}

pub(crate) async fn run(dir: &Path, args: &[&str]) -> Output {
    finish(lockkit(dir).args(args).spawn().expect("start lockkit")).await
}

pub(crate) fn code(output: &Output) -> i32 {
    output
        .status
        .code()
        .unwrap_or_else(|| panic!("killed: {output:?}"))
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub(crate) fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("locks.db").display())
}

/// Waits until `path` exists (the command has started).
pub(crate) async fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn pid(child: &Child) -> Pid {
    Pid::from_raw(child.id().expect("running") as i32)
}

/// A lock held by the test on a SQLite file in a fresh directory, and the
/// path that a command touches if it runs.
pub(crate) struct Held {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) url: String,
    pub(crate) guard: LockGuard,
    pub(crate) marker: std::path::PathBuf,
}

/// Holds `name` on a fresh SQLite file.
pub(crate) async fn held_on_sqlite(name: &str) -> Held {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let locks = lockkit::connect(&url).await.unwrap();
    let guard = locks.acquire(name, &LockOptions::new()).await.unwrap();
    let marker = dir.path().join("ran");
    Held {
        dir,
        url,
        guard,
        marker,
    }
}
