#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
//!
//! ## How it runs
//!
//! A backend's test file implements [`Harness`] and expands
//! [`conformance_suite!`], which turns every case below into its own named
//! `#[tokio::test]` (the calling crate needs tokio with its `macros` and
//! `rt-multi-thread` features), so a failure says which case broke. Each case
//! is also a plain `async fn` over `&dyn Harness`, for running one by hand.
//!
//! Cases use unique lock names, so they can share one server with other tests.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{DistributedLock, Result};

mod bounds;
mod cases;
mod clocks;
mod contention;
mod elections;
mod family;
mod fifo;
mod lock_sets;
mod memory;
mod panics;
mod storage;

pub use bounds::*;
pub use cases::*;
pub use clocks::*;
pub use contention::{Probe, spawn_contenders};
pub use elections::*;
pub use family::*;
pub use fifo::*;
pub use lock_sets::*;
pub use memory::{MemoryHarness, Wrap};
pub use storage::*;

/// How long one case may run before it counts as hung.
pub const CASE_LIMIT: Duration = Duration::from_secs(90);

/// What a backend provides to run the suite.
#[async_trait::async_trait]
pub trait Harness: Send + Sync {
    /// A new, independent client of the shared server (its own connections).
    async fn client(&self) -> Arc<dyn DistributedLock>;

    /// Deletes the lease on `name` behind its holder's back, as an operator would.
    async fn revoke(&self, name: &str);

    /// A server of its own that the case may kill.
    async fn disposable(&self) -> Box<dyn Disposable>;

    /// The connect timeout the harness's clients are configured with.
    fn connect_timeout(&self) -> Duration;

    /// How many entries the shared server stores for lock and semaphore
    /// names that start with `prefix`: keys, rows or nodes, every one
    /// derived from such a name counted (entries shared by all names, such
    /// as one sequence, are not). Entries the server removes by itself
    /// shortly (an expiring key, a container node the server reaps) may be
    /// waited for, for a few seconds at most.
    async fn stored_entries(&self, prefix: &str) -> usize;

    /// How many clients the shared server shows waiting for `name`, where
    /// `status` does not count them but the harness can read them from the
    /// server (MariaDB's `lease` mode: the release bells in its process
    /// list); `None` (the default) where it cannot.
    async fn waiting_clients(&self, name: &str) -> Option<usize> {
        let _ = name;
        None
    }
}

/// A server that one case owns and may kill; see [`Harness::disposable`].
#[async_trait::async_trait]
pub trait Disposable: Send + Sync {
    /// A client of this server. Once the server is dead this must fail with
    /// `LockError::Unavailable` (or give a client whose first call does).
    async fn connect(&self) -> Result<Arc<dyn DistributedLock>>;

    /// Kills the server (the process dies; nothing is shut down gracefully).
    async fn kill(&mut self);

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    async fn pause(&mut self);

    /// Unfreezes the server.
    async fn resume(&mut self);

    /// Starts the server again after [`kill`](Self::kill) (killing it
    /// first if it runs), on the same address and with its data, returning
    /// once it serves. Takes `&self`, so that a case can connect while the
    /// server starts.
    async fn restart(&self);

    /// Like [`connect`](Self::connect), with the client's connect timeout
    /// set to `timeout`.
    async fn connect_within(&self, timeout: Duration) -> Result<Arc<dyn DistributedLock>>;

    /// Moves every server's wall clock `offset` ahead of the machine's
    /// (`None`: back to the machine's), as a clock that leaps would; `false`
    /// (the default) when this harness cannot move them. The cases about
    /// clocks have nothing to check then.
    async fn shift_clock(&mut self, offset: Option<Duration>) -> bool {
        let _ = offset;
        false
    }
}

/// Expands to one `#[tokio::test]` per conformance case, each building its own
/// harness from the given expression (which may use `.await`).
#[macro_export]
macro_rules! conformance_suite {
    ($harness:expr) => {
        $crate::conformance_suite!(@cases $harness;
            mutual_exclusion_between_two_clients,
            independent_names,
            reacquire_after_release,
            double_release_is_harmless,
            stale_guard_cannot_release_or_extend,
            ttl_expiry_frees_crashed_holder,
            extend_by_holder,
            auto_renew_keeps_lock_across_five_ttls,
            lost_signal_when_lease_deleted,
            lost_signal_when_server_dies,
            renewal_survives_a_short_outage,
            fencing_tokens_strictly_increase,
            is_current_tells_the_holding,
            acquire_succeeds_when_holder_releases,
            acquire_times_out_near_deadline,
            a_waiter_that_gives_up_leaves_the_line,
            a_wait_given_up_never_takes_the_lock_later,
            no_wait_gives_timeout_at_once,
            no_overlap_under_contention,
            cancelled_acquires_leak_no_lease,
            acquire_given_up_in_an_outage_is_undone,
            dropped_guard_releases_promptly,
            invalid_names_rejected,
            invalid_options_rejected,
            odd_names_work_and_do_not_collide,
            dead_server_gives_unavailable,
            connect_waits_for_a_starting_server,
            guard_reports_its_state,
            status_reports_the_holder,
            fifo_backends_serve_waiters_in_order,
            a_release_goes_to_a_waiting_client,
            a_client_that_does_not_ask_again_holds_up_no_turn,
            a_dropped_client_holds_up_no_turn,
            a_release_wakes_the_watchers_of_other_clients,
            local_handoffs_keep_exclusion_and_fencing,
            unsupported_kinds_are_refused,
            two_readers_hold_together,
            readers_arriving_together_all_get_in,
            writer_and_readers_exclude_each_other,
            no_writer_starvation,
            readers_and_a_writer_of_one_client_all_get_through,
            semaphore_admits_exactly_its_permits,
            semaphore_bounds_holders_under_contention,
            crashed_permit_comes_back,
            fencing_tokens_across_kinds,
            fencing_tokens_keep_rising_when_the_server_clock_goes_back,
            cancelled_family_acquires_leak_nothing,
            dropped_family_guards_release,
            mixed_permits_follow_the_documented_rule,
            lock_sets_in_opposite_orders_never_deadlock,
            cancelled_lock_set_leaves_nothing,
            elections_have_one_leader_at_a_time,
            lost_leadership_is_told_before_a_new_leader,
            holder_identities_are_read_back,
            holder_identities_follow_the_holding,
            released_names_leave_bounded_storage,
            max_hold_ends_the_holding,
            min_hold_keeps_the_name_after_an_early_release,
            lock_delay_keeps_an_unreleased_name,
            a_lapsed_guard_keeps_its_lock_delay,
            at_risk_rises_when_cut_off_and_clears_when_healed,
            invalid_bounds_rejected,
        );
    };
    (@cases $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $harness;
                tokio::time::timeout(
                    $crate::CASE_LIMIT,
                    $crate::$case(&harness),
                )
                .await
                .expect(concat!("conformance case `", stringify!($case), "` hung"));
            }
        )*
    };
}
