//! A run's records, grouped into critical sections: what the checker and
//! the history checker read, and what the timeline draws.

use std::collections::BTreeMap;

use crate::record::{Kind, Micros, Trace};

/// One critical section (or attempt) of one worker.
#[derive(Clone, Debug, Default)]
pub struct Section {
    /// The worker.
    pub client: u32,
    /// The worker's attempt number.
    pub section: u32,
    /// The fencing token, if the backend gave one.
    pub token: Option<u64>,
    /// When the grant was reported.
    pub acquired_at: Option<Micros>,
    /// Every write: (time, accepted).
    pub writes: Vec<(Micros, bool)>,
    /// When the worker released it, or saw it lost.
    pub ended_at: Option<Micros>,
    /// Released without error.
    pub released: bool,
    /// Abandoned on the lease-lost signal.
    pub lost: bool,
    /// When the worker noticed the loss (`guard.is_lost()`) and said so,
    /// if it did: its writes after that are made knowing.
    pub lost_at: Option<Micros>,
    /// When the guard's early warning rose, if it did.
    pub at_risk_at: Option<Micros>,
    /// When the guard's lost signal fired, if it did.
    pub lost_signal_at: Option<Micros>,
}

impl Section {
    /// First and last write, if it wrote at all.
    pub fn interval(&self) -> Option<(Micros, Micros)> {
        Some((self.writes.first()?.0, self.writes.last()?.0))
    }

    /// The time of its first accepted write.
    pub fn first_accepted(&self) -> Option<Micros> {
        self.writes
            .iter()
            .find(|(_, accepted)| *accepted)
            .map(|(at, _)| *at)
    }

    /// Released after all its writes were accepted.
    pub fn completed(&self) -> bool {
        self.released && !self.writes.is_empty() && self.writes.iter().all(|(_, ok)| *ok)
    }

    /// Whether `self` was granted after `other`, in real time (the grant as
    /// the resource saw it reported). Not by token: the point of the check is
    /// to catch tokens that disagree with the real order.
    pub(crate) fn newer_than(&self, other: &Section) -> bool {
        self.acquired_at > other.acquired_at
    }
}

/// The sections of a trace, ordered by worker and attempt.
pub fn sections(trace: &Trace) -> Vec<Section> {
    let mut sections: BTreeMap<(u32, u32), Section> = BTreeMap::new();
    for record in &trace.records {
        let section = sections
            .entry((record.client, record.section))
            .or_insert_with(|| Section {
                client: record.client,
                section: record.section,
                ..Section::default()
            });
        match &record.kind {
            Kind::Attempt | Kind::Failed(_) => {}
            Kind::AtRisk => section.at_risk_at = Some(record.at),
            Kind::LostSignal => section.lost_signal_at = Some(record.at),
            Kind::Acquired(token) => {
                section.token = *token;
                section.acquired_at = Some(record.at);
            }
            Kind::Write { accepted, .. } => section.writes.push((record.at, *accepted)),
            Kind::Lost => {
                section.lost = true;
                section.lost_at = section.lost_at.or(Some(record.at));
                section.ended_at = section.ended_at.max(Some(record.at));
            }
            Kind::Released(ok) => {
                section.released = *ok;
                section.ended_at = section.ended_at.max(Some(record.at));
            }
        }
    }
    sections
        .into_values()
        .filter(|section| section.acquired_at.is_some())
        .collect()
}

/// The pairs (as indexes into `sections`) of overlapping sections.
pub fn overlapping_pairs(sections: &[Section]) -> Vec<(usize, usize)> {
    let mut pairs = Vec::new();
    for (i, a) in sections.iter().enumerate() {
        let Some((a_start, a_end)) = a.interval() else {
            continue;
        };
        for (j, b) in sections.iter().enumerate().skip(i + 1) {
            if a.client == b.client {
                continue;
            }
            if let Some((b_start, b_end)) = b.interval()
                && a_start <= b_end
                && b_start <= a_end
            {
                pairs.push((i, j));
            }
        }
    }
    pairs
}
