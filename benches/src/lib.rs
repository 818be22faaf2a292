//! Shared helpers for lockkit's benchmarks (not published).
//!
//! The benchmarks live in `benches/`; run them with
//! `cargo bench -p lockkit-benches --bench redis`, `--bench redlock`,
//! `--bench zk` and `--bench sql`. This library holds what they share: the run modes, the
//! uncontended cycles measured both by criterion and in interleaved rounds
//! (whose paired ratios the targets are judged on), the handoff from a holder
//! to a parked waiter paired with a yardstick, the raw Redis and SQL floors,
//! percentiles, formatting of durations, and reading the estimates criterion
//! wrote, so that a benchmark can print its own summary after the criterion
//! groups have run.

mod catalog;
mod contention;
pub mod cpu;
mod cycles;
mod etcd_raw;
mod handoff;
pub mod held_names;
mod load;
mod mode;
pub mod plot;
mod raw;
mod sql;
mod sql_handoff;
mod stock;
mod zk_raw;

pub use catalog::{Deployment, RawFloor, Servers, benched, connect, connect_patient, selected};
pub use contention::{Contender, Contention, contention};
pub use cycles::{
    BackendRow, CycleFixture, CycleKind, Estimates, Interleaved, Row, bench_cycles,
    bench_then_pair, pair_every_backend, round_order,
};
pub use etcd_raw::RawEtcd;
pub use handoff::{HandoffDiag, HandoffProbe, Handoffs};
pub use load::{
    Client, Held, LoadKind, Locker, Outcome, PeerProvider, Scenario, Tally, run, run_tasks,
};
pub use mode::{
    Limit, PIN_CPUS, RunMode, configure_fast, criterion, flavours, judge_optional, median,
    pin_from_env, runtime, runtime_of, save_summary, verdict,
};
pub use raw::{RAW_RELEASE, RawLock, lockkit_cycle, ping};
pub use sql::{RAW_TTL, RawMy, RawPg, RawSqlite};
pub use sql_handoff::{RawHandoff, RawSessionHandoffs, RawSessionMode};
pub use stock::Stock;
pub use zk_raw::{
    RAW_ZK_PREFIX, zk_children, zk_create_node, zk_delete_node, zk_mkdir, zk_raw_cycle,
    zk_raw_permit_cycle, zk_session, zk_session_patient,
};

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

/// Nanoseconds since the Unix epoch on the wall clock, which every process
/// of one machine reads alike (0 before the epoch): how a bench's worker
/// processes agree on when to start and stamp what they did.
pub fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The `p`-th percentile (`0.0..=100.0`) of `sorted` by the nearest-rank
/// method; `None` for an empty slice.
///
/// `sorted` must be sorted ascending.
///
/// ```
/// use std::time::Duration;
/// let v: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
/// assert_eq!(lockkit_benches::percentile(&v, 50.0), Some(Duration::from_micros(50)));
/// assert_eq!(lockkit_benches::percentile(&v, 99.0), Some(Duration::from_micros(99)));
/// assert_eq!(lockkit_benches::percentile(&v, 100.0), Some(Duration::from_micros(100)));
/// assert_eq!(lockkit_benches::percentile(&[], 50.0), None);
/// ```
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let p = p.clamp(0.0, 100.0);
    // Nearest rank: the smallest value with at least p % of the values at or below it.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Formats a duration given in nanoseconds for a table: `850 ns`, `9.5 µs`,
