//! Per-call lock options.

use std::time::Duration;

use crate::backoff::Backoff;
use crate::error::{LockError, Result};

/// The shortest lease lockkit accepts.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The longest lease or wait lockkit accepts (365 days); wait longer with
/// [`LockOptions::wait_forever`].
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

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
    fn drift() {
        assert_eq!(
            clock_drift(Duration::from_secs(30)),
            Duration::from_millis(302)
        );
    }
}
