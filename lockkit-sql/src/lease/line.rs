//! A client's places in the lines of waiting clients, where `lease` mode
//! keeps them (PostgreSQL, SQLite): a place per name the client waits for,
//! taken when one of its waiters starts to wait, renewed while any waits,
//! and left when the last of them stops.
//!
//! A release that finds other clients in a name's line does not free the
//! row for anyone: the dialect leaves it to those clients for a moment (see
//! each dialect's `release` statements), so that a holder that releases
//! and asks again at once does not take the lock straight back from them.
//! The places themselves are rows of the lock table; [`Places`] writes
//! them, and the [`Line`]'s keeper task orders the writes.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockkit_core::backend::{NotifyHub, ReleaseWatch};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use crate::settings::Settings;
use crate::statement::{Runs, Value};

/// How long a client's place in a line lasts unless renewed: the keeper
/// renews its places every third of it.
pub(crate) const PLACE_TTL: Duration = Duration::from_secs(10);

/// The statements of a client's places, as a dialect writes them: each
/// binds the name of the lock (not `leave_all`), then the client, then
/// (`enqueue`) the place's lease in milliseconds. The places of a line that
/// ran out (clients that stopped without leaving) are swept in passing, as
/// the dialect's statements take or leave a place there.
#[derive(Clone, Debug)]
pub(crate) struct PlaceSql {
    /// Takes a place at the back of the line of the name, or keeps the one
    /// the client has for [`PLACE_TTL`] more.
    pub(crate) enqueue: Arc<str>,
    /// Leaves the line of the name.
    pub(crate) dequeue: Arc<str>,
    /// Leaves every line (the client is dropped).
    pub(crate) leave_lines: Arc<str>,
}

/// A client's places: its statements, run on a pool, each bounded by the
/// command timeout.
#[derive(Debug)]
pub(crate) struct Places<DB: sqlx::Database> {
    pub(crate) pool: sqlx::Pool<DB>,
    pub(crate) sql: PlaceSql,
    /// This client, as the lines name it.
    pub(crate) client: String,
    pub(crate) settings: Settings,
}

impl<DB: Runs> Places<DB> {
    async fn join(&self, name: &str) -> bool {
        let ttl = Value::Int(PLACE_TTL.as_millis() as i64);
        let values = [Value::Text(name), Value::Text(&self.client), ttl];
        self.run("take a place in line", &self.sql.enqueue, &values)
            .await
    }

    async fn leave(&self, name: &str) -> bool {
        let values = [Value::Text(name), Value::Text(&self.client)];
        self.run("leave a line", &self.sql.dequeue, &values).await
    }

    async fn leave_all(&self) -> bool {
        let values = [Value::Text(&self.client)];
        self.run("leave its lines", &self.sql.leave_lines, &values)
            .await
    }

    /// Runs `sql` with `values` on a connection of the pool, bounded by
    /// the command timeout; whether it ran. A failure is logged: the
    /// client's waiters then wait without a place, backing off where they
    /// would otherwise sleep until their turn.
    async fn run(&self, what: &str, sql: &Arc<str>, values: &[Value<'_>]) -> bool {
        let statement = async {
            let mut conn = self.pool.acquire().await?;
            DB::changed(&mut conn, (sql, values)).await
        };
        match self.settings.bounded(what, statement).await {
            Ok(_) => true,
            Err(error) => {
                tracing::debug!(%error, "could not {what}; the waiters wait without a place");
                false
            }
        }
    }
}

/// What the keeper does, one after the other, so that a place left and
/// taken again in quick succession is left before it is taken.
#[derive(Debug)]
enum Request {
    /// Take a place in the line of the name; answer whether it was taken.
    Join(String, oneshot::Sender<bool>),
    /// The last waiter of the name stopped: leave its line, unless one
    /// waits again by now.
    Leave(String),
}

/// A client's places, and the keeper task that takes, renews and leaves
/// them (started on first use).
pub(crate) struct Line<DB: Runs> {
    places: Arc<Places<DB>>,
    /// One topic per name the client waits for: the last watch of a name
    /// dropped leaves its line.
    hub: NotifyHub,
    requests: mpsc::UnboundedSender<Request>,
    /// The requests for the keeper, until it starts.
    pending: Mutex<Option<mpsc::UnboundedReceiver<Request>>>,
    keeper: Mutex<Option<AbortHandle>>,
    /// Whether the waiters of a name are woken as the keeper renews its
    /// place: where they sleep until their turn (see
    /// [`ReleaseWatch::telling_turns`]), this bounds how long they sleep
    /// through a free lock should a client ahead have stopped without
    /// leaving the line.
    wake_on_renew: bool,
}

impl<DB: Runs> std::fmt::Debug for Line<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Line")
            .field("names", &self.hub.len())
            .finish_non_exhaustive()
    }
}

