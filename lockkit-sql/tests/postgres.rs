//! PostgreSQL in every mode (`lease`, `row`, `advisory`): the conformance
//! suite and the session-mode behaviour, against real servers started by the
//! testkit.
#![cfg(feature = "postgres")]

mod common;

use std::time::Duration;

use common::{SqlHarness, SqlServer, connect, opts};
use lockkit_core::{DistributedLock, LockError};
use lockkit_sql::Mode;
use lockkit_testkit::PostgresServer;
use lockkit_testkit::{TestServer, waiter};
use tokio::time::Instant;

/// A string literal for psql (test names only).
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[async_trait::async_trait]
impl SqlServer for PostgresServer {
    /// The lease row's owner is cleared; a session lock's backend is
    /// terminated (waiting until it is gone).
    async fn revoke(&self, mode: Mode, name: &str) {
        let sql = match mode {
            Mode::Lease => format!(
                "UPDATE lockkit_locks SET owner = NULL, expires_at = now() \
                 WHERE name = {} AND owner IS NOT NULL RETURNING 1",
                literal(name)
            ),
            Mode::Advisory => {
                let key = lockkit_sql::advisory_key(name) as u64;
                format!(
                    "SELECT pg_terminate_backend(pid, 5000) FROM pg_locks \
                     WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
                     AND classid = {} AND objid = {}",
                    key >> 32,
                    key & 0xffff_ffff
                )
            }
            _ => format!(
                "CREATE EXTENSION IF NOT EXISTS pgrowlocks; \
                 SELECT pg_terminate_backend(pid, 5000) FROM lockkit_locks l \
                 JOIN pgrowlocks('lockkit_locks') r ON r.locked_row = l.ctid, unnest(r.pids) AS pid \
                 WHERE l.name = {}",
                literal(name)
            ),
        };
        let out = self.psql(&sql).await.expect("revoke");
        assert!(
            out.lines().any(|l| l == "1" || l == "t"),
            "nothing of {name:?} to revoke: {out:?}"
        );
    }

    async fn waiting_statements(&self) -> String {
        self.psql("SELECT count(*) FROM pg_locks WHERE NOT granted")
            .await
            .unwrap()
    }

    async fn client_sql(&self, sql: &str) -> String {
        self.psql(sql).await.expect("the server's client")
    }

    fn name_contains(part: &str) -> String {
        format!("strpos(name, {}) > 0", literal(part))
    }
}

mod lease {
    use super::*;
    lockkit_conformance::conformance_suite!(SqlHarness::<PostgresServer>::start(Mode::Lease).await);
}

mod row {
    use super::*;
    lockkit_conformance::conformance_suite!(SqlHarness::<PostgresServer>::start(Mode::Row).await);
}

mod advisory {
    use super::*;
    lockkit_conformance::conformance_suite!(
        SqlHarness::<PostgresServer>::start(Mode::Advisory).await
    );
}

mod advisory_tokenless {
    use super::*;
    common::tokenless_suite!(
        SqlHarness::<PostgresServer>::start_with(Mode::Advisory, "&fencing=false").await
    );
}

mod row_tokenless {
    use super::*;
    common::tokenless_suite!(
        SqlHarness::<PostgresServer>::start_with(Mode::Row, "&fencing=false").await
    );
}

/// Clients without tokens (`fencing=false`) draw none from the sequence, in
/// `advisory` and `row` mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenless_grants_draw_nothing() {
    let server = PostgresServer::start().await;
    let others = [opts().shared(), opts().semaphore(2)];
    for mode in [Mode::Advisory, Mode::Row] {
        common::tokenless_grants_draw_nothing(&server, mode, &others, |b| b).await;
    }
}

