//! Tests of the `PostgresServer` and `MariaDbServer` harnesses against the
//! real servers.

mod common;

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{Footprint, assert_exited_over, process_exists};
use lockkit_testkit::{FaultControl, TestServer};
use lockkit_testkit::{MariaDbServer, PostgresServer};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// Names the helper test and the file it writes to, when it runs as the
/// child of `*_dies_with_the_test_process`.
const CHILD_ENV: &str = "LOCKKIT_SQL_SERVERS_CHILD";

/// `/proc/PID/stat` of `pid` as (state, parent PID).
fn proc_stat(pid: u32) -> Option<(char, u32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((state, parent))
}

/// Whether `pid` is a live process (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| !matches!(state, 'Z' | 'X'))
}

/// Whether `pid` is stopped (SIGSTOP).
fn stopped(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| state == 'T')
}

/// Every process (zombies included) whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|&pid| proc_stat(pid).is_some_and(|(_, ppid)| ppid == parent))
        .collect()
}

/// The live processes whose working directory is `dir`.
fn processes_in(dir: &Path) -> Vec<u32> {
    let dir = fs::metadata(dir).unwrap();
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|&pid| {
            fs::metadata(format!("/proc/{pid}/cwd"))
                .is_ok_and(|cwd| cwd.dev() == dir.dev() && cwd.ino() == dir.ino())
        })
        .filter(|&pid| alive(pid))
        .collect()
}

/// Whether a System V shared memory segment created by `pid` exists.
fn shared_memory_of(pid: u32) -> bool {
    fs::read_to_string("/proc/sysvipc/shm")
        .unwrap()
        .lines()
        .skip(1)
        .any(|line| line.split_whitespace().nth(4) == Some(&pid.to_string()))
}

