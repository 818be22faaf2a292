#![allow(clippy::print_stdout)]
//! lockkit-zk against one real standalone ZooKeeper server, in one process
//! and one run, so that the ratios between the measurements are meaningful on
//! a noisy machine.
//!
//! * `zk_cycle/raw_floor` (a): the physical floor of a lock cycle, hand-written
//!   with the `zookeeper-client` crate on its own session: `create` an
//!   `EPHEMERAL_SEQUENTIAL` node under a lock directory (created once, before
//!   any timing), `list_children` of the directory, `delete` the node.
//! * `zk_cycle/raw_create`: only the `create` of such a node, on the same
//!   session (the node is deleted after each create, outside the timing): the
//!   yardstick of the handoff.
//! * `zk_cycle/diag_raw_list` (diagnostic): one `list_children` of that
//!   directory, a read round trip, to split the floor into reads and writes.
//! * `zk_cycle/lockkit_zk_cycle` (b) and `lockkit_zk_cycle_renew` (c): `acquire`
//!   + `release` of an uncontended lock, watchdog renewal off / on.
//! * `zk_handoff/handoff` (d): from the holder's `release()` call to the moment
//!   a waiter on another client (its own session), already inside `acquire`
//!   with its node queued and its predecessor watch set, gets the lock. Each
//!   handoff is paired with a `raw_create` timed just before it.
//!
//! The targets are judged on paired measurements: (b)/(a) ≤ 1.15 over the
//! interleaved rounds run after the criterion groups, and the median handoff
//! ≤ 2 × the median of the raw creates paired with the handoffs. After every
//! batch of cycles (outside the timing) the cycle's lock directory is checked
//! to hold no node any more.
//!
//! Run with `cargo bench -p lockkit-benches --bench zk`; the summary is printed
//! at the end and written to `target/lockkit-bench/zk-summary.md`.
//! `LOCKKIT_BENCH_QUICK=1` shrinks everything to a smoke test, as does
//! criterion's `-- --test` (which runs each benchmark once and writes no
//! estimates, so the criterion table is left out).

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use criterion::Criterion;
use lockkit_benches::{
    CycleFixture, CycleKind, Estimates, HandoffDiag, HandoffProbe, Handoffs, Interleaved, Limit,
    RunMode, bench_then_pair, lockkit_cycle, save_summary, zk_children, zk_create_node,
    zk_delete_node, zk_raw_cycle, zk_session,
};
use lockkit_core::LockOptions;
use lockkit_testkit::TestServer;
use lockkit_testkit::ZkServer;
use lockkit_zk::ZkLock;
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode};

const CYCLE_GROUP: &str = "zk_cycle";
const HANDOFF_GROUP: &str = "zk_handoff";
const TTL: Duration = Duration::from_secs(30);

/// lockkit's root node: lock `name` lives at `/bench/<name>`.
const LOCK_ROOT: &str = "bench";
const NO_RENEW_NAME: &str = "bench-zk-cycle";
const RENEW_NAME: &str = "bench-zk-cycle-renew";
const HANDOFF_NAME: &str = "bench-zk-handoff";

/// The lock directory of the raw floor (a persistent node).
const RAW_DIR: &str = "/bench-raw/floor";
/// Where the raw creates put their nodes (a persistent node).
const CREATE_DIR: &str = "/bench-raw/create";

fn main() {
    let mode = RunMode::from_env();
    let runtime = lockkit_benches::runtime();
    // Estimates older than this belong to an earlier run.
    let run_started = SystemTime::now();
    let server = runtime.block_on(ZkServer::start());

    let fixture = runtime.block_on(Fixture::new(&server));

    let Some((handoff, paired)) = bench_then_pair(&runtime, CYCLE_GROUP, &fixture, mode, |c| {
        bench_handoff(c, &runtime, &server, &fixture, mode)
    }) else {
        return;
    };

    save_summary(mode, "zk", &summary(mode, run_started, &paired, &handoff));
    // The sessions end before the server does.
    drop(fixture);
    drop(server);
}

/// lockkit's lock directory of `name`.
fn lock_dir(name: &str) -> String {
    format!("/{LOCK_ROOT}/{}", lockkit_zk::encode_name(name))
}

/// One uncontended cycle of each kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cycle {
    Raw,
    RawCreate,
    RawList,
    NoRenew,
    Renew,
}

