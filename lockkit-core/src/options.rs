//! Per-call lock options.

use std::time::Duration;

use crate::backoff::Backoff;
use crate::error::{LockError, Result};

/// The shortest lease lockkit accepts.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The longest lease or wait lockkit accepts (365 days); wait longer with
/// [`LockOptions::wait_forever`].
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest [`max_hold`](LockOptions::max_hold),
/// [`min_hold`](LockOptions::min_hold) or
/// [`lock_delay`](LockOptions::lock_delay) lockkit accepts: one day.
pub const MAX_BOUND: Duration = Duration::from_secs(24 * 3600);

/// The longest holder identity lockkit accepts, in bytes of UTF-8.
pub const MAX_HOLDER_LEN: usize = 255;

/// What kind of holding a request asks for; see [`LockOptions::shared`],
/// [`exclusive`](LockOptions::exclusive) and
/// [`semaphore`](LockOptions::semaphore).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// The write side of NAME's reader-writer lock: excludes every other
    /// holding of NAME. What every lock is unless asked otherwise.
    #[default]
    Exclusive,
    /// The read side of NAME's reader-writer lock: shared holdings coexist,
    /// an exclusive one excludes them.
    Shared,
    /// One of `permits` permits of the semaphore NAME (a namespace of its
    /// own: the semaphore `jobs` and the lock `jobs` are unrelated).
    Semaphore {
        /// How many holdings the semaphore allows at once.
        permits: u32,
    },
}

/// How long [`acquire`](crate::DistributedLock::acquire) waits for a held lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wait {
    /// One attempt; `Timeout` if the lock is held.
    NoWait,
    /// Wait up to this long, then `Timeout`.
    For(Duration),
    /// Wait until the lock is granted (or an error occurs).
    Forever,
}

/// Options of one lock request.
///
/// ```
/// use std::time::Duration;
/// use lockkit_core::{LockOptions, Wait};
///
/// let opts = LockOptions::new()
///     .ttl(Duration::from_secs(10))
///     .wait_for(Duration::from_secs(2))
///     .auto_renew(false);
/// assert_eq!(opts.lease_ttl(), Duration::from_secs(10));
/// assert_eq!(opts.wait(), Wait::For(Duration::from_secs(2)));
/// assert!(!opts.auto_renews());
/// assert_eq!(LockOptions::new(), LockOptions::default());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LockOptions {
    ttl: Duration,
    wait: Wait,
    auto_renew: bool,
    backoff: Backoff,
    kind: LockKind,
    holder: Option<String>,
    bounds: HoldBounds,
}

/// The bounds of a holding: see [`LockOptions::max_hold`],
/// [`min_hold`](LockOptions::min_hold) and
/// [`lock_delay`](LockOptions::lock_delay). All off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HoldBounds {
    /// The longest a holding lasts, from its grant.
    pub max_hold: Option<Duration>,
    /// The shortest time the name stays taken, from the grant.
    pub min_hold: Option<Duration>,
    /// How long the name stays taken after a holding ends without a release.
    pub lock_delay: Option<Duration>,
}

impl HoldBounds {
    /// Whether any bound is set.
    pub fn any(&self) -> bool {
        self.max_hold.is_some() || self.min_hold.is_some() || self.lock_delay.is_some()
    }

    /// The lease length to ask the server for, for a holding whose client
    /// validity is `ttl`: `ttl` plus the lock delay, and never more than
    /// the max hold (counted from the request).
    pub fn server_ttl(&self, ttl: Duration) -> Duration {
        self.server_ttl_within(ttl, self.max_hold)
    }

    /// [`server_ttl`](Self::server_ttl) when `left` of the max hold
    /// remains: `ttl` plus the lock delay, never more than `left`.
    pub(crate) fn server_ttl_within(&self, ttl: Duration, left: Option<Duration>) -> Duration {
        let ttl = ttl + self.lock_delay.unwrap_or_default();
        left.map_or(ttl, |left| ttl.min(left))
    }
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(30),
            wait: Wait::Forever,
            auto_renew: true,
            backoff: Backoff::DEFAULT,
            kind: LockKind::Exclusive,
            holder: None,
            bounds: HoldBounds::default(),
        }
    }
}