/// `pg_terminate_backend` of the holder's connection frees the lock at once
/// and fires the holder's lost signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_terminated_holder() {
    common::killed_holder::<PostgresServer>(Mode::Advisory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_terminated_holder() {
    common::killed_holder::<PostgresServer>(Mode::Row).await;
}

/// With the default liveness period, a terminated holder is told within
/// it (1 s, or a third of the TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_detection_after_kills() {
    common::loss_detection_after_kills::<PostgresServer>("postgres", &[Mode::Advisory, Mode::Row])
        .await;
}

/// A new client connects (and checks the schema) while a lock is held,
/// in every mode, without waiting for the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_connects_while_held() {
    for mode in [Mode::Row, Mode::Advisory, Mode::Lease] {
        common::connects_while_held::<PostgresServer>(mode).await;
    }
}

/// A cancelled wait is dropped by the server within its client check interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_cancelled_wait_leaves_nothing_behind() {
    common::cancelled_wait_leaves_nothing_behind::<PostgresServer>(Mode::Advisory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_cancelled_wait_leaves_nothing_behind() {
    common::cancelled_wait_leaves_nothing_behind::<PostgresServer>(Mode::Row).await;
}

/// The advisory key is the documented one: a plain client holding
/// `pg_advisory_lock(advisory_key(name))` blocks lockkit, and vice versa.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_key_interoperates() {
    let server = PostgresServer::start().await;
    let locks = connect(&server, Mode::Advisory).await.unwrap();
    let guard = locks.acquire("job", &opts()).await.unwrap();
    let key = lockkit_sql::advisory_key("job");
    assert_eq!(
        server
            .psql(&format!("SELECT pg_try_advisory_lock({key})"))
            .await
            .unwrap(),
        "f"
    );
    guard.release().await.unwrap();
    assert_eq!(
        server
            .psql(&format!("SELECT pg_try_advisory_lock({key})"))
            .await
            .unwrap(),
        "t"
    );
}

