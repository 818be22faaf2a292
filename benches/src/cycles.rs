//! Uncontended cycles measured two ways in one run: by criterion, one
//! benchmark after the other, and by interleaved rounds whose per-round ratios
//! are what the targets are judged on.

use std::fmt::{self, Write as _};
use std::marker::PhantomData;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use criterion::Criterion;
use tokio::runtime::Runtime;

use crate::mode::{Limit, RunMode, configure_fast, judge_optional};
use crate::{criterion_dir, criterion_median_ns, fmt_opt_ns};

/// The kinds of cycle a benchmark compares.
pub trait CycleKind: Copy + PartialEq + fmt::Debug + 'static {
    /// Every kind, in the order of the criterion group (and of the first
    /// interleaved round).
    const ALL: &'static [Self];

    /// The criterion benchmark id of this kind within its group.
    fn bench(self) -> &'static str;
}

/// What runs one cycle of each kind, shared by the criterion group and the
/// interleaved rounds.
#[allow(async_fn_in_trait)]
pub trait CycleFixture {
    /// The kinds of cycle.
    type Kind: CycleKind;

    /// Runs one cycle of `kind` (panics if it fails).
    async fn run(&self, kind: Self::Kind);

    /// Runs one cycle of `kind` and returns how long its measured part took.
    /// By default that is all of [`run`](Self::run); a kind whose cycle also
    /// does work that is not to be timed (e.g. deleting what the measured
    /// request created) times only its measured part here.
    async fn run_timed(&self, kind: Self::Kind) -> Duration {
        let started = Instant::now();
        self.run(kind).await;
        started.elapsed()
    }

    /// Called outside the timing after every batch of cycles of `kind` (e.g.
    /// to check that nothing was left on the servers). Does nothing by default.
    async fn after_batch(&self, kind: Self::Kind) {
        let _ = kind;
    }
}

/// One criterion group `group` with a benchmark per kind (each cycle run by
/// `to_async` on `runtime` and timed by [`CycleFixture::run_timed`]), each
/// followed by [`CycleFixture::after_batch`].
pub fn bench_cycles<F: CycleFixture>(
    c: &mut Criterion,
    runtime: &Runtime,
    group: &str,
    fixture: &F,
    mode: RunMode,
) {
    let mut group = c.benchmark_group(group);
    configure_fast(&mut group, mode);
    for &kind in F::Kind::ALL {
        group.bench_function(kind.bench(), |b| {
            b.to_async(runtime).iter_custom(|iters| async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += fixture.run_timed(kind).await;
                }
                total
            });
        });
        runtime.block_on(fixture.after_batch(kind));
    }
    group.finish();
}

/// What every benchmark runs first: criterion's group `group` of the cycles of
/// `fixture` ([`bench_cycles`]), then `more` criterion benchmarks (e.g. a
/// handoff), criterion's final summary, and, unless criterion was only asked
/// to list the benchmarks (`None` then), the interleaved rounds of
/// [`RunMode::interleaved_plan`].
pub fn bench_then_pair<F: CycleFixture, T>(
    runtime: &Runtime,
    group: &str,
    fixture: &F,
    mode: RunMode,
    more: impl FnOnce(&mut Criterion) -> T,
) -> Option<(T, Interleaved<F::Kind>)> {
    let mut criterion = crate::criterion();
    bench_cycles(&mut criterion, runtime, group, fixture, mode);
    let more = more(&mut criterion);
    criterion.final_summary();
    if mode == RunMode::List {
        return None;
    }
    let (rounds, per_round) = mode.interleaved_plan();
    let paired = runtime.block_on(Interleaved::measure(fixture, rounds, per_round));
    Some((more, paired))
}

/// Which kind runs at `step` of `round`: the kinds in turn, from a first one
/// that moves on by one every other round, and in reverse order every
/// other round, so that each kind runs right before and right after each
/// of its neighbours equally often. (A kind that runs right after another
/// on the same server finds the server, and the machine, in the state the
/// other left them: awake, or not.)
pub fn round_order(round: usize, step: usize, kinds: usize) -> usize {
    let first = round / 2;
    if round.is_multiple_of(2) {
        (first + step) % kinds
    } else {
        (first + kinds - 1 - step) % kinds
    }
}

/// A row of [`Interleaved::summary`]: label, kind, the base of its paired
/// ratio, and the target on that ratio.
pub type Row<'a, K> = (&'a str, K, K, Option<Limit>);

/// Per-round mean cycle times (ns) from rounds of cycles of each kind, the
/// kinds interleaved within every round (in an order that turns, and is
/// reversed every other round, so that each kind runs right before and
/// right after each neighbour equally often). A slow or fast phase of the
/// shared machine then hits all kinds of one round alike, and the
/// per-round ratios cancel it out.
#[derive(Debug)]
pub struct Interleaved<K> {
    /// `rounds[r][i]`: mean of kind `K::ALL[i]` in round `r`.
    rounds: Vec<Vec<f64>>,
    /// Cycles of each kind per round.
    per_round: usize,
    kind: PhantomData<K>,
}

