//! How a benchmark run was asked for, and what that changes: sample sizes,
//! verdicts, whether the summary is saved.

use std::time::Duration;

use criterion::{BenchmarkGroup, measurement::WallTime};

/// How the run was asked for: criterion's own modes, plus our quick mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunMode {
    /// `cargo bench`: full measurements.
    Bench,
    /// `LOCKKIT_BENCH_QUICK=1`: tiny samples, still real estimates.
    Quick,
    /// `-- --test` (or `cargo test --benches`): every benchmark once, no estimates.
    Test,
    /// `-- --list`: criterion lists the benchmarks; nothing is run.
    List,
}

impl RunMode {
    /// Mirrors criterion 0.8's `configure_from_args`: test mode unless cargo
    /// passed `--bench` and no `--test` was given.
    pub fn from_env() -> RunMode {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let has = |flag: &str| args.iter().any(|a| a == flag);
        if has("--list") {
            RunMode::List
        } else if !has("--bench") || has("--test") {
            RunMode::Test
        } else if std::env::var("LOCKKIT_BENCH_QUICK").is_ok_and(|v| v == "1") {
            RunMode::Quick
        } else {
            RunMode::Bench
        }
    }

    /// How the run is named in a summary's title: `full`, `quick`, …
    pub fn label(self) -> &'static str {
        match self {
            RunMode::Bench => "full",
            RunMode::Quick => "quick",
            RunMode::Test => "test-mode",
            RunMode::List => "list",
        }
    }

    /// Rounds, and cycles of each kind per round, of an interleaved
    /// measurement (see [`Interleaved`](crate::Interleaved)).
    pub fn interleaved_plan(self) -> (usize, usize) {
        match self {
            RunMode::Bench => (40, 100),
            RunMode::Quick => (5, 20),
            _ => (2, 5),
        }
    }
}

/// PASS or MISS; a test-mode run (a smoke test of a debug build) judges nothing.
pub fn verdict(pass: bool) -> &'static str {
    if RunMode::from_env() == RunMode::Test {
        return "not judged in test mode";
    }
    if pass { "PASS" } else { "MISS" }
}

/// A target on a ratio.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// The ratio must be at most this.
    AtMost(f64),
    /// The ratio must be strictly below this.
    Below(f64),
    /// The ratio must be at least this.
    AtLeast(f64),
}

impl Limit {
    /// Whether `ratio` meets the target.
    pub fn passes(self, ratio: f64) -> bool {
        match self {
            Limit::AtMost(limit) => ratio <= limit,
            Limit::Below(limit) => ratio < limit,
            Limit::AtLeast(limit) => ratio >= limit,
        }
    }

    /// The ratio's cell and the target's cell of a summary row:
    /// (`"1.043"`, `"≤ 1.10: PASS"`), or `n/a` and `not measured`.
    pub fn judge(self, ratio: Option<f64>) -> (String, String) {
        let target = match self {
            Limit::AtMost(limit) => format!("≤ {limit:.2}"),
            Limit::Below(limit) => format!("< {limit:.2}"),
            Limit::AtLeast(limit) => format!("≥ {limit:.2}"),
        };
        match ratio {
            Some(r) => (
                format!("{r:.3}"),
                format!("{target}: {}", verdict(self.passes(r))),
            ),
            None => ("n/a".to_owned(), format!("{target}: not measured")),
        }
    }
}

/// [`Limit::judge`] of an optional target: without one, the ratio's cell and
/// `—`.
pub fn judge_optional(limit: Option<Limit>, ratio: Option<f64>) -> (String, String) {
    match limit {
        Some(limit) => limit.judge(ratio),
        None => (
            ratio.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.3}")),
            "—".to_owned(),
        ),
    }
}

/// The budgets of a group of short benchmarks (a cycle of a few round trips).
pub fn configure_fast(group: &mut BenchmarkGroup<'_, WallTime>, mode: RunMode) {
    match mode {
        RunMode::Quick => {
            group
                .sample_size(10)
                .warm_up_time(Duration::from_millis(100))
                .measurement_time(Duration::from_millis(300));
        }
        _ => {
            group
                .sample_size(50)
                .warm_up_time(Duration::from_secs(1))
                .measurement_time(Duration::from_secs(5));
        }
    }
}

