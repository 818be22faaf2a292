//! Release bells of `lease` mode on MySQL and MariaDB: a waiting client
//! parks a connection of its own in a wait that names the lock, and a
//! release that finds it interrupts it with `KILL QUERY`.
//!
//! Neither server notifies a client, but a session can end another's
//! statement. While a client has waiters for a name, a connection of its
//! own (the name's *sleeper*) waits [`PERIOD`] at a time for the client's
//! *door*, a user lock that one more connection of the client holds:
//! `SELECT GET_LOCK('lockkit door <client>', 1), 'lockkit bell <table>
//! <hash> <client>'`, one after another. Before each it marks the name in
//! the lock table, in one statement: the name's mark `\x01bell:<hash>`,
//! shared by every client that waits, and its own row
//! `\x01bell:<hash>\x01<client>`, which holds its connection id.
//!
//! A release that finds no live mark deletes the row, as it always did. One
//! that finds a mark claims the sleeper rows of up to
//! [`RUNG`](super::statements::RUNG) other clients, those that marked least
//! recently (see `MyLease::release`), leaves the row to the other clients
//! for a moment, and ends those sleepers' waits; their clients then try at
//! once. So a release that nobody waits for costs one statement, and one
//! that others wait for costs three and a `KILL QUERY` per sleeper woken,
//! however many clients wait. A second sleeper is woken in case the first
//! has just stopped waiting (its wait runs out within [`PERIOD`]). A waiter
//! whose bell sleeps does not back off: it asks again when rung, or after
//! [`ASK_AGAIN`] all the same.
//!
//! No ring is lost between two waits. The server drops a `KILL QUERY` that
//! finds no statement running, but a release claims the rows before it
//! rings, and a sleeper tells a claim apart from a sleep that ran out: its
//! wait begins only while its row is there (in the same statement), its
//! row is made again only after a ring it heard, and after a wait that ran
//! out it renews the row, which fails once the row was claimed. A sleeper
//! deletes its row as it stops; rows of clients that stopped without that
//! go when the next sleeper of the name starts, and a name's mark with its
//! next release.
//!
//! The wait is for a lock rather than a `SLEEP()`: MariaDB's sleeps share
//! one mutex, and a `KILL QUERY` of a sleep while another sleep starts or
//! ends can take the server seconds (measured: two seconds and more, where
//! a wait for a lock ends within a millisecond).
//!
//! A user ends its own sessions only: clients that log in as different
//! users need the `CONNECTION ADMIN` (MariaDB: `CONNECTION ADMIN`, or
//! `SUPER`) privilege to wake each other, and `PROCESS` to see that a wait
//! has begun. Where a bell cannot be rung or watched, waiters back off,
//! never past the holder's expiry, as they do without bells.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockkit_core::backend::{NotifyHub, ReleaseWatch};
use sqlx::mysql::{
    MySqlArguments, MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions,
};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, ConnectOptions as _, Connection as _};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::statements::{CONNECTION_ID, MySql};
use crate::error::is_interrupted;
use crate::lease::bell_mark_row;
use crate::settings::Settings;
use crate::statement::trusted;

/// How long one sleep of a bell lasts (s): how long a bell lingers after
/// its client's last waiter of the name has left.
const PERIOD: u32 = 1;

/// How long a waiter whose bell sleeps waits for a ring before it asks
/// again all the same (its watch [tells turns](ReleaseWatch::telling_turns):
/// it does not back off meanwhile): one sleep of the bell, so that a ring
/// that found its bell between two sleeps costs it no more.
pub(super) const ASK_AGAIN: Duration = Duration::from_secs(PERIOD as u64);

/// How many names one client watches with bells at once; waiters of more
/// names back off.
const MAX_BELLS: usize = 16;

/// How many connections a client's rings and checks use at most.
const RINGERS: u32 = 2;

