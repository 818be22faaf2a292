//! Release notifications on PostgreSQL: one `LISTEN` connection per client,
//! and a line of the waiting clients per name, so that a release goes to
//! the client that has waited longest and wakes that one alone.
//!
//! `NOTIFY` reaches every client that listens on the channel. If each woke
//! its waiters of the released name, every release would send each waiting
//! client to ask again, and all but one would be refused: the statements
//! per release would grow with the number of clients that wait. And the
//! client that released, asking again at once, would mostly win. So a
//! client whose waiter starts to wait for a name takes a place at the back
//! of the name's line (a row beside the lock's, see `statements::FIRST`),
//! or keeps the one it has, and leaves the line when the last of its
//! waiters stops. A release that finds clients in line does not delete the
//! lock's row: it reserves it for the client at the head of the line, for
//! [`RESERVED_MS`](super::statements::RESERVED_MS), ends that client's
//! place, and notifies that client alone, on its own channel
//! (`lockkit-<client>`; each client listens on it and on the table's). Only
//! that client is granted a reserved row; should it not ask in time (its
//! process died), anyone may take the row once the reservation runs out. A
//! release with nobody in line deletes the row and notifies the table's
//! channel, which wakes every client's waiters of the name, as do the other
//! statements that free a name (a reader group's last leave, a withdrawn
//! waiting record). (Every listening session's server process still reads
//! each notification, of whichever channel: that work grows with the
//! clients that listen.)
//!
//! Waiters in line sleep until their client is woken, or until what stands
//! in the way runs out; and, every third of [`PLACE_TTL`], when the client
//! renews its places (taking them again where they went), they ask once. A
//! client that stopped without leaving the line (its process died) keeps its
//! place until it runs out, at most [`PLACE_TTL`]; it is swept when a
//! client next takes a place in that line, and a reservation for it holds
//! the name up for at most `RESERVED_MS`. A client whose place could not
//! be taken backs off and asks again (never past the holder's expiry).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockkit_core::backend::{NotifyHub, ReleaseWatch};
use sqlx::Postgres;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::query::Query;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::AbortHandle;

use super::statements::PgSql;
use crate::settings::Settings;
use crate::statement::trusted;

/// How long a client's place in a line lasts unless renewed.
const PLACE_TTL: Duration = Duration::from_secs(10);

/// One `LISTEN` connection per client, started on first use, that wakes the
/// waiters of a name when a release reserves it for this client (or wakes
/// everyone); and the task that keeps the client's places in line. The
/// `LISTEN` connection comes from a pool of its own, so that it never takes
/// a connection from the statements.
#[derive(Debug)]
pub(super) struct PgNotifications {
    options: PgConnectOptions,
    hub: NotifyHub,
    line: Arc<Line>,
    /// The requests for the keeper, until it starts.
    requests: Mutex<Option<mpsc::UnboundedReceiver<Request>>>,
    /// `true` once `LISTEN` is in place; the listener and the keeper.
    state: Mutex<Option<Running>>,
}

#[derive(Debug)]
struct Running {
    listening: watch::Receiver<bool>,
    tasks: [AbortHandle; 2],
}

/// This client's places in the lines of the names its waiters wait for.
#[derive(Debug)]
struct Line {
    pool: PgPool,
    sql: Arc<PgSql>,
    settings: Settings,
    requests: mpsc::UnboundedSender<Request>,
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

impl PgNotifications {
    pub(super) fn new(
        options: PgConnectOptions,
        pool: PgPool,
        sql: Arc<PgSql>,
        settings: &Settings,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let idle = tx.clone();
        PgNotifications {
            options,
            hub: NotifyHub::with_idle_hook(move |name| {
                let _ = idle.send(Request::Leave(name.to_owned()));
            }),
            line: Arc::new(Line {
                pool,
                sql,
                settings: settings.clone(),
                requests: tx,
            }),
            requests: Mutex::new(Some(rx)),
            state: Mutex::new(None),
        }
    }

    /// A watch on `name`; inactive (the waiter falls back to backoff and the
    /// holder's expiry) when `LISTEN` cannot be set up in time.
    pub(super) async fn watch(&self, settings: &Settings, name: &str) -> ReleaseWatch {
        let mut listening = self.start(settings);
        let (watch, _) = self.hub.watch(name);
        let joined = async {
            let listening = listening.wait_for(|on| *on).await.is_ok();
            // A place kept, or taken at the back of the line: a grant
            // ended any place this client had.
            let (done, joined) = oneshot::channel();
            let _ = self
                .line
                .requests
                .send(Request::Join(name.to_owned(), done));
            (listening, joined.await.unwrap_or(false))
        };
        match tokio::time::timeout(settings.command_timeout, joined).await {
            // A release wakes the client when its turn has come (the row
            // reserved for it): the waiters sleep until then, or until
            // what stands in the way runs out, rather than ask again on
            // the backoff.
            Ok((true, true)) => watch.telling_turns(),
            Ok((true, false)) => watch,
            _ => {
                tracing::warn!(postgres.address = %settings.address, "LISTEN is not set up; waiting by polling");
                ReleaseWatch::none()
            }
        }
    }

