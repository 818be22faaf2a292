//! Apache Curator's `InterProcessSemaphoreV2` or `LeaderSelector` as a peer:
//! a small Java program
//! (`src/curator/CuratorPeer.java`), compiled at first use against Debian's
//! `libcurator-recipes-java`, and driven line by line.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::OnceCell;

use crate::ZkServer;

/// Curator's recipes; its manifest names the jars it needs (curator-framework,
/// curator-client, zookeeper, guava, slf4j).
const RECIPES_JAR: &str = "/usr/share/java/curator-recipes.jar";
const SOURCE: &str = include_str!("curator/CuratorPeer.java");
const FIX: &str = "run scripts/install-services.sh (it installs Debian's libcurator-recipes-java and default-jdk-headless)";

/// How long the peer may take to answer one command (a JVM's first
/// connection included).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// The compiled classes, shared by every peer of this process.
static CLASSES: OnceCell<(tempfile::TempDir, PathBuf)> = OnceCell::const_new();

async fn compiled() -> &'static Path {
    let (_, dir) = CLASSES
        .get_or_init(|| async {
            assert!(
                Path::new(RECIPES_JAR).exists(),
                "{RECIPES_JAR} is missing: {FIX}"
            );
            let dir = tempfile::tempdir().expect("a temporary directory");
            let source = dir.path().join("CuratorPeer.java");
            std::fs::write(&source, SOURCE).expect("write the Java source");
            let out = tokio::process::Command::new("javac")
                .args(["-cp", RECIPES_JAR, "-d"])
                .arg(dir.path())
                .arg(&source)
                .output()
                .await
                .unwrap_or_else(|e| panic!("javac could not be run ({e}): {FIX}"));
            assert!(
                out.status.success(),
                "javac failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let classes = dir.path().to_owned();
            (dir, classes)
        })
        .await;
    dir
}

/// A Curator client with an `InterProcessSemaphoreV2` or a `LeaderSelector`
/// on one path; killed when dropped.
#[derive(Debug)]
pub struct CuratorPeer {
    _child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl CuratorPeer {
    /// A Curator client of `server` with the semaphore at `path` of `permits`,
    /// connected and ready.
    ///
    /// # Panics
    ///
    /// Loudly, with the install command, when Curator or `javac` is missing.
    pub async fn semaphore(server: &ZkServer, path: &str, permits: u32) -> CuratorPeer {
        Self::start(server, path, &[&permits.to_string()]).await
    }

    /// A Curator client of `server` with a `LeaderSelector` at `path` whose
    /// participant id is `id` (not campaigning until `run`), connected and
    /// ready. Commands: `run`, `leading`, `leader`, `participants`, `resign`.
    ///
    /// # Panics
    ///
    /// As [`semaphore`](Self::semaphore).
    pub async fn leader_selector(server: &ZkServer, path: &str, id: &str) -> CuratorPeer {
        Self::start(server, path, &["leader", id]).await
    }

    async fn start(server: &ZkServer, path: &str, args: &[&str]) -> CuratorPeer {
        let classes = compiled().await;
        let mut child = tokio::process::Command::new("java")
            .arg("-cp")
            .arg(format!("{}:{RECIPES_JAR}", classes.display()))
            .arg("CuratorPeer")
            .arg(server.connect_string())
            .arg(path)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("java could not be run ({e}): {FIX}"));
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let mut peer = CuratorPeer {
            _child: child,
            stdin,
            stdout,
        };
        assert_eq!(peer.answer().await, "ready", "Curator did not connect");
        peer
    }

    async fn answer(&mut self) -> String {
        tokio::time::timeout(ANSWER_TIMEOUT, self.stdout.next_line())
            .await
            .expect("the Curator peer answers")
            .expect("read from the Curator peer")
            .expect("the Curator peer is alive")
    }

    /// Sends one command and returns the answer.
    pub async fn ask(&mut self, command: &str) -> String {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("write to the Curator peer");
        self.answer().await
    }

    /// One acquire + return of a lease, timed inside the JVM (the pipe to
    /// it is not counted).
    pub async fn cycle(&mut self) -> Duration {
        let answer = self.ask("cycle").await;
        let nanos: u64 = answer
            .parse()
            .unwrap_or_else(|_| panic!("Curator's cycle answered {answer:?}"));
        Duration::from_nanos(nanos)
    }
}