impl<K: CycleKind> Interleaved<K> {
    /// Runs `rounds` rounds of `per_round` cycles of every kind on `fixture`,
    /// each timed by [`CycleFixture::run_timed`].
    pub async fn measure<F: CycleFixture<Kind = K>>(
        fixture: &F,
        rounds: usize,
        per_round: usize,
    ) -> Self {
        let kinds = K::ALL.len();
        let mut result = Vec::with_capacity(rounds);
        for round in 0..rounds {
            let mut means = vec![f64::NAN; kinds];
            for step in 0..kinds {
                let index = round_order(round, step, kinds);
                let mut total = Duration::ZERO;
                for _ in 0..per_round {
                    total += fixture.run_timed(K::ALL[index]).await;
                }
                means[index] = total.as_nanos() as f64 / per_round as f64;
                fixture.after_batch(K::ALL[index]).await;
            }
            result.push(means);
        }
        Self::from_rounds(result, per_round)
    }

    /// From measured rounds: `rounds[r][i]` is the mean of `K::ALL[i]` over
    /// `per_round` cycles in round `r`.
    pub fn from_rounds(rounds: Vec<Vec<f64>>, per_round: usize) -> Self {
        assert!(
            rounds.iter().all(|r| r.len() == K::ALL.len()),
            "one mean per kind in every round"
        );
        Interleaved {
            rounds,
            per_round,
            kind: PhantomData,
        }
    }

    /// How many rounds were measured.
    pub fn rounds(&self) -> usize {
        self.rounds.len()
    }

    fn index(kind: K) -> usize {
        K::ALL
            .iter()
            .position(|k| *k == kind)
            .expect("every kind is in ALL")
    }

    fn median_of(mut values: Vec<f64>) -> Option<f64> {
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied()
    }

    /// Median over rounds of the round mean of `kind`.
    pub fn median(&self, kind: K) -> Option<f64> {
        let i = Self::index(kind);
        Self::median_of(self.rounds.iter().map(|r| r[i]).collect())
    }

    /// Median over rounds of `kind / base` within the same round.
    pub fn paired_ratio(&self, kind: K, base: K) -> Option<f64> {
        let (i, b) = (Self::index(kind), Self::index(base));
        Self::median_of(self.rounds.iter().map(|r| r[i] / r[b]).collect())
    }

    /// A summary table row `| label | median | paired ratio | target |`: the
    /// median of `kind`, its paired ratio to `base`, and the ratio judged by
    /// `limit` (`—` without one).
    pub fn row(&self, label: &str, kind: K, base: K, limit: Option<Limit>) -> String {
        let ratio = self.paired_ratio(kind, base);
        let (ratio, target) = judge_optional(limit, ratio);
        format!(
            "| {label} | {} | {ratio} | {target} |",
            fmt_opt_ns(self.median(kind))
        )
    }

    /// The start of a summary of these rounds: the title `## <what> (<mode>
    /// run, <n> interleaved rounds of <m> cycles of each kind<more>)`, the
    /// paragraph `intro`, and the table `| measurement | median | paired ratio
    /// | target |` with a [`row`](Self::row) for each of `rows` (more rows may
    /// follow).
    pub fn summary(
        &self,
        mode: RunMode,
        what: &str,
        more: &str,
        intro: &str,
        rows: &[Row<'_, K>],
    ) -> String {
        let mut out = format!(
            "## {what} ({} run, {} interleaved rounds of {} cycles of each kind{more})\n\n{intro}\n\n",
            mode.label(),
            self.rounds(),
            self.per_round,
        );
        let _ = writeln!(out, "| measurement | median | paired ratio | target |");
        let _ = writeln!(out, "| --- | --- | --- | --- |");
        for &(label, kind, base, limit) in rows {
            let _ = writeln!(out, "{}", self.row(label, kind, base, limit));
        }
        out
    }

    /// In how many rounds `kind` was faster than `base`.
    pub fn rounds_faster(&self, kind: K, base: K) -> usize {
        let (i, b) = (Self::index(kind), Self::index(base));
        self.rounds.iter().filter(|r| r[i] < r[b]).count()
    }
}

/// The medians criterion wrote during this run.
#[derive(Debug)]
pub struct Estimates {
    dir: PathBuf,
    not_before: SystemTime,
}

impl Estimates {
    /// Estimates under [`criterion_dir`] written since `not_before` (the start
    /// of this run).
    pub fn new(not_before: SystemTime) -> Self {
        Estimates {
            dir: criterion_dir(),
            not_before,
        }
    }

    /// Criterion's median (ns) of `group/bench`; see [`criterion_median_ns`].
    pub fn median(&self, group: &str, bench: &str) -> Option<f64> {
        criterion_median_ns(&self.dir, group, bench, self.not_before)
    }