/// Shared advisory locks are Postgres' own: a psql session holding
/// `pg_advisory_lock_shared(advisory_key(name))` shares the name with
/// lockkit's readers and keeps its writer out; lockkit's writer keeps psql's
/// readers out, and its readers let them in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_shared_locks_interoperate_with_psql() {
    let server = PostgresServer::start().await;
    let locks = connect(&server, Mode::Advisory).await.unwrap();
    let key = lockkit_sql::advisory_key("report");
    let psql_try = |shared: bool| {
        let function = if shared {
            "pg_try_advisory_lock_shared"
        } else {
            "pg_try_advisory_lock"
        };
        let sql = format!("SELECT {function}({key})");
        let server = &server;
        async move { server.psql(&sql).await.unwrap() }
    };
    let hold_shared = format!("SELECT pg_advisory_lock_shared({key}); SELECT pg_sleep(2)");
    let psql_reader = server.psql(&hold_shared);
    let beside_it = async {
        let deadline = Instant::now() + Duration::from_secs(3);
        while !locks.status("report").await.unwrap().held {
            assert!(Instant::now() < deadline, "psql's shared lock never showed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let reader = locks
            .try_acquire("report", &opts().shared())
            .await
            .unwrap()
            .expect("lockkit's reader shares the name with psql's");
        assert_eq!(locks.status("report").await.unwrap().holders, Some(2));
        assert!(
            locks
                .try_acquire("report", &opts())
                .await
                .unwrap()
                .is_none(),
            "lockkit's writer got in beside psql's reader"
        );
        assert_eq!(psql_try(true).await, "t", "psql's reader beside lockkit's");
        assert_eq!(
            psql_try(false).await,
            "f",
            "psql's writer beside lockkit's reader"
        );
        reader.release().await.unwrap();
    };
    let (psql, ()) = tokio::join!(psql_reader, beside_it);
    psql.unwrap();
    let writer = locks.acquire("report", &opts()).await.unwrap();
    assert_eq!(
        psql_try(true).await,
        "f",
        "psql's reader beside lockkit's writer"
    );
    writer.release().await.unwrap();
    assert_eq!(psql_try(true).await, "t");
}

/// A semaphore's permits are advisory locks on its documented slot keys: a
/// psql session holding slot 0 of a 2-permit semaphore leaves lockkit one
/// permit; lockkit holding both leaves psql none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_semaphore_slots_interoperate_with_psql() {
    let server = PostgresServer::start().await;
    let locks = connect(&server, Mode::Advisory).await.unwrap();
    let slots = [0, 1].map(|slot| lockkit_sql::semaphore_slot_key("transcoders", slot));
    let permit = opts().semaphore(2);
    let hold_slot = format!("SELECT pg_advisory_lock({}); SELECT pg_sleep(2)", slots[0]);
    let psql_holder = server.psql(&hold_slot);
    let beside_it = async {
        let deadline = Instant::now() + Duration::from_secs(3);
        while !locks
            .status_of("transcoders", permit.kind())
            .await
            .unwrap()
            .held
        {
            assert!(Instant::now() < deadline, "psql's slot never showed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let one = locks
            .try_acquire("transcoders", &permit)
            .await
            .unwrap()
            .expect("the slot psql does not hold");
        assert!(
            locks
                .try_acquire("transcoders", &permit)
                .await
                .unwrap()
                .is_none()
        );
        one
    };
    let (psql, one) = tokio::join!(psql_holder, beside_it);
    psql.unwrap();
    let two = locks.acquire("transcoders", &permit).await.unwrap();
    for slot in slots {
        let sql = format!("SELECT pg_try_advisory_lock({slot})");
        assert_eq!(server.psql(&sql).await.unwrap(), "f", "slot {slot} is held");
    }
    one.release().await.unwrap();
    two.release().await.unwrap();
}

/// A semaphore of more permit slots than `advisory` mode keeps is refused
/// before anything is sent, not tried key by key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_semaphores_have_at_most_max_slot_permits() {
    let server = PostgresServer::start().await;
    let locks = connect(&server, Mode::Advisory).await.unwrap();
    let most = opts().semaphore(lockkit_sql::MAX_SLOT_PERMITS);
    let guard = locks
        .try_acquire("wide", &most)
        .await
        .unwrap()
        .expect("free");
    guard.release().await.unwrap();
    let too_many = opts().semaphore(lockkit_sql::MAX_SLOT_PERMITS + 1);
    for result in [
        locks.try_acquire("wide", &too_many).await.map(drop),
        locks.acquire("wide", &too_many).await.map(drop),
    ] {
        let err = result.unwrap_err();
        assert!(matches!(err, LockError::Unsupported { .. }), "{err}");
        assert!(err.to_string().contains("256 permits"), "{err}");
    }
}

/// Lease-mode waiters are woken by `NOTIFY` on release, not by polling: a
/// waiter whose backoff would sleep for seconds still takes the lock within
/// milliseconds of the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_waiters_are_notified() {
    let server = PostgresServer::start().await;
    let (a, b) = (
        connect(&server, Mode::Lease).await.unwrap(),
        connect(&server, Mode::Lease).await.unwrap(),
    );
    assert!(b.capabilities().notified_wait);
    let holder = a.acquire("notified", &opts()).await.unwrap();
    let slow_backoff =
        opts()
            .wait_for(Duration::from_secs(20))
            .backoff(lockkit_core::Backoff::new(
                Duration::from_secs(5),
                Duration::from_secs(10),
            ));
    let waiter = tokio::spawn(async move {
        let guard = b.acquire("notified", &slow_backoff).await.unwrap();
        let at = Instant::now();
        guard.release().await.unwrap();
        at
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let acquired = waiter.await.unwrap();
    let handoff = acquired - released;
    assert!(handoff < Duration::from_secs(1), "handoff took {handoff:?}");
}

/// A writer granted after waiting withdraws its waiting record without a
/// `NOTIFY` (nobody can be granted while it holds, and its release wakes
/// them; and every listening session's server process reads each
/// notification): the table's channel carries only the release that
/// nobody waited for. (The first release wakes the waiting client on its
/// own channel.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_waiter_withdraws_its_record_without_a_wake_up() {
    let server = PostgresServer::start().await;
    let name = "withdrawn-quietly";
    let channel = "lockkit_lockkit_locks";
    let mut listener = sqlx::postgres::PgListener::connect(&server.url())
        .await
        .unwrap();
    listener.listen(channel).await.unwrap();
    let (holder, waiter) = (
        connect(&server, Mode::Lease).await.unwrap(),
        connect(&server, Mode::Lease).await.unwrap(),
    );
    let held = holder.acquire(name, &opts()).await.unwrap();
    let task = waiter::spawn_patient_acquire(waiter, name);
    let records = r"SELECT count(*) FROM lockkit_locks WHERE name LIKE E'\001waiting:%'";
    let places = r"SELECT count(*) FROM lockkit_locks WHERE name LIKE E'\001queue:%'";
    assert!(
        lockkit_testkit::eventually(Duration::from_secs(30), || async {
            server.psql(records).await.unwrap().trim() == "1"
                && server.psql(places).await.unwrap().trim() == "1"
        })
        .await,
        "the waiter never recorded itself and took its place in line"
    );
    let (guard, _) = waiter::hand_over(held, task).await;
    assert_eq!(
        server.psql(records).await.unwrap().trim(),
        "0",
        "the granted writer withdrew its record"
    );
    guard.release().await.unwrap();
    assert_eq!(
        notified(&server, &mut listener).await,
        [(channel.to_owned(), name.to_owned())],
        "one wake-up of {name:?} on the table's channel: the release nobody waited for"
    );
}

/// The notifications `listener` receives before a marker sent now on the
/// table's channel: (channel, payload) pairs.
async fn notified(
    server: &PostgresServer,
    listener: &mut sqlx::postgres::PgListener,
) -> Vec<(String, String)> {
    server
        .psql("NOTIFY lockkit_lockkit_locks, 'end'")
        .await
        .unwrap();
    let mut seen = Vec::new();
    loop {
        let note = tokio::time::timeout(Duration::from_secs(30), listener.recv())
            .await
            .expect("the end marker arrives")
            .unwrap();
        if note.payload() == "end" {
            return seen;
        }
        seen.push((note.channel().to_owned(), note.payload().to_owned()));
    }
}

/// Waits (`within` at most) until `n` bell sessions
/// (`lockkit-bell-<client>`) are open on `server`; panics with `what`
/// otherwise.
async fn until_bells(server: &PostgresServer, n: usize, within: Duration, what: &str) {
    let bells =
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'lockkit-bell-%'";
    let want = n.to_string();
    assert!(
        lockkit_testkit::eventually(within, || async {
            server.psql(bells).await.unwrap().trim() == want
        })
        .await,
        "{what}"
    );
}

/// A release with clients in the name's line reserves the row for the
/// client at its head and wakes that client alone, by its bell (a session
/// of its own, `lockkit-bell-<client>`), with no `NOTIFY`: every listening
/// session's server process reads each notification. The clients are
/// served in the order they came, each leaving the line as its turn comes.
/// A release that nobody waits for notifies the table's channel, which
/// wakes every client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_goes_to_the_client_first_in_line() {
    let server = PostgresServer::start().await;
    let name = "first-in-line";
    let channel = "lockkit_lockkit_locks";
    let places = r"SELECT count(*) FROM lockkit_locks WHERE name LIKE E'\001queue:%'";
    let line = format!(
        r"SELECT string_agg(owner, ',' ORDER BY fence) FROM lockkit_locks WHERE name LIKE E'\001queue:{name}\001%'"
    );
    let holder = connect(&server, Mode::Lease).await.unwrap();
    let held = holder.acquire(name, &opts()).await.unwrap();
    let mut waiters = Vec::new();
    for n in 1..=3 {
        let client = connect(&server, Mode::Lease).await.unwrap();
        waiters.push(waiter::spawn_patient_acquire(client, name));
        assert!(
            lockkit_testkit::eventually(Duration::from_secs(30), || async {
                server.psql(places).await.unwrap().trim() == n.to_string()
            })
            .await,
            "waiting client {n} never took its place in line"
        );
    }
    until_bells(
        &server,
        3,
        Duration::from_secs(30),
        "the waiting clients' bells never showed",
    )
    .await;
    let order = server.psql(&line).await.unwrap();
    let order: Vec<String> = order
        .trim()
        .split(',')
        .map(|c| format!("lockkit-{c}"))
        .collect();
    assert_eq!(order.len(), 3, "{order:?}");
    let mut listener = sqlx::postgres::PgListener::connect(&server.url())
        .await
        .unwrap();
    let mut channels: Vec<&str> = order.iter().map(String::as_str).collect();
    channels.push(channel);
    listener.listen_all(channels).await.unwrap();
    held.release().await.unwrap();
    assert_eq!(
        notified(&server, &mut listener).await,
        [],
        "the release rings the bell of the client that came first, and notifies no one"
    );
    // Each waiter in its turn, in the order they came.
    for (turn, waiting) in waiters.into_iter().enumerate() {
        let (guard, _) = waiting.await.expect("a waiting task");
        guard
            .unwrap_or_else(|e| panic!("waiter {turn}'s acquire: {e}"))
            .release()
            .await
            .unwrap();
    }
    assert_eq!(
        server.psql(places).await.unwrap().trim(),
        "0",
        "each client left the line when its turn came"
    );
    let _ = notified(&server, &mut listener).await;
    // The holder's client found a line at its last release of the name, so
    // its next release runs the statement that serves the line at once:
    // with the line empty, that one frees the row as the other would.
    let again = holder.acquire(name, &opts()).await.unwrap();
    again.release().await.unwrap();
    assert_eq!(
        notified(&server, &mut listener).await,
        [(channel.to_owned(), name.to_owned())],
        "with nobody in line, a release wakes every client"
    );
    let rows = format!("SELECT count(*) FROM lockkit_locks WHERE name = '{name}'");
    assert_eq!(
        server.psql(&rows).await.unwrap().trim(),
        "0",
        "a release with nobody in line leaves no row"
    );
}

