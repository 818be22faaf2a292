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
//!
//! A release may reserve a name for this client just as its last waiter of
//! the name stops (gives up, or is cancelled), before the keeper has left
//! the line. The client's [`Turns`] then pass the turn on at once (the
//! release is run again, for the reservation), rather than hold the name
//! up until the reservation runs out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use lockkit_core::backend::{NotifyHub, ReleaseWatch};
use tokio::sync::Notify;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::settings::Settings;
use crate::statement::{Runs, Value};

/// How long a client's place in a line lasts unless renewed: the keeper
/// renews its places every third of it.
pub(crate) const PLACE_TTL: Duration = Duration::from_secs(10);

/// The owner of a row that a release reserved for a client, followed by
/// the client: no owner token starts with `\x01`.
pub(crate) const RESERVED_FOR: &str = "\u{1}for:";

/// The most names a client remembers having left (see [`Turns`]): past
/// it, those whose places are gone already are forgotten, and if that is
/// not enough (leaving fails, the database being away), all of them: a
/// turn for one of those then runs out rather than being passed on.
const LEFT_MAX: usize = 256;

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
    /// Answer once the requests before this one are done.
    Flush(oneshot::Sender<()>),
}

/// A client's places, and the keeper task that takes, renews and leaves
/// them (started on first use).
pub(crate) struct Line<DB: Runs> {
    places: Arc<Places<DB>>,
    /// What the client does when its turn comes; its hub has one topic per
    /// name the client waits for: the last watch of a name dropped leaves
    /// its line.
    turns: Turns,
    requests: mpsc::UnboundedSender<Request>,
    /// The names whose lines the client is in, as the keeper takes and
    /// leaves its places.
    in_line: Arc<InLine>,
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
            .field("names", &self.turns.hub.len())
            .finish_non_exhaustive()
    }
}

impl<DB: Runs> Line<DB> {
    pub(crate) fn new(places: Places<DB>, wake_on_renew: bool) -> Self {
        let (requests, pending) = mpsc::unbounded_channel();
        let idle = requests.clone();
        let left = Arc::new(Left::default());
        let stopped = left.clone();
        Line {
            places: Arc::new(places),
            turns: Turns {
                hub: NotifyHub::with_idle_hook(move |name| {
                    stopped.stopped(name);
                    let _ = idle.send(Request::Leave(name.to_owned()));
                }),
                left,
            },
            requests,
            in_line: Arc::default(),
            pending: Mutex::new(Some(pending)),
            keeper: Mutex::new(None),
            wake_on_renew,
        }
    }

    /// The names whose lines the client is in (see [`InLine`]).
    #[cfg(feature = "postgres")]
    pub(crate) fn in_line(&self) -> &Arc<InLine> {
        &self.in_line
    }

    /// The statements that write the places.
    pub(crate) fn places(&self) -> &Places<DB> {
        &self.places
    }

    /// What the client does when its turn comes (its notifier tells it).
    pub(crate) fn turns(&self) -> &Turns {
        &self.turns
    }