/// A multi-thread tokio runtime with all drivers, for the benchmarks and
/// their fixtures.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The two runtime flavours applications run, by name: a current-thread
/// runtime and [`runtime`]'s multi-thread one.
pub fn flavours() -> [(&'static str, tokio::runtime::Runtime); 2] {
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    [("current_thread", current), ("multi_thread", runtime())]
}

/// A runtime of the named flavour, as an application runs one: a
/// current-thread one, or a multi-thread one with 4 workers (on this 2-core
/// machine, more workers than cores).
pub fn runtime_of(flavour: &str) -> tokio::runtime::Runtime {
    let mut builder = if flavour == "current_thread" {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(4);
        builder
    };
    builder.enable_all().build().expect("a tokio runtime")
}

/// The median of `values` (the upper one of an even count); `NaN` for none.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Prints `summary`, and writes it to `<target dir>/lockkit-bench/<name>-summary.md`
/// unless this is a test-mode run.
#[allow(clippy::print_stdout)]
pub fn save_summary(mode: RunMode, name: &str, summary: &str) {
    println!("\n{summary}");
    if mode == RunMode::Test {
        println!("test mode: the summary is not saved");
        return;
    }
    let dir = crate::target_dir().join("lockkit-bench");
    let path = dir.join(format!("{name}-summary.md"));
    let stamped = lockkit_testkit::stamp::stamped(&bench_command(), summary);
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, stamped)) {
        Ok(()) => println!("summary written to {}", path.display()),
        Err(e) => println!("could not write {}: {e}", path.display()),
    }
}

/// The environment variable that pins a benchmark, and the servers it
/// starts, to some CPUs: a `taskset` CPU list, such as `0`.
pub const PIN_CPUS: &str = "LOCKKIT_BENCH_CPUS";

/// The CPU list this process was pinned to by [`pin_from_env`], if it was:
/// what a summary's stamp names (a bench that never pins runs unpinned,
/// whatever [`PIN_CPUS`] says).
static PINNED: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Pins this process (every thread of it, and the servers it starts
/// afterwards, which inherit it) to the CPUs [`PIN_CPUS`] names, if set;
/// call it first in `main`. Returns the CPU list, or `None` when unpinned.
///
/// Why: on this machine a lock cycle's round trips run two to three times
/// slower when the scheduler puts the client and the server process of a
/// connection on different cores than on the same one, and the placement
/// of each connection's server process sticks for seconds at a time, so
/// two cycles on two connections, measured in the same round, can differ
/// by that much for no reason of their own. Pinned to one CPU, both sides
/// of every connection share it, and paired ratios compare the work each
/// cycle makes the client and the server do.
///
/// # Panics
///
/// When `taskset` cannot pin the process: a benchmark asked to be pinned
/// must not run unpinned.
pub fn pin_from_env() -> Option<String> {
    let cpus = std::env::var(PIN_CPUS).ok().filter(|c| !c.is_empty())?;
    let status = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", &cpus, &std::process::id().to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("{PIN_CPUS}={cpus}: cannot run taskset (util-linux): {e}"));
    assert!(
        status.success(),
        "{PIN_CPUS}={cpus}: taskset could not pin the benchmark ({status})"
    );
    Some(PINNED.get_or_init(|| cpus).clone())
}

/// The command that runs this benchmark: cargo names a bench executable
/// `<bench>-<hash>`. When [`pin_from_env`] pinned this process, the
/// command sets [`PIN_CPUS`] as it was.
fn bench_command() -> String {
    let exe = std::env::current_exe().ok();
    let stem = exe
        .as_deref()
        .and_then(std::path::Path::file_stem)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let bench = stem
        .rsplit_once('-')
        .map_or(stem.as_str(), |(bench, _)| bench);
    let pinned = PINNED
        .get()
        .map_or(String::new(), |cpus| format!("{PIN_CPUS}={cpus} "));
    format!("{pinned}cargo bench -p lockkit-benches --bench {bench}")
}

/// criterion, configured from the command line, with its HTML charts when
/// the chart font can be registered and without them (and a note why)
/// otherwise: plotters cannot draw text without it.
#[allow(clippy::print_stderr)]
pub fn criterion() -> criterion::Criterion {
    let c = criterion::Criterion::default().configure_from_args();
    match crate::plot::font() {
        Ok(()) => c,
        Err(why) => {
            eprintln!("criterion's charts are off: {why}");
            c.without_plots()
        }
    }
}
