//! What a run records: every step of every worker as the fenced resource saw
//! it, and the faults the orchestrator injected, on one clock.

use std::fmt;

/// Microseconds since the start of a run, on the orchestrator's clock (the
/// resource stamps every record when it arrives, so all workers share it).
pub type Micros = u64;

/// One step of one worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// When the resource received it.
    pub at: Micros,
    /// The worker (0-based).
    pub client: u32,
    /// The worker's attempt number; a critical section is `(client, section)`.
    pub section: u32,
    /// What happened.
    pub kind: Kind,
}

impl Record {
    /// A record of `client`'s section `section` at `at`.
    pub fn new(at: Micros, client: u32, section: u32, kind: Kind) -> Self {
        Record {
            at,
            client,
            section,
            kind,
        }
    }
}

/// The kinds of [`Record`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The worker starts to acquire the lock.
    Attempt,
    /// The lock was granted, with this fencing token (`None`: the backend has
    /// no fencing).
    Acquired(Option<u64>),
    /// A write to the resource inside the critical section, and whether the
    /// resource accepted it (a write whose token is lower than the last
    /// accepted one is rejected).
    Write {
        /// The token the write carried.
        token: Option<u64>,
        /// The write's index inside its critical section (0 = first).
        index: u32,
        /// Accepted by the resource.
        accepted: bool,
    },
    /// The attempt failed: `timeout`, `unavailable`, or another error kind.
    Failed(String),
    /// The worker saw the lease-lost signal and abandoned its critical section.
    Lost,
    /// The worker released the lock (`true`) or the release failed (`false`).
    Released(bool),
    /// The guard's early warning rose (`at_risk`) while it was still valid.
    AtRisk,
    /// The guard's lost signal (`lost()`) fired.
    LostSignal,
}

/// A fault injected by the orchestrator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// What was done, e.g. `pause holder 2` or `kill redis`.
    pub label: String,
    /// When it began.
    pub start: Micros,
    /// When it was healed (equal to `start` for a one-off such as a kill).
    pub end: Micros,
}

/// Everything one run recorded.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// The workers' records, in arrival order.
    pub records: Vec<Record>,
    /// The injected faults, in order.
    pub faults: Vec<Fault>,
    /// How many workers ran.
    pub clients: u32,
    /// The length of the run.
    pub duration: Micros,
    /// What the real stores made of each fenced write (empty when the run
    /// had no stores, or the backend no tokens).
    pub stores: Vec<StoreRecord>,
}

impl Trace {
    /// The run as text, one event a line in the order of the run's clock:
    /// the faults' starts and ends, and every worker's steps. Written for
    /// every run beside its timeline, and printed for a run that failed.
    pub fn events(&self) -> String {
        let mut lines: Vec<(Micros, String)> =
            Vec::with_capacity(self.records.len() + 2 * self.faults.len());
        for fault in &self.faults {
            lines.push((fault.start, format!("fault   {}: begins", fault.label)));
            if fault.end > fault.start {
                lines.push((fault.end, format!("fault   {}: healed", fault.label)));
            }
        }
        for record in &self.records {
            lines.push((
                record.at,
                format!(
                    "worker {} section {}: {}",
                    record.client, record.section, record.kind
                ),
            ));
        }
        // Stable: records that arrived at the same microsecond keep their order.
        lines.sort_by_key(|(at, _)| *at);
        let mut out = String::new();
        for (at, line) in lines {
            out.push_str(&format!("{:>10.6} s  {line}\n", at as f64 / 1e6));
        }
        out
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let token = |token: &Option<u64>| {
            token.map_or_else(|| "no token".to_owned(), |t| format!("token {t}"))
        };
        match self {
            Kind::Attempt => write!(f, "attempt"),
            Kind::Acquired(t) => write!(f, "acquired ({})", token(t)),
            Kind::Write {
                token: t,
                index,
                accepted,
            } => write!(
                f,
                "write {index} ({}) {}",
                token(t),
                if *accepted { "accepted" } else { "rejected" }
            ),
            Kind::Failed(kind) => write!(f, "failed: {kind}"),
            Kind::Lost => write!(f, "saw the lease lost (is_lost)"),
            Kind::Released(ok) => {
                write!(f, "released {}", if *ok { "ok" } else { "with an error" })
            }
            Kind::AtRisk => write!(f, "at risk"),
            Kind::LostSignal => write!(f, "lost signal"),
        }
    }
}

/// Formats microseconds as seconds with millisecond precision.
#[derive(Clone, Copy, Debug)]
pub struct Seconds(pub Micros);

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.2} s", self.0 as f64 / 1e6)
    }
}

/// `1234ms`: a duration as a URL parameter or command-line argument.
pub fn millis(duration: std::time::Duration) -> String {
    format!("{}ms", duration.as_millis())
}

/// A real store that fences.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Store {
    /// PostgreSQL, through `lockkit_fence`.
    Postgres,
    /// Redis, through the fence script.
    Redis,
}

impl Store {
    /// Both, in report order.
    pub const ALL: [Store; 2] = [Store::Postgres, Store::Redis];

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Store::Postgres => "PostgreSQL",
            Store::Redis => "Redis",
        }
    }
}

/// One write to one store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreWrite {
    /// The store.
    pub store: Store,
    /// When it was sent.
    pub sent: Micros,
    /// When the store answered.
    pub done: Micros,
    /// `Some(true)` admitted, `Some(false)` refused as stale, `None` the
    /// store failed.
    pub admitted: Option<bool>,
}

/// One worker write and what the stores made of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreRecord {
    /// The worker.
    pub client: u32,
    /// Its critical section.
    pub section: u32,
    /// Each store's answer.
    pub writes: Vec<StoreWrite>,
}