/// Polls `condition` every 10 ms until it holds or `timeout` passes.
async fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while !condition() {
        if started.elapsed() > timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// Asserts that `request` (to a paused server) fails with `TimedOut` after
/// the clients' 5 s.
async fn assert_times_out_after_5s(request: impl Future<Output = io::Result<String>>) {
    let started = Instant::now();
    let error = request.await.unwrap_err();
    let waited = started.elapsed();
    assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
    assert!(waited >= Duration::from_millis(4900), "{waited:?}");
    assert!(waited < Duration::from_secs(8), "{waited:?}");
}

/// A private templates directory that the `postgres` user can reach (its
/// parent is a fresh temporary directory, made traversable).
fn private_templates_dir() -> (tempfile::TempDir, PathBuf) {
    let parent = tempfile::tempdir().unwrap();
    fs::set_permissions(parent.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let templates = parent.path().join("templates");
    (parent, templates)
}

/// The entries of `dir`, by name.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// One long-lived `psql` connection, fed statements on stdin.
struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Session {
    async fn open(server: &PostgresServer) -> Self {
        let mut child = tokio::process::Command::new(server.bin_dir().join("psql"))
            .args([
                "-X",
                "-At",
                "-h",
                "127.0.0.1",
                "-p",
                &server.port().to_string(),
            ])
            .args(["-U", "postgres", "-d", "postgres"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            child,
            stdin,
            stdout,
        }
    }

    /// Runs one statement that returns one line.
    async fn query(&mut self, sql: &str) -> io::Result<String> {
        self.stdin.write_all(format!("{sql};\n").as_bytes()).await?;
        self.stdin.flush().await?;
        let line = tokio::time::timeout(Duration::from_secs(5), self.stdout.next_line())
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer"))??;
        line.ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "psql exited"))
    }

    /// The PID of this connection's backend.
    async fn backend_pid(&mut self) -> u32 {
        self.query("SELECT pg_backend_pid()")
            .await
            .unwrap()
            .parse()
            .unwrap()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

// ---------------------------------------------------------------------------
// PostgreSQL
// ---------------------------------------------------------------------------

#[tokio::test]
async fn postgres_starts_and_answers_queries() {
    let server = PostgresServer::start().await;
    let port = server.port();
    assert_eq!(server.psql("SELECT 1").await.unwrap(), "1");
    assert_eq!(server.psql("SHOW port").await.unwrap(), port.to_string());
    assert_eq!(
        server
            .psql("SELECT current_user, current_database()")
            .await
            .unwrap(),
        "postgres|postgres"
    );
    assert_eq!(server.psql("SHOW fsync").await.unwrap(), "off");
    assert_eq!(server.psql("SHOW max_connections").await.unwrap(), "200");
    assert_eq!(
        server.url(),
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    );
    assert_eq!(server.addr().to_string(), format!("127.0.0.1:{port}"));

    // The PID we hold is the postmaster's (setpriv execs it), running as
    // `postgres` when the tests run as root.
    let pid = server.pid().unwrap();
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(comm.trim(), "postgres");
    let lock_file = fs::read_to_string(server.data_dir().join("postmaster.pid")).unwrap();
    assert_eq!(lock_file.lines().next(), Some(pid.to_string().as_str()));
    let owner = fs::metadata(format!("/proc/{pid}")).unwrap().uid();
    let data_owner = fs::metadata(server.data_dir()).unwrap();
    assert_eq!(owner, data_owner.uid());
    assert_eq!(data_owner.mode() & 0o777, 0o700);
    if nix::unistd::Uid::effective().is_root() {
        assert_ne!(owner, 0, "PostgreSQL must not run as root");
    }
    assert!(server.log_tail(50).contains("ready to accept connections"));
    let debug = format!("{server:?}");
    assert!(debug.contains(&port.to_string()), "{debug}");

    let error = server
        .psql("SELECT * FROM no_such_table")
        .await
        .unwrap_err();
    assert!(error.to_string().contains("no_such_table"), "{error}");
}

#[tokio::test]
async fn postgres_pause_freezes_postmaster_and_backends_and_resume_recovers() {
    let server = PostgresServer::start().await;
    let pid = server.pid().unwrap();
    let mut session = Session::open(&server).await;
    let backend = session.backend_pid().await;
    assert_eq!(proc_stat(backend).map(|(_, ppid)| ppid), Some(pid));

    server.pause();
    assert!(stopped(pid));
    let children = children_of(pid);
    assert!(children.contains(&backend), "{children:?}");
    for child in &children {
        assert!(
            stopped(*child) || !alive(*child),
            "child {child} still runs"
        );
    }
    assert_times_out_after_5s(server.psql("SELECT 1")).await;
    assert_eq!(server.pid(), Some(pid));

    server.resume();
    assert!(!stopped(pid));
    assert!(!stopped(backend));
    assert_eq!(server.psql("SELECT 1").await.unwrap(), "1");
    assert_eq!(session.backend_pid().await, backend);
    // Resuming a running server changes nothing.
    server.resume();
    assert_eq!(server.psql("SELECT 2").await.unwrap(), "2");
}

#[tokio::test]
async fn postgres_kill_stops_everything_and_restart_keeps_data() {
    let server = PostgresServer::start().await;
    let port = server.port();
    server
        .psql("CREATE TABLE t (v text); INSERT INTO t VALUES ('durable')")
        .await
        .unwrap();
    let pid = server.pid().unwrap();
    let mut session = Session::open(&server).await;
    let backend = session.backend_pid().await;
    let children = children_of(pid);
    assert!(children.len() >= 4, "{children:?}");

    server.kill();
    server.kill(); // idempotent
    assert_eq!(server.pid(), None);
    assert!(!process_exists(pid), "the postmaster was not reaped");
    // kill returns once the children are dead (zombies at most, until init
    // reaps them), not merely signalled.
    for child in children.iter().chain([&backend]) {
        assert!(!alive(*child), "child {child} survived the kill");
    }
    assert!(children_of(pid).is_empty());
    let error = server.psql("SELECT 1").await.unwrap_err();
    assert_ne!(error.kind(), io::ErrorKind::TimedOut, "{error}");

    server.restart().await;
    assert_eq!(server.port(), port);
    let second = server.pid().unwrap();
    assert_ne!(second, pid);
    assert_eq!(server.psql("SELECT v FROM t").await.unwrap(), "durable");

    // A paused server can be killed too, and restart also works on a
    // running server.
    server.pause();
    server.kill();
    assert!(children_of(second).is_empty());
    server.restart().await;
    server.restart().await;
    assert_eq!(server.psql("SELECT count(*) FROM t").await.unwrap(), "1");
}

#[tokio::test]
async fn postgres_drop_leaves_no_process_and_no_shared_memory() {
    let server = PostgresServer::start().await;
    let footprint = Footprint::of(&server);
    let pid = footprint.pid;
    let mut session = Session::open(&server).await;
    let backend = session.backend_pid().await;
    let children = children_of(pid);
    assert!(children.contains(&backend), "{children:?}");
    assert!(shared_memory_of(pid));

    server.pause(); // dropping a paused server works too
    drop(server);
    footprint.assert_gone().await;
    for child in &children {
        assert!(!alive(*child), "child {child} survived the drop");
    }
    assert!(
        !shared_memory_of(pid),
        "the shared memory segment of {pid} was left behind"
    );
}

#[tokio::test]
async fn postgres_servers_start_concurrently_from_a_new_template() {
    let (_parent, templates) = private_templates_dir();
    let start = || {
        PostgresServer::builder()
            .templates_dir(&templates)
            .setting("lock_timeout", "7s")
            .start()
    };
    let (a, b, c) = tokio::join!(start(), start(), PostgresServer::start());
    let ports: HashSet<u16> = [&a, &b, &c].iter().map(|s| s.port()).collect();
    assert_eq!(ports.len(), 3);
    for server in [&a, &b, &c] {
        server.psql("CREATE TABLE mine (port int)").await.unwrap();
        let insert = format!("INSERT INTO mine VALUES ({})", server.port());
        server.psql(&insert).await.unwrap();
    }
    for server in [&a, &b] {
        assert_eq!(
            server.psql("SELECT port FROM mine").await.unwrap(),
            server.port().to_string()
        );
        assert_eq!(server.psql("SHOW lock_timeout").await.unwrap(), "7s");
    }
    // One finished template, no leftover build directory.
    let names = entries(&templates);
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].starts_with("postgres-"), "{names:?}");
}

#[tokio::test]
async fn postgres_bad_setting_reports_exit_with_log_tail() {
    let error = PostgresServer::builder()
        .setting("no_such_setting", "1")
        .try_start()
        .await
        .unwrap_err();
    assert_exited_over(error, "no_such_setting");
}

// ---------------------------------------------------------------------------
// MariaDB
// ---------------------------------------------------------------------------

#[tokio::test]
async fn mariadb_starts_and_answers_queries() {
    let server = MariaDbServer::start().await;
    let port = server.port();
    assert_eq!(server.sql("SELECT 1").await.unwrap(), "1");
    assert_eq!(
        server
            .sql("SELECT DATABASE(), CURRENT_USER()")
            .await
            .unwrap(),
        "lockkit\troot@127.0.0.1"
    );
    assert_eq!(server.sql("SELECT @@port").await.unwrap(), port.to_string());
    assert_eq!(server.sql("SELECT @@max_connections").await.unwrap(), "300");
    assert_eq!(server.sql("SELECT GET_LOCK('a', 0)").await.unwrap(), "1");
    assert_eq!(
        server.url(),
        format!("mysql://root@127.0.0.1:{port}/lockkit")
    );
    assert_eq!(server.addr().to_string(), format!("127.0.0.1:{port}"));
    let pid = server.pid().unwrap();
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(comm.trim(), "mariadbd");
    assert!(server.log_tail(50).contains("ready for connections"));
    let debug = format!("{server:?}");
    assert!(debug.contains(&port.to_string()), "{debug}");

    let error = server.sql("SELECT * FROM no_such_table").await.unwrap_err();
    assert!(error.to_string().contains("no_such_table"), "{error}");
}

#[tokio::test]
async fn mariadb_pause_makes_queries_time_out_and_resume_recovers() {
    let server = MariaDbServer::start().await;
    let pid = server.pid().unwrap();
    server.pause();
    assert!(stopped(pid));
    assert_times_out_after_5s(server.sql("SELECT 1")).await;
    assert_eq!(server.pid(), Some(pid));
    server.resume();
    assert_eq!(server.sql("SELECT 1").await.unwrap(), "1");
}

#[tokio::test]
async fn mariadb_kill_then_restart_keeps_data() {
    let server = MariaDbServer::start().await;
    let port = server.port();
    server
        .sql("CREATE TABLE t (v VARCHAR(20)) ENGINE=InnoDB; INSERT INTO t VALUES ('durable')")
        .await
        .unwrap();
    let pid = server.pid().unwrap();

    server.kill();
    server.kill(); // idempotent
    assert_eq!(server.pid(), None);
    assert!(!process_exists(pid));
    let error = server.sql("SELECT 1").await.unwrap_err();
    assert_ne!(error.kind(), io::ErrorKind::TimedOut, "{error}");

    server.restart().await;
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), Some(pid));
    assert_eq!(server.sql("SELECT v FROM t").await.unwrap(), "durable");

    server.pause();
    server.kill();
    server.restart().await;
    server.restart().await; // on a running server
    assert_eq!(server.sql("SELECT COUNT(*) FROM t").await.unwrap(), "1");
}