/// A client's bells: the sleepers it runs, by name hash.
pub(super) struct Bells {
    shared: Arc<Shared>,
}

struct Shared {
    options: MySqlConnectOptions,
    /// The lock table's statements (the marks').
    sql: Arc<MySql>,
    /// A pool of the bells' own (at most [`RINGERS`] connections), for the
    /// statements that ring a bell and see one show: a release's ring never
    /// waits for, nor takes, a connection of the lock's statements.
    pool: MySqlPool,
    settings: Settings,
    /// The lock table (validated).
    table: String,
    /// `lockkit bell <table> `.
    prefix: String,
    /// This client, in its bells' text and its sleepers' rows.
    client: String,
    hub: NotifyHub,
    sleepers: Mutex<HashMap<String, Sleeper>>,
    /// The connection that holds this client's door (see [`Shared::bell`])
    /// once a sleeper needed it; `None` before, or after it was found gone.
    door: tokio::sync::Mutex<Option<MySqlConnection>>,
}

struct Sleeper {
    /// The sleeper's connection id, once its first sleep shows in the
    /// process list.
    armed: watch::Receiver<Option<i64>>,
    task: AbortHandle,
}

impl fmt::Debug for Bells {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sleepers = self.shared.lock().len();
        f.debug_struct("Bells")
            .field("table", &self.shared.prefix)
            .field("sleepers", &sleepers)
            .finish()
    }
}

impl Bells {
    /// The bells of lock table `table` (validated), for a client connecting
    /// with `options`. Connects nothing until a waiter watches.
    pub(super) fn new(
        options: MySqlConnectOptions,
        sql: Arc<MySql>,
        settings: &Settings,
        table: &str,
    ) -> Self {
        let pool = MySqlPoolOptions::new()
            .max_connections(RINGERS)
            .min_connections(0)
            .acquire_timeout(settings.connect_timeout)
            .test_before_acquire(false)
            .connect_lazy_with(options.clone());
        let client = sql.lease.client.clone();
        Bells {
            shared: Arc::new(Shared {
                options,
                sql,
                pool,
                settings: settings.clone(),
                table: table.to_owned(),
                prefix: format!("lockkit bell {table} "),
                client,
                // Topics stay until their sleeper stops (`stop_if_idle`).
                hub: NotifyHub::with_idle_hook(|_| {}),
                sleepers: Mutex::new(HashMap::new()),
                door: tokio::sync::Mutex::new(None),
            }),
        }
    }

    /// The connections of up to [`RUNG`](super::statements::RUNG) other
    /// clients sleeping on `name`'s bell, the one that marked least recently
    /// first, claimed on `conn` where the server can (see
    /// `MySql::bell_sleepers`). None when they cannot be read (the failure is only traced:
    /// the release then goes as if nobody waited, and the waiters find it
    /// on their next try).
    pub(super) async fn sleepers(&self, conn: &mut MySqlConnection, name: &str) -> Vec<i64> {
        let key = Key::of(name);
        let own = self.shared.own_row(&key);
        let found = sqlx::query_scalar(trusted(&self.shared.sql.bell_sleepers))
            .bind(key.first().into_bytes())
            .bind(key.past().into_bytes())
            .bind(own.as_bytes())
            .fetch_all(conn)
            .await;
        found.unwrap_or_else(|error| {
            tracing::debug!(%error, "could not read the sleepers of a release bell");
            Vec::new()
        })
    }

    /// Ends the sleep of `sleepers` (see [`sleepers`](Self::sleepers)), in
    /// the background, one after another: the release that freed their name
    /// returns at once (a `KILL QUERY` may take the server a while, and
    /// concurrent ones of one connection far longer). Failures are only
    /// traced (a sleeper that went meanwhile is no error of the release's):
    /// the waiters then find the release on their next try.
    pub(super) fn wake(&self, sleepers: Vec<i64>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = self.shared.clone();
        runtime.spawn(async move {
            let rung = shared.settings.timed(shared.ring(&sleepers)).await;
            match rung {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::debug!(%error, "could not ring a release bell"),
                Err(_) => tracing::debug!("ringing a release bell timed out"),
            }
        });
    }