/// A client first in line whose bell is away (here a place written by
/// hand, as a client of an earlier version would have it) is woken on its
/// own channel, `lockkit-<client>`, and no one else is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_bell_is_notified_on_its_own_channel() {
    let server = PostgresServer::start().await;
    let name = "bell-away";
    let holder = connect(&server, Mode::Lease).await.unwrap();
    let held = holder.acquire(name, &opts()).await.unwrap();
    let client = "00000000bel1away";
    server
        .psql(&format!(
            "INSERT INTO lockkit_locks (name, owner, fence, expires_at) \
             VALUES (chr(1) || 'queue:{name}' || chr(1) || '{client}', '{client}', \
                     nextval('lockkit_locks_fence_seq'), now() + interval '1 minute')"
        ))
        .await
        .unwrap();
    let mut listener = sqlx::postgres::PgListener::connect(&server.url())
        .await
        .unwrap();
    let own = format!("lockkit-{client}");
    listener
        .listen_all([own.as_str(), "lockkit_lockkit_locks"])
        .await
        .unwrap();
    held.release().await.unwrap();
    assert_eq!(
        notified(&server, &mut listener).await,
        [(own, name.to_owned())],
        "the release notifies the client first in line on its own channel"
    );
    let reserved =
        format!("SELECT owner = chr(1) || 'for:{client}' FROM lockkit_locks WHERE name = '{name}'");
    assert_eq!(
        server.psql(&reserved).await.unwrap().trim(),
        "t",
        "the row is reserved for that client"
    );
}