/// `95 µs`, `1.25 ms`, `46.2 ms`, `1.50 s`.
pub fn fmt_ns(ns: f64) -> String {
    if !ns.is_finite() {
        return "n/a".to_owned();
    }
    if ns < 1_000.0 {
        format!("{ns:.0} ns")
    } else if ns < 10_000.0 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1_000_000.0 {
        format!("{:.0} µs", ns / 1e3)
    } else if ns < 10_000_000.0 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns < 1_000_000_000.0 {
        format!("{:.1} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// [`fmt_ns`] of a value that may be missing (`n/a`).
pub fn fmt_opt_ns(ns: Option<f64>) -> String {
    ns.map_or_else(|| "n/a".to_owned(), fmt_ns)
}

/// [`fmt_ns`] for a [`Duration`].
pub fn fmt_duration(d: Duration) -> String {
    fmt_ns(d.as_nanos() as f64)
}

/// The cargo target directory: `$CARGO_TARGET_DIR`, else what
/// `$CARGO metadata` says (cargo sets `$CARGO` for the benchmarks it runs),
/// else the nearest `target` directory next to a `Cargo.lock` found by walking
/// up from the current directory, else `./target`.
pub fn target_dir() -> PathBuf {
    if let Some(dir) = env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = target_dir_from_cargo_metadata() {
        return dir;
    }
    if let Ok(cwd) = env::current_dir() {
        for dir in cwd.ancestors() {
            if dir.join("Cargo.lock").is_file() {
                return dir.join("target");
            }
        }
    }
    PathBuf::from("target")
}

fn target_dir_from_cargo_metadata() -> Option<PathBuf> {
    let output = Command::new(env::var_os("CARGO")?)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
    metadata
        .get("target_directory")?
        .as_str()
        .map(PathBuf::from)
}

/// Where criterion writes its results, decided the way criterion 0.8 does:
/// `$CRITERION_HOME`, else `<target dir>/criterion` (see [`target_dir`]).
pub fn criterion_dir() -> PathBuf {
    match env::var_os("CRITERION_HOME") {
        Some(home) => PathBuf::from(home),
        None => target_dir().join("criterion"),
    }
}

/// The median (ns per iteration) that criterion wrote for `group/bench`
/// under `criterion_dir`, read from `<group>/<bench>/new/estimates.json`
/// (field `median.point_estimate`).
///
/// `None` when the file is missing, unreadable, or older than `not_before`:
/// criterion's `--test` and `--list` modes and filtered runs do not write
/// estimates, and a file from an earlier run must not pass for this one's.
pub fn criterion_median_ns(
    criterion_dir: &Path,
    group: &str,
    bench: &str,
    not_before: SystemTime,
) -> Option<f64> {
    let path = criterion_dir
        .join(criterion_file_name(group))
        .join(criterion_file_name(bench))
        .join("new")
        .join("estimates.json");
    let modified = fs::metadata(&path).ok()?.modified().ok()?;
    if modified < not_before {
        return None;
    }
    let estimates: serde_json::Value = serde_json::from_slice(&fs::read(&path).ok()?).ok()?;
    estimates
        .get("median")?
        .get("point_estimate")?
        .as_f64()
        .filter(|ns| ns.is_finite() && *ns > 0.0)
}

/// The directory criterion writes a group's or a benchmark's results to:
/// its id with the characters a file name cannot hold (`/` among them)
/// replaced by `_`, cut to 64 bytes.
fn criterion_file_name(id: &str) -> String {
    const UNSAFE: [char; 10] = ['?', '"', '/', '\\', '*', '<', '>', ':', '|', '^'];
    let mut name = id.replace(UNSAFE, "_");
    let mut end = name.len().min(64);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name.truncate(end);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criterion_file_names_replace_slashes() {
        assert_eq!(criterion_file_name("redis/renew_off"), "redis_renew_off");
        assert_eq!(criterion_file_name("plain"), "plain");
        assert_eq!(criterion_file_name(&"é".repeat(40)).len(), 64);
    }

    #[test]
    fn percentile_nearest_rank() {
        let v = [10, 20, 30, 40].map(Duration::from_micros);
        assert_eq!(percentile(&v, 0.0), Some(Duration::from_micros(10)));
        assert_eq!(percentile(&v, 50.0), Some(Duration::from_micros(20)));
        assert_eq!(percentile(&v, 51.0), Some(Duration::from_micros(30)));
        assert_eq!(percentile(&v, 99.0), Some(Duration::from_micros(40)));
        assert_eq!(percentile(&v, 100.0), Some(Duration::from_micros(40)));
    }

    #[test]
    fn formats_durations() {
        assert_eq!(fmt_ns(850.0), "850 ns");
        assert_eq!(fmt_ns(9_500.0), "9.5 µs");
        assert_eq!(fmt_ns(95_400.0), "95 µs");
        assert_eq!(fmt_ns(1_254_000.0), "1.25 ms");
        assert_eq!(fmt_ns(46_200_000.0), "46.2 ms");
    }

    #[test]
    fn reads_fresh_estimates_only() {
        let dir = env::temp_dir().join(format!("lockkit-benches-test-{}", std::process::id()));
        let new = dir.join("g").join("b").join("new");
        fs::create_dir_all(&new).unwrap();
        let before = SystemTime::now() - Duration::from_secs(5);
        fs::write(
            new.join("estimates.json"),
            r#"{"median":{"point_estimate":95123.5,"standard_error":1.0}}"#,
        )
        .unwrap();
        assert_eq!(criterion_median_ns(&dir, "g", "b", before), Some(95123.5));
        let later = SystemTime::now() + Duration::from_secs(5);
        assert_eq!(criterion_median_ns(&dir, "g", "b", later), None);
        assert_eq!(criterion_median_ns(&dir, "g", "missing", before), None);
        fs::remove_dir_all(&dir).unwrap();
    }
}
