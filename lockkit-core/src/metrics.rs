//! Metrics through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! With the cargo feature `metrics` (of `lockkit-core`, or of `lockkit`),
//! every backend emits the metrics below to whatever recorder the
//! application installed (Prometheus, StatsD, OpenTelemetry exporters all
//! plug into the facade). The keys of the metrics every acquire records
//! are made once per backend, so that without a recorder those cost a
//! thread-local read and an atomic load. Without the feature nothing is
//! compiled in. The names are fixed
//! here as constants.
//!
//! Labels are bounded: the backend (`redis`, `zookeeper`, …) and an outcome
//! or reason from a short fixed list. Lock names are never labels (a
//! service that locks per order would make a series per order).
//!
//! | name | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `lockkit_acquires_total` | counter | `backend`, `op`, `outcome` | acquires ended: `op` is `acquire` or `try_acquire`; `outcome` is `acquired`, `busy` (a `try_acquire` that found the lock held), `timeout` or `error` |
//! | `lockkit_acquire_wait_seconds` | histogram | `backend`, `op`, `outcome` | from the call to its end |
//! | `lockkit_acquire_attempts_total` | counter | `backend` | attempts made on the server (a backend whose server queues the waiters makes one per acquire); ÷ `lockkit_acquires_total`, the attempts per acquire |
//! | `lockkit_renewals_total` | counter | `backend`, `outcome` | watchdog renewals: `renewed`, `failed` (retried while the lease lasts) or `refused` (the lease was no longer ours) |
//! | `lockkit_leases_lost_total` | counter | `backend`, `reason` | holdings lost, by [`LostReason`](crate::LostReason) (`expired`, `renewal_failed`, `revoked`, `session_expired`, `connection_lost`, `hold_limit`) |
//! | `lockkit_at_risk_total` | counter | `backend` | holdings that became at risk ([`LockGuard::is_at_risk`](crate::LockGuard::is_at_risk)): a renewal failed or was overdue, or the session was down |
//! | `lockkit_at_risk_seconds` | histogram | `backend` | how long each at-risk spell lasted, recorded when it ends (a renewal confirmed the holding, or it was lost) |
//! | `lockkit_handoff_seconds` | histogram | `backend` | hand-over inside one client: from a holder's release to the grant of the next task of the same client that waited for the name |
//! | `lockkit_leader_changes_total` | counter | `change` | elections: `elected` (this candidate leads), `resigned`, and `observed` (an [`observe`](crate::Election::observe) watch saw another leader) |
//!
//! A test (`tests/metrics.rs` of `lockkit-core`) installs a recorder and
//! checks that each of them is emitted.

use std::time::Duration;

/// Counter of acquires ended (labels `backend`, `op`, `outcome`).
pub const ACQUIRES: &str = "lockkit_acquires_total";
/// Histogram of an acquire's duration in seconds (labels `backend`, `op`,
/// `outcome`).
pub const ACQUIRE_WAIT: &str = "lockkit_acquire_wait_seconds";
/// Counter of attempts made on the server (label `backend`).
pub const ACQUIRE_ATTEMPTS: &str = "lockkit_acquire_attempts_total";
/// Counter of watchdog renewals (labels `backend`, `outcome`).
pub const RENEWALS: &str = "lockkit_renewals_total";
/// Counter of holdings lost (labels `backend`, `reason`).
pub const LEASES_LOST: &str = "lockkit_leases_lost_total";
/// Counter of holdings that became at risk (label `backend`).
pub const AT_RISK: &str = "lockkit_at_risk_total";
/// Histogram of at-risk spells in seconds (label `backend`).
pub const AT_RISK_TIME: &str = "lockkit_at_risk_seconds";
/// Histogram of in-client hand-overs in seconds (label `backend`).
pub const HANDOFF: &str = "lockkit_handoff_seconds";
/// Counter of leadership changes (label `change`).
pub const LEADER_CHANGES: &str = "lockkit_leader_changes_total";

#[cfg(feature = "metrics")]
mod emit {
    use std::cell::Cell;
    use std::sync::Mutex;

    use metrics::{Key, Label, Level, Metadata};

    use super::*;

    /// What the metrics macros would pass for a metric of this module.
    static METADATA: Metadata<'static> =
        Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

    /// The `op` labels of [`ACQUIRES`] and [`ACQUIRE_WAIT`].
    const OPS: [&str; 2] = ["acquire", "try_acquire"];
    /// Their `outcome` labels.
    const OUTCOMES: [&str; 4] = ["acquired", "busy", "timeout", "error"];

    /// The keys of one backend's per-acquire metrics, made once per backend
    /// name and kept for the rest of the process (a program has a handful
    /// of backends, each named by a static string; at most
    /// [`MAX_BACKENDS`] are kept): an acquire hands the
    /// recorder a key it already has, where the metrics macros would build
    /// one (its labels allocated and hashed) each time, recorder or not.
    struct AcquireKeys {
        backend: &'static str,
        /// [`ACQUIRES`] by op and outcome.
        ended: [[Key; OUTCOMES.len()]; OPS.len()],
        /// [`ACQUIRE_WAIT`] by op and outcome.
        waited: [[Key; OUTCOMES.len()]; OPS.len()],
        /// [`ACQUIRE_ATTEMPTS`].
        attempts: Key,
    }