/// A client's bell session (`lockkit-bell-<client>`) opens while a waiter
/// of the client waits, and closes once the client has waited for nothing
/// for a while (10 s), the client still open: an idle client keeps no bell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bell_closes_once_its_client_waits_no_more() {
    let server = PostgresServer::start().await;
    let name = "idle-bell";
    let holder = connect(&server, Mode::Lease).await.unwrap();
    let waiter = connect(&server, Mode::Lease).await.unwrap();
    let held = holder.acquire(name, &opts()).await.unwrap();
    let task = waiter::spawn_patient_acquire(waiter.clone(), name);
    until_bells(
        &server,
        1,
        Duration::from_secs(30),
        "the waiting client's bell never opened",
    )
    .await;
    let (guard, _) = waiter::hand_over(held, task).await;
    guard.release().await.unwrap();
    // It closes 10 s after the wait.
    until_bells(
        &server,
        0,
        Duration::from_secs(60),
        "the bell of a client that waits no more stayed open",
    )
    .await;
    // The client still works, and its next waiter opens a bell again.
    let held = holder.acquire(name, &opts()).await.unwrap();
    let task = waiter::spawn_patient_acquire(waiter.clone(), name);
    until_bells(
        &server,
        1,
        Duration::from_secs(30),
        "the bell did not open again",
    )
    .await;
    let (guard, _) = waiter::hand_over(held, task).await;
    guard.release().await.unwrap();
    drop(waiter);
}

