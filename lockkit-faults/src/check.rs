//! The checker: from a run's records, what the resource saw.
//!
//! * **Overlaps**: pairs of critical sections of different workers whose
//!   write intervals (first write to last write, accepted or not) intersect:
//!   two workers believed they held the lock at once.
//! * **Stale writes**: a write of section S made after a section S' granted
//!   later (in real time, whatever the tokens say) to another worker had its
//!   first write accepted. Accepted stale writes are the damage fencing
//!   exists to prevent; rejected ones are fencing at work.
//! * **Valid writes rejected**: rejected writes that were not stale (the
//!   token went backwards, e.g. a fence counter lost with the server).
//! * **Done / tried**: sections released after all their writes were
//!   accepted, over acquire attempts.
//! * **Recovery**: per fault, from its start to the first write of the first
//!   section granted after it that completed.
//! * **At the real stores** (PostgreSQL, Redis; [`StoreOutcome`]): a write
//!   is stale there when a newer section's write had been admitted by that
//!   store (answered) before this one was sent; a store that admits it
//!   failed to fence.

use crate::history::{Violation, violations};
use crate::record::{Kind, Micros, Trace};
use crate::record::{Store, StoreRecord, StoreWrite};
use crate::section::{Section, overlapping_pairs, sections};

/// What the checker found in one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Pairs of overlapping critical sections.
    pub overlaps: u64,
    /// Stale writes the resource accepted.
    pub stale_accepted: u64,
    /// Stale writes the resource rejected.
    pub stale_rejected: u64,
    /// Rejected writes that were not stale.
    pub valid_rejected: u64,
    /// Acquire attempts.
    pub attempted: u64,
    /// Completed critical sections.
    pub completed: u64,
    /// Sections abandoned on the lease-lost signal.
    pub lost: u64,
    /// Failed acquire attempts (timeouts and errors).
    pub failed: u64,
    /// Per fault, the time to the next completed section (`None`: none came).
    pub recovery: Vec<Option<Micros>>,
    /// What each real store did with the fenced writes (empty without
    /// stores or tokens).
    pub stores: Vec<StoreOutcome>,
    /// Per lost signal, in order: how long before it the guard's early
    /// warning rose (`None`: no warning before the loss).
    pub warnings: Vec<Option<Micros>>,
    /// What the [history checker](crate::history) found.
    pub violations: Vec<Violation>,
}

/// What one real store did with a run's fenced writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreOutcome {
    /// The store.
    pub store: Store,
    /// Writes it admitted.
    pub admitted: u64,
    /// Stale writes it admitted: the damage it exists to prevent.
    pub stale_admitted: u64,
    /// Stale writes it refused.
    pub stale_refused: u64,
    /// Writes it failed to answer.
    pub errors: u64,
}

impl Outcome {
    /// Every fault recovered (true when there was none).
    pub fn recovered(&self) -> bool {
        self.recovery.iter().all(Option::is_some)
    }

    /// The violations of `rule`.
    pub fn violations_of(&self, rule: crate::history::Rule) -> usize {
        self.violations.iter().filter(|v| v.rule == rule).count()
    }

    /// The longest recovery, `None` if some fault never recovered.
    pub fn worst_recovery(&self) -> Option<Micros> {
        self.recovery
            .iter()
            .try_fold(0, |worst: Micros, recovery| recovery.map(|r| worst.max(r)))
    }
}

/// Whether a write of `section` at `at` came after a newer section of
/// another worker had started writing.
fn is_stale(sections: &[Section], section: &Section, at: Micros) -> bool {
    sections.iter().any(|other| {
        other.client != section.client
            && other.newer_than(section)
            && other.first_accepted().is_some_and(|start| start < at)
    })
}