impl LockOptions {
    /// The defaults: 30 s lease, wait forever, auto-renew on.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lease length (default 30 s). A lease that is not extended ends `ttl` after
    /// it was granted. For session-based backends it is the client-side validity bound.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Wait up to `wait` for a held lock. `Duration::ZERO` means [`no_wait`](Self::no_wait).
    pub fn wait_for(mut self, wait: Duration) -> Self {
        self.wait = if wait.is_zero() {
            Wait::NoWait
        } else {
            Wait::For(wait)
        };
        self
    }

    /// Make one attempt only.
    pub fn no_wait(mut self) -> Self {
        self.wait = Wait::NoWait;
        self
    }

    /// Wait until the lock is granted (the default).
    pub fn wait_forever(mut self) -> Self {
        self.wait = Wait::Forever;
        self
    }

    /// Renew the lease every `ttl / 3` while the guard lives (default `true`).
    /// When renewal keeps failing until the lease runs out, the guard is marked lost.
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// The retry delays used when the backend gives no better hint (default [`Backoff::DEFAULT`]).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The read side of NAME's reader-writer lock: shared holdings of NAME
    /// coexist; an exclusive holding excludes them, and once an exclusive
    /// acquirer waits, new shared acquirers wait behind it. A backend that
    /// cannot do this answers [`LockError::Unsupported`] (see
    /// [`Capabilities::shared`](crate::Capabilities::shared)).
    pub fn shared(mut self) -> Self {
        self.kind = LockKind::Shared;
        self
    }

    /// The write side of NAME's reader-writer lock: excludes every other
    /// holding of NAME. The default.
    pub fn exclusive(mut self) -> Self {
        self.kind = LockKind::Exclusive;
        self
    }

    /// One of `permits` permits of the semaphore NAME: at most `permits`
    /// holdings at once, each its own lease. Every user of one semaphore is
    /// expected to pass the same `permits`. `0` is `InvalidOptions`; a backend
    /// that has no semaphores answers [`LockError::Unsupported`] (see
    /// [`Capabilities::semaphore`](crate::Capabilities::semaphore)).
    pub fn semaphore(mut self, permits: u32) -> Self {
        self.kind = LockKind::Semaphore { permits };
        self
    }

    /// Records `identity` with the holding, for `status` and elections: at
    /// most 255 bytes of UTF-8, not empty, no control characters (else
    /// `InvalidOptions`). Off by default, as it costs a write on some
    /// backends; a backend that cannot record it answers
    /// [`LockError::Unsupported`].
    pub fn holder(mut self, identity: impl Into<String>) -> Self {
        self.holder = Some(identity.into());
        self
    }

    /// Ends the holding at grant + `limit`, whatever renews it: renewals
    /// never carry the lease past that point, the guard is then lost with
    /// [`LostReason::HoldLimit`](crate::LostReason::HoldLimit) and the name
    /// freed, so a hung holder that still renews cannot hold for ever
    /// (ShedLock's `lockAtMostFor`). At most one day, and not below
    /// [`min_hold`](Self::min_hold) (else `InvalidOptions`). Every backend
    /// keeps it.
    pub fn max_hold(mut self, limit: Duration) -> Self {
        self.bounds.max_hold = Some(limit);
        self
    }

    /// Keeps the name taken until grant + `floor` even when the holding is
    /// released (or dropped, or lost) before: a job that finishes in a
    /// second on one machine is not run again by a machine whose trigger is
    /// a little late (ShedLock's `lockAtLeastFor`). The server keeps the
    /// name, so this holds when the client process has exited; then the
    /// name is free with nothing left behind, and the holding's fencing
    /// token stays the greatest on the name. At most one day. Backends
    /// whose locks live only as long as a session or connection answer
    /// [`LockError::Unsupported`] (see
    /// [`Capabilities::min_hold`](crate::Capabilities::min_hold)).
    pub fn min_hold(mut self, floor: Duration) -> Self {
        self.bounds.min_hold = Some(floor);
        self
    }

