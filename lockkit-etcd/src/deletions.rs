//! The deletions a client's waiters wait for, told by one watch per client.
//!
//! etcd counts a new watch among its "synced" watchers (told of every write
//! as it commits) only if no write lands between the server reading the
//! current revision for it and registering it. A watch that loses that race
//! is served by a catch-up loop that runs every 100 ms. Under contention the
//! race is lost often: with a watch per waiter, a few handoffs in a hundred
//! waited up to 100 ms for their event (the server's
//! `etcd_debugging_mvcc_slow_watcher_total` counted them).
//!
//! So a client keeps one watch of every deletion under its prefix: the
//! first waiter starts it, it stays while waiters come (and for [`LINGER`]
//! after the last one), and each deletion is handed to the waiters of its
//! lock's directory: they keep count of the keys ahead of them, so a
//! deletion costs no request from a waiter it does not let through, and
//! none from the one it does (see [`crate::lock`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions, WatchResponse, WatchStream};
use lockkit_core::{LockError, Result};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::error::{BACKEND, Resend, map_error, resend};

/// How long the watch outlives its last waiter: at least this, at most
/// twice this.
pub(crate) const LINGER: Duration = Duration::from_secs(30);

/// What watching deletions is called in errors.
const WATCH: &str = "watch the previous contender";

/// The shared watch of one client, and who waits for what.
#[derive(Debug)]
pub(crate) struct Deletions {
    shared: Arc<Mutex<Shared>>,
    /// Dropped with the client: the watch's task then ends.
    alive: watch::Sender<()>,
}

#[derive(Debug, Default)]
struct Shared {
    next_id: u64,
    waits: HashMap<u64, Wait>,
    /// The phase of the running watch; `None` when no task runs.
    phase: Option<watch::Receiver<Phase>>,
}

/// One registered wait: the deletions of every key under `dir`.
#[derive(Debug)]
struct Wait {
    dir: Vec<u8>,
    signal: Arc<Signal>,
}

/// How a wait is woken: deletions seen, or the watch failed.
#[derive(Debug, Default)]
struct Signal {
    notify: Notify,
    state: Mutex<Woken>,
}

#[derive(Debug, Default)]
struct Woken {
    /// The keys deleted since the waiter last looked, each with the
    /// revision of its deletion, in revision order.
    deleted: Vec<(Vec<u8>, i64)>,
    failed: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    Starting,
    Ready,
    Failed(String),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Signal {
    fn wake(&self, change: impl FnOnce(&mut Woken)) {
        change(&mut lock(&self.state));
        self.notify.notify_one();
    }
}

impl Default for Deletions {
    fn default() -> Self {
        Deletions {
            shared: Arc::default(),
            alive: watch::channel(()).0,
        }
    }
}

impl Deletions {
    /// Registers a wait for the deletions of the keys under `dir`, starting
    /// the client's watch of `watched` (a prefix that covers `dir`) if none
    /// runs, and returns once that watch is in place (bounded by `limit`).
    /// Every deletion committed after this returned is told; one before it
    /// may or may not be: read the keys afterwards.
    pub(crate) async fn register(
        &self,
        client: &Arc<Client>,
        watched: &str,
        dir: &[u8],
        limit: Duration,
    ) -> Result<Deletes> {
        let signal = Arc::new(Signal::default());
        let (id, mut phase) = {
            let mut shared = lock(&self.shared);
            let running = shared
                .phase
                .as_ref()
                .filter(|phase| !matches!(*phase.borrow(), Phase::Failed(_)))
                .cloned();
            let phase = match running {
                Some(phase) => phase,
                None => {
                    let (tx, rx) = watch::channel(Phase::Starting);
                    tokio::spawn(run(
                        client.clone(),
                        watched.to_owned(),
                        limit,
                        self.shared.clone(),
                        tx,
                        self.alive.subscribe(),
                    ));
                    shared.phase = Some(rx.clone());
                    rx
                }
            };
            shared.next_id += 1;
            let id = shared.next_id;
            let wait = Wait {
                dir: dir.to_vec(),
                signal: signal.clone(),
            };
            shared.waits.insert(id, wait);
            (id, phase)
        };
        let deletes = Deletes {
            shared: self.shared.clone(),
            id,
            signal,
        };
        let ready = tokio::time::timeout(limit, phase.wait_for(|p| *p != Phase::Starting)).await;
        match ready {
            Ok(Ok(phase)) => match &*phase {
                Phase::Failed(message) => Err(LockError::unavailable(BACKEND, message.clone())),
                _ => Ok(deletes),
            },
            Ok(Err(_)) => Err(LockError::unavailable(
                BACKEND,
                format!("{WATCH}: the watch ended"),
            )),
            Err(_) => Err(LockError::unavailable(
                BACKEND,
                format!("{WATCH}: no answer within {limit:?}"),
            )),
        }
    }
}

/// A registered wait; dropping it unregisters it.
#[derive(Debug)]
pub(crate) struct Deletes {
    shared: Arc<Mutex<Shared>>,
    id: u64,
    signal: Arc<Signal>,
}

impl Deletes {
    /// Waits for deletions under the registered directory: the keys
    /// deleted since the last call (at least one), each with the revision
    /// of its deletion, or `None` once `deadline` passed. A watch that
    /// ends, is cancelled or fails is `Unavailable`.
    ///
    /// A deletion may be told after the key was created again under the
    /// same name (a lease kept for another holding gives the same key):
    /// it concerns a key only if its revision is above the key's create
    /// revision.
    pub(crate) async fn next(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Option<Vec<(Vec<u8>, i64)>>> {
        loop {
            {
                let mut woken = lock(&self.signal.state);
                if let Some(message) = &woken.failed {
                    return Err(LockError::unavailable(BACKEND, message.clone()));
                }
                if !woken.deleted.is_empty() {
                    return Ok(Some(std::mem::take(&mut woken.deleted)));
                }
            }
            let notified = self.signal.notify.notified();
            match deadline {
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, notified).await.is_err() {
                        return Ok(None);
                    }
                }
                None => notified.await,
            }
        }
    }
}

