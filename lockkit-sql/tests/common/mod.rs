//! The test harness shared by the server databases (Postgres, MariaDB): a
//! [`SqlServer`] says how to start, fault and inspect one; the rest (the
//! conformance harness and the session-mode cases) is written once.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lockkit_conformance::{Disposable, Harness};
use lockkit_core::backend::{Driver, boxed_connect};
use lockkit_core::{DistributedLock, LockError, LockOptions, LostReason, Result};
use lockkit_sql::Mode;
use lockkit_testkit::{DisposableServer, TestServer};
use tokio::time::Instant;

/// The connect timeout of every test client.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A database server of the testkit, as the shared cases need it.
#[async_trait::async_trait]
pub(crate) trait SqlServer: TestServer {
    /// Ends the lock `name` behind its holder's back: the lease row's owner is
    /// cleared; a session lock's connection is killed, and this returns once
    /// the server has let go of the lock.
    async fn revoke(&self, mode: Mode, name: &str);
    /// How many statements wait for a lock on the server, as text.
    async fn waiting_statements(&self) -> String;
    /// Runs `sql` with the server's own client: its output as text.
    async fn client_sql(&self, sql: &str) -> String;
    /// The condition that the `name` column contains `part`, in SQL.
    fn name_contains(part: &str) -> String;

    /// How many clients the server shows waiting for `name` in `mode`,
    /// where it shows them apart from `status` (see
    /// `Harness::waiting_clients`); `None` by default.
    async fn waiting_clients(&self, mode: Mode, name: &str) -> Option<usize> {
        let _ = (mode, name);
        None
    }

    /// How many rows of the lock table have a name that contains `part`
    /// (the lock's own, its permit slots', its waiting writer's).
    async fn rows_naming(&self, part: &str) -> usize {
        let out = self
            .client_sql(&format!(
                "SELECT COUNT(*) FROM lockkit_locks WHERE {}",
                Self::name_contains(part)
            ))
            .await;
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("a count: {out:?}"))
    }
}

/// Every SQL database through `lockkit_sql::connect`, for disposable servers.
const SQL_DRIVER: Driver = Driver::new(
    "sql",
    &["postgres", "postgresql", "mysql", "mariadb", "sqlite"],
    |url| boxed_connect(lockkit_sql::connect(url)),
);

/// The URL of a test client in `mode`: short timeouts and liveness period.
pub(crate) fn url<S: SqlServer>(server: &S, mode: Mode) -> String {
    format!(
        "{}?mode={mode}&connect_timeout=1s&command_timeout=2s&liveness=200ms",
        server.url()
    )
}

/// A new client of `server` in `mode`.
pub(crate) async fn connect<S: SqlServer>(
    server: &S,
    mode: Mode,
) -> Result<Arc<dyn DistributedLock>> {
    Ok(Arc::new(lockkit_sql::connect(&url(server, mode)).await?))
}

/// A 30 s lease.
pub(crate) fn opts() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(30))
}

/// The conformance harness of one mode on a server of its own.
pub(crate) struct SqlHarness<S> {
    server: S,
    mode: Mode,
    /// More URL parameters, each after a `&`.
    extra: &'static str,
}

impl<S: SqlServer> SqlHarness<S> {
    /// Starts the server.
    pub(crate) async fn start(mode: Mode) -> Self {
        Self::start_with(mode, "").await
    }

    /// Starts the server, for clients whose URLs also carry `extra`
    /// (`&name=value…`).
    pub(crate) async fn start_with(mode: Mode, extra: &'static str) -> Self {
        SqlHarness {
            server: S::start().await,
            mode,
            extra,
        }
    }

    fn url_of(&self, server: &S) -> String {
        format!("{}{}", url(server, self.mode), self.extra)
    }
}

#[async_trait::async_trait]
impl<S: SqlServer> Harness for SqlHarness<S> {
    async fn client(&self) -> Arc<dyn DistributedLock> {
        let url = self.url_of(&self.server);
        Arc::new(lockkit_sql::connect(&url).await.expect("connect"))
    }

    async fn revoke(&self, name: &str) {
        self.server.revoke(self.mode, name).await;
    }

