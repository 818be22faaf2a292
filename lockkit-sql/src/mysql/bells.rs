//! Release bells of `lease` mode on MySQL and MariaDB: a waiting client
//! parks a connection of its own in a `SLEEP` that names the lock, and a
//! release that finds it interrupts it with `KILL QUERY`.
//!
//! Neither server notifies a client, but a session can end another's
//! statement. While a client has waiters for a name, a connection of its
//! own marks the name (a row `\x01bell:<hash>` in the lock table, shared by
//! every client that waits) and runs [`PERIOD`]-long sleeps, `SELECT
//! SLEEP(1), 'lockkit bell <table> <hash> <client>'`, one after another,
//! renewing the mark before each; the sleep shows in the server's process
//! list with that text. A release deletes the name's mark in the same
//! statement (ends it, on MySQL's path, where lease rows stay), and its
//! changed-row count tells whether there was one. Only then does the client
//! that released look in the process list for the name's bells of other
//! clients and end the sleep of the (at most [`RUNG`]) longest sleepers,
//! whose clients then try at once and mark the name again. So a release
//! that nobody waits for costs what it did, and one that someone waits for
//! costs two statements more (the look and a `KILL QUERY`), however many
//! clients wait. A second sleeper is woken in case the first has just
//! stopped waiting (its sleep runs out within [`PERIOD`]); a sleeper not
//! woken marks the name again at its next sleep. A mark left by the last
//! waiter goes with the name's next release.
//!
//! A user sees and ends its own sessions only: clients that log in as
//! different users need the `PROCESS` and `CONNECTION ADMIN` (MariaDB:
//! `CONNECTION ADMIN`, or `SUPER`) privileges to wake each other. Where a
//! bell cannot be rung or watched, waiters back off, never past the
//! holder's expiry, as they do without bells.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockkit_core::backend::{NotifyHub, ReleaseWatch};
use sqlx::mysql::{MySqlArguments, MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
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

/// How many sleepers a release wakes at most.
const RUNG: u32 = 2;

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
    /// `lockkit bell <table> `.
    prefix: String,
    /// This client, in its bells' text.
    client: String,
    /// The look for up to [`RUNG`] sleepers of a name in the process list,
    /// the longest first; binds the bells' `LIKE` pattern and this client's
    /// own bell.
    find: String,
    hub: NotifyHub,
    sleepers: Mutex<HashMap<String, Sleeper>>,
}

struct Sleeper {
    /// `true` once the first sleep shows in the process list.
    armed: watch::Receiver<bool>,
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
    /// with `options`; `mariadb` picks the process list's millisecond
    /// column. Connects nothing until a release rings or a waiter watches.
    pub(super) fn new(
        options: MySqlConnectOptions,
        sql: Arc<MySql>,
        settings: &Settings,
        table: &str,
        mariadb: bool,
    ) -> Self {
        let pool = MySqlPoolOptions::new()
            .max_connections(RINGERS)
            .min_connections(0)
            .acquire_timeout(settings.connect_timeout)
            .test_before_acquire(false)
            .connect_lazy_with(options.clone());
        Bells {
            shared: Arc::new(Shared {
                options,
                sql,
                pool,
                settings: settings.clone(),
                prefix: format!("lockkit bell {table} "),
                client: format!("{:016x}", fastrand::u64(..)),
                // How long a statement has run: in ms on MariaDB, in s on MySQL.
                find: format!(
                    "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST \
                     WHERE INFO LIKE ? AND INFO <> ? ORDER BY {} DESC LIMIT {RUNG}",
                    if mariadb { "TIME_MS" } else { "TIME" }
                ),
                // Topics stay until their sleeper stops (`stop_if_idle`).
                hub: NotifyHub::with_idle_hook(|_| {}),
                sleepers: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Wakes up to [`RUNG`] other clients sleeping on `name`'s bell, in the
    /// background: the release that freed it (and found its mark) has
    /// returned. Failures are only traced; the waiters then find the release
    /// on their next try.
    pub(super) fn ring(&self, name: &str) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = self.shared.clone();
        let key = Key::of(name);
        runtime.spawn(async move {
            let rung = shared.settings.timed(shared.ring(&key.hash)).await;
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
                let (tx, armed) = watch::channel(false);
                let task = tokio::spawn(self.shared.clone().sleep(key.clone(), tx));
                Sleeper {
                    armed,
                    task: task.abort_handle(),
                }
            });
            (watch, sleeper.armed.clone(), running)
        };
        if running && *armed.borrow() {
            // A release since its last sleep began may have deleted the
            // mark of a sleeper that is still running (this client's own
            // release, or another's that woke other sleepers).
            let marked = self.shared.mark(&key).execute(&self.shared.pool);
            if let Err(error) = self
                .shared
                .settings
                .bounded("mark a release bell", marked)
                .await
            {
                tracing::debug!(%error, "could not mark a release bell");
            }
            return watch;
        }
        // A new bell connects, marks and shows its sleep.
        let settings = &self.shared.settings;
        let ready = tokio::time::timeout(
            settings.connect_timeout + settings.command_timeout,
            armed.wait_for(|on| *on),
        );
        match ready.await {
            Ok(Ok(_)) => watch,
            _ => {
                tracing::debug!(mysql.address = %self.shared.settings.address, "no release bell in time; waiting by polling");
                ReleaseWatch::none()
            }
        }
    }
}

impl Drop for Bells {
    fn drop(&mut self) {
        for (_, sleeper) in self.shared.lock().drain() {
            sleeper.task.abort();
        }
    }
}

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
        let hash = mark.trim_start_matches("\u{1}bell:").to_owned();
        Key { hash, mark }
    }
}