    /// Appends the informational table of criterion's medians: every kind of
    /// `group` with its ratio to `base`, then `others` (`(group, bench)`)
    /// without a ratio, and a note when criterion wrote no fresh estimates.
    pub fn write_table<K: CycleKind>(
        &self,
        out: &mut String,
        group: &str,
        base: K,
        others: &[(&str, &str)],
    ) {
        let base_ns = self.median(group, base.bench());
        let _ = writeln!(
            out,
            "Criterion's medians (measured one benchmark after the other; informational):\n"
        );
        let _ = writeln!(out, "| benchmark | median | ratio to {} |", base.bench());
        let _ = writeln!(out, "| --- | --- | --- |");
        for &kind in K::ALL {
            let value = self.median(group, kind.bench());
            let ratio = match (value, base_ns) {
                (Some(v), Some(b)) => format!("{:.3}", v / b),
                _ => "n/a".to_owned(),
            };
            let _ = writeln!(
                out,
                "| {group}/{} | {} | {ratio} |",
                kind.bench(),
                fmt_opt_ns(value)
            );
        }
        for (other_group, bench) in others {
            let _ = writeln!(
                out,
                "| {other_group}/{bench} | {} | |",
                fmt_opt_ns(self.median(other_group, bench))
            );
        }
        if base_ns.is_none() {
            let _ = writeln!(
                out,
                "\nNote: criterion wrote no fresh estimates (`--test`/`--list` mode or a filter); looked in {}.",
                self.dir.display()
            );
        }
    }
}

/// One row of [`pair_every_backend`]: the runtime flavour, the backend, its
/// fixture and the paired, interleaved rounds of its cycles.
pub type BackendRow<F> = (
    &'static str,
    crate::Deployment,
    F,
    Interleaved<<F as CycleFixture>::Kind>,
);

/// Every selected backend's `fixture` (made on each runtime flavour in
/// turn), benchmarked by criterion and then paired and interleaved
/// ([`bench_then_pair`]) in the group `<prefix>_<flavour>_<backend>`: the
/// rows in order, and the backends left out (`fixture` gave `None`: the
/// backend cannot run this benchmark). `None` in list mode.
#[allow(clippy::type_complexity, reason = "the rows and the backends left out")]
pub fn pair_every_backend<F: CycleFixture>(
    mode: RunMode,
    prefix: &str,
    fixture: impl AsyncFn(&crate::Servers, crate::Deployment, &str) -> Option<F>,
) -> Option<(Vec<BackendRow<F>>, Vec<crate::Deployment>)> {
    let runtimes = crate::flavours();
    let backends = crate::selected();
    let servers = runtimes[1].1.block_on(crate::Servers::start(&backends));
    let mut rows = Vec::new();
    let mut left_out = Vec::new();
    for (flavour, runtime) in &runtimes {
        for &backend in &backends {
            let Some(fixture) = runtime.block_on(fixture(&servers, backend, flavour)) else {
                if !left_out.contains(&backend) {
                    left_out.push(backend);
                }
                continue;
            };
            let group = format!("{prefix}_{flavour}_{}", backend.label());
            let ((), paired) = bench_then_pair(runtime, &group, &fixture, mode, |_| ())?;
            rows.push((*flavour, backend, fixture, paired));
        }
    }
    Some((rows, left_out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum K {
        A,
        B,
    }

    impl CycleKind for K {
        const ALL: &'static [K] = &[K::A, K::B];
        fn bench(self) -> &'static str {
            match self {
                K::A => "a",
                K::B => "b",
            }
        }
    }

    #[test]
    fn paired_ratios_cancel_drift() {
        // The machine slows down 10× in the last round; B stays 2 × A.
        let paired = Interleaved::<K>::from_rounds(
            vec![vec![100.0, 200.0], vec![110.0, 220.0], vec![1000.0, 2000.0]],
            100,
        );
        assert_eq!(paired.rounds(), 3);
        assert_eq!(paired.median(K::A), Some(110.0));
        assert_eq!(paired.paired_ratio(K::B, K::A), Some(2.0));
        assert_eq!(paired.rounds_faster(K::A, K::B), 3);
        assert_eq!(
            paired.row("b", K::B, K::A, None),
            "| b | 220 ns | 2.000 | — |"
        );
        assert_eq!(Interleaved::<K>::from_rounds(vec![], 0).median(K::A), None);
    }

    #[test]
    fn every_kind_runs_once_a_round_and_before_and_after_each_neighbour_alike() {
        let kinds = 5;
        // (a, b): how often a ran right before b.
        let mut before = vec![vec![0; kinds]; kinds];
        for round in 0..2 * kinds {
            let steps: Vec<usize> = (0..kinds)
                .map(|step| round_order(round, step, kinds))
                .collect();
            let mut seen = steps.clone();
            seen.sort_unstable();
            assert_eq!(
                seen,
                (0..kinds).collect::<Vec<_>>(),
                "round {round}: {steps:?}"
            );
            for pair in steps.windows(2) {
                before[pair[0]][pair[1]] += 1;
            }
        }
        for a in 0..kinds {
            for b in 0..kinds {
                assert_eq!(before[a][b], before[b][a], "{a} before {b}: {before:?}");
            }
        }
        // Neighbours in the kinds' order do run next to each other.
        assert!(before[0][1] > 0);
    }
}
