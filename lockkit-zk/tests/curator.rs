//! Interop with Apache Curator itself (Debian's `libcurator-recipes-java`,
//! compiled against at test time with `javac`): Curator's
//! `InterProcessSemaphoreV2` and lockkit's semaphores share one semaphore.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use lockkit_core::{DistributedLock, LockOptions};
use lockkit_testkit::{TestServer, ZkServer};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::time::Instant;

const RECIPES_JAR: &str = "/usr/share/java/curator-recipes.jar";
const SOURCE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/curator/CuratorSemaphore.java"
);
const FIX: &str = "run scripts/install-services.sh (it installs Debian's libcurator-recipes-java and default-jdk-headless)";

/// `CuratorSemaphore.java` compiled into a directory of its own. The jar's
/// manifest names the jars it needs (curator-framework, zookeeper, ...).
async fn compile(dir: &Path) -> PathBuf {
    assert!(
        Path::new(RECIPES_JAR).exists(),
        "{RECIPES_JAR} is missing: {FIX}"
    );
    let out = Command::new("javac")
        .args(["-cp", RECIPES_JAR, "-d"])
        .arg(dir)
        .arg(SOURCE)
        .output()
        .await
        .unwrap_or_else(|e| panic!("javac could not be run ({e}): {FIX}"));
    assert!(
        out.status.success(),
        "javac failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir.to_owned()
}

fn curator(classes: &Path, server: &ZkServer, path: &str, permits: u32) -> Command {
    let mut command = Command::new("java");
    command
        .arg("-cp")
        .arg(format!("{}:{RECIPES_JAR}", classes.display()))
        // Curator's own logging (slf4j without a binding) stays quiet.
        .arg("CuratorSemaphore")
        .arg(server.connect_string())
        .arg(path)
        .arg(permits.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Curator's answer to a `try`: `acquired` or `busy`.
async fn curator_try(classes: &Path, server: &ZkServer, path: &str, permits: u32) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        curator(classes, server, path, permits).arg("try").output(),
    )
    .await
    .expect("Curator's try finished")
    .expect("java runs");
    assert!(
        out.status.success(),
        "Curator failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_is_shared_with_curator_interprocess_semaphore_v2() {
    let server = ZkServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let classes = compile(dir.path()).await;
    let url = format!("{}?session_timeout=5s", server.url_at("locks"));
    let locks = lockkit_zk::connect(&url).await.expect("connect");
    let path = format!("/locks/{}/transcoders", lockkit_zk::SEMAPHORES);
    let permit = LockOptions::new().ttl(Duration::from_secs(30)).semaphore(2);

    // lockkit holds both permits: Curator gets none.
    let one = locks.acquire("transcoders", &permit).await.unwrap();
    let two = locks.acquire("transcoders", &permit).await.unwrap();
    assert_eq!(curator_try(&classes, &server, &path, 2).await, "busy");
    two.release().await.unwrap();
    assert_eq!(curator_try(&classes, &server, &path, 2).await, "acquired");

    // Curator holds one permit for a while: lockkit gets only the other,
    // and the returned one once Curator lets it go.
    let mut holder = curator(&classes, &server, &path, 2)
        .args(["hold", "1500"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("java runs");
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("Curator answered")
        .unwrap();
    // lockkit's `one` is held, so Curator's lease is the second.
    assert_eq!(first.as_deref(), Some("acquired"));
    let status = locks.status_of("transcoders", permit.kind()).await.unwrap();
    assert_eq!(status.holders, Some(2), "{status:?}");
    assert!(
        locks
            .try_acquire("transcoders", &permit)
            .await
            .unwrap()
            .is_none(),
        "a third holder beside lockkit's and Curator's"
    );
    let started = Instant::now();
    let after = locks
        .acquire(
            "transcoders",
            &permit.clone().wait_for(Duration::from_secs(10)),
        )
        .await
        .expect("Curator's returned lease is lockkit's to take");
    assert!(started.elapsed() >= Duration::from_millis(500));
    let done = holder.wait().await.unwrap();
    assert!(done.success());
    after.release().await.unwrap();
    one.release().await.unwrap();
}