    impl AcquireKeys {
        fn new(backend: &'static str) -> Self {
            let labelled = |name: &'static str, op: &'static str, outcome: &'static str| {
                Key::from_parts(
                    name,
                    vec![
                        Label::from_static_parts("backend", backend),
                        Label::from_static_parts("op", op),
                        Label::from_static_parts("outcome", outcome),
                    ],
                )
            };
            let by_op_and_outcome = |name: &'static str| {
                OPS.map(|op| OUTCOMES.map(|outcome| labelled(name, op, outcome)))
            };
            AcquireKeys {
                backend,
                ended: by_op_and_outcome(ACQUIRES),
                waited: by_op_and_outcome(ACQUIRE_WAIT),
                attempts: Key::from_parts(
                    ACQUIRE_ATTEMPTS,
                    vec![Label::from_static_parts("backend", backend)],
                ),
            }
        }
    }

    /// How many backends' keys the process keeps at most: past that (a
    /// program that makes up backend names), keys are built per use.
    const MAX_BACKENDS: usize = 64;

    /// The keys of `backend`: those this thread used last, else those of
    /// the process's list (made and added the first time); `None` when the
    /// list is full.
    fn keys_of(backend: &'static str) -> Option<&'static AcquireKeys> {
        thread_local! {
            static LAST: Cell<Option<&'static AcquireKeys>> = const { Cell::new(None) };
        }
        static ALL: Mutex<Vec<&'static AcquireKeys>> = Mutex::new(Vec::new());
        if let Some(keys) = LAST.get()
            && keys.backend == backend
        {
            return Some(keys);
        }
        let keys = {
            let mut all = ALL.lock().unwrap_or_else(|p| p.into_inner());
            match all.iter().find(|keys| keys.backend == backend) {
                Some(keys) => *keys,
                None if all.len() >= MAX_BACKENDS => return None,
                None => {
                    let keys: &'static AcquireKeys = Box::leak(Box::new(AcquireKeys::new(backend)));
                    all.push(keys);
                    keys
                }
            }
        };
        LAST.set(Some(keys));
        Some(keys)
    }

    pub(crate) fn acquire(
        backend: &'static str,
        op: &'static str,
        outcome: &'static str,
        took: Duration,
    ) {
        let known = |labels: &[&str], label| labels.iter().position(|l| *l == label);
        let (Some(op), Some(outcome), Some(keys)) =
            (known(&OPS, op), known(&OUTCOMES, outcome), keys_of(backend))
        else {
            // An op of a backend of its own, or too many backends: keyed
            // afresh.
            metrics::counter!(ACQUIRES, "backend" => backend, "op" => op, "outcome" => outcome)
                .increment(1);
            metrics::histogram!(ACQUIRE_WAIT, "backend" => backend, "op" => op, "outcome" => outcome)
                .record(took.as_secs_f64());
            return;
        };
        metrics::with_recorder(|recorder| {
            recorder
                .register_counter(&keys.ended[op][outcome], &METADATA)
                .increment(1);
            recorder
                .register_histogram(&keys.waited[op][outcome], &METADATA)
                .record(took.as_secs_f64());
        });
    }

    pub(crate) fn attempt(backend: &'static str) {
        let Some(keys) = keys_of(backend) else {
            metrics::counter!(ACQUIRE_ATTEMPTS, "backend" => backend).increment(1);
            return;
        };
        metrics::with_recorder(|recorder| {
            recorder
                .register_counter(&keys.attempts, &METADATA)
                .increment(1);
        });
    }

    pub(crate) fn renewal(backend: &'static str, outcome: &'static str) {
        metrics::counter!(RENEWALS, "backend" => backend, "outcome" => outcome).increment(1);
    }

    pub(crate) fn lost(backend: &'static str, reason: &'static str) {
        metrics::counter!(LEASES_LOST, "backend" => backend, "reason" => reason).increment(1);
    }

    pub(crate) fn at_risk(backend: &'static str) {
        metrics::counter!(AT_RISK, "backend" => backend).increment(1);
    }

    pub(crate) fn at_risk_for(backend: &'static str, took: Duration) {
        metrics::histogram!(AT_RISK_TIME, "backend" => backend).record(took.as_secs_f64());
    }

    pub(crate) fn handoff(backend: &'static str, took: Duration) {
        metrics::histogram!(HANDOFF, "backend" => backend).record(took.as_secs_f64());
    }

    pub(crate) fn leader_change(change: &'static str) {
        metrics::counter!(LEADER_CHANGES, "change" => change).increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
mod emit {
    use super::*;

    pub(crate) fn acquire(_: &'static str, _: &'static str, _: &'static str, _: Duration) {}
    pub(crate) fn attempt(_: &'static str) {}
    pub(crate) fn renewal(_: &'static str, _: &'static str) {}
    pub(crate) fn lost(_: &'static str, _: &'static str) {}
    pub(crate) fn at_risk(_: &'static str) {}
    pub(crate) fn at_risk_for(_: &'static str, _: Duration) {}
    pub(crate) fn handoff(_: &'static str, _: Duration) {}
    pub(crate) fn leader_change(_: &'static str) {}
}

pub(crate) use emit::*;