    /// A watch on `name`, woken when a release rings its bell; inactive when
    /// the client watches [`MAX_BELLS`] names already, or its bell does not
    /// show on the server within the connect and command timeouts.
    pub(super) async fn watch(&self, name: &str) -> ReleaseWatch {
        let key = Key::of(name);
        let (watch, mut armed, running) = {
            let mut sleepers = self.shared.lock();
            let running = sleepers.contains_key(&key.hash);
            if !running && sleepers.len() >= MAX_BELLS {
                return ReleaseWatch::none();
            }
            let (watch, _) = self.shared.hub.watch(&key.hash);
            let sleeper = sleepers.entry(key.hash.clone()).or_insert_with(|| {
                let (tx, armed) = watch::channel(None);
                let task = tokio::spawn(self.shared.clone().sleep(key.clone(), tx));
                Sleeper {
                    armed,
                    task: task.abort_handle(),
                }
            });
            (watch, sleeper.armed.clone(), running)
        };
        let shown = *armed.borrow();
        if let (true, Some(_)) = (running, shown) {
            // A release since its last sleep began may have deleted the
            // name's mark while the sleeper still runs (this client's own
            // release, or another's that woke other sleepers). The
            // sleeper's own row is its own to make again (see `bell`).
            let marked = self.shared.mark_name(&key).execute(&self.shared.pool);
            if let Err(error) = self
                .shared
                .settings
                .bounded("mark a release bell", marked)
                .await
            {
                tracing::debug!(%error, "could not mark a release bell");
            }
            return watch.telling_turns();
        }
        // A new bell connects, marks and shows its sleep.
        let settings = &self.shared.settings;
        let ready = tokio::time::timeout(
            settings.connect_timeout + settings.command_timeout,
            armed.wait_for(Option::is_some),
        );
        match ready.await {
            Ok(Ok(_)) => watch.telling_turns(),
            _ => {
                tracing::debug!(mysql.address = %self.shared.settings.address, "no release bell in time; waiting by polling");
                ReleaseWatch::none()
            }
        }
    }
}

impl Drop for Bells {
    /// Stops the sleepers, and deletes their rows in the background (a
    /// sleeper stopped here does not delete its own).
    fn drop(&mut self) {
        let mut rows = Vec::new();
        for (hash, sleeper) in self.shared.lock().drain() {
            sleeper.task.abort();
            rows.push(self.shared.own_row(&Key::of_hash(hash)));
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if rows.is_empty() {
            return;
        }
        let shared = self.shared.clone();
        runtime.spawn(async move {
            for row in rows {
                let unmarked = sqlx::query(trusted(&shared.sql.bell_unmark))
                    .bind(row.as_bytes())
                    .execute(&shared.pool);
                if let Err(error) = shared
                    .settings
                    .bounded("unmark a release bell", unmarked)
                    .await
                {
                    tracing::debug!(%error, "could not delete a release bell's row");
                }
            }
        });
    }
}

/// How a name's mark row starts (see `bell_mark_row`).
const BELL_PREFIX: &str = "\u{1}bell:";

/// A name as its bell knows it: the hash of its side rows (see
/// `bell_mark_row`), and the row that marks it.
#[derive(Clone, Debug)]
struct Key {
    hash: String,
    mark: String,
}

impl Key {
    fn of(name: &str) -> Key {
        let mark = bell_mark_row(name);
        let hash = mark.trim_start_matches(BELL_PREFIX).to_owned();
        Key { hash, mark }
    }

    /// The key whose mark's hash is `hash`.
    fn of_hash(hash: String) -> Key {
        Key {
            mark: format!("{BELL_PREFIX}{hash}"),
            hash,
        }
    }

