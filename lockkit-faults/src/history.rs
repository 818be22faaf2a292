//! The history checker: a run's history (grants, writes with their tokens,
//! losses and releases, in the order and at the times the resource received
//! them) checked against what a lock promises, every violation listed with
//! the events that show it.
//!
//! * **Exclusion**: two workers each wrote, between two of its writes, while
//!   the other was writing, and neither had been told of a loss: the
//!   *unaware* writes of a section are those made before its worker noticed
//!   the loss (`guard.is_lost()`, reported before the next write), and two
//!   sections of different workers whose unaware writes (first to last)
//!   intersect in time both believed they held the lock at once. A holder
//!   that knew of its loss and wrote on is not a violation of the lock (it
//!   is what fencing is for, counted as a stale write).
//! * **Token order**: a section that began writing after another had
//!   written its last has a fencing token no greater than that one's: the
//!   tokens disagree with the order the resource saw, so a resource
//!   checking them would refuse the newer holder or admit the older one.
//!
//! The resource receives every record over one connection per worker and
//! stamps it on arrival, so one worker's records keep their order and a
//! write recorded at `t` was made before `t`. Grants and releases are
//! reported after the fact and so are not compared across workers: only
//! writes are, which happen inside the holding.

use std::fmt::{self, Write as _};

use crate::record::{Kind, Micros, Seconds, Trace};
use crate::section::{Section, sections};

/// What a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    /// Two holders, neither told of a loss, wrote at once.
    Exclusion,
    /// A later holder's token is not greater than an earlier one's.
    TokenOrder,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Rule::Exclusion => "exclusion",
            Rule::TokenOrder => "token order",
        })
    }
}

/// A critical section, by worker and attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SectionId {
    /// The worker.
    pub client: u32,
    /// Its attempt number.
    pub section: u32,
}

impl fmt::Display for SectionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker {} section {}", self.client, self.section)
    }
}

/// One violation: the two sections, the first moment it shows, what
/// happened, and the events of both sections around it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule broken.
    pub rule: Rule,
    /// The section granted first.
    pub earlier: SectionId,
    /// The other.
    pub later: SectionId,
    /// When it first shows (resource clock).
    pub at: Micros,
    /// One sentence.
    pub summary: String,
    /// The two sections' events in order, one line each.
    pub events: Vec<String>,
}

/// Every violation in `trace`, in the order they show.
pub fn violations(trace: &Trace) -> Vec<Violation> {
    let sections = sections(trace);
    let mut found = Vec::new();
    for (i, a) in sections.iter().enumerate() {
        for b in &sections[i + 1..] {
            let (earlier, later) = if b.acquired_at < a.acquired_at {
                (b, a)
            } else {
                (a, b)
            };
            if let Some(v) = exclusion(trace, earlier, later) {
                found.push(v);
            }
            if let Some(v) = token_order(trace, earlier, later) {
                found.push(v);
            }
        }
    }
    found.sort_by_key(|v| (v.at, v.rule, v.earlier, v.later));
    found
}

fn id(section: &Section) -> SectionId {
    SectionId {
        client: section.client,
        section: section.section,
    }
}

/// First and last write made before the worker noticed a loss.
fn unaware_writes(section: &Section) -> Option<(Micros, Micros)> {
    let unaware = section
        .writes
        .iter()
        .map(|&(at, _)| at)
        .filter(|&at| section.lost_at.is_none_or(|lost| at < lost));
    let first = unaware.clone().min()?;
    Some((first, unaware.max()?))
}

fn exclusion(trace: &Trace, earlier: &Section, later: &Section) -> Option<Violation> {
    if earlier.client == later.client {
        return None;
    }
    let (e_first, e_last) = unaware_writes(earlier)?;
    let (l_first, l_last) = unaware_writes(later)?;
    if e_first > l_last || l_first > e_last {
        return None;
    }
    let at = e_first.max(l_first);
    Some(Violation {
        rule: Rule::Exclusion,
        earlier: id(earlier),
        later: id(later),
        at,
        summary: format!(
            "{} wrote from {} to {} and {} from {} to {}, neither told of a loss",
            id(earlier),
            Seconds(e_first),
            Seconds(e_last),
            id(later),
            Seconds(l_first),
            Seconds(l_last)
        ),
        events: events(trace, &[earlier, later]),
    })
}

fn token_order(trace: &Trace, earlier: &Section, later: &Section) -> Option<Violation> {
    let (Some(e_token), Some(l_token)) = (earlier.token, later.token) else {
        return None;
    };
    let (_, e_last) = earlier.interval()?;
    let (l_first, _) = later.interval()?;
    let (first, second, first_token, second_token) = if e_last < l_first {
        (earlier, later, e_token, l_token)
    } else {
        // Granted first but began writing after the other's last write.
        let (_, l_last) = later.interval()?;
        let (e_first, _) = earlier.interval()?;
        if l_last >= e_first {
            return None;
        }
        (later, earlier, l_token, e_token)
    };
    if second_token > first_token {
        return None;
    }
    let at = second.interval()?.0;
    Some(Violation {
        rule: Rule::TokenOrder,
        earlier: id(first),
        later: id(second),
        at,
        summary: format!(
            "{} (token {second_token}) began writing at {} after {} (token {first_token}) had written its last",
            id(second),
            Seconds(at),
            id(first)
        ),
        events: events(trace, &[first, second]),
    })
}

