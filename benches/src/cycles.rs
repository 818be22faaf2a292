//! Uncontended cycles measured two ways in one run: by criterion, one
//! benchmark after the other, and by interleaved rounds whose per-round ratios
//! are what the targets are judged on.

use std::fmt::{self, Write as _};
use std::marker::PhantomData;
use std::path::PathBuf;
use std::time::{Instant, SystemTime};

use criterion::Criterion;
use tokio::runtime::Runtime;

use crate::mode::{Limit, RunMode, configure_fast};
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

    /// Called outside the timing after every batch of cycles of `kind` (e.g.
    /// to check that nothing was left on the servers). Does nothing by default.
    async fn after_batch(&self, kind: Self::Kind) {
        let _ = kind;
    }
}

/// One criterion group `group` with a benchmark per kind (each cycle run by
/// `to_async` on `runtime`), followed by [`CycleFixture::after_batch`].
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
            b.to_async(runtime).iter(|| fixture.run(kind));
        });
        runtime.block_on(fixture.after_batch(kind));
    }
    group.finish();
}

/// Per-round mean cycle times (ns) from rounds of cycles of each kind, the
/// kinds interleaved (and their order rotated) within every round. A slow or
/// fast phase of the shared machine then hits all kinds of one round alike,
/// and the per-round ratios cancel it out.
#[derive(Debug)]
pub struct Interleaved<K> {
    /// `rounds[r][i]`: mean of kind `K::ALL[i]` in round `r`.
    rounds: Vec<Vec<f64>>,
    kind: PhantomData<K>,
}

impl<K: CycleKind> Interleaved<K> {
    /// Runs `rounds` rounds of `per_round` cycles of every kind on `fixture`.
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
                let index = (round + step) % kinds;
                let started = Instant::now();
                for _ in 0..per_round {
                    fixture.run(K::ALL[index]).await;
                }
                means[index] = started.elapsed().as_nanos() as f64 / per_round as f64;
                fixture.after_batch(K::ALL[index]).await;
            }
            result.push(means);
        }
        Self::from_rounds(result)
    }

    /// From measured rounds: `rounds[r][i]` is the mean of `K::ALL[i]` in round `r`.
    pub fn from_rounds(rounds: Vec<Vec<f64>>) -> Self {
        assert!(
            rounds.iter().all(|r| r.len() == K::ALL.len()),
            "one mean per kind in every round"
        );
        Interleaved {
            rounds,
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
        let (ratio, target) = match limit {
            Some(limit) => limit.judge(ratio),
            None => (
                ratio.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.3}")),
                "—".to_owned(),
            ),
        };
        format!(
            "| {label} | {} | {ratio} | {target} |",
            fmt_opt_ns(self.median(kind))
        )
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
        let paired = Interleaved::<K>::from_rounds(vec![
            vec![100.0, 200.0],
            vec![110.0, 220.0],
            vec![1000.0, 2000.0],
        ]);
        assert_eq!(paired.rounds(), 3);
        assert_eq!(paired.median(K::A), Some(110.0));
        assert_eq!(paired.paired_ratio(K::B, K::A), Some(2.0));
        assert_eq!(paired.rounds_faster(K::A, K::B), 3);
        assert_eq!(
            paired.row("b", K::B, K::A, None),
            "| b | 220 ns | 2.000 | — |"
        );
        assert_eq!(Interleaved::<K>::from_rounds(vec![]).median(K::A), None);
    }
}