    /// A watch on `name` that keeps the client in its line while it lives,
    /// and whether the place was taken (or kept) by the time this returns.
    /// A waiter that gives up and [closes](ReleaseWatch::close) the watch
    /// has left the line (if it was the client's last waiter of the name)
    /// once that returns, within the command timeout.
    pub(crate) async fn join(&self, name: &str) -> (ReleaseWatch, bool) {
        self.start();
        self.turns.left.joined(name);
        let (watch, _) = self.turns.hub.watch(name);
        let (done, joined) = oneshot::channel();
        let _ = self.requests.send(Request::Join(name.to_owned(), done));
        let requests = self.requests.clone();
        let bound = self.places.settings.command_timeout;
        let watch = watch.closing_with(move || async move {
            let (done, flushed) = oneshot::channel();
            if requests.send(Request::Flush(done)).is_ok() {
                let _ = tokio::time::timeout(bound, flushed).await;
            }
        });
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
                self.turns.clone(),
                self.in_line.clone(),
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
    turns: Turns,
    in_line: Arc<InLine>,
    requests: Option<mpsc::UnboundedReceiver<Request>>,
    wake_on_renew: bool,
) {
    let Some(mut requests) = requests else {
        return;
    };
    let mut renew = tokio::time::interval(PLACE_TTL / 3);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    renew.tick().await;
    loop {
        tokio::select! {
            request = requests.recv() => match request {
                Some(Request::Join(name, done)) => {
                    // Counted in line before the place is taken: a release
                    // may serve it as soon as it is.
                    in_line.joined(&name);
                    let _ = done.send(places.join(&name).await);
                }
                Some(Request::Leave(name)) => {
                    if turns.hub.remove_if_idle(&name) {
                        let gone = places.leave(&name).await;
                        if gone {
                            turns.left.gone(&name);
                        }
                        in_line.left(&name, gone);
                    }
                }
                Some(Request::Flush(done)) => {
                    let _ = done.send(());
                }
                None => return,
            },
            _ = renew.tick() => {
                let names = in_line.joined_names();
                if !names.is_empty() {
                    for name in &names {
                        places.join(name).await;
                    }
                    if wake_on_renew {
                        turns.hub.notify_all();
                    }
                }
            }
        }
    }
}

/// How long a name stays counted in line after the client left it: a
/// release that served the client's place just before it went reserved
/// the name for the client, and the client's notifier must still see that
/// reservation, to pass the turn on (see [`Turns`]).
const LEFT_LINGER: Duration = Duration::from_secs(2);

/// How many names that the client left lately [`InLine`] keeps; past it,
/// the oldest are forgotten (a reservation for one of those then runs out
/// rather than being passed on).
const LEFT_KEPT: usize = 1024;

/// The names whose lines a client is in: joined before its place is taken,
/// and counted for [`LEFT_LINGER`] after it is left (for a [`PLACE_TTL`]
/// more should leaving have failed, as the place then stands until it
/// runs out). A notifier that asks the server for the names reserved for
/// the client asks about these (PostgreSQL's bell, see `postgres::bell`).
#[derive(Debug, Default)]
pub(crate) struct InLine {
    /// By name: `None` while in line, else until when it is counted.
    names: Mutex<HashMap<String, Option<Instant>>>,
    /// Told when a name joins.
    joined: Notify,
}

impl InLine {
    fn names(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<Instant>>> {
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn joined(&self, name: &str) {
        self.names().insert(name.to_owned(), None);
        self.joined.notify_waiters();
    }

    /// The client left the line of `name`; `gone`: its place is gone.
    fn left(&self, name: &str, gone: bool) {
        let linger = if gone {
            LEFT_LINGER
        } else {
            PLACE_TTL + LEFT_LINGER
        };
        let mut names = self.names();
        if names.len() >= LEFT_KEPT {
            let now = Instant::now();
            names.retain(|_, until| until.is_none_or(|until| until > now));
            while names.len() >= LEFT_KEPT {
                let oldest = names
                    .iter()
                    .filter_map(|(name, until)| until.map(|until| (until, name.clone())))
                    .min();
                match oldest {
                    Some((_, name)) => names.remove(&name),
                    None => break,
                };
            }
        }
        names.insert(name.to_owned(), Some(Instant::now() + linger));
    }

    /// The names whose lines the client is in now (its places to renew).
    fn joined_names(&self) -> Vec<String> {
        let names = self.names();
        let joined = names.iter().filter(|(_, until)| until.is_none());
        joined.map(|(name, _)| name.clone()).collect()
    }

    /// The names counted in line now, the lingering ones included; those
    /// whose time is up are forgotten.
    #[cfg(feature = "postgres")]
    pub(crate) fn counted(&self) -> Vec<String> {
        let now = Instant::now();
        let mut names = self.names();
        names.retain(|_, until| until.is_none_or(|until| until > now));
        names.keys().cloned().collect()
    }

    /// Returns once some name is counted in line.
    #[cfg(feature = "postgres")]
    pub(crate) async fn until_any(&self) {
        loop {
            let joined = self.joined.notified();
            if !self.counted().is_empty() {
                return;
            }
            joined.await;
        }
    }
}

/// What a client does when a release reserved a name for it: its waiters
/// of the name take the lock; or, when none waits any longer (the last
/// gave up or was cancelled after the release found the client in line),
/// the client passes the turn on at once, by the dialect's release of the
/// reservation (see [`on_pass`](Self::on_pass)): to the next client in
/// line, or to nobody. Without it, the name would stay held up until the
/// reservation ran out.
#[derive(Clone)]
pub(crate) struct Turns {
    /// One topic per name the client waits for.
    hub: NotifyHub,
    left: Arc<Left>,
}

impl std::fmt::Debug for Turns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turns")
            .field("hub", &self.hub)
            .finish_non_exhaustive()
    }
}

/// The names whose last waiter stopped, and how a turn is passed on.
#[derive(Default)]
struct Left {
    /// By name: whether the client's place there is gone (a reservation
    /// for the client can no longer be made) or may still stand.
    names: Mutex<HashMap<String, bool>>,
    pass: OnceLock<Box<dyn Fn(String) + Send + Sync>>,
}

impl Left {
    fn names(&self) -> std::sync::MutexGuard<'_, HashMap<String, bool>> {
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last waiter of `name` stopped; its place may still stand.
    fn stopped(&self, name: &str) {
        let mut names = self.names();
        if names.len() >= LEFT_MAX {
            names.retain(|_, gone| !*gone);
            if names.len() >= LEFT_MAX {
                names.clear();
            }
        }
        names.insert(name.to_owned(), false);
    }

