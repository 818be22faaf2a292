#![allow(clippy::print_stdout)]
//! What recording a holder identity costs: the uncontended exclusive
//! `acquire` + `release` cycle with `LockOptions::holder` against the same
//! cycle without, per backend, on a current-thread and on a multi-thread
//! tokio runtime, in one run.
//!
//! * `holder_<flavour>_<backend>/anonymous`: `acquire` + `release`.
//! * `holder_<flavour>_<backend>/identified`: the same with
//!   `holder("<hostname>:<pid>")`-like identity of realistic length.
//!
//! The target (at most 1.1 × the cycle without) is judged on interleaved
//! rounds (both cycles in every round, their order turned and reversed
//! every other round), so that the shared machine's drift cancels out.
//! Backends that cannot record an identity are left out, and the summary
//! says so. Run with
//! `cargo bench -p lockkit-benches --bench holder`
//! (`LOCKKIT_BENCH_BACKENDS=memory,redis` limits the backends); the summary
//! is printed and written to `target/lockkit-bench/holder-summary.md`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use lockkit_benches::{
    CycleFixture, CycleKind, Deployment, Interleaved, Limit, RunMode, Servers, connect_patient,
    lockkit_cycle, pair_every_backend, save_summary,
};
use lockkit_core::{DistributedLock, LockOptions};

const TTL: Duration = Duration::from_secs(30);
/// An identity as `lockkit exec` records it: `<hostname>:<pid>`.
const IDENTITY: &str = "worker-07.eu-west.example.internal:48213";

/// The exclusive cycle without and with a holder identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Anonymous,
    Identified,
}

impl CycleKind for Kind {
    const ALL: &'static [Kind] = &[Kind::Anonymous, Kind::Identified];

    fn bench(self) -> &'static str {
        match self {
            Kind::Anonymous => "anonymous",
            Kind::Identified => "identified",
        }
    }
}

/// One backend's client on one runtime, with a name per kind.
struct Fixture {
    lock: Arc<dyn DistributedLock>,
    names: [String; 2],
    opts: [LockOptions; 2],
}

impl CycleFixture for Fixture {
    type Kind = Kind;

    async fn run(&self, kind: Kind) {
        let i = kind as usize;
        lockkit_cycle(self.lock.as_ref(), &self.names[i], &self.opts[i]).await;
    }
}

fn main() {
    let mode = RunMode::from_env();
    let Some((rows, left_out)) = pair_every_backend(mode, "holder", fixture) else {
        return;
    };
    let rows: Vec<_> = rows
        .into_iter()
        .map(|(flavour, backend, _, paired)| (flavour, backend, paired))
        .collect();
    save_summary(mode, "holder", &summary(mode, &rows, &left_out));
}

/// A client of `backend` made on the calling runtime, warmed up; `None` if
/// the backend cannot record holder identities.
async fn fixture(servers: &Servers, backend: Deployment, flavour: &str) -> Option<Fixture> {
    let lock = connect_patient(servers, backend)
        .await
        .unwrap_or_else(|e| panic!("{backend} connects: {e}"));
    if !lock.capabilities().holder {
        return None;
    }
    let names = ["anonymous", "identified"]
        .map(|kind| format!("bench-holder-{flavour}-{}-{kind}", backend.label()));
    let plain = LockOptions::new().ttl(TTL);
    let fixture = Fixture {
        lock,
        names,
        opts: [plain.clone(), plain.holder(IDENTITY)],
    };
    for _ in 0..3 {
        for &kind in Kind::ALL {
            fixture.run(kind).await;
        }
    }
    Some(fixture)
}

fn summary(
    mode: RunMode,
    rows: &[(&str, Deployment, Interleaved<Kind>)],
    left_out: &[Deployment],
) -> String {
    let mut out = format!(
        "## What a holder identity costs ({} run)\n\n\
         Uncontended exclusive `acquire` + `release`, without and with `holder(\"{IDENTITY}\")`; the ratio is the median over interleaved rounds of the identified cycle's round mean ÷ the anonymous one's in the same round. \
         Target: at most 1.1 ×.\n\n\
         | runtime | backend | without | with identity | × without |\n\
         | --- | --- | --- | --- | --- |\n",
        mode.label()
    );
    let limit = Limit::AtMost(1.1);
    for (flavour, backend, paired) in rows {
        let (ratio, target) = limit.judge(paired.paired_ratio(Kind::Identified, Kind::Anonymous));
        let _ = writeln!(
            out,
            "| {flavour} | {} | {} | {} | {ratio} {target} |",
            backend.label(),
            lockkit_benches::fmt_opt_ns(paired.median(Kind::Anonymous)),
            lockkit_benches::fmt_opt_ns(paired.median(Kind::Identified)),
        );
    }
    if !left_out.is_empty() {
        let labels: Vec<&str> = left_out.iter().map(|b| b.label()).collect();
        let _ = writeln!(
            out,
            "\nLeft out (they cannot record a holder identity): {}.",
            labels.join(", ")
        );
    }
    out
}
