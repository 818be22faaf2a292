//! A Python client as the peer of an interop test.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// A Python program driven line by line: each command written to its stdin
/// is answered with one line on its stdout. Killed when dropped.
#[derive(Debug)]
pub struct PythonPeer {
    _child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl PythonPeer {
    /// Runs `python3 -c <script> <args…>`.
    ///
    /// # Panics
    ///
    /// Loudly, with the install command, when Python cannot import `module`.
    pub async fn start(module: &str, script: &str, args: &[&str]) -> PythonPeer {
        let check = std::process::Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .output();
        match check {
            Ok(out) if out.status.success() => {}
            _ => panic!(
                "this interop test needs Python's {module} client: run scripts/install-services.sh \
                 (or: python3 -m pip install {module})"
            ),
        }
        let mut child = tokio::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start python3");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        PythonPeer {
            _child: child,
            stdin,
            stdout,
        }
    }

    /// The peer side of [`assert_mutual_exclusion_with`]: `setup` is Python
    /// code that defines `lock` (with `acquire(blocking=False)` and
    /// `release()`, as redis-py's and kazoo's locks have); the command loop is
    /// appended.
    pub async fn start_lock_peer(module: &str, setup: &str, args: &[&str]) -> PythonPeer {
        Self::start(module, &format!("{setup}\n{LOCK_PEER_LOOP}"), args).await
    }

    /// Sends one command line and returns the peer's answer (within 15 s).
    ///
    /// # Panics
    ///
    /// When the peer does not answer in time or has exited.
    pub async fn ask(&mut self, command: &str) -> String {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("write to the Python peer");
        tokio::time::timeout(Duration::from_secs(15), self.stdout.next_line())
            .await
            .expect("the Python peer answers")
            .expect("read from the Python peer")
            .expect("the Python peer is alive")
    }
}

/// The command loop of a lock peer: `try` and `release` on the `lock` the
/// setup code defined.
const LOCK_PEER_LOOP: &str = r#"
import sys as _sys
for _line in _sys.stdin:
    _command = _line.strip()
    if _command == "try":
        print("acquired" if lock.acquire(blocking=False) else "busy", flush=True)
    elif _command == "release":
        lock.release()
        print("released", flush=True)
"#;

/// The interop protocol, against a peer (see [`PythonPeer::start_lock_peer`]) that answers `try` with `acquired` or
/// `busy` and `release` with `released` for the same lock as `name`: the
/// peer's lock excludes lockkit, lockkit's excludes the peer, and neither
/// releases the other's.
pub async fn assert_mutual_exclusion_with(
    peer: &mut PythonPeer,
    locks: &dyn lockkit_core::DistributedLock,
    name: &str,
) {
    let opts = lockkit_core::LockOptions::new().ttl(Duration::from_secs(30));
    assert_eq!(peer.ask("try").await, "acquired");
    let probe = locks.try_acquire(name, &opts).await.expect("try_acquire");
    assert!(probe.is_none(), "the peer's lock must exclude lockkit");
    assert_eq!(peer.ask("release").await, "released");

    let guard = locks
        .try_acquire(name, &opts)
        .await
        .expect("try_acquire")
        .expect("free once the peer released");
    assert_eq!(
        peer.ask("try").await,
        "busy",
        "lockkit's lock must exclude the peer"
    );
    guard.release().await.expect("release");
    assert_eq!(peer.ask("try").await, "acquired");
    assert_eq!(peer.ask("release").await, "released");
}