impl Drop for Deletes {
    fn drop(&mut self) {
        lock(&self.shared).waits.remove(&self.id);
    }
}

/// The watch's task: opens the watch of `watched`, then wakes the waits
/// its deletions concern, until it fails (every wait is told), the client
/// is dropped, or nobody has waited for [`LINGER`].
async fn run(
    client: Arc<Client>,
    watched: String,
    limit: Duration,
    shared: Arc<Mutex<Shared>>,
    phase: watch::Sender<Phase>,
    mut alive: watch::Receiver<()>,
) {
    let mut stream = match tokio::time::timeout(limit, open(&client, &watched)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(message)) => return fail(&shared, &phase, message),
        Err(_) => {
            return fail(
                &shared,
                &phase,
                format!("{WATCH}: no answer within {limit:?}"),
            );
        }
    };
    tracing::debug!(prefix = %watched, "watching deletions");
    phase.send_replace(Phase::Ready);
    let mut idle = tokio::time::interval(LINGER);
    idle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    idle.tick().await;
    let mut was_idle = false;
    loop {
        tokio::select! {
            _ = alive.changed() => return fail(&shared, &phase, format!("{WATCH}: the client was dropped")),
            message = stream.message() => match message {
                Ok(Some(message)) if message.canceled() => {
                    let reason = message.cancel_reason().to_owned();
                    return fail(&shared, &phase, format!("{WATCH}: cancelled: {reason}"));
                }
                Ok(Some(message)) => wake(&shared, &message),
                Ok(None) => return fail(&shared, &phase, format!("{WATCH}: the watch ended")),
                Err(error) => return fail(&shared, &phase, map_error(WATCH, error).to_string()),
            },
            _ = idle.tick() => {
                let mut shared = lock(&shared);
                let idle_now = shared.waits.is_empty();
                if idle_now && was_idle {
                    shared.phase = None;
                    tracing::debug!(prefix = %watched, "no waiter for a while; the deletions watch ends");
                    return;
                }
                was_idle = idle_now;
            }
        }
    }
}

/// Opens the watch of every deletion under `watched`, in place when this
/// returns. It starts at the current revision.
async fn open(client: &Client, watched: &str) -> std::result::Result<WatchStream, String> {
    let options = WatchOptions::new()
        .with_prefix()
        .with_filters([WatchFilterType::NoPut]);
    // A watch sent to a member that cannot be reached, or whose connection
    // breaks, is sent again (the caller bounds the wait).
    let mut stream = resend(WATCH, None, Resend::Repeatable, || {
        let mut watcher = client.watch_client();
        let options = options.clone();
        async move { watcher.watch(watched, Some(options)).await }
    })
    .await
    .map_err(|error| map_error(WATCH, error).to_string())?;
    loop {
        match stream.message().await {
            Ok(Some(message)) if message.created() => return Ok(stream),
            Ok(Some(_)) => {}
            Ok(None) => return Err(format!("{WATCH}: the watch ended")),
            Err(error) => return Err(map_error(WATCH, error).to_string()),
        }
    }
}

/// Hands each deletion of `message` to the waits of its directory.
fn wake(shared: &Mutex<Shared>, message: &WatchResponse) {
    let shared = lock(shared);
    for event in message.events() {
        if event.event_type() != EventType::Delete {
            continue;
        }
        let Some(kv) = event.kv() else {
            continue;
        };
        let (deleted, revision) = (kv.key(), kv.mod_revision());
        for wait in shared.waits.values() {
            if deleted.starts_with(&wait.dir) {
                wait.signal
                    .wake(|w| w.deleted.push((deleted.to_vec(), revision)));
            }
        }
    }
}

/// Tells every wait that the watch failed, and lets the next wait start a
/// new one.
fn fail(shared: &Mutex<Shared>, phase: &watch::Sender<Phase>, message: String) {
    tracing::debug!(%message, "the deletions watch failed");
    let mut shared = lock(shared);
    phase.send_replace(Phase::Failed(message.clone()));
    for wait in shared.waits.values() {
        wait.signal.wake(|w| w.failed = Some(message.clone()));
    }
    shared.waits.clear();
}