    /// Keeps the name taken `delay` longer when the holding ends without a
    /// release: its holder crashed, froze or was cut off, or its lease ran
    /// out. Writes the holder still had in flight then land before the next
    /// holder starts (Chubby's lock-delay, Consul's session `LockDelay`).
    /// [`LockGuard::release`](crate::LockGuard::release) (and dropping the
    /// guard) frees the name at once. The server keeps the delay: the lease
    /// asked for is `ttl + delay`, while the guard counts its validity from
    /// `ttl` alone. At most one day. Backends whose locks live only as long
    /// as a session or connection answer [`LockError::Unsupported`] (see
    /// [`Capabilities::lock_delay`](crate::Capabilities::lock_delay)).
    pub fn lock_delay(mut self, delay: Duration) -> Self {
        self.bounds.lock_delay = Some(delay);
        self
    }

    /// The bounds asked for ([`max_hold`](Self::max_hold),
    /// [`min_hold`](Self::min_hold), [`lock_delay`](Self::lock_delay)).
    pub fn bounds(&self) -> HoldBounds {
        self.bounds
    }

    /// The kind of holding asked for.
    pub fn kind(&self) -> LockKind {
        self.kind
    }

    /// The default options for a holding of `kind`.
    pub(crate) fn of_kind(kind: LockKind) -> Self {
        LockOptions {
            kind,
            ..LockOptions::new()
        }
    }

    /// The holder identity to record, if any.
    pub fn holder_identity(&self) -> Option<&str> {
        self.holder.as_deref()
    }

    /// The lease length.
    pub fn lease_ttl(&self) -> Duration {
        self.ttl
    }

    /// The wait.
    pub fn wait(&self) -> Wait {
        self.wait
    }

    /// Whether the lease is auto-renewed.
    pub fn auto_renews(&self) -> bool {
        self.auto_renew
    }

    /// The retry delays.
    pub fn backoff_policy(&self) -> Backoff {
        self.backoff
    }

    /// Checks every value; `InvalidOptions` says which one is out of range.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lockkit_core::LockOptions;
    /// assert!(LockOptions::new().ttl(Duration::ZERO).validate().is_err());
    /// assert!(LockOptions::new().ttl(Duration::MAX).validate().is_err());
    /// assert!(LockOptions::new().validate().is_ok());
    /// ```
    pub fn validate(&self) -> Result<()> {
        check_ttl(self.ttl)?;
        if let Wait::For(wait) = self.wait
            && wait > MAX_DURATION
        {
            return Err(LockError::invalid_options(format!(
                "wait {wait:?} exceeds the maximum of 365 days; use wait_forever()"
            )));
        }
        if self.kind == (LockKind::Semaphore { permits: 0 }) {
            return Err(LockError::invalid_options(
                "a semaphore needs at least one permit; semaphore(0) allows no holder",
            ));
        }
        if let Some(identity) = &self.holder {
            check_holder(identity)?;
        }
        check_bounds(&self.bounds)?;
        self.backoff.check().map_err(LockError::invalid_options)
    }