/// A release may reserve a name for a client just as its last waiter stops
/// (gives up, or is cancelled), before the client has left the line. When
/// the notification comes on that client's own channel, it finds no waiter
/// for the name and passes the turn on: here, with nobody else in line,
/// the reserved row goes at once rather than when the reservation runs out
/// (a minute, here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_no_waiter_wants_is_passed_on() {
    let server = PostgresServer::start().await;
    let name = "unwanted";
    let place =
        format!(r"SELECT owner FROM lockkit_locks WHERE name LIKE E'\001queue:{name}\001%'");
    let holder = connect(&server, Mode::Lease).await.unwrap();
    let held = holder.acquire(name, &opts()).await.unwrap();
    let client = connect(&server, Mode::Lease).await.unwrap();
    let watch = client.watch_releases(name).await.unwrap();
    let owner = server.psql(&place).await.unwrap().trim().to_owned();
    assert!(
        !owner.is_empty(),
        "the watching client took a place in line"
    );
    drop(watch);
    assert!(
        lockkit_testkit::eventually(Duration::from_secs(30), || async {
            server.psql(&place).await.unwrap().trim().is_empty()
        })
        .await,
        "the client left the line when its waiter stopped"
    );
    // The holder's release, had it come a moment earlier: the row reserved
    // for the client that was in line, and that client notified.
    let reserved = server
        .psql(&format!(
            "UPDATE lockkit_locks SET owner = chr(1) || 'for:' || {owner}, \
                 expires_at = now() + interval '60 seconds' \
             WHERE name = {name} RETURNING 1; \
             SELECT pg_notify('lockkit-' || {owner}, {name})",
            owner = literal(&owner),
            name = literal(name),
        ))
        .await
        .unwrap();
    assert!(reserved.lines().any(|l| l == "1"), "{reserved:?}");
    assert!(
        lockkit_testkit::eventually(Duration::from_secs(30), || async {
            let rows = format!(
                "SELECT count(*) FROM lockkit_locks WHERE name = {}",
                literal(name)
            );
            server.psql(&rows).await.unwrap().trim() == "0"
        })
        .await,
        "the client did not pass on the turn nobody wanted"
    );
    let other = connect(&server, Mode::Lease).await.unwrap();
    let status = other.status(name).await.unwrap();
    assert!(!status.held, "the name is free: {status:?}");
    drop(held);
}

