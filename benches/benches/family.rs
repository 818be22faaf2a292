#![allow(clippy::print_stdout)]
//! The lock family against the exclusive lock, per backend, in one run: an
//! uncontended `acquire` + `release` cycle of a shared (read) holding and of
//! a semaphore permit, each paired with the exclusive cycle of the same
//! backend, on a current-thread and on a multi-thread tokio runtime (the two
//! flavours applications run).
//!
//! * `family_<flavour>_<backend>/exclusive`: `acquire` + `release`, exclusive.
//! * `family_<flavour>_<backend>/shared`: the same with `LockOptions::shared()`.
//! * `family_<flavour>_<backend>/permit`: the same with `semaphore(4)`.
//! * `family_<flavour>_zk/permit-layout`: ZooKeeper only, a permit in
//!   Curator's `InterProcessSemaphoreV2` layout written by hand
//!   (`lockkit_benches::zk_raw_permit_cycle`): the cost of the layout that
//!   lockkit shares with Curator, beside lockkit's permit. (Elsewhere the
//!   kind runs nothing.)
//!
//! The targets are judged on interleaved rounds (every kind in every round,
//! their order turned and reversed every other round), so that the shared
//! machine's drift cancels out: a shared cycle and a permit cycle within
//! 1.2 × the exclusive cycle; within 1.3 × on ZooKeeper and Redlock, where a
//! permit needs more of the servers (Curator's mutex around the lease node;
//! a quorum larger than a majority), and where ZooKeeper's permit misses,
//! the cost of Curator's layout written by hand stands beside it.
//!
//! The backends are the catalog's (`LOCKKIT_BENCH_BACKENDS=memory,redis`
//! limits them); those whose capabilities claim neither kind are left out,
//! and the summary says so. A kind a backend does not claim shows no figure. Run with `cargo bench -p lockkit-benches --bench
//! family`; the summary is printed and written to
//! `target/lockkit-bench/family-summary.md`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use lockkit_benches::{
    CycleFixture, CycleKind, Deployment, Interleaved, Limit, RunMode, Servers, connect_patient,
    lockkit_cycle, pair_every_backend, pin_from_env, save_summary, zk_mkdir, zk_raw_permit_cycle,
    zk_session_patient,
};
use lockkit_core::{DistributedLock, LockOptions};

const TTL: Duration = Duration::from_secs(30);
/// The permits of the benchmarked semaphore.
const PERMITS: u32 = 4;

/// One uncontended cycle of each kind of holding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Exclusive,
    Shared,
    Permit,
    /// A ZooKeeper permit in Curator's layout, written by hand.
    PermitLayout,
}

impl CycleKind for Kind {
    const ALL: &'static [Kind] = &[
        Kind::Exclusive,
        Kind::Shared,
        Kind::Permit,
        Kind::PermitLayout,
    ];

    fn bench(self) -> &'static str {
        match self {
            Kind::Exclusive => "exclusive",
            Kind::Shared => "shared",
            Kind::Permit => "permit",
            Kind::PermitLayout => "permit-layout",
        }
    }
}

/// A session of its own on ZooKeeper, and the semaphore directory in which
/// it takes permits in Curator's layout by hand.
struct LayoutFloor {
    client: zookeeper_client::Client,
    dir: String,
}

/// One backend's client on one runtime, with a name per kind.
struct Fixture {
    lock: Arc<dyn DistributedLock>,
    names: [String; 3],
    /// Which kinds the backend claims (always the exclusive one; the
    /// hand-written permit on ZooKeeper only).
    claimed: [bool; 4],
    /// ZooKeeper's hand-written permit.
    layout: Option<LayoutFloor>,
}

impl Fixture {
    fn opts(kind: Kind) -> LockOptions {
        let opts = LockOptions::new().ttl(TTL);
        match kind {
            Kind::Exclusive => opts,
            Kind::Shared => opts.shared(),
            Kind::Permit | Kind::PermitLayout => opts.semaphore(PERMITS),
        }
    }

    fn name(&self, kind: Kind) -> &str {
        &self.names[kind as usize]
    }
}

impl CycleFixture for Fixture {
    type Kind = Kind;

    /// A kind the backend does not claim runs the exclusive cycle in its
    /// place (on a name of its own), so that every round has the same
    /// shape; the summary shows no figure for it. The hand-written permit,
    /// a yardstick of ZooKeeper's alone, runs nothing elsewhere.
    async fn run(&self, kind: Kind) {
        if kind == Kind::PermitLayout {
            if let Some(floor) = &self.layout {
                zk_raw_permit_cycle(&floor.client, &floor.dir, PERMITS as usize).await;
            }
            return;
        }
        let opts = if self.claimed[kind as usize] {
            Self::opts(kind)
        } else {
            Self::opts(Kind::Exclusive)
        };
        lockkit_cycle(self.lock.as_ref(), self.name(kind), &opts).await;
    }
}

