//! The report: a Markdown table of every run, a timeline per run, and the
//! verdict (fencing backends accept no stale write; every run went end to
//! end, and recovered from each of its faults).

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use crate::deploy::Deployment;
use crate::history::{self, Rule};
use crate::record::{Micros, Seconds};
use crate::run::{RunResult, Settings};
use crate::scenario::Scenario;
use crate::timeline;

/// Why a suite failed, one line per problem.
pub fn problems(results: &[RunResult]) -> Vec<String> {
    let mut problems = Vec::new();
    for result in results {
        if let Some(error) = &result.error {
            problems.push(format!(
                "{}: did not run end to end: {error}",
                result.slug()
            ));
        }
        if result.error.is_none() && !result.outcome.recovered() {
            problems.push(format!(
                "{}: a fault did not recover: no critical section granted after it \
                 completed before the run ended",
                result.slug()
            ));
        }
        if result.fencing && result.outcome.stale_accepted > 0 {
            problems.push(format!(
                "{}: the backend claims fencing, yet the resource accepted {} stale writes",
                result.slug(),
                result.outcome.stale_accepted
            ));
        }
        if result.lock_delay.is_some() && result.outcome.stale_accepted > 0 {
            problems.push(format!(
                "{}: the lock delay did not keep the late writes out: the resource accepted {} stale writes",
                result.slug(),
                result.outcome.stale_accepted
            ));
        }
        for store in &result.outcome.stores {
            if result.fencing && store.stale_admitted > 0 {
                problems.push(format!(
                    "{}: {} admitted {} stale writes through lockkit::fence",
                    result.slug(),
                    store.store.name(),
                    store.stale_admitted
                ));
            }
        }
    }
    problems
}

/// The runs that `problems` (from [`problems`]) name, with every event
/// each recorded: what a failed suite prints, so that a log shows what
/// happened in the run that failed.
pub fn failed_runs_events(results: &[RunResult], problems: &[String]) -> String {
    let mut out = String::new();
    for result in results {
        let slug = result.slug();
        let prefix = format!("{slug}:");
        if problems.iter().any(|problem| problem.starts_with(&prefix)) {
            let _ = writeln!(out, "events of {slug}:");
            out.push_str(&result.trace.events());
            if let Some(servers) = &result.servers {
                let _ = writeln!(out, "servers of {slug} at the end of the run:\n{servers}");
            }
        }
    }
    out
}