/// `advisory` mode tries first: a free lock is taken by the try form
/// (`pg_try_advisory_lock`), which sets no `lock_timeout`; only a refused
/// acquire sends the waiting form, which sets it and joins the server's
/// queue. (Each session's last statement, as the server shows it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_acquire_waits_only_after_a_refused_try() {
    let server = PostgresServer::start().await;
    let name = "tried-first";
    let (holder, waiter) = (
        connect(&server, Mode::Advisory).await.unwrap(),
        connect(&server, Mode::Advisory).await.unwrap(),
    );
    let held = holder.acquire(name, &opts()).await.unwrap();
    let last = "SELECT query FROM pg_stat_activity \
                WHERE query LIKE '%advisory_lock%' AND pid <> pg_backend_pid()";
    let taken = server.psql(last).await.unwrap();
    assert!(
        taken.contains("pg_try_advisory_lock(") && !taken.contains("set_config"),
        "a free lock is taken by the try form alone: {taken:?}"
    );
    let task = waiter::spawn_patient_acquire(waiter, name);
    let queued = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
    assert!(
        lockkit_testkit::eventually(Duration::from_secs(30), || async {
            server.psql(queued).await.unwrap().trim() == "1"
        })
        .await,
        "the waiter never joined the server's queue"
    );
    let waiting = server
        .psql("SELECT query FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        .await
        .unwrap();
    assert!(
        waiting.contains("set_config('lock_timeout'") && waiting.contains("pg_advisory_lock("),
        "a refused acquire waits in the waiting form: {waiting:?}"
    );
    let (guard, _) = waiter::hand_over(held, task).await;
    guard.release().await.unwrap();
}

/// `migrate` can run again, the table name is configurable, and without
/// migration a missing table is a clear backend error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_idempotent_and_table_is_configurable() {
    let server = PostgresServer::start().await;
    let url = format!("{}?table=other_locks", server.url());
    let locks = lockkit_sql::connect(&url).await.unwrap();
    assert_eq!(locks.table(), "other_locks");
    locks.migrate().await.unwrap();
    locks.migrate().await.unwrap();
    let guard = locks.acquire("x", &opts()).await.unwrap();
    assert_eq!(
        server
            .psql("SELECT name FROM other_locks WHERE owner IS NOT NULL")
            .await
            .unwrap(),
        "x"
    );
    guard.release().await.unwrap();
    let without = lockkit_sql::connect(&format!("{}?table=never_made&migrate=false", server.url()))
        .await
        .unwrap();
    let err = without.try_acquire("x", &opts()).await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err}");
}

/// Bad credentials and unreachable servers give typed errors without secrets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_failures_are_typed() {
    let server = PostgresServer::start().await;
    server
        .psql("CREATE ROLE app LOGIN PASSWORD 'right-pw'; GRANT ALL ON SCHEMA public TO app")
        .await
        .unwrap();
    // The server trusts local connections; make it check app's password.
    let hba = server.data_dir().join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!("host all app 127.0.0.1/32 scram-sha-256\n{rules}"),
    )
    .unwrap();
    assert_eq!(server.psql("SELECT pg_reload_conf()").await.unwrap(), "t");
    let port = server.port();
    common::connection_failures_are_typed(&server, |password| {
        format!("postgres://app:{password}@127.0.0.1:{port}/postgres")
    })
    .await;
}

/// A table of an earlier version: the first connect raises the sequence
/// above its rows' tokens.
#[tokio::test]
async fn tokens_rise_above_an_earlier_table() {
    let server = PostgresServer::start().await;
    server
        .psql(&format!(
            "CREATE TABLE {t} (name text COLLATE \"C\" PRIMARY KEY, owner text, \
                 fence bigint NOT NULL, expires_at timestamptz NOT NULL); \
             CREATE SEQUENCE {t}_fence_seq; \
             INSERT INTO {t} VALUES ('old', NULL, {token}, now())",
            t = common::UPGRADED_TABLE,
            token = common::EARLIER_TOKEN
        ))
        .await
        .expect("make the earlier table");
    common::tokens_rise_above_an_earlier_table(&server).await;
}