impl<DB: Runs> Line<DB> {
    pub(crate) fn new(places: Places<DB>, wake_on_renew: bool) -> Self {
        let (requests, pending) = mpsc::unbounded_channel();
        let idle = requests.clone();
        Line {
            places: Arc::new(places),
            hub: NotifyHub::with_idle_hook(move |name| {
                let _ = idle.send(Request::Leave(name.to_owned()));
            }),
            requests,
            pending: Mutex::new(Some(pending)),
            keeper: Mutex::new(None),
            wake_on_renew,
        }
    }

    /// The statements that write the places.
    pub(crate) fn places(&self) -> &Places<DB> {
        &self.places
    }

    /// The hub whose topics are the names the client waits for (Postgres'
    /// notifications wake its waiters through it).
    #[cfg(feature = "postgres")]
    pub(crate) fn hub(&self) -> &NotifyHub {
        &self.hub
    }

    /// A watch on `name` that keeps the client in its line while it lives,
    /// and whether the place was taken (or kept) by the time this returns.
    pub(crate) async fn join(&self, name: &str) -> (ReleaseWatch, bool) {
        self.start();
        let (watch, _) = self.hub.watch(name);
        let (done, joined) = oneshot::channel();
        let _ = self.requests.send(Request::Join(name.to_owned(), done));
        (watch, joined.await.unwrap_or(false))
    }

    fn start(&self) {
        let mut keeper = self.keeper.lock().unwrap_or_else(|p| p.into_inner());
        if keeper.is_none() {
            let pending = self
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            let task = tokio::spawn(keep(
                self.places.clone(),
                self.hub.clone(),
                pending,
                self.wake_on_renew,
            ));
            *keeper = Some(task.abort_handle());
        }
    }
}

impl<DB: Runs> Drop for Line<DB> {
    fn drop(&mut self) {
        let keeper = self.keeper.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(task) = keeper.take() {
            task.abort();
            // Leave every line now rather than when the places run out.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let places = self.places.clone();
                runtime.spawn(async move { places.leave_all().await });
            }
        }
    }
}

/// The keeper: takes and leaves places as asked, one request after the
/// other, and every third of [`PLACE_TTL`] renews this client's places
/// (taking again those that went: a reservation may end the place it
/// serves, and another waiter of the client may wait on).
async fn keep<DB: Runs>(
    places: Arc<Places<DB>>,
    hub: NotifyHub,
    requests: Option<mpsc::UnboundedReceiver<Request>>,
    wake_on_renew: bool,
) {
    let Some(mut requests) = requests else {
        return;
    };
    // The names whose lines this client is in.
    let mut names = BTreeSet::new();
    let mut renew = tokio::time::interval(PLACE_TTL / 3);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    renew.tick().await;
    loop {
        tokio::select! {
            request = requests.recv() => match request {
                Some(Request::Join(name, done)) => {
                    let _ = done.send(places.join(&name).await);
                    names.insert(name);
                }
                Some(Request::Leave(name)) => {
                    if hub.remove_if_idle(&name) {
                        places.leave(&name).await;
                        names.remove(&name);
                    }
                }
                None => return,
            },
            _ = renew.tick() => {
                if !names.is_empty() {
                    for name in &names {
                        places.join(name).await;
                    }
                    if wake_on_renew {
                        hub.notify_all();
                    }
                }
            }
        }
    }
}