#[tokio::test]
async fn mariadb_drop_kills_the_process_and_frees_the_port() {
    let server = MariaDbServer::start().await;
    let footprint = Footprint::of(&server);
    server.pause();
    drop(server);
    footprint.assert_gone().await;
}

#[tokio::test]
async fn mariadb_servers_start_concurrently_from_a_new_template() {
    let (_parent, templates) = private_templates_dir();
    let start = || {
        MariaDbServer::builder()
            .templates_dir(&templates)
            .arg("--lock-wait-timeout=7")
            .start()
    };
    let (a, b, c) = tokio::join!(start(), start(), MariaDbServer::start());
    let ports: HashSet<u16> = [&a, &b, &c].iter().map(|s| s.port()).collect();
    assert_eq!(ports.len(), 3);
    for server in [&a, &b, &c] {
        let sql = format!(
            "CREATE TABLE mine (port INT); INSERT INTO mine VALUES ({})",
            server.port()
        );
        server.sql(&sql).await.unwrap();
    }
    for server in [&a, &b] {
        assert_eq!(
            server.sql("SELECT port FROM mine").await.unwrap(),
            server.port().to_string()
        );
        assert_eq!(server.sql("SELECT @@lock_wait_timeout").await.unwrap(), "7");
    }
    let names = entries(&templates);
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].starts_with("mariadb-"), "{names:?}");
}