/// A waiter whose `LISTEN` connection is terminated still hears the
/// holder's release: the listener connects and listens again, and the wait
/// goes on, well before its 10 s backoff.
#[tokio::test]
async fn waiter_is_woken_after_its_listen_connection_is_terminated() {
    let server = PostgresServer::start().await;
    let (holder, waiter) = (
        connect(&server, Mode::Lease).await.unwrap(),
        connect(&server, Mode::Lease).await.unwrap(),
    );
    let held = holder.acquire("relisten", &opts()).await.unwrap();
    let task = waiter::spawn_patient_acquire(waiter, "relisten");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let listening = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'";
    assert_eq!(
        server.psql(listening).await.unwrap().trim(),
        "1",
        "the waiter's client listens"
    );
    let terminated = server
        .psql(
            "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity \
             WHERE query LIKE 'LISTEN%'",
        )
        .await
        .unwrap();
    assert_eq!(terminated.trim(), "1", "the listener terminated");
    // Time for the client to notice and listen again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        server.psql(listening).await.unwrap().trim(),
        "1",
        "listening again"
    );
    let (guard, handoff) = waiter::hand_over(held, task).await;
    assert!(
        handoff < Duration::from_secs(2),
        "handoff took {handoff:?} after the LISTEN connection was terminated"
    );
    guard.release().await.unwrap();
}

/// Sends `signal` (`STOP`, `CONT`) to a backend of the test's own server.
fn signal_backend(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}: {status}");
}

/// Continues a stopped backend however the test ends.
struct Stopped(u32);

impl Drop for Stopped {
    fn drop(&mut self) {
        signal_backend(self.0, "CONT");
    }
}

/// `row` mode: a release hands the name's gate to the first waiter at once,
/// but that waiter locks the row only once its backend runs. The releasing
/// client's clean-up of the row must leave it to that waiter even when the
/// waiter is slow to run (here: its backend stopped); deleting it sent the
/// waiter, finding no row, to the back of the queue to make it again, behind
/// a waiter that came later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_release_leaves_the_row_to_a_waiter_handed_the_gate() {
    let server = PostgresServer::start().await;
    let name = "handed-the-gate";
    let holder = connect(&server, Mode::Row).await.unwrap();
    let guard = holder.acquire(name, &opts()).await.unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    let mut stopped = None;
    for i in 0..2 {
        let client = connect(&server, Mode::Row).await.unwrap();
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let wait = opts().wait_for(Duration::from_secs(20));
            let guard = client.acquire(name, &wait).await?;
            order.lock().unwrap().push(i);
            guard.release().await.map(drop)
        }));
        lockkit_conformance::until_queued(holder.as_ref(), name, i + 1).await;
        if i == 0 {
            let pid = server
                .psql(
                    "SELECT pid FROM pg_locks \
                     WHERE locktype = 'advisory' AND objsubid = 2 AND NOT granted",
                )
                .await
                .unwrap();
            let pid = pid.trim().parse().expect("one waiting backend");
            signal_backend(pid, "STOP");
            stopped = Some(Stopped(pid));
        }
    }
    guard.release().await.unwrap();
    let rows = format!("SELECT count(*) FROM lockkit_locks WHERE name = '{name}'");
    let left = server.psql(&rows).await.unwrap();
    drop(stopped);
    assert_eq!(
        left.trim(),
        "1",
        "the row was deleted under the first waiter"
    );
    for waiter in waiters {
        waiter
            .await
            .expect("a waiter task")
            .expect("a waiter's lock");
    }
    assert_eq!(*order.lock().unwrap(), [0, 1], "the waiters' order");
}