/// Checks one run.
pub fn check(trace: &Trace) -> Outcome {
    let sections = sections(trace);
    let mut outcome = Outcome {
        overlaps: overlapping_pairs(&sections).len() as u64,
        ..Outcome::default()
    };
    for record in &trace.records {
        match record.kind {
            Kind::Attempt => outcome.attempted += 1,
            Kind::Failed(_) => outcome.failed += 1,
            _ => {}
        }
    }
    for section in &sections {
        if let Some(lost) = section.lost_signal_at {
            let warned = section.at_risk_at.filter(|at| *at <= lost);
            outcome.warnings.push(warned.map(|at| lost - at));
        }
        outcome.completed += u64::from(section.completed());
        outcome.lost += u64::from(section.lost);
        for &(at, accepted) in &section.writes {
            match (is_stale(&sections, section, at), accepted) {
                (true, true) => outcome.stale_accepted += 1,
                (true, false) => outcome.stale_rejected += 1,
                (false, false) => outcome.valid_rejected += 1,
                (false, true) => {}
            }
        }
    }
    outcome.stores = store_outcomes(&sections, &trace.stores);
    outcome.violations = violations(trace);
    outcome.recovery = trace
        .faults
        .iter()
        .map(|fault| {
            sections
                .iter()
                .filter(|s| s.completed() && s.acquired_at.is_some_and(|at| at >= fault.start))
                .filter_map(Section::first_accepted)
                .min()
                .map(|first| first - fault.start)
        })
        .collect();
    outcome
}