    /// What every sleeper row of the name sorts after: the mark and
    /// `\x01` (a sleeper row is the mark, `\x01` and its client).
    fn first(&self) -> String {
        format!("{}\u{1}", self.mark)
    }

    /// What every sleeper row of the name sorts before.
    fn past(&self) -> String {
        format!("{}\u{2}", self.mark)
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Sleeper>> {
        self.sleepers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The row of this client's sleeper of `key`.
    fn own_row(&self, key: &Key) -> String {
        format!("{}{}", key.first(), self.client)
    }

    /// The statement that marks (or marks again) the name of `key`, and
    /// this client's sleeper row `own` on connection `id`.
    fn mark<'q>(
        &'q self,
        key: &'q Key,
        own: &'q str,
        id: i64,
    ) -> Query<'q, sqlx::MySql, MySqlArguments> {
        sqlx::query(trusted(&self.sql.bell_mark))
            .bind(key.mark.as_bytes())
            .bind(own.as_bytes())
            .bind(id)
    }

    /// The statement that marks (or marks again) the name of `key` alone,
    /// leaving the sleeper rows as they are (see `MySql::bell_mark_name`).
    fn mark_name<'q>(&'q self, key: &'q Key) -> Query<'q, sqlx::MySql, MySqlArguments> {
        sqlx::query(trusted(&self.sql.bell_mark_name)).bind(key.mark.as_bytes())
    }

    /// The statement a sleeper of this client runs for the name `key`.
    ///
    /// The sleep is a wait for this client's *door*, a user lock that
    /// another connection of the client holds ([`open_door`](Self::open_door)):
    /// `GET_LOCK` answers 0 after [`PERIOD`], and a `KILL QUERY` ends it at
    /// once (see the module's notes on `SLEEP()`).
    ///
    /// It sleeps only while the sleeper's row is there; a release that
    /// claimed the row (see [`Bells::sleepers`]) before the statement began
    /// finds it answering NULL at once, as a ring would. The server drops a
    /// `KILL QUERY` that comes between two statements, so without this a
    /// ring that found the sleeper between its mark and its sleep would be
    /// lost (its claimed row not marked again either, until the sleep ran
    /// out): a claim commits before its ring is sent, so a ring either ends
    /// the statement or comes before it, and then the statement sees the
    /// claim.
    fn bell(&self, key: &Key) -> String {
        // The sleeper's row name, as a hex literal (it holds `\x01`s).
        let own: String = self
            .own_row(key)
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!(
            "SELECT CAST(IF(EXISTS(SELECT 1 FROM {} WHERE name = X'{own}'), \
                    GET_LOCK('{}', {PERIOD}), NULL) AS SIGNED), '{}{} {}'",
            self.table,
            self.door_lock(),
            self.prefix,
            key.hash,
            self.client
        )
    }

    /// The name of this client's door lock.
    fn door_lock(&self) -> String {
        format!("lockkit door {}", self.client)
    }

    /// Makes sure that this client's door is held, by a connection of its
    /// own, opened the first time (and again after it was found gone).
    async fn open_door(&self) -> Result<(), String> {
        let mut door = self.door.lock().await;
        if door.is_some() {
            return Ok(());
        }
        let connect = self
            .settings
            .connecting("open a release bell's door", self.options.connect());
        let mut conn = connect.await.map_err(|e| e.to_string())?;
        let take = format!("SELECT CAST(GET_LOCK('{}', 0) AS SIGNED)", self.door_lock());
        let taken = sqlx::query_scalar::<_, Option<i64>>(AssertSqlSafe(take)).fetch_one(&mut conn);
        match self
            .settings
            .bounded("lock a release bell's door", taken)
            .await
        {
            Ok(Some(1)) => {
                *door = Some(conn);
                Ok(())
            }
            Ok(answer) => Err(format!(
                "the door of the release bells is taken ({answer:?})"
            )),
            Err(error) => Err(error.to_string()),
        }
    }