    async fn disposable(&self) -> Box<dyn Disposable> {
        let server = S::start().await;
        let url = self.url_of(&server);
        Box::new(DisposableServer::new(server, url, SQL_DRIVER))
    }

    fn connect_timeout(&self) -> Duration {
        CONNECT_TIMEOUT
    }

    async fn stored_entries(&self, prefix: &str) -> usize {
        self.server.rows_naming(prefix).await
    }

    async fn waiting_clients(&self, name: &str) -> Option<usize> {
        self.server.waiting_clients(self.mode, name).await
    }
}

/// Killing the holder's connection: the server frees the lock at once, so
/// another client takes it without waiting for any TTL, and the holder's lost
/// signal fires within the liveness period.
pub(crate) async fn killed_holder<S: SqlServer>(mode: Mode) {
    let server = S::start().await;
    let (a, b) = (
        connect(&server, mode).await.unwrap(),
        connect(&server, mode).await.unwrap(),
    );
    let name = format!("kill-{mode}");
    let guard = a.acquire(&name, &opts()).await.unwrap();
    let lost = guard.lost();
    server.revoke(mode, &name).await;
    // Within a wait well inside the holder's 30 s lease: the server freed
    // the lock when it killed the holder, not when the lease ran out.
    let taken = b
        .acquire(&name, &opts().wait_for(Duration::from_secs(15)))
        .await
        .expect("the server frees a killed holder's lock");
    let reason = tokio::time::timeout(Duration::from_secs(20), lost)
        .await
        .expect("the liveness check notices the killed connection");
    assert_eq!(reason, LostReason::ConnectionLost);
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    taken.release().await.unwrap();
}