/// Per store: a write is stale at a store when a newer section (of another
/// worker) had a write admitted by that store before this one was sent.
fn store_outcomes(sections: &[Section], records: &[StoreRecord]) -> Vec<StoreOutcome> {
    let section_of = |client: u32, section: u32| {
        sections
            .iter()
            .find(|s| s.client == client && s.section == section)
    };
    let mut outcomes = Vec::new();
    for store in Store::ALL {
        let writes: Vec<(&StoreRecord, &StoreWrite)> = records
            .iter()
            .flat_map(|record| record.writes.iter().map(move |write| (record, write)))
            .filter(|(_, write)| write.store == store)
            .collect();
        if writes.is_empty() {
            continue;
        }
        let mut outcome = StoreOutcome {
            store,
            admitted: 0,
            stale_admitted: 0,
            stale_refused: 0,
            errors: 0,
        };
        for &(record, write) in &writes {
            let Some(admitted) = write.admitted else {
                outcome.errors += 1;
                continue;
            };
            let mine = section_of(record.client, record.section);
            let stale = writes.iter().any(|&(other, other_write)| {
                other.client != record.client
                    && other_write.admitted == Some(true)
                    && other_write.done < write.sent
                    && match (section_of(other.client, other.section), mine) {
                        (Some(other), Some(mine)) => other.newer_than(mine),
                        _ => false,
                    }
            });
            match (stale, admitted) {
                (true, true) => outcome.stale_admitted += 1,
                (true, false) => outcome.stale_refused += 1,
                (false, true) => outcome.admitted += 1,
                (false, false) => {}
            }
        }
        outcomes.push(outcome);
    }
    outcomes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Fault, Record};

    fn record(at: Micros, client: u32, section: u32, kind: Kind) -> Record {
        Record::new(at, client, section, kind)
    }

    fn write(token: Option<u64>, accepted: bool) -> Kind {
        Kind::Write {
            token,
            index: 0,
            accepted,
        }
    }

    /// A holder paused past its lease: its late write is stale. With a token
    /// the resource rejected it; without one it was accepted.
    fn paused_holder(token: impl Fn(u64) -> Option<u64>, late_accepted: bool) -> Trace {
        Trace {
            records: vec![
                record(0, 0, 0, Kind::Attempt),
                record(10, 0, 0, Kind::Acquired(token(1))),
                record(20, 0, 0, write(token(1), true)),
                record(30, 1, 0, Kind::Attempt),
                record(1_000, 1, 0, Kind::Acquired(token(2))),
                record(1_010, 1, 0, write(token(2), true)),
                record(1_500, 0, 0, write(token(1), late_accepted)),
                record(1_600, 1, 0, write(token(2), true)),
                record(1_700, 1, 0, Kind::Released(true)),
                record(1_800, 0, 0, Kind::Released(true)),
            ],
            faults: vec![Fault {
                label: "pause holder 0".into(),
                start: 25,
                end: 1_500,
            }],
            clients: 2,
            duration: 2_000,
            stores: vec![],
        }
    }

    #[test]
    fn fencing_turns_a_stale_write_into_a_rejection() {
        let outcome = check(&paused_holder(Some, false));
        assert_eq!(outcome.overlaps, 1);
        assert_eq!(outcome.stale_accepted, 0);
        assert_eq!(outcome.stale_rejected, 1);
        assert_eq!(outcome.valid_rejected, 0);
        assert_eq!(outcome.attempted, 2);
        // The paused holder's section had a rejected write: not completed.
        assert_eq!(outcome.completed, 1);
        assert_eq!(outcome.recovery, vec![Some(1_010 - 25)]);
    }

    /// The same pause, with the writes also made to a store: the store that
    /// refuses the late write fences; one that admits it is counted.
    #[test]
    fn a_store_that_admits_the_late_write_is_counted() {
        use crate::record::{Store, StoreRecord, StoreWrite};
        let at_store = |client, sent, admitted| StoreRecord {
            client,
            section: 0,
            writes: vec![StoreWrite {
                store: Store::Postgres,
                sent,
                done: sent + 5,
                admitted: Some(admitted),
            }],
        };
        for (late_admitted, stale_admitted, stale_refused) in [(false, 0, 1), (true, 1, 0)] {
            let mut trace = paused_holder(Some, false);
            trace.stores = vec![
                at_store(0, 21, true),
                at_store(1, 1_011, true),
                at_store(0, 1_501, late_admitted),
                at_store(1, 1_601, true),
            ];
            let outcome = check(&trace);
            let store = &outcome.stores[0];
            assert_eq!(store.store, Store::Postgres);
            assert_eq!(
                (store.stale_admitted, store.stale_refused),
                (stale_admitted, stale_refused)
            );
            assert_eq!(store.admitted, 3, "the other writes were not stale");
        }
    }

    #[test]
    fn without_tokens_the_stale_write_is_accepted() {
        let outcome = check(&paused_holder(|_| None, true));
        assert_eq!(outcome.overlaps, 1);
        assert_eq!(outcome.stale_accepted, 1);
        assert_eq!(outcome.stale_rejected, 0);
        assert_eq!(outcome.completed, 2);
    }

    #[test]
    fn tokens_going_backwards_reject_valid_writes() {
        // The newer grant got a lower token (a fence counter lost with the
        // server): its writes are rejected although they are not stale.
        let trace = Trace {
            records: vec![
                record(10, 0, 0, Kind::Acquired(Some(7))),
                record(20, 0, 0, write(Some(7), true)),
                record(30, 0, 0, Kind::Released(true)),
                record(40, 1, 0, Kind::Acquired(Some(1))),
                record(50, 1, 0, write(Some(1), false)),
                record(60, 1, 0, Kind::Released(true)),
            ],
            faults: vec![],
            clients: 2,
            duration: 100,
            stores: vec![],
        };
        let outcome = check(&trace);
        assert_eq!(outcome.overlaps, 0);
        assert_eq!(outcome.stale_accepted + outcome.stale_rejected, 0);
        assert_eq!(outcome.valid_rejected, 1);
        assert_eq!(outcome.completed, 1);
    }

    #[test]
    fn sequential_sections_are_clean_and_a_fault_without_recovery_shows() {
        let trace = Trace {
            records: vec![
                record(10, 0, 0, Kind::Acquired(Some(1))),
                record(20, 0, 0, write(Some(1), true)),
                record(30, 0, 0, write(Some(1), true)),
                record(40, 0, 0, Kind::Released(true)),
                record(50, 1, 0, Kind::Acquired(Some(2))),
                record(60, 1, 0, write(Some(2), true)),
                record(70, 1, 0, Kind::Lost),
            ],
            faults: vec![Fault {
                label: "kill server".into(),
                start: 45,
                end: 45,
            }],
            clients: 2,
            duration: 100,
            stores: vec![],
        };
        let outcome = check(&trace);
        assert_eq!(outcome.overlaps, 0);
        assert_eq!(outcome.stale_accepted, 0);
        assert_eq!(outcome.lost, 1);
        assert_eq!(outcome.completed, 1);
        assert_eq!(outcome.recovery, vec![None]);
        assert_eq!(outcome.worst_recovery(), None);
    }
}