impl CycleKind for Cycle {
    const ALL: &'static [Cycle] = &[
        Cycle::Raw,
        Cycle::RawCreate,
        Cycle::RawList,
        Cycle::NoRenew,
        Cycle::Renew,
    ];

    /// The criterion benchmark id within [`CYCLE_GROUP`].
    fn bench(self) -> &'static str {
        match self {
            Cycle::Raw => "raw_floor",
            Cycle::RawCreate => "raw_create",
            Cycle::RawList => "diag_raw_list",
            Cycle::NoRenew => "lockkit_zk_cycle",
            Cycle::Renew => "lockkit_zk_cycle_renew",
        }
    }
}

/// The clients of the uncontended cycles, shared by the criterion group and
/// the interleaved rounds; the raw session is also the handoff's admin.
struct Fixture {
    raw: Client,
    locks: ZkLock,
}

impl Fixture {
    async fn new(server: &ZkServer) -> Fixture {
        let raw = zk_session(&server.connect_string()).await;
        let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
        for dir in [RAW_DIR, CREATE_DIR] {
            raw.mkdir(dir, &persistent).await.expect("mkdir");
        }
        let locks = lockkit_zk::connect(&server.url_at(LOCK_ROOT))
            .await
            .expect("lockkit-zk connects");
        let fixture = Fixture { raw, locks };
        // Outside every measurement: lockkit creates its lock directories on
        // the first acquire.
        for &kind in Cycle::ALL {
            for _ in 0..3 {
                fixture.run(kind).await;
            }
            fixture.after_batch(kind).await;
        }
        fixture
    }

    /// (a): create our node, list the directory (ours must be the only
    /// contender, so the lock is ours), delete the node.
    async fn raw_cycle(&self) {
        zk_raw_cycle(&self.raw, RAW_DIR).await;
    }

    /// The directory whose nodes a cycle of `kind` creates.
    fn dir(kind: Cycle) -> String {
        match kind {
            Cycle::Raw | Cycle::RawList => RAW_DIR.to_owned(),
            Cycle::RawCreate => CREATE_DIR.to_owned(),
            Cycle::NoRenew => lock_dir(NO_RENEW_NAME),
            Cycle::Renew => lock_dir(RENEW_NAME),
        }
    }
}

impl CycleFixture for Fixture {
    type Kind = Cycle;

    async fn run(&self, kind: Cycle) {
        self.run_timed(kind).await;
    }

    async fn run_timed(&self, kind: Cycle) -> Duration {
        let started = Instant::now();
        match kind {
            Cycle::Raw => self.raw_cycle().await,
            Cycle::RawCreate => {
                let path = zk_create_node(&self.raw, CREATE_DIR).await;
                let took = started.elapsed();
                zk_delete_node(&self.raw, &path).await;
                return took;
            }
            Cycle::RawList => {
                zk_children(&self.raw, RAW_DIR).await;
            }
            Cycle::NoRenew => {
                let opts = LockOptions::new().ttl(TTL).auto_renew(false);
                lockkit_cycle(&self.locks, NO_RENEW_NAME, &opts).await;
            }
            Cycle::Renew => {
                lockkit_cycle(&self.locks, RENEW_NAME, &LockOptions::new().ttl(TTL)).await;
            }
        }
        started.elapsed()
    }

    /// Checks that the cycles left no node behind.
    async fn after_batch(&self, kind: Cycle) {
        let dir = Self::dir(kind);
        let left = zk_children(&self.raw, &dir).await;
        assert!(
            left.is_empty(),
            "{}: nodes left behind under {dir}: {left:?}",
            kind.bench()
        );
    }
}

/// The handoff's view of the server: the admin session, and the server's
/// `wchs` (watch count) four-letter word.
struct ZkProbe<'a> {
    server: &'a ZkServer,
    admin: Client,
    /// The lock directory of the handoff.
    dir: String,
    /// The node the last yardstick created, deleted after its handoff.
    created: Mutex<Option<String>>,
}

impl ZkProbe<'_> {
    /// `Total watches:` of the server's `wchs`.
    async fn watches(&self) -> u64 {
        let wchs = self.server.four_letter("wchs").await.expect("wchs");
        wchs.lines()
            .find_map(|line| line.strip_prefix("Total watches:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no watch count in wchs: {wchs:?}"))
    }
}

