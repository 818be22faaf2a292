//! Interop with etcd's own client, Debian's `etcdctl` (etcd-client 3.4):
//! `etcdctl lock` and lockkit exclude each other on the same name, and
//! `etcdctl elect` and lockkit's `Election` see each other's leader. Also the
//! key layout and the fencing token, read back with `etcdctl`.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{DistributedLock, Election, LockOptions};
use lockkit_testkit::{EtcdServer, TestServer};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

fn opts() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(10))
}

async fn connect(server: &EtcdServer) -> Arc<dyn DistributedLock> {
    Arc::new(
        lockkit_etcd::connect(&format!("{}/locks", server.url()))
            .await
            .expect("connect"),
    )
}

/// `etcdctl --endpoints <server> ARGS…` as a child process whose stdout is
/// read line by line; killed when dropped.
fn etcdctl(server: &EtcdServer, args: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new(EtcdServer::etcdctl_binary().expect("etcdctl is installed"))
        .env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(server.endpoint())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("run etcdctl");
    let lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    (child, lines)
}

/// The next line that satisfies `wanted`, within `limit`; `None` if none came.
async fn line_where(
    lines: &mut Lines<BufReader<ChildStdout>>,
    limit: Duration,
    wanted: impl Fn(&str) -> bool,
) -> Option<String> {
    tokio::time::timeout(limit, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if wanted(&line) {
                return Some(line);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
}

/// The key is `<prefix>/<name>/<lease id in hex>`, its value the holder
/// identity, and the fencing token its create revision.
#[tokio::test]
async fn keys_are_in_etcds_own_layout() {
    let server = EtcdServer::start().await;
    let locks = connect(&server).await;
    let guard = locks
        .acquire("layout", &opts().holder("host-a:7"))
        .await
        .unwrap();
    let listed = server
        .etcdctl(&["get", "/locks/layout/", "--prefix", "-w", "fields"])
        .await
        .unwrap();
    let field = |name: &str| {
        listed
            .lines()
            .find_map(|l| l.strip_prefix(&format!("\"{name}\" : ")))
            .unwrap_or_else(|| panic!("no {name} in {listed}"))
            .trim_matches('"')
            .to_owned()
    };
    let key = field("Key");
    let lease: i64 = field("Lease").parse().unwrap();
    assert_eq!(key, format!("/locks/layout/{lease:x}"));
    assert_eq!(field("Value"), "host-a:7");
    let revision: u64 = field("CreateRevision").parse().unwrap();
    assert_eq!(guard.fencing_token().unwrap().get(), revision);
    guard.release().await.unwrap();
    let left = server
        .etcdctl(&["get", "/locks/layout/", "--prefix", "--keys-only"])
        .await
        .unwrap();
    assert!(left.trim().is_empty(), "{left}");
}

/// `etcdctl lock` holding the name shuts lockkit out until its command
/// ends; lockkit holding it keeps `etcdctl lock` waiting until the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_and_lockkit_exclude_each_other() {
    let server = EtcdServer::start().await;
    let locks = connect(&server).await;

    let (_ctl, mut out) = etcdctl(
        &server,
        &[
            "lock",
            "/locks/shared-name",
            "--",
            "sh",
            "-c",
            "echo held; sleep 2",
        ],
    );
    line_where(&mut out, Duration::from_secs(10), |l| l == "held")
        .await
        .expect("etcdctl takes the lock");
    assert!(
        locks
            .try_acquire("shared-name", &opts())
            .await
            .unwrap()
            .is_none(),
        "lockkit got the lock etcdctl holds"
    );
    let guard = locks
        .acquire("shared-name", &opts().wait_for(Duration::from_secs(15)))
        .await
        .expect("lockkit gets it once etcdctl's command ended");

    let (_ctl, mut out) = etcdctl(&server, &["lock", "/locks/shared-name", "echo", "got it"]);
    assert_eq!(
        line_where(&mut out, Duration::from_secs(2), |l| l == "got it").await,
        None,
        "etcdctl got the lock lockkit holds"
    );
    guard.release().await.unwrap();
    line_where(&mut out, Duration::from_secs(10), |l| l == "got it")
        .await
        .expect("etcdctl gets it after lockkit's release");
}

/// `etcdctl elect --listen` shows lockkit's leader; lockkit's `leader()`
/// shows the proposal of the leader `etcdctl elect` made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_interoperate_with_etcdctl_elect() {
    let server = EtcdServer::start().await;
    let locks = connect(&server).await;

    let election = Election::new(locks.clone(), "scheduler", "lockkit-a");
    let leadership = election.campaign(&opts()).await.unwrap();
    let (_listener, mut out) = etcdctl(&server, &["elect", "--listen", "/locks/scheduler"]);
    line_where(&mut out, Duration::from_secs(10), |l| l == "lockkit-a")
        .await
        .expect("etcdctl elect --listen shows lockkit's leader");
    leadership.resign().await.unwrap();

    let (_candidate, mut out) = etcdctl(&server, &["elect", "/locks/reports", "etcd-b"]);
    line_where(&mut out, Duration::from_secs(10), |l| l == "etcd-b")
        .await
        .expect("etcdctl elect becomes leader");
    let election = Election::new(locks.clone(), "reports", "lockkit-c");
    assert_eq!(election.leader().await.unwrap().as_deref(), Some("etcd-b"));
    assert!(
        locks
            .try_acquire("reports", &opts())
            .await
            .unwrap()
            .is_none(),
        "lockkit took the name etcdctl leads"
    );
}

/// A waiter whose key an operator deleted while it waited is told so when
/// its turn comes (a missing key is no place in the queue), instead of
/// holding without a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_key_was_deleted_is_refused() {
    let server = EtcdServer::start().await;
    let (holder, waiter) = (connect(&server).await, connect(&server).await);
    let held = holder.acquire("queue", &opts()).await.unwrap();
    let waiting = tokio::spawn(async move {
        waiter
            .acquire("queue", &opts().wait_for(Duration::from_secs(20)))
            .await
    });
    let keys = || async {
        server
            .etcdctl(&[
                "get",
                "/locks/queue/",
                "--prefix",
                "--keys-only",
                "--sort-by=CREATE",
            ])
            .await
            .unwrap()
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let queued = lockkit_testkit::eventually(Duration::from_secs(10), || async {
        keys().await.len() == 2
    })
    .await;
    assert!(queued, "the waiter did not queue");
    let waiters_key = keys().await.pop().unwrap();
    server.etcdctl(&["del", &waiters_key]).await.unwrap();
    held.release().await.unwrap();
    let refused = waiting.await.unwrap();
    assert!(
        matches!(refused, Err(lockkit_core::LockError::Unavailable { .. })),
        "{refused:?}"
    );
    assert!(keys().await.is_empty(), "a key was left behind");
}