#[tokio::test]
async fn mariadb_bad_option_reports_exit_with_log_tail() {
    let error = MariaDbServer::builder()
        .arg("--no-such-option")
        .try_start()
        .await
        .unwrap_err();
    assert_exited_over(error, "no-such-option");
}

// ---------------------------------------------------------------------------
// The test process dies while a server is paused
// ---------------------------------------------------------------------------

/// Not a test by itself: run by `*_dies_with_the_test_process` as a child
/// process (`$LOCKKIT_SQL_SERVERS_CHILD` = `postgres:FILE` or
/// `mariadb:FILE`). Starts a server, pauses it, writes what the parent
/// checks to FILE, and waits to be killed.
#[tokio::test]
#[ignore = "run by postgres/mariadb_*_dies_with_the_test_process in a child process"]
async fn child_holds_a_paused_server() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (kind, file) = spec.split_once(':').unwrap();
    let report = match kind {
        "postgres" => {
            let server = PostgresServer::start().await;
            let mut session = Session::open(&server).await;
            let backend = session.backend_pid().await;
            let pid = server.pid().unwrap();
            server.pause();
            let children: Vec<String> = children_of(pid).iter().map(u32::to_string).collect();
            let report = format!(
                "{}\n{pid}\n{backend} {}\n",
                server.dir().display(),
                children.join(" ")
            );
            // Never dropped: the process dies holding them.
            std::mem::forget(session);
            std::mem::forget(server);
            report
        }
        "mariadb" => {
            let server = MariaDbServer::start().await;
            server.pause();
            let report = format!("{}\n{}\n\n", server.dir().display(), server.pid().unwrap());
            std::mem::forget(server);
            report
        }
        other => panic!("unknown kind {other}"),
    };
    fs::write(format!("{file}.tmp"), report).unwrap();
    fs::rename(format!("{file}.tmp"), file).unwrap();
    std::future::pending::<()>().await;
}

