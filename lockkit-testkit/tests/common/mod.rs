//! Assertions shared by the tests of the server harnesses.
#![allow(dead_code, reason = "each test file uses some of these")]

use std::fmt::Debug;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lockkit_testkit::{ServerError, TestServer};
use tokio::net::TcpStream;

/// Whether a process `pid` exists (a zombie counts).
pub(crate) fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Polls `condition` every 10 ms until it holds or `timeout` passes.
async fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    loop {
        if condition() {
            return true;
        }
        if started.elapsed() > timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Asserts that a start failed because something is not installed, with a
/// message that names `missing` and says how to install it.
pub(crate) fn assert_not_installed<T: Debug>(result: Result<T, ServerError>, missing: &str) {
    let error = result.unwrap_err();
    assert!(
        matches!(error, ServerError::NotInstalled { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("scripts/install-services.sh"), "{message}");
    assert!(message.contains(missing), "{message}");
}

/// Asserts that `request` (made to a paused server, with a 2 s timeout)
/// fails with `TimedOut` after about 2 s.
pub(crate) async fn assert_times_out<T: Debug>(request: impl Future<Output = io::Result<T>>) {
    let started = Instant::now();
    let error = request.await.unwrap_err();
    let waited = started.elapsed();
    assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
    assert!(waited >= Duration::from_millis(1900), "{waited:?}");
    assert!(waited < Duration::from_secs(4), "{waited:?}");
}

/// What a running server occupies: its process, its address and its
/// directory.
pub(crate) struct Footprint {
    pub(crate) pid: u32,
    pub(crate) addr: SocketAddr,
    pub(crate) dir: PathBuf,
}

impl Footprint {
    pub(crate) fn of(server: &impl TestServer) -> Footprint {
        Footprint {
            pid: server.pid().expect("a running server has a pid"),
            addr: server.addr(),
            dir: server.dir().to_path_buf(),
        }
    }

    /// Asserts, once the server is dropped, that its process is gone, that
    /// nothing listens on its address any more and that its directory was
    /// removed.
    pub(crate) async fn assert_gone(&self) {
        let (pid, addr, dir) = (self.pid, self.addr, &self.dir);
        assert!(
            eventually(Duration::from_secs(2), || !process_exists(pid)).await,
            "server {pid} still exists after drop"
        );
        let signal = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None);
        assert!(signal.is_err(), "pid {pid} still accepts signals");
        let connect = TcpStream::connect(addr).await;
        assert!(
            connect.is_err(),
            "port {} still accepts connections",
            addr.port()
        );
        assert!(!dir.exists(), "temporary directory {dir:?} was not removed");
    }
}

/// Starts a server of type `S` and drops it: nothing of it is left.
pub(crate) async fn assert_drop_frees<S: TestServer>() {
    let server = S::start().await;
    let footprint = Footprint::of(&server);
    assert!(process_exists(footprint.pid));
    drop(server);
    footprint.assert_gone().await;
}

/// Asserts that a server refused to start because its process exited, with
/// `word` (the bad option) in the log tail the error carries.
pub(crate) fn assert_exited_over(error: ServerError, word: &str) {
    assert!(matches!(error, ServerError::Exited { .. }), "{error:?}");
    let tail = error.log_tail().unwrap();
    assert!(tail.contains(word), "{tail}");
}