/// Stale writes admitted / refused at each real store, e.g. `0 / 2, 0 / 2`
/// (`–` without stores or tokens).
fn stores_text(result: &RunResult) -> String {
    if result.outcome.stores.is_empty() {
        return "–".into();
    }
    result
        .outcome
        .stores
        .iter()
        .map(|store| {
            let mark = if result.fencing && store.stale_admitted > 0 {
                " ❌"
            } else {
                ""
            };
            let errors = if store.errors > 0 {
                format!(" ({} unanswered)", store.errors)
            } else {
                String::new()
            };
            format!(
                "{} / {}{mark}{errors}",
                store.stale_admitted, store.stale_refused
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Durations in seconds, `none` for a missing one, `–` for an empty list:
/// per lost signal, how long before it `at_risk` rose; per fault, its
/// recovery.
fn seconds_text(durations: &[Option<Micros>]) -> String {
    if durations.is_empty() {
        return "–".into();
    }
    durations
        .iter()
        .map(|d| d.map_or_else(|| "none".to_owned(), |d| Seconds(d).to_string()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Each run with a lock delay beside the same run without: the stale
/// writes accepted, both ways.
pub fn lock_delay_comparison(results: &[RunResult]) -> String {
    let mut out = String::new();
    for delayed in results.iter().filter(|r| r.lock_delay.is_some()) {
        let Some(plain) = results.iter().find(|r| {
            r.lock_delay.is_none() && r.backend == delayed.backend && r.scenario == delayed.scenario
        }) else {
            continue;
        };
        let _ = writeln!(
            out,
            "* {} {}: {} stale writes accepted without a lock delay, {} with `{}`{}.",
            delayed.backend,
            delayed.scenario,
            plain.outcome.stale_accepted,
            delayed.outcome.stale_accepted,
            delayed
                .backend_label()
                .split(" + ")
                .nth(1)
                .unwrap_or_default(),
            if delayed.error.is_some() || plain.error.is_some() {
                " (a run failed: see the table)"
            } else {
                ""
            }
        );
    }
    out
}

/// The Markdown table, one row per run; timelines linked from `timelines`
/// (a path relative to the report).
pub fn table(results: &[RunResult], timelines: Option<&str>) -> String {
    let mut out = String::new();
    out.push_str(
        "| backend | scenario | fencing | overlaps | violations: exclusion / token order | stale writes accepted | stale writes rejected | valid writes rejected | stale at PostgreSQL, Redis (admitted / refused) | done / tried | lost signals | at risk before the loss | recovery |\n",
    );
    out.push_str(
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n",
    );
    for result in results {
        let o = &result.outcome;
        let scenario = match timelines {
            Some(dir) => format!("[{}]({dir}/{}.svg)", result.scenario, result.slug()),
            None => result.scenario.to_string(),
        };
        let recovery = match &result.error {
            Some(_) => "**run failed**".to_owned(),
            None => seconds_text(&o.recovery),
        };
        let _ = writeln!(
            out,
            "| {} | {scenario} | {} | {} | {} / {} | {}{} | {} | {} | {} | {} / {} | {} | {} | {recovery} |",
            result.backend_label(),
            if result.fencing { "yes" } else { "no" },
            o.overlaps,
            o.violations_of(Rule::Exclusion),
            o.violations_of(Rule::TokenOrder),
            o.stale_accepted,
            if result.fencing && o.stale_accepted > 0 {
                " ❌"
            } else {
                ""
            },
            o.stale_rejected,
            o.valid_rejected,
            stores_text(result),
            o.completed,
            o.attempted,
            o.lost,
            seconds_text(&o.warnings),
        );
    }
    out
}

const LEGEND: &str = "\
* **overlaps**: pairs of critical sections of different workers whose writes \
(first to last) intersect in time: two workers believed they held the lock at once.
* **violations**: what the history checker found (listed under \
\"Violations\" with their events). *Exclusion*: two workers wrote at once \
(first to last write) before either noticed a loss: the lock let two holders \
believe they held it. *Token order*: a holder that began writing after \
another had finished got a token no greater than that one's.
* **stale writes accepted**: writes made after a newer holder had started \
writing, which the resource still accepted: real damage. Must be 0 wherever \
the backend claims fencing.
* **stale writes rejected**: the same, turned away by the resource's token check: \
fencing at work.
* **valid writes rejected**: writes of the newest holder rejected because its \
token was lower than one accepted before (the fence counter went backwards).
* **stale at PostgreSQL, Redis**: every fenced write also goes to two real \
stores through `lockkit::fence` (`lockkit_fence` inside a history `INSERT`; \
the Redis fence script around an `RPUSH`). A write is stale there when a \
newer holder's write had been admitted by that store before it was sent; \
admitted stale writes must be 0 wherever the backend claims fencing.
* **done / tried**: critical sections released after all their writes were \
accepted, over acquire attempts.
* **lost signals**: sections abandoned because the guard reported the lease lost.
* **at risk before the loss**: per lost signal, how long before it the \
guard's early warning (`at_risk`) rose; `none`: the loss came without one \
(a frozen holder sees nothing until it runs again).
* **+ lock_delay**: the same run with the workers asking for a lock delay \
of twice the fault's pause; a stale write it lets through fails the suite.
* **recovery**: per fault, from the fault's start to the first write of the \
next section that completed (`none`: no section completed after it).
";

/// One cell of the safety matrix: what the run shows about the backend
/// under that fault.
fn verdict(result: &RunResult) -> &'static str {
    let o = &result.outcome;
    let unaware = o.violations_of(Rule::Exclusion) > 0;
    if result.error.is_some() {
        "run failed"
    } else if o.stale_accepted > 0 || o.stores.iter().any(|s| s.stale_admitted > 0) {
        "**unsafe**"
    } else if o.stale_rejected > 0 || unaware {
        "fence needed"
    } else {
        "safe"
    }
}

/// The safety matrix: a row per backend, a column per scenario, each cell
/// what its run showed (see [`MATRIX_LEGEND`]); runs with a lock delay are
/// rows of their own.
pub fn safety_matrix(results: &[RunResult]) -> String {
    let mut scenarios: Vec<_> = results.iter().map(|r| r.scenario).collect();
    scenarios.sort();
    scenarios.dedup();
    let mut rows: Vec<String> = Vec::new();
    for result in results {
        let label = result.backend_label();
        if !rows.contains(&label) {
            rows.push(label);
        }
    }
    let mut out = String::from("| backend | fencing |");
    for scenario in &scenarios {
        let _ = write!(out, " {scenario} |");
    }
    out.push_str("\n| --- | --- |");
    out.push_str(&" --- |".repeat(scenarios.len()));
    out.push('\n');
    for row in &rows {
        let runs: Vec<&RunResult> = results
            .iter()
            .filter(|r| &r.backend_label() == row)
            .collect();
        let fencing = if runs.iter().any(|r| r.fencing) {
            "yes"
        } else {
            "no"
        };
        let _ = write!(out, "| {row} | {fencing} |");
        for scenario in &scenarios {
            let cell = runs
                .iter()
                .find(|r| r.scenario == *scenario)
                .map_or("–", |r| verdict(r));
            let _ = write!(out, " {cell} |");
        }
        out.push('\n');
    }
    out
}

/// What the safety matrix's cells mean.
pub const MATRIX_LEGEND: &str = "\
* **safe**: no stale write reached the resource and no two holders wrote \
at once unaware of a loss: the lock alone kept the writes apart, with or \
without fencing.
* **fence needed**: a holder wrote after its successor had started (or two \
holders wrote at once, neither told of a loss), and the resource's token \
check refused every such write: safe with fencing, unsafe without it.
* **unsafe**: the resource (or a real store) accepted a stale write: \
without fencing, or with a fence the tokens did not order.
* **–**: the scenario does not apply (or was not run).
";

/// The clock that decides a lease's end on `backend`'s server, as its
/// implementation reads it (what a clock jump can move).
fn expiry_clock(backend: Deployment) -> &'static str {
    match backend {
        Deployment::Redis | Deployment::RedisAof => {
            "key expiry: the server's wall clock (absolute Unix ms, `gettimeofday`)"
        }
        Deployment::Redlock3 | Deployment::Redlock5 => {
            "key expiry on each master: that master's wall clock"
        }
        Deployment::PgLease => "the lease row's expiry against `now()`: the wall clock",
        Deployment::MariaDbLease => "the lease row's expiry against `NOW(6)`: the wall clock",
        Deployment::Zk | Deployment::ZkEnsemble => {
            "session expiry: the server's monotonic clock (the wall clock only stamps znodes)"
        }
        _ => "–",
    }
}

/// The clock-jump runs: per backend, the clock its expiry reads and what
/// the jump did. Empty without such runs.
pub fn clock_jumps(results: &[RunResult]) -> String {
    let runs: Vec<&RunResult> = results
        .iter()
        .filter(|r| r.scenario == Scenario::ClockJump)
        .collect();
    if runs.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\n## Clock jumps\n\nA server's wall clock leaps three leases ahead while a lock is held, stays there two leases, and jumps back (Redlock: one master of three; then the holder is cut off from a second master first, Kleppmann's case). etcd is not in it: Go reads the clock through the vDSO, not through libc, where the testkit moves it.\n\n| backend | what decides expiry | lost signals | holders at once, unaware (exclusion violations) | stale writes accepted / refused | token order violations |\n| --- | --- | ---: | ---: | --- | ---: |\n",
    );
    for r in runs {
        let o = &r.outcome;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} / {} | {} |",
            r.backend_label(),
            expiry_clock(r.backend),
            o.lost,
            o.violations_of(Rule::Exclusion),
            o.stale_accepted,
            o.stale_rejected,
            o.violations_of(Rule::TokenOrder),
        );
    }
    out
}

/// Every run's violations, with their events and a link to the run's
/// timeline; empty when no run has any.
pub fn violations_section(results: &[RunResult]) -> String {
    let listed: String = results
        .iter()
        .filter(|r| !r.outcome.violations.is_empty())
        .map(|r| {
            let title = format!("{} {}", r.backend_label(), r.scenario);
            let timeline = format!("[timeline](timelines/{}.svg)", r.slug());
            history::markdown(&r.outcome.violations, &title, &timeline)
        })
        .collect();
    if listed.is_empty() {
        return String::new();
    }
    format!(
        "\n## Violations\n\nEvery violation the history checker found, with the events of the two critical sections (times on the resource's clock, from the run's start).\n\n{listed}"
    )
}

/// Writes `report.md` (with `problems`, see [`problems`]) and one SVG
/// timeline per run into `dir`.
pub fn write(
    dir: &Path,
    results: &[RunResult],
    settings: &Settings,
    command: &str,
    problems: &[String],
) -> io::Result<()> {
    let timelines = dir.join("timelines");
    let events = dir.join("events");
    std::fs::create_dir_all(&timelines)?;
    std::fs::create_dir_all(&events)?;
    for result in results {
        let title = format!("{} — {}", result.backend, result.scenario);
        std::fs::write(
            timelines.join(format!("{}.svg", result.slug())),
            timeline::svg(&title, &result.trace),
        )?;
        std::fs::write(
            events.join(format!("{}.txt", result.slug())),
            result.trace.events(),
        )?;
    }
    let mut out = String::new();
    let _ = writeln!(out, "{}\n", lockkit_testkit::stamp::stamp(command));
    let _ = writeln!(out, "# lockkit fault-injection report\n");
    let _ = writeln!(
        out,
        "Command: `{command}`. Lease (TTL, ZooKeeper session timeout) {}; {} worker processes per run; each run on fresh servers on loopback. Workers {}.\n",
        humantime::format_duration(settings.lease),
        settings.clients,
        if settings.careful {
            "abandon a critical section when the guard reports the lease lost"
        } else {
            "report a lost lease but write on (a pause between check and write): only fencing stops a stale write"
        }
    );
    out.push_str(&table(results, Some("timelines")));
    out.push('\n');
    out.push_str(LEGEND);
    out.push_str("\n## Safety matrix\n\nWhat each run shows, per backend and fault, with and without fencing at the resource.\n\n");
    out.push_str(&safety_matrix(results));
    out.push('\n');
    out.push_str(MATRIX_LEGEND);
    out.push_str(&clock_jumps(results));
    out.push_str(&violations_section(results));
    let comparison = lock_delay_comparison(results);
    if !comparison.is_empty() {
        out.push_str("\n## Lock delay\n\n");
        out.push_str(&comparison);
    }
    out.push_str("\n## Verdict\n\n");
    if problems.is_empty() {
        out.push_str(
            "Every run went end to end and recovered from its faults; no backend that claims fencing accepted a stale write.\n",
        );
    } else {
        for problem in problems {
            let _ = writeln!(out, "* {problem}");
        }
    }
    std::fs::write(dir.join("report.md"), out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Outcome;
    use crate::record::Trace;

    fn result(recovery: Vec<Option<u64>>) -> RunResult {
        RunResult {
            backend: Deployment::Redis,
            scenario: Scenario::ServerKilled,
            fencing: true,
            trace: Trace::default(),
            outcome: Outcome {
                recovery,
                ..Outcome::default()
            },
            error: None,
            lock_delay: None,
            servers: None,
        }
    }

    #[test]
    fn the_matrix_tells_safe_fenced_and_unsafe_runs_apart() {
        let mut fenced = result(vec![Some(1_000)]);
        fenced.outcome.stale_rejected = 2;
        let mut unfenced = result(vec![Some(1_000)]);
        unfenced.backend = Deployment::Redlock3;
        unfenced.fencing = false;
        unfenced.outcome.stale_accepted = 1;
        let mut calm = result(vec![Some(1_000)]);
        calm.scenario = Scenario::HolderKilled;
        let matrix = safety_matrix(&[fenced, unfenced, calm]);
        let lines: Vec<&str> = matrix.lines().collect();
        assert_eq!(
            lines[0],
            "| backend | fencing | holder-killed | server-killed |"
        );
        assert_eq!(lines[2], "| redis | yes | safe | fence needed |");
        assert_eq!(lines[3], "| redlock3 | no | – | **unsafe** |");
    }

    #[test]
    fn a_fault_that_did_not_recover_is_a_problem() {
        assert!(problems(&[result(vec![Some(1_000)])]).is_empty());
        let problems = problems(&[result(vec![Some(1_000), None])]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("did not recover"), "{problems:?}");
    }

    #[test]
    fn a_failed_run_prints_its_events_in_the_order_of_the_run() {
        use crate::record::{Fault, Kind, Record};
        let mut failed = result(vec![Some(1_000)]);
        failed.outcome.stale_accepted = 1;
        failed.trace.records = vec![
            Record::new(
                2_500_000,
                0,
                3,
                Kind::Write {
                    token: Some(7),
                    index: 1,
                    accepted: true,
                },
            ),
            Record::new(10, 0, 3, Kind::Acquired(Some(7))),
        ];
        failed.trace.faults = vec![Fault {
            label: "worker 0 paused".into(),
            start: 20,
            end: 2_400_000,
        }];
        let mut passed = result(vec![Some(1_000)]);
        passed.scenario = Scenario::HolderKilled;
        passed.trace.records = vec![Record::new(5, 1, 0, Kind::Attempt)];
        let results = [failed, passed];
        let text = failed_runs_events(&results, &problems(&results));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "events of redis--server-killed:",
                "  0.000010 s  worker 0 section 3: acquired (token 7)",
                "  0.000020 s  fault   worker 0 paused: begins",
                "  2.400000 s  fault   worker 0 paused: healed",
                "  2.500000 s  worker 0 section 3: write 1 (token 7) accepted",
            ]
        );
    }

    #[test]
    fn a_run_that_did_not_recover_prints_what_its_servers_said() {
        let mut stuck = result(vec![None]);
        stuck.servers = Some("--- member 0 (myid 1), mode no answer".into());
        let mut recovered = result(vec![Some(1_000)]);
        recovered.scenario = Scenario::HolderKilled;
        recovered.servers = Some("never printed".into());
        let results = [stuck, recovered];
        let text = failed_runs_events(&results, &problems(&results));
        assert!(
            text.contains(
                "servers of redis--server-killed at the end of the run:\n--- member 0 (myid 1), mode no answer"
            ),
            "{text}"
        );
        assert!(!text.contains("never printed"), "{text}");
    }
}
