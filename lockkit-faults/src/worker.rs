//! The worker: one client process of a scenario. It takes the lock again and
//! again, and inside each critical section writes to the fenced resource
//! with its fencing token, the way the crate docs teach: check the lease-lost
//! signal before each write, let the resource reject stale tokens. Every step
//! is reported to the resource, which stamps it.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lockkit::{DistributedLock, LockError, LockOptions};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::Instant;

/// Bound of one connect attempt to the backend.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound of a release.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);
/// Slack over the lock wait before an acquire counts as hung.
const ACQUIRE_SLACK: Duration = Duration::from_secs(10);
/// Bound of every exchange with the resource (on loopback, in the
/// orchestrating process: a missing answer means it is gone).
const RESOURCE_TIMEOUT: Duration = Duration::from_secs(10);

/// What one worker does.
#[derive(Clone, Debug)]
pub struct WorkerPlan {
    /// The backend's URL (possibly through this worker's proxies).
    pub url: String,
    /// The lock name.
    pub name: String,
    /// This worker's number.
    pub client: u32,
    /// The fenced resource.
    pub resource: SocketAddr,
    /// The lease length asked for.
    pub ttl: Duration,
    /// How long a critical section lasts, first write to last.
    pub hold: Duration,
    /// Writes per critical section (at least 2).
    pub writes: u32,
    /// How long one acquire waits.
    pub wait: Duration,
    /// When the worker stops on its own.
    pub deadline: Duration,
    /// Abandon a section on the lease-lost signal (checked before each
    /// write). Without it, the worker reports the signal but writes on, as a
    /// process does whose pause fell between its check and its write: what
    /// is left to stop it is the resource's fencing check.
    pub careful: bool,
    /// The lock delay asked for, if any.
    pub lock_delay: Option<Duration>,
}

/// The worker's link to the resource.
struct Link {
    /// Shared with the watcher of the current section's signals.
    write: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
    replies: Lines<BufReader<OwnedReadHalf>>,
}

/// Sends one line (whole, under the lock) to the resource.
async fn send_line(write: &tokio::sync::Mutex<OwnedWriteHalf>, line: String) -> io::Result<()> {
    let mut write = write.lock().await;
    bounded(write.write_all(format!("{line}\n").as_bytes())).await
}

impl Link {
    async fn send(&mut self, line: String) -> io::Result<()> {
        send_line(&self.write, line).await
    }

    /// A write to the resource; `true` if it was accepted.
    async fn write(&mut self, section: u32, token: Option<u64>, index: u32) -> io::Result<bool> {
        self.send(format!("write {section} {} {index}", token_text(token)))
            .await?;
        match bounded(self.replies.next_line()).await? {
            Some(reply) => Ok(reply == "ok"),
            None => Err(io::ErrorKind::UnexpectedEof.into()),
        }
    }
}

async fn bounded<T>(call: impl Future<Output = io::Result<T>>) -> io::Result<T> {
    tokio::time::timeout(RESOURCE_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()))
}

fn token_text(token: Option<u64>) -> String {
    token.map_or_else(|| "-".to_owned(), |token| token.to_string())
}

fn error_kind(error: &LockError) -> &'static str {
    match error {
        LockError::Timeout { .. } => "timeout",
        LockError::Unavailable { .. } => "unavailable",
        LockError::Lost { .. } => "lost",
        _ => "error",
    }
}