    /// `Unsupported` when these options ask `backend`, which can do what
    /// `capabilities` say, for a kind of holding it cannot give (shared, a
    /// semaphore permit) or for a holder identity it cannot record. For
    /// backend implementors: every engine calls it before it sends anything,
    /// so that no request is ever granted as a different kind.
    pub fn check_supported(
        &self,
        backend: &'static str,
        capabilities: &crate::Capabilities,
    ) -> Result<()> {
        let operation = match self.kind {
            LockKind::Shared if !capabilities.shared => {
                Some("take the shared side of a reader-writer lock")
            }
            LockKind::Semaphore { .. } if !capabilities.semaphore => {
                Some("hold a semaphore permit")
            }
            _ if self.holder.is_some() && !capabilities.holder => Some("record a holder identity"),
            _ if self.bounds.min_hold.is_some() && !capabilities.min_hold => Some(
                "keep a name taken after its release (min_hold): its locks end with the client's session or connection",
            ),
            _ if self.bounds.lock_delay.is_some() && !capabilities.lock_delay => Some(
                "keep a name taken after an unclean end (lock_delay): its locks end with the client's session or connection",
            ),
            _ => None,
        };
        match operation {
            Some(operation) => Err(LockError::Unsupported { backend, operation }),
            None => Ok(()),
        }
    }
}

/// Checks a holder identity: 1..=255 bytes of UTF-8, no control characters.
fn check_holder(identity: &str) -> Result<()> {
    let reason = if identity.is_empty() {
        "a holder identity must not be empty".to_owned()
    } else if identity.len() > MAX_HOLDER_LEN {
        format!(
            "a holder identity is at most {MAX_HOLDER_LEN} bytes; this one has {}",
            identity.len()
        )
    } else if identity.chars().any(char::is_control) {
        format!("the holder identity {identity:?} has a control character")
    } else {
        return Ok(());
    };
    Err(LockError::invalid_options(reason))
}

/// Checks the bounds of a holding: each above zero and at most
/// [`MAX_BOUND`], and `min_hold` not above `max_hold`.
fn check_bounds(bounds: &HoldBounds) -> Result<()> {
    for (option, value) in [
        ("max_hold", bounds.max_hold),
        ("min_hold", bounds.min_hold),
        ("lock_delay", bounds.lock_delay),
    ] {
        match value {
            Some(d) if d.is_zero() => {
                return Err(LockError::invalid_options(format!(
                    "{option} must be above zero; leave it unset for none"
                )));
            }
            Some(d) if d > MAX_BOUND => {
                return Err(LockError::invalid_options(format!(
                    "{option} {d:?} exceeds the maximum of one day"
                )));
            }
            _ => {}
        }
    }
    if let (Some(floor), Some(limit)) = (bounds.min_hold, bounds.max_hold)
        && floor > limit
    {
        return Err(LockError::invalid_options(format!(
            "min_hold {floor:?} is above max_hold {limit:?}: the name cannot stay taken longer than a holding may last"
        )));
    }
    Ok(())
}

/// Checks a lease length: between [`MIN_TTL`] and [`MAX_DURATION`].
pub fn check_ttl(ttl: Duration) -> Result<()> {
    if ttl < MIN_TTL {
        Err(LockError::invalid_options(format!(
            "ttl {ttl:?} is below the minimum of {MIN_TTL:?}"
        )))
    } else if ttl > MAX_DURATION {
        Err(LockError::invalid_options(format!(
            "ttl {ttl:?} exceeds the maximum of 365 days"
        )))
    } else {
        Ok(())
    }
}