/// How long after a server-side kill of the holder's connection its lost
/// signal fires, with the default liveness period (1 s, or a third of the
/// TTL when that is shorter), in each of `modes` of the server called
/// `database`: at most that period after the kill. The kill comes at a
/// random point of the period, through the server's own client (a process
/// started for it, more than one for MariaDB), so its moment is known only
/// between when it was asked for and when it was done; both times are
/// reported, and the check holds the later one, which the client's start
/// and the machine's load cannot inflate, to the period plus
/// `SCHEDULING`. Prints the figures (`--no-capture`) and writes them,
/// as a table, to `target/lockkit-bench/loss-detection-<database>-summary.md`
/// (for the reports, by `scripts/reports.sh`).
#[allow(clippy::print_stdout, reason = "prints its figures for people")]
pub(crate) async fn loss_detection_after_kills<S: SqlServer>(database: &str, modes: &[Mode]) {
    /// What a busy machine may add to the liveness check's own tick and
    /// round trip.
    const SCHEDULING: Duration = Duration::from_millis(300);
    let periods = [
        (Duration::from_secs(30), Duration::from_secs(1)),
        (Duration::from_millis(1500), Duration::from_millis(500)),
    ];
    let server = S::start().await;
    let mut table = String::from(
        "| mode | TTL 30 s (check every 1 s) | TTL 1.5 s (check every 500 ms) |\n\
         | --- | --- | --- |\n",
    );
    for &mode in modes {
        let url = format!("{}?mode={mode}&connect_timeout=1s", server.url());
        let locks = lockkit_sql::connect(&url).await.expect("connect");
        let mut cells = Vec::new();
        for (ttl, period) in periods {
            let mut seen = Vec::new();
            for sample in 0..3 {
                let name = format!("detect-{mode}-{}-{sample}", ttl.as_millis());
                let guard = locks
                    .acquire(&name, &LockOptions::new().ttl(ttl))
                    .await
                    .expect("acquire");
                let lost = guard.lost();
                tokio::time::sleep(period.mul_f64(fastrand::f64())).await;
                let asked = Instant::now();
                server.revoke(mode, &name).await;
                let done = Instant::now();
                let reason = tokio::time::timeout(period + Duration::from_secs(5), lost)
                    .await
                    .expect("the lost signal fires");
                assert_eq!(reason, LostReason::ConnectionLost);
                seen.push((done.elapsed(), asked.elapsed()));
            }
            println!(
                "loss detection, {database} {mode}, ttl {ttl:?}: {seen:?} \
                 (after the kill was done, after it was asked for)"
            );
            let worst = seen.iter().map(|&(after_done, _)| after_done).max();
            assert!(
                worst.unwrap_or_default() <= period + SCHEDULING,
                "{database} {mode}, ttl {ttl:?}: the lost signal came {worst:?} after the kill \
                 was done (period {period:?}); all (after done, after asked): {seen:?}"
            );
            cells.push(
                seen.iter()
                    .map(|&(lo, hi)| format!("{}–{}", lo.as_millis(), hi.as_millis()))
                    .collect::<Vec<_>>()
                    .join(", ")
                    + " ms",
            );
        }
        table += &format!("| {database} {mode} | {} |\n", cells.join(" | "));
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .join("lockkit-bench");
    let path = dir.join(format!("loss-detection-{database}-summary.md"));
    std::fs::create_dir_all(&dir)
        .and_then(|()| {
            let command = "cargo nextest run -p lockkit-sql --all-features -E 'test(loss_detection)' --no-capture";
            std::fs::write(&path, lockkit_testkit::stamp::stamped(command, &table))
        })
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    println!("{table}written to {}", path.display());
}

/// An acquire cancelled while the server waits leaves no waiting statement
/// behind: once the holder releases, nobody holds the lock.
pub(crate) async fn cancelled_wait_leaves_nothing_behind<S: SqlServer>(mode: Mode) {
    let server = S::start().await;
    let (a, b, c) = (
        connect(&server, mode).await.unwrap(),
        connect(&server, mode).await.unwrap(),
        connect(&server, mode).await.unwrap(),
    );
    let name = format!("cancel-{mode}");
    let holder = a.acquire(&name, &opts()).await.unwrap();
    let waiting = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move { b.acquire(&name, &opts()).await }
    });
    // Until the waiter's statement is queued on the server.
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.waiting_statements().await == "0" {
        assert!(
            Instant::now() < deadline,
            "the waiter never queued on the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    let deadline = Instant::now() + Duration::from_secs(2);
    while server.waiting_statements().await != "0" {
        assert!(
            Instant::now() < deadline,
            "the cancelled wait is still queued on the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    holder.release().await.unwrap();
    // Time for a wait left behind to be granted, if one were.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let guard = c
        .try_acquire(&name, &opts())
        .await
        .unwrap()
        .expect("free after the holder released: the cancelled waiter did not get it");
    guard.release().await.unwrap();
}

/// The end of every server's `connection_failures_are_typed`: with the user
/// `app` set up to need the password `right-pw` (`url(password)` is its
/// URL), the right password connects; a wrong one is a typed `Backend` error
/// saying so, without the password in it; and a killed server answers
/// `Unavailable` within the connect timeout.
pub(crate) async fn connection_failures_are_typed<S: SqlServer>(
    server: &S,
    url: impl Fn(&str) -> String,
) {
    drop(
        lockkit_sql::connect(&url("right-pw"))
            .await
            .expect("the right password"),
    );
    let err = lockkit_sql::connect(&url("wrong-pw")).await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("authentication failed"), "{shown}");
    assert!(!shown.contains("wrong-pw"), "{shown}");
    server.kill();
    let start = Instant::now();
    let err = lockkit_sql::connect(&format!("{}?connect_timeout=1s", server.url()))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    // Refused, not hung (the timeout is 1 s; a loaded machine may be slow).
    assert!(start.elapsed() < Duration::from_secs(10));
}

/// A client that connects (and so checks the schema) while another holds a
/// lock in `mode` connects at once, sees that lock held and can take another
/// one: the schema check must not wait for the holder's transaction or
/// session.
pub(crate) async fn connects_while_held<S: SqlServer>(mode: Mode) {
    let server = S::start().await;
    let holder = connect(&server, mode).await.expect("the holder connects");
    let guard = holder.acquire("busy", &opts()).await.expect("acquire");
    // Had it waited for the holder (who holds on), it would have failed at
    // its connect timeout.
    let late = connect(&server, mode)
        .await
        .expect("a client connects while a lock is held");
    assert!(late.try_acquire("busy", &opts()).await.unwrap().is_none());
    let other = late.try_acquire("free", &opts()).await.unwrap();
    other
        .expect("another name is free")
        .release()
        .await
        .unwrap();
    guard.release().await.unwrap();
    let taken = late.try_acquire("busy", &opts()).await.unwrap();
    taken
        .expect("free after the release")
        .release()
        .await
        .unwrap();
}

/// The table the upgrade case finds made by an earlier version.
pub(crate) const UPGRADED_TABLE: &str = "upgraded_locks";

/// The token the earlier version's row `old` of [`UPGRADED_TABLE`] holds
/// (released rows then stayed, each with its name's last token).
pub(crate) const EARLIER_TOKEN: u64 = 1_000_000;

/// `server` has [`UPGRADED_TABLE`] as an earlier version left it: the
/// lease row `old`, released, with the token [`EARLIER_TOKEN`], which the
/// sequence is far below. A client of this version connects (and migrates):
/// the tokens of that name, and of a new one, are above it.
pub(crate) async fn tokens_rise_above_an_earlier_table<S: SqlServer>(server: &S) {
    let url = format!(
        "{}?mode=lease&table={UPGRADED_TABLE}&connect_timeout=1s&command_timeout=2s",
        server.url()
    );
    let locks = lockkit_sql::connect(&url).await.expect("connect");
    let mut last = EARLIER_TOKEN;
    for name in ["old", "new", "old"] {
        let guard = locks.acquire(name, &opts()).await.expect("acquire");
        let token = guard.fencing_token().expect("a token").get();
        assert!(token > last, "{name}: token {token} after {last}");
        last = token;
        guard.release().await.expect("release");
    }
}

/// In `mode` on `server`, with the clients `tweak` sets up: between two
/// grants of a client with tokens, a client without (`fencing=false`)
/// holds the name ten times, then once with each of `others` (readers,
/// permits), with no token, and its grants draw none: the second token
/// follows the first.
pub(crate) async fn tokenless_grants_draw_nothing<S: SqlServer>(
    server: &S,
    mode: Mode,
    others: &[LockOptions],
    tweak: impl Fn(lockkit_sql::SqlLockBuilder) -> lockkit_sql::SqlLockBuilder,
) {
    let client = |fencing| {
        let builder = lockkit_sql::SqlLockBuilder::from_url(&url(server, mode)).unwrap();
        tweak(builder).fencing(fencing).connect()
    };
    let (fenced, tokenless) = (client(true).await.unwrap(), client(false).await.unwrap());
    assert!(fenced.capabilities().fencing);
    let caps = tokenless.capabilities();
    assert!(!caps.fencing, "{mode}: {caps:?}");
    let name = format!("tokenless-{mode}-{:x}", fastrand::u64(..));
    let token = || async {
        let guard = fenced.acquire(&name, &opts().no_wait()).await.unwrap();
        let token = guard.fencing_token().expect("a token").get();
        guard.release().await.unwrap();
        token
    };
    let first = token().await;
    let exclusive = opts();
    for opts in std::iter::repeat_n(&exclusive, 10).chain(others) {
        let opts = opts.clone().no_wait();
        let guard = tokenless
            .acquire(&name, &opts)
            .await
            .unwrap_or_else(|e| panic!("{mode} {opts:?}: {e}"));
        assert_eq!(guard.fencing_token(), None, "{mode} {opts:?}");
        guard.release().await.unwrap();
    }
    assert_eq!(
        token().await,
        first + 1,
        "{mode}: a tokenless grant drew a token"
    );
}

/// The conformance cases about what a grant carries and what it excludes,
/// for a session mode's clients without fencing tokens (`fencing=false`):
/// their guards carry none, as their capabilities say, and every other
/// guarantee holds as with tokens.
macro_rules! tokenless_suite {
    ($harness:expr) => {
        lockkit_conformance::conformance_suite!(@cases $harness;
            mutual_exclusion_between_two_clients,
            acquire_succeeds_when_holder_releases,
            fencing_tokens_strictly_increase,
            fencing_tokens_across_kinds,
            is_current_tells_the_holding,
            guard_reports_its_state,
            status_reports_the_holder,
            local_handoffs_keep_exclusion_and_fencing,
            no_overlap_under_contention,
            two_readers_hold_together,
            semaphore_admits_exactly_its_permits,
            holder_identities_are_read_back,
            lost_signal_when_lease_deleted,
        );
    };
}
pub(crate) use tokenless_suite;