/// `text` as a `LIKE` pattern that matches it literally.
fn like_literal(text: &str) -> String {
    let mut pattern = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '\\' | '%' | '_') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Sleeper>> {
        self.sleepers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The statement that marks (or marks again) the name of `key`.
    fn mark<'q>(&'q self, key: &'q Key) -> Query<'q, sqlx::MySql, MySqlArguments> {
        sqlx::query(trusted(&self.sql.bell_mark)).bind(key.mark.as_bytes())
    }

    /// The statement a sleeper of this client runs for the name `key`.
    fn bell(&self, key: &str) -> String {
        format!(
            "SELECT SLEEP({PERIOD}), '{}{key} {}'",
            self.prefix, self.client
        )
    }

    /// Ends the sleep of up to [`RUNG`] other clients' sleepers of `key`,
    /// the longest first.
    async fn ring(&self, key: &str) -> sqlx::Result<()> {
        let pattern = format!(
            "{}%",
            like_literal(&format!("SELECT SLEEP({PERIOD}), '{}{key} ", self.prefix))
        );
        let mut conn = self.pool.acquire().await?;
        let sleepers: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(self.find.as_str()))
            .bind(pattern)
            .bind(self.bell(key))
            .fetch_all(&mut *conn)
            .await?;
        for id in sleepers {
            // A sleeper that went meanwhile is no error of the release's.
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
    async fn sleep(self: Arc<Self>, key: Key, armed: watch::Sender<bool>) {
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
        armed: &watch::Sender<bool>,
    ) -> Result<(), String> {
        let bell = &self.bell(&key.hash);
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
        loop {
            let marked = self.mark(key).execute(&mut conn);
            self.settings
                .bounded("mark a release bell", marked)
                .await
                .map_err(|e| e.to_string())?;
            let slept = {
                let sleeping = sqlx::raw_sql(AssertSqlSafe(bell.to_owned())).execute(&mut conn);
                tokio::pin!(sleeping);
                if *armed.borrow() {
                    sleeping.await
                } else {
                    tokio::select! {
                        slept = &mut sleeping => slept,
                        () = self.until_shown(id, bell) => {
                            armed.send_replace(true);
                            sleeping.await
                        }
                    }
                }
            };
            match slept {
                Ok(_) => {}
                Err(error) if is_interrupted(&error) => {
                    self.hub.notify(&key.hash);
                }
                Err(error) => return Err(error.to_string()),
            }
            if self.stop_if_idle(&key.hash) {
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
    fn like_patterns_match_the_bell_literally() {
        assert_eq!(
            like_literal("lockkit bell my_locks 1f"),
            r"lockkit bell my\_locks 1f"
        );
        assert_eq!(like_literal(r"50% \ x"), r"50\% \\ x");
    }

    #[test]
    fn a_key_is_the_hash_of_the_mark() {
        let key = Key::of("jobs");
        assert_eq!(key.hash.len(), 40);
        assert!(key.hash.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(key.mark, format!("\u{1}bell:{}", key.hash));
        assert_ne!(key.hash, Key::of("jobs2").hash);
    }
}