impl HandoffProbe for ZkProbe<'_> {
    /// The server's watch count before the waiter starts.
    type Mark = u64;

    async fn mark(&self) -> u64 {
        self.watches().await
    }

    /// Waits until the waiter's node is queued behind the holder's (two
    /// children in the directory) and its watch on its predecessor is set
    /// (one watch more on the server), then polls a few more times so that
    /// the waiter's client has the reply to its watch request.
    async fn until_parked(&self, watches_before: u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while zk_children(&self.admin, &self.dir).await.len() < 2 {
            assert!(Instant::now() < deadline, "the waiter never queued");
        }
        while self.watches().await <= watches_before {
            assert!(Instant::now() < deadline, "the waiter never set its watch");
        }
        for _ in 0..3 {
            zk_children(&self.admin, &self.dir).await;
        }
    }

    /// A raw create on the admin session, timed just before the release.
    async fn yardstick(&self) -> Duration {
        let started = Instant::now();
        let path = zk_create_node(&self.admin, CREATE_DIR).await;
        let took = started.elapsed();
        *self.created.lock().unwrap_or_else(|p| p.into_inner()) = Some(path);
        took
    }

    async fn after_handoff(&self) {
        let created = self
            .created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(path) = created {
            zk_delete_node(&self.admin, &path).await;
        }
    }
}

/// (d): release by client A to acquisition by a waiting client B (another
/// `connect`, its own session).
fn bench_handoff(
    c: &mut Criterion,
    runtime: &tokio::runtime::Runtime,
    server: &ZkServer,
    fixture: &Fixture,
    mode: RunMode,
) -> HandoffDiag {
    let probe = ZkProbe {
        server,
        admin: fixture.raw.clone(),
        dir: lock_dir(HANDOFF_NAME),
        created: Mutex::new(None),
    };
    let url = server.url_at(LOCK_ROOT);
    let opts = LockOptions::new().ttl(TTL);
    Handoffs::connect(
        runtime,
        || lockkit_zk::connect(&url),
        HANDOFF_NAME,
        opts,
        probe,
    )
    .bench(c, runtime, HANDOFF_GROUP, mode)
}

fn summary(
    mode: RunMode,
    run_started: SystemTime,
    paired: &Interleaved<Cycle>,
    handoff: &HandoffDiag,
) -> String {
    let raw = Cycle::Raw;
    let mut out = paired.summary(
        mode,
        "lockkit-zk on one standalone ZooKeeper server",
        "",
        "Targets, from paired measurements: each cycle ratio is the median over rounds of the ratio of two cycles run in the same round, and the handoff is compared with a raw create timed just before each handoff, so that the shared machine's slow and fast phases cancel out.",
        &[
            (
                "(a) raw floor: create EPHEMERAL_SEQUENTIAL + list_children + delete",
                raw,
                raw,
                None,
            ),
            (
                "raw create of an EPHEMERAL_SEQUENTIAL node alone; ratio to (a)",
                Cycle::RawCreate,
                raw,
                None,
            ),
            (
                "(diag) raw list_children alone; ratio to (a)",
                Cycle::RawList,
                raw,
                None,
            ),
            (
                "(b) lockkit-zk acquire+release, auto_renew off; ratio (b)/(a)",
                Cycle::NoRenew,
                raw,
                Some(Limit::AtMost(1.15)),
            ),
            (
                "(c) lockkit-zk acquire+release, auto_renew on; ratio (c)/(a)",
                Cycle::Renew,
                raw,
                None,
            ),
        ],
    );
    let _ = writeln!(
        out,
        "{}",
        handoff.row(
            "(d) handoff release→waiter acquired, ratio to the raw create timed just before each",
            "create",
            Some(Limit::AtMost(2.0)),
        )
    );
    let rounds = paired.rounds();
    let _ = writeln!(
        out,
        "\nRounds in which (b) was faster than (a): {} of {rounds}.\n",
        paired.rounds_faster(Cycle::NoRenew, Cycle::Raw),
    );
    if let Some(line) = handoff.describe() {
        let _ = writeln!(out, "(d) detail: {line}.\n");
    }

    // Informational: criterion's medians, one benchmark after the other.
    Estimates::new(run_started).write_table(
        &mut out,
        CYCLE_GROUP,
        Cycle::Raw,
        &[(HANDOFF_GROUP, "handoff")],
    );
    out
}