/// What the child reported: the server's directory, its PID, other PIDs.
struct ChildReport {
    dir: PathBuf,
    pid: u32,
    others: Vec<u32>,
}

/// Runs `child_holds_a_paused_server` for `kind` in a child process, SIGKILLs
/// that process once its server is paused, and returns what it reported.
async fn kill_a_test_process_holding_a_paused(kind: &str) -> ChildReport {
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("report");
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_holds_a_paused_server", "--ignored"])
        .arg("--test-threads=1")
        .env(CHILD_ENV, format!("{kind}:{}", file.display()))
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let reported = eventually(Duration::from_secs(60), || file.exists()).await;
    assert!(reported, "the child did not report");
    child.kill().await.unwrap(); // SIGKILL: no destructor runs
    let report = fs::read_to_string(&file).unwrap();
    let mut lines = report.lines();
    let dir = PathBuf::from(lines.next().unwrap());
    let pid = lines.next().unwrap().parse().unwrap();
    let others = lines
        .next()
        .unwrap_or("")
        .split_whitespace()
        .map(|pid| pid.parse().unwrap())
        .collect();
    ChildReport { dir, pid, others }
}

#[tokio::test]
async fn postgres_paused_dies_with_the_test_process() {
    let report = kill_a_test_process_holding_a_paused("postgres").await;
    let data_dir = report.dir.join("data");
    assert!(!report.others.is_empty());
    let mut all: Vec<u32> = [report.pid].into_iter().chain(report.others).collect();
    all.sort_unstable();
    all.dedup();
    // The postmaster dies of its parent-death signal (set after setpriv's
    // switch to the user postgres); its stopped children only because the
    // watcher kills them.
    let gone = eventually(Duration::from_secs(5), || {
        all.iter().all(|&pid| !alive(pid))
    })
    .await;
    let survivors: Vec<u32> = all.iter().copied().filter(|&pid| alive(pid)).collect();
    let in_dir = processes_in(&data_dir);
    let segment_freed = eventually(Duration::from_secs(5), || !shared_memory_of(report.pid)).await;
    // Clean up before asserting.
    for &pid in survivors.iter().chain(&in_dir) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    fs::remove_dir_all(&report.dir).unwrap();
    assert!(gone, "processes {survivors:?} survived the test process");
    assert!(in_dir.is_empty(), "{in_dir:?} still run in {data_dir:?}");
    assert!(segment_freed, "the shared memory segment was left behind");
}

#[tokio::test]
async fn mariadb_paused_dies_with_the_test_process() {
    let report = kill_a_test_process_holding_a_paused("mariadb").await;
    let gone = eventually(Duration::from_secs(5), || !alive(report.pid)).await;
    if !gone {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(report.pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    fs::remove_dir_all(&report.dir).unwrap();
    assert!(gone, "mariadbd {} survived the test process", report.pid);
}