fn main() {
    // With LOCKKIT_BENCH_CPUS set, the bench and the servers it starts
    // share those CPUs (see `pin_from_env`); the stamp names the setting.
    pin_from_env();
    let mode = RunMode::from_env();
    let Some((rows, left_out)) = pair_every_backend(mode, "family", fixture) else {
        return;
    };
    let rows: Vec<_> = rows
        .into_iter()
        .map(|(flavour, backend, fixture, paired)| (flavour, backend, fixture.claimed, paired))
        .collect();
    save_summary(mode, "family", &summary(mode, &rows, &left_out));
}

/// A client of `backend` made on the calling runtime, warmed up; `None` if
/// the backend claims neither shared holdings nor semaphores.
async fn fixture(servers: &Servers, backend: Deployment, flavour: &str) -> Option<Fixture> {
    let lock = connect_patient(servers, backend)
        .await
        .unwrap_or_else(|e| panic!("{backend} connects: {e}"));
    let caps = lock.capabilities();
    if !(caps.shared || caps.semaphore) {
        return None;
    }
    let names = ["exclusive", "shared", "permit"]
        .map(|kind| format!("bench-family-{flavour}-{}-{kind}", backend.label()));
    let layout = match backend {
        Deployment::Zk => {
            let client = zk_session_patient(&servers.zk().connect_string()).await;
            let dir = format!("/bench-family-{flavour}-permit-layout");
            for sub in ["locks", "leases"] {
                zk_mkdir(&client, &format!("{dir}/{sub}")).await;
            }
            Some(LayoutFloor { client, dir })
        }
        _ => None,
    };
    let claimed = [true, caps.shared, caps.semaphore, layout.is_some()];
    let fixture = Fixture {
        lock,
        names,
        claimed,
        layout,
    };
    for _ in 0..3 {
        for &kind in Kind::ALL {
            fixture.run(kind).await;
        }
    }
    Some(fixture)
}

/// The target of a shared and a permit cycle over the exclusive one on
/// `backend`.
fn limit_of(backend: Deployment) -> Limit {
    match backend {
        Deployment::Zk | Deployment::ZkEnsemble | Deployment::Redlock3 | Deployment::Redlock5 => {
            Limit::AtMost(1.3)
        }
        _ => Limit::AtMost(1.2),
    }
}

/// The rows of the summary: runtime flavour, backend, which kinds it
/// claims, and its rounds.
type Rows<'a> = [(&'a str, Deployment, [bool; 4], Interleaved<Kind>)];

fn summary(mode: RunMode, rows: &Rows<'_>, left_out: &[Deployment]) -> String {
    let mut out = format!(
        "## The lock family against the exclusive lock ({} run)\n\n\
         Uncontended `acquire` + `release` per kind; each ratio is the median over interleaved rounds of the kind's round mean ÷ the exclusive cycle's in the same round. \
         Target: a shared and a permit cycle within 1.2 × the exclusive cycle of the same backend; within 1.3 × on ZooKeeper and Redlock, \
         where a permit needs more of the servers (Curator's mutex around the lease node; ⌊N·permits/(permits+1)⌋ + 1 Redlock instances, more than a majority). \
         The last two columns, ZooKeeper's alone, are the permit of Curator's `InterProcessSemaphoreV2` layout written by hand (four requests in one round trip, then the deletion of its two nodes) against the same exclusive cycle, and lockkit's permit against it: \
         the layout, which lockkit shares with Curator's clients, is what a permit costs there.\n\n\
         | runtime | backend | exclusive | shared | × exclusive | permit ({PERMITS}) | × exclusive | permit in Curator's layout, by hand | × exclusive | lockkit's permit ÷ by hand |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        mode.label()
    );
    for (flavour, backend, claimed, paired) in rows {
        let limit = limit_of(*backend);
        let median = |kind: Kind| {
            if claimed[kind as usize] {
                lockkit_benches::fmt_opt_ns(paired.median(kind))
            } else {
                "—".to_owned()
            }
        };
        let judged = |kind: Kind| {
            if !claimed[kind as usize] {
                return "not held by this backend".to_owned();
            }
            let (ratio, target) = limit.judge(paired.paired_ratio(kind, Kind::Exclusive));
            format!("{ratio} {target}")
        };
        let ratio = |kind: Kind, base: Kind| {
            if !claimed[Kind::PermitLayout as usize] {
                return "—".to_owned();
            }
            paired
                .paired_ratio(kind, base)
                .map_or_else(|| "—".to_owned(), |r| format!("{r:.3}"))
        };
        let _ = writeln!(
            out,
            "| {flavour} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            backend.label(),
            median(Kind::Exclusive),
            median(Kind::Shared),
            judged(Kind::Shared),
            median(Kind::Permit),
            judged(Kind::Permit),
            median(Kind::PermitLayout),
            ratio(Kind::PermitLayout, Kind::Exclusive),
            ratio(Kind::Permit, Kind::PermitLayout),
        );
    }
    if !left_out.is_empty() {
        let labels: Vec<&str> = left_out.iter().map(|b| b.label()).collect();
        let _ = writeln!(
            out,
            "\nLeft out (they claim neither shared holdings nor semaphores): {}.",
            labels.join(", ")
        );
    }
    out
}