/// The records of `of` in order, one line each.
fn events(trace: &Trace, of: &[&Section]) -> Vec<String> {
    trace
        .records
        .iter()
        .filter(|r| {
            of.iter()
                .any(|s| s.client == r.client && s.section == r.section)
        })
        .filter_map(|r| {
            let what = match &r.kind {
                Kind::Attempt | Kind::Failed(_) => return None,
                Kind::Acquired(Some(token)) => format!("granted, token {token}"),
                Kind::Acquired(None) => "granted".to_owned(),
                Kind::Write {
                    token, accepted, ..
                } => format!(
                    "write{} {}",
                    token.map_or_else(String::new, |t| format!(" with token {t}")),
                    if *accepted { "accepted" } else { "refused" }
                ),
                Kind::Lost => "noticed the loss".to_owned(),
                Kind::Released(true) => "released".to_owned(),
                Kind::Released(false) => "release failed".to_owned(),
                Kind::AtRisk => "at risk".to_owned(),
                Kind::LostSignal => "lost signal".to_owned(),
            };
            Some(format!(
                "{} worker {} section {}: {what}",
                Seconds(r.at),
                r.client,
                r.section
            ))
        })
        .collect()
}

/// The violations of `trace` as Markdown: one item per violation with its
/// events, `timeline` (a link) after the first line; empty without any.
pub fn markdown(violations: &[Violation], title: &str, timeline: &str) -> String {
    let mut out = String::new();
    for v in violations {
        let _ = writeln!(
            out,
            "* {title}, **{}** at {}: {} ({timeline})",
            v.rule,
            Seconds(v.at),
            v.summary
        );
        for event in &v.events {
            let _ = writeln!(out, "  * {event}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Record;

    fn record(at: Micros, client: u32, section: u32, kind: Kind) -> Record {
        Record::new(at, client, section, kind)
    }

    fn write(at: Micros, client: u32, token: u64, accepted: bool) -> Record {
        record(
            at,
            client,
            0,
            Kind::Write {
                token: Some(token),
                index: 0,
                accepted,
            },
        )
    }

    fn trace(records: Vec<Record>) -> Trace {
        Trace {
            records,
            clients: 2,
            duration: 10_000,
            ..Trace::default()
        }
    }

    #[test]
    fn a_holder_not_told_of_its_loss_writing_beside_the_next_breaks_exclusion() {
        let records = vec![
            record(10, 0, 0, Kind::Acquired(Some(1))),
            write(20, 0, 1, true),
            record(100, 1, 0, Kind::Acquired(Some(2))),
            write(110, 1, 2, true),
            // Worker 0 has not noticed anything: it writes on.
            write(120, 0, 1, false),
            write(130, 1, 2, true),
        ];
        let found = violations(&trace(records));
        assert_eq!(found.len(), 1, "{found:?}");
        let v = &found[0];
        assert_eq!(v.rule, Rule::Exclusion);
        assert_eq!((v.earlier.client, v.later.client), (0, 1));
        assert_eq!(v.at, 110);
        assert_eq!(v.events.len(), 6, "{:?}", v.events);
        let text = markdown(&found, "redis clock-jump", "[timeline](t.svg)");
        assert!(text.contains("**exclusion** at 0.00 s"), "{text}");
        assert!(text.contains("write with token 1 refused"), "{text}");
    }

    #[test]
    fn a_holder_that_knew_of_its_loss_is_not_a_violation() {
        let records = vec![
            record(10, 0, 0, Kind::Acquired(Some(1))),
            write(20, 0, 1, true),
            record(100, 1, 0, Kind::Acquired(Some(2))),
            write(110, 1, 2, true),
            record(115, 0, 0, Kind::Lost),
            write(120, 0, 1, false),
            write(130, 1, 2, true),
        ];
        assert_eq!(violations(&trace(records)), Vec::new());
    }

    #[test]
    fn a_token_lower_than_an_earlier_holders_breaks_token_order() {
        let records = vec![
            record(10, 0, 0, Kind::Acquired(Some(7))),
            write(20, 0, 7, true),
            record(30, 0, 0, Kind::Released(true)),
            record(40, 1, 0, Kind::Acquired(Some(3))),
            write(50, 1, 3, false),
            record(60, 1, 0, Kind::Released(true)),
        ];
        let found = violations(&trace(records));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].rule, Rule::TokenOrder);
        assert_eq!((found[0].earlier.client, found[0].later.client), (0, 1));
        // In order, the same history is clean.
        let records = vec![
            record(10, 0, 0, Kind::Acquired(Some(3))),
            write(20, 0, 3, true),
            record(40, 1, 0, Kind::Acquired(Some(7))),
            write(50, 1, 7, true),
        ];
        assert_eq!(violations(&trace(records)), Vec::new());
    }
}