    /// How many clients wait in the line of `name`.
    pub(super) async fn in_line(&self, name: &str) -> sqlx::Result<usize> {
        let count: i64 = sqlx::query_scalar(trusted(&self.line.sql.in_line))
            .bind(name)
            .fetch_one(&self.line.pool)
            .await?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    /// The listener and the keeper, started on first use; whether `LISTEN`
    /// is in place.
    fn start(&self, settings: &Settings) -> watch::Receiver<bool> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let running = state.get_or_insert_with(|| {
            let (tx, rx) = watch::channel(false);
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(settings.connect_timeout)
                .connect_lazy_with(self.options.clone());
            let own = format!("lockkit-{}", self.line.sql.lease.client);
            let channels = [self.line.sql.channel().to_owned(), own];
            let listener = tokio::spawn(listen(pool, channels, self.hub.clone(), tx));
            let requests = self
                .requests
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            let keeper = tokio::spawn(keep(self.line.clone(), self.hub.clone(), requests));
            Running {
                listening: rx,
                tasks: [listener.abort_handle(), keeper.abort_handle()],
            }
        });
        running.listening.clone()
    }
}

impl Drop for PgNotifications {
    fn drop(&mut self) {
        let running = self.state.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(running) = running {
            running.tasks.iter().for_each(AbortHandle::abort);
            // Leave every line now rather than when the places run out.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let line = self.line.clone();
                runtime.spawn(async move { line.leave_all().await });
            }
        }
    }
}

impl Line {
    /// Takes (or keeps) a place in the line of `name`; whether it did.
    async fn join(&self, name: &str) -> bool {
        let query = sqlx::query(trusted(&self.sql.enqueue))
            .bind(name)
            .bind(&self.sql.lease.client)
            .bind(PLACE_TTL.as_millis() as i64);
        self.run("take a place in line", query).await
    }

    /// Leaves the line of `name`.
    async fn leave(&self, name: &str) -> bool {
        let query = sqlx::query(trusted(&self.sql.dequeue))
            .bind(name)
            .bind(&self.sql.lease.client);
        self.run("leave a line", query).await
    }

    /// Leaves every line.
    async fn leave_all(&self) -> bool {
        let query = sqlx::query(trusted(&self.sql.leave_lines)).bind(&self.sql.lease.client);
        self.run("leave its lines", query).await
    }

    /// Runs one of the line's statements, bounded by the command timeout;
    /// whether it ran. A failure is logged: the waiters wait on, backing
    /// off as they do without a place.
    async fn run(&self, what: &str, query: Query<'_, Postgres, PgArguments>) -> bool {
        match self.settings.bounded(what, query.execute(&self.pool)).await {
            Ok(_) => true,
            Err(error) => {
                tracing::debug!(%error, "could not {what}; the waiters back off instead");
                false
            }
        }
    }
}

/// The keeper: takes and leaves places as asked, one request after the
/// other, and every third of [`PLACE_TTL`] renews this client's places
/// (taking again those that went: a reservation ends the place it serves,
/// and another waiter of the client may wait on), waking its waiters to
/// ask once.
async fn keep(line: Arc<Line>, hub: NotifyHub, requests: Option<mpsc::UnboundedReceiver<Request>>) {
    let Some(mut requests) = requests else {
        return;
    };
    // The names whose lines this client is in.
    let mut names = std::collections::BTreeSet::new();
    let mut renew = tokio::time::interval(PLACE_TTL / 3);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    renew.tick().await;
    loop {
        tokio::select! {
            request = requests.recv() => match request {
                Some(Request::Join(name, done)) => {
                    let _ = done.send(line.join(&name).await);
                    names.insert(name);
                }
                Some(Request::Leave(name)) => {
                    if hub.remove_if_idle(&name) {
                        line.leave(&name).await;
                        names.remove(&name);
                    }
                }
                None => return,
            },
            _ = renew.tick() => {
                if !names.is_empty() {
                    for name in &names {
                        line.join(name).await;
                    }
                    // Waiters in line sleep until woken: should a client
                    // ahead have stopped without leaving the line, this
                    // bounds how long they sleep through a free lock.
                    hub.notify_all();
                }
            }
        }
    }
}

/// The listener task: `LISTEN` on the table's channel and on this client's,
/// then wake the waiters of each notification's name. After a lost
/// connection every waiter is woken, as notifications may have been
/// missed; sqlx reconnects and listens again.
async fn listen(
    pool: PgPool,
    channels: [String; 2],
    hub: NotifyHub,
    listening: watch::Sender<bool>,
) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::debug!(%error, "cannot open the LISTEN connection; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(error) = listener
            .listen_all(channels.iter().map(String::as_str))
            .await
        {
            tracing::debug!(%error, "LISTEN failed; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        listening.send_replace(true);
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    hub.notify(notification.payload());
                }
                Ok(None) => {
                    // The connection was lost; the next call reconnects.
                    hub.notify_all();
                }
                Err(error) => {
                    tracing::debug!(%error, "the LISTEN connection failed; reconnecting");
                    hub.notify_all();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            }
        }
    }
}