/// The clock drift allowance subtracted from every lease's validity: 1 % of the
/// TTL plus 2 ms (the Redlock paper's figure, applied to every backend).
pub fn clock_drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_zero_is_no_wait() {
        assert_eq!(
            LockOptions::new().wait_for(Duration::ZERO).wait(),
            Wait::NoWait
        );
    }

    #[test]
    fn rejects_out_of_range() {
        for opts in [
            LockOptions::new().ttl(Duration::ZERO),
            LockOptions::new().ttl(Duration::from_millis(9)),
            LockOptions::new().ttl(MAX_DURATION + Duration::from_secs(1)),
            LockOptions::new().wait_for(Duration::MAX),
            LockOptions::new().backoff(Backoff::new(Duration::ZERO, Duration::ZERO)),
            LockOptions::new().semaphore(0),
            LockOptions::new().holder(""),
            LockOptions::new().holder("x".repeat(MAX_HOLDER_LEN + 1)),
            LockOptions::new().holder("tab\there"),
            LockOptions::new().max_hold(Duration::ZERO),
            LockOptions::new().min_hold(Duration::ZERO),
            LockOptions::new().lock_delay(Duration::ZERO),
            LockOptions::new().max_hold(MAX_BOUND + Duration::from_secs(1)),
            LockOptions::new().min_hold(MAX_BOUND + Duration::from_secs(1)),
            LockOptions::new().lock_delay(MAX_BOUND + Duration::from_secs(1)),
            LockOptions::new()
                .min_hold(Duration::from_secs(2))
                .max_hold(Duration::from_secs(1)),
        ] {
            assert!(
                matches!(opts.validate(), Err(LockError::InvalidOptions { .. })),
                "{opts:?}"
            );
        }
        assert!(LockOptions::new().ttl(MIN_TTL).validate().is_ok());
        assert!(
            LockOptions::new()
                .ttl(MAX_DURATION)
                .wait_for(MAX_DURATION)
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn kinds_and_holder() {
        let opts = LockOptions::new().semaphore(4).holder("host:42");
        assert_eq!(opts.kind(), LockKind::Semaphore { permits: 4 });
        assert_eq!(opts.holder_identity(), Some("host:42"));
        assert!(opts.validate().is_ok());
        assert_eq!(opts.clone().shared().kind(), LockKind::Shared);
        assert_eq!(opts.shared().exclusive().kind(), LockKind::Exclusive);
        assert_eq!(LockOptions::new().kind(), LockKind::Exclusive);
        assert!(
            LockOptions::new()
                .holder("é".repeat(127))
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn unsupported_requests_are_named() {
        use crate::{Capabilities, ReleaseOnCrash};
        let caps = Capabilities::new(ReleaseOnCrash::Ttl);
        for opts in [
            LockOptions::new().shared(),
            LockOptions::new().semaphore(2),
            LockOptions::new().holder("me"),
        ] {
            assert!(
                matches!(
                    opts.check_supported("x", &caps),
                    Err(LockError::Unsupported { backend: "x", .. })
                ),
                "{opts:?}"
            );
        }
        assert!(LockOptions::new().check_supported("x", &caps).is_ok());
        let all = caps
            .with_shared(true)
            .with_semaphore(true)
            .with_holder(true);
        assert!(
            LockOptions::new()
                .shared()
                .holder("me")
                .check_supported("x", &all)
                .is_ok()
        );
    }

    #[test]
    fn bounds() {
        let s = Duration::from_secs;
        let opts = LockOptions::new()
            .max_hold(s(60))
            .min_hold(s(60))
            .lock_delay(s(5));
        assert!(opts.validate().is_ok());
        let bounds = opts.bounds();
        assert_eq!(bounds.server_ttl(s(30)), s(35));
        assert_eq!(bounds.server_ttl(s(58)), s(60), "capped by max_hold");
        assert_eq!(HoldBounds::default().server_ttl(s(30)), s(30));
        assert!(!LockOptions::new().bounds().any());
        assert!(LockOptions::new().max_hold(MAX_BOUND).validate().is_ok());
        use crate::{Capabilities, ReleaseOnCrash};
        let session = Capabilities::new(ReleaseOnCrash::Session);
        for opts in [
            LockOptions::new().min_hold(s(1)),
            LockOptions::new().lock_delay(s(1)),
        ] {
            assert!(matches!(
                opts.check_supported("zk", &session),
                Err(LockError::Unsupported { .. })
            ));
        }
        assert!(
            LockOptions::new()
                .max_hold(s(1))
                .check_supported("zk", &session)
                .is_ok()
        );
    }

    #[test]
    fn drift() {
        assert_eq!(
            clock_drift(Duration::from_secs(30)),
            Duration::from_millis(302)
        );
    }
}