    /// A waiter of `name` waits again.
    fn joined(&self, name: &str) {
        self.names().remove(name);
    }

    /// The client's place in the line of `name` is gone.
    fn gone(&self, name: &str) {
        if let Some(gone) = self.names().get_mut(name) {
            *gone = true;
        }
    }

    fn pass(&self, name: String) {
        match self.pass.get() {
            Some(pass) => pass(name),
            None => tracing::debug!(name, "a turn nobody wants runs out"),
        }
    }
}

impl Turns {
    /// How a turn is passed on: `pass(name)` releases the row of `name`
    /// reserved for this client (set once, by the lease engine).
    pub(crate) fn on_pass(&self, pass: impl Fn(String) + Send + Sync + 'static) {
        let _ = self.left.pass.set(Box::new(pass));
    }

    /// The hub whose topics are the names the client waits for.
    #[cfg(feature = "postgres")]
    pub(crate) fn hub(&self) -> &NotifyHub {
        &self.hub
    }

    /// A release reserved `name` for this client: its waiters of the name
    /// wake, or, with none, the turn is passed on.
    #[cfg(feature = "postgres")]
    pub(crate) fn came(&self, name: &str) {
        if self.hub.watched(name) {
            self.hub.notify(name);
        } else {
            self.left.pass(name.to_owned());
        }
    }

    /// A release reserved some name for this client, or for another whose
    /// bell it shares (the notifier does not say which): the turns of the
    /// names whose last waiter stopped, and that nobody waits for again,
    /// are passed on. (A passed turn that was not this client's releases
    /// nothing.) A name whose place was gone by then is forgotten: no
    /// reservation can be made for the client there since.
    #[cfg(feature = "sqlite")]
    pub(crate) fn came_for_some(&self) {
        let unwanted: Vec<String> = {
            let mut names = self.left.names();
            let unwanted = names
                .keys()
                .filter(|name| !self.hub.watched(name))
                .cloned()
                .collect();
            names.retain(|name, gone| !*gone && !self.hub.watched(name));
            unwanted
        };
        for name in unwanted {
            self.left.pass(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "postgres")]
    #[tokio::test(start_paused = true)]
    async fn names_left_are_counted_a_while_and_stay_bounded() {
        let in_line = InLine::default();
        in_line.joined("waited");
        in_line.joined("left");
        in_line.left("left", true);
        let mut counted = in_line.counted();
        counted.sort();
        assert_eq!(counted, ["left", "waited"], "a name left lingers");
        assert_eq!(
            in_line.joined_names(),
            ["waited"],
            "only joined names are renewed"
        );
        tokio::time::advance(LEFT_LINGER + Duration::from_millis(1)).await;
        assert_eq!(
            in_line.counted(),
            ["waited"],
            "the lingering name is forgotten"
        );
        for n in 0..3 * LEFT_KEPT {
            let name = format!("left-{n}");
            in_line.joined(&name);
            in_line.left(&name, false);
            assert!(in_line.names().len() <= LEFT_KEPT);
        }
        assert!(
            in_line.counted().contains(&"waited".to_owned()),
            "a name in line is never forgotten"
        );
        in_line.until_any().await;
    }

    #[test]
    fn the_names_left_stay_bounded() {
        let left = Left::default();
        // Places gone: forgotten first.
        for n in 0..LEFT_MAX {
            left.stopped(&format!("gone-{n}"));
            left.gone(&format!("gone-{n}"));
        }
        left.stopped("pending");
        assert_eq!(left.names().len(), 1, "the gone names were forgotten");
        // Places that never went (leaving fails): all forgotten at the cap.
        for n in 0..10 * LEFT_MAX {
            left.stopped(&format!("stuck-{n}"));
            assert!(left.names().len() <= LEFT_MAX);
        }
        left.stopped("back");
        assert!(left.names().contains_key("back"));
        left.joined("back");
        assert!(
            !left.names().contains_key("back"),
            "a name waited for again is no longer left"
        );
    }
}