    /// The door was found open (a sleeper's wait for it was granted: its
    /// connection is gone): the sleeper on `conn` gives the lock back, and
    /// the next sleeper opens the door again.
    async fn door_gone(&self, conn: &mut MySqlConnection) -> Result<(), String> {
        *self.door.lock().await = None;
        let give = format!("DO RELEASE_LOCK('{}')", self.door_lock());
        let given = sqlx::raw_sql(AssertSqlSafe(give)).execute(conn);
        self.settings
            .bounded("give back a release bell's door", given)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// Ends the sleep of `sleepers`, one after another, on a connection of
    /// the bells' pool.
    async fn ring(&self, sleepers: &[i64]) -> sqlx::Result<()> {
        let mut conn = self.pool.acquire().await?;
        for id in sleepers {
            let kill = format!("KILL QUERY {id}");
            if let Err(error) = sqlx::raw_sql(AssertSqlSafe(kill)).execute(&mut *conn).await {
                tracing::trace!(connection = id, %error, "KILL QUERY of a release bell");
            }
        }
        Ok(())
    }

    /// Whether the sleeper of `key` stops: nobody watches the name any more.
    /// Its entry goes with the topic, under the lock `watch` takes, so that
    /// a new waiter either finds the sleeper running or starts another.
    fn stop_if_idle(&self, key: &str) -> bool {
        let mut sleepers = self.lock();
        let idle = self.hub.remove_if_idle(key);
        if idle {
            sleepers.remove(key);
        }
        idle
    }

    /// A sleeper: sleeps on `key`'s bell, on a connection of its own, for as
    /// long as anyone watches the name, and wakes the watchers when a sleep
    /// is ended early. `armed` turns `true` once its first sleep shows in
    /// the process list, where a release can find it.
    async fn sleep(self: Arc<Self>, key: Key, armed: watch::Sender<Option<i64>>) {
        loop {
            match self.sleep_on_one_connection(&key, &armed).await {
                Ok(()) => return,
                Err(error) => {
                    // A release may have been missed: everyone looks again.
                    tracing::debug!(%error, "a release bell's connection failed; reconnecting");
                    self.hub.notify(&key.hash);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if self.stop_if_idle(&key.hash) {
                        return;
                    }
                }
            }
        }
    }

    /// [`sleep`](Self::sleep) on one connection, until nobody watches (`Ok`)
    /// or the connection fails.
    async fn sleep_on_one_connection(
        &self,
        key: &Key,
        armed: &watch::Sender<Option<i64>>,
    ) -> Result<(), String> {
        let bell = &self.bell(key);
        let own = self.own_row(key);
        let connect = self
            .settings
            .connecting("open a release bell", self.options.connect());
        let mut conn = connect.await.map_err(|e| e.to_string())?;
        let id = self
            .settings
            .bounded(
                "read a release bell's connection id",
                sqlx::query_scalar::<_, i64>(CONNECTION_ID).fetch_one(&mut conn),
            )
            .await
            .map_err(|e| e.to_string())?;
        // The rows of sleepers of the name whose clients stopped without
        // deleting them.
        let swept = sqlx::query(trusted(&self.sql.bell_sweep))
            .bind(key.first().into_bytes())
            .bind(key.past().into_bytes())
            .execute(&mut conn);
        self.settings
            .bounded("sweep a release bell's rows", swept)
            .await
            .map_err(|e| e.to_string())?;
        // Whether the sleeper's row outlived its last sleep (which ran out):
        // only the name's mark is then renewed before the next one.
        let mut kept = false;
        loop {
            self.open_door().await?;
            let mark = if kept {
                self.mark_name(key)
            } else {
                self.mark(key, &own, id)
            };
            let marked = self.settings.timed(mark.execute(&mut conn));
            kept = false;
            let slept = match marked.await {
                Ok(Ok(_)) => {
                    let sleeping =
                        sqlx::query_as::<_, (Option<i64>, String)>(AssertSqlSafe(bell.to_owned()))
                            .fetch_one(&mut conn);
                    tokio::pin!(sleeping);
                    if armed.borrow().is_some() {
                        sleeping.await
                    } else {
                        tokio::select! {
                            slept = &mut sleeping => slept,
                            () = self.until_shown(id, bell) => {
                                armed.send_replace(Some(id));
                                sleeping.await
                            }
                        }
                    }
                }
                // A release that read this sleeper's row ended the mark
                // instead of a sleep.
                Ok(Err(error)) => Err(error),
                Err(_) => return Err("marking a release bell timed out".to_owned()),
            };
            match slept {
                // The door held it out for the whole period. The row is
                // renewed, unless a release claimed it meanwhile: the ring
                // then came between two statements, and the server dropped
                // it (see `bell`).
                Ok((Some(0), _)) => {
                    let renewed = sqlx::query(trusted(&self.sql.bell_renew))
                        .bind(own.as_bytes())
                        .execute(&mut conn);
                    kept = self
                        .settings
                        .bounded("renew a release bell's row", renewed)
                        .await
                        .map_err(|e| e.to_string())?
                        .rows_affected()
                        == 1;
                    if !kept {
                        self.hub.notify(&key.hash);
                    }
                }
                // Ended by a release (an interrupted `GET_LOCK` answers
                // NULL, or fails; the sleeper's row was claimed before the
                // sleep began, see `bell`).
                Ok((None, _)) => {
                    self.hub.notify(&key.hash);
                }
                Err(error) if is_interrupted(&error) => {
                    self.hub.notify(&key.hash);
                }
                Ok((Some(_), _)) => {
                    // A release may have been missed: everyone looks again.
                    self.door_gone(&mut conn).await?;
                    self.hub.notify(&key.hash);
                }
                Err(error) => return Err(error.to_string()),
            }
            if self.stop_if_idle(&key.hash) {
                let unmarked = sqlx::query(trusted(&self.sql.bell_unmark))
                    .bind(own.as_bytes())
                    .execute(&mut conn);
                if let Err(error) = self
                    .settings
                    .bounded("unmark a release bell", unmarked)
                    .await
                {
                    tracing::debug!(%error, "could not delete a release bell's row");
                }
                if let Err(error) = conn.close().await {
                    tracing::trace!(%error, "closing a release bell's connection");
                }
                return Ok(());
            }
        }
    }

    /// Returns once connection `id` shows running `bell` in the process
    /// list (or the command timeout passed, or the process list cannot be
    /// read: the watch is then of no use, and its waiter falls back on
    /// backoff).
    async fn until_shown(&self, id: i64, bell: &str) {
        const SHOWN: &str = "SELECT CAST(1 AS SIGNED) FROM information_schema.PROCESSLIST \
                             WHERE ID = ? AND INFO = ?";
        let shown = async {
            let mut pause = Duration::from_millis(1);
            loop {
                let found = sqlx::query_scalar::<_, i64>(SHOWN)
                    .bind(id)
                    .bind(bell)
                    .fetch_optional(&self.pool)
                    .await;
                match found {
                    Ok(Some(_)) => return,
                    Ok(None) => {}
                    Err(error) => {
                        tracing::debug!(%error, "cannot read the process list");
                        std::future::pending::<()>().await;
                    }
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(50));
            }
        };
        if tokio::time::timeout(self.settings.command_timeout, shown)
            .await
            .is_err()
        {
            tracing::debug!("a release bell did not show in the process list");
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_the_hash_of_the_mark() {
        let key = Key::of("jobs");
        assert_eq!(key.hash.len(), 40);
        assert!(key.hash.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(key.mark, format!("\u{1}bell:{}", key.hash));
        assert_ne!(key.hash, Key::of("jobs2").hash);
    }
}
