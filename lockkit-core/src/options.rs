//! Per-call lock options.

use std::time::Duration;

use crate::backoff::Backoff;
use crate::error::{LockError, Result};

/// The shortest lease lockkit accepts.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The longest lease or wait lockkit accepts (365 days); wait longer with
/// [`LockOptions::wait_forever`].
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

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
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(30),
            wait: Wait::Forever,
            auto_renew: true,
            backoff: Backoff::DEFAULT,
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
        self.backoff.check().map_err(LockError::invalid_options)
    }
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
    fn drift() {
        assert_eq!(
            clock_drift(Duration::from_secs(30)),
            Duration::from_millis(302)
        );
    }
}
