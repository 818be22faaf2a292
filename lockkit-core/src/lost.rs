//! Why a holding ended without its holder releasing it.

use std::fmt;

/// Why a lease was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The lease ran out: auto-renew was off and nobody extended it in time.
    Expired,
    /// Auto-renewal kept failing (e.g. the server was unreachable) until the lease ran out.
    RenewalFailed,
    /// The backend says the lease is no longer ours: it was deleted behind our
    /// back, expired on the server, or is now held by another owner.
    Revoked,
    /// The session that held the lock expired, or was out of touch with the
    /// servers for so long that it may have (ZooKeeper).
    SessionExpired,
    /// The connection that held the lock is gone (SQL session locks).
    ConnectionLost,
    /// The holding reached its [`max_hold`](crate::LockOptions::max_hold)
    /// and was ended.
    HoldLimit,
}

impl LostReason {
    /// A short name for a metric label: `expired`, `renewal_failed`,
    /// `revoked`, `session_expired`, `connection_lost` or `hold_limit`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            LostReason::Expired => "expired",
            LostReason::RenewalFailed => "renewal_failed",
            LostReason::Revoked => "revoked",
            LostReason::SessionExpired => "session_expired",
            LostReason::ConnectionLost => "connection_lost",
            LostReason::HoldLimit => "hold_limit",
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "the lease expired without being extended",
            LostReason::RenewalFailed => "renewal failed until the lease ran out",
            LostReason::Revoked => "the backend no longer holds the lease for this owner",
            LostReason::SessionExpired => "the session expired",
            LostReason::ConnectionLost => "the connection holding the lock was lost",
            LostReason::HoldLimit => "the holding reached its max_hold",
        })
    }
}