/// A client of `url`, each attempt bounded by [`CONNECT_TIMEOUT`] and
/// retried every 200 ms (servers may be paused or down); `None` once
/// `deadline` has passed.
pub(crate) async fn connect_until(
    url: &str,
    deadline: Instant,
) -> Option<Arc<dyn DistributedLock>> {
    loop {
        match tokio::time::timeout(CONNECT_TIMEOUT, lockkit::connect(url)).await {
            Ok(Ok(lock)) => return Some(lock),
            Ok(Err(e)) => tracing::warn!("connect: {e}"),
            Err(_) => tracing::warn!("connect: no answer within {CONNECT_TIMEOUT:?}"),
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reports the section's early warning (`risk`) and lost signal
/// (`signal`) as they come; aborted when the section ends.
async fn watch_signals(
    at_risk: impl Future<Output = ()>,
    lost: impl Future<Output = lockkit::LostReason>,
    write: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
    section: u32,
) {
    tokio::pin!(lost);
    let warned = tokio::select! {
        biased;
        _ = &mut lost => false,
        () = at_risk => true,
    };
    if warned {
        let _ = send_line(&write, format!("risk {section}")).await;
        lost.await;
    }
    let _ = send_line(&write, format!("signal {section}")).await;
}

/// Runs the worker until its deadline; an error means the resource is gone
/// (the orchestrator ended), which also ends the worker.
pub async fn run(plan: WorkerPlan) -> io::Result<()> {
    let stream = bounded(TcpStream::connect(plan.resource)).await?;
    stream.set_nodelay(true)?;
    let (read, write) = stream.into_split();
    let mut link = Link {
        write: Arc::new(tokio::sync::Mutex::new(write)),
        replies: BufReader::new(read).lines(),
    };
    link.send(format!("hello {}", plan.client)).await?;
    let deadline = Instant::now() + plan.deadline;
    let Some(lock) = connect_until(&plan.url, deadline).await else {
        return Ok(());
    };
    let mut options = LockOptions::new().ttl(plan.ttl).wait_for(plan.wait);
    if let Some(delay) = plan.lock_delay {
        options = options.lock_delay(delay);
    }
    let writes = plan.writes.max(2);
    let step = plan.hold / (writes - 1);
    let mut section = 0_u32;
    while Instant::now() < deadline {
        link.send(format!("attempt {section}")).await?;
        let acquired = tokio::time::timeout(
            plan.wait + ACQUIRE_SLACK,
            lock.acquire(&plan.name, &options),
        )
        .await;
        match acquired {
            Ok(Ok(guard)) => {
                let token = guard.fencing_token().map(|token| token.get());
                link.send(format!("acquired {section} {}", token_text(token)))
                    .await?;
                let mut watcher = tokio::spawn(watch_signals(
                    guard.at_risk(),
                    guard.lost(),
                    link.write.clone(),
                    section,
                ));
                let mut lost = false;
                for index in 0..writes {
                    if index > 0 {
                        tokio::time::sleep(step).await;
                    }
                    if !lost && guard.is_lost() {
                        lost = true;
                        link.send(format!("lost {section}")).await?;
                    }
                    if lost && plan.careful {
                        break;
                    }
                    link.write(section, token, index).await?;
                }
                if lost {
                    // The watchdog marks the loss the worker saw; the
                    // watcher reports it, then ends.
                    let _ = tokio::time::timeout(RELEASE_TIMEOUT, &mut watcher).await;
                    watcher.abort();
                    drop(guard);
                } else {
                    watcher.abort();
                    let released = tokio::time::timeout(RELEASE_TIMEOUT, guard.release()).await;
                    let ok = matches!(released, Ok(Ok(())));
                    if let Ok(Err(e)) = &released {
                        tracing::warn!("release: {e}");
                    }
                    link.send(format!(
                        "released {section} {}",
                        if ok { "ok" } else { "err" }
                    ))
                    .await?;
                }
            }
            Ok(Err(e)) => {
                tracing::warn!("acquire: {e}");
                link.send(format!("failed {section} {}", error_kind(&e)))
                    .await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(_) => {
                link.send(format!("failed {section} hung")).await?;
            }
        }
        section += 1;
        // Room for the others between two sections of this worker.
        let gap = plan.hold / 4 + Duration::from_millis(fastrand::u64(0..20));
        tokio::time::sleep(gap).await;
    }
    Ok(())
}
