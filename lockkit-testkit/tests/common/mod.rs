//! Assertions shared by the tests of the server harnesses.

use std::fmt::Debug;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use lockkit_testkit::ServerError;
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

/// Asserts that a dropped server's process `pid` is gone, that nothing
/// listens on `addr` any more and that its directory `dir` was removed.
pub(crate) async fn assert_dropped(pid: u32, addr: SocketAddr, dir: &Path) {
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
