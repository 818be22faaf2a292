//! Exponential backoff with full jitter.

use std::time::Duration;

/// Exponential backoff with "full jitter": the n-th delay is drawn uniformly from
/// `0..=min(max, initial · 2ⁿ)`.
///
/// Full jitter spreads competing clients apart better than a fixed or additive
/// jitter does (see the AWS Architecture Blog, "Exponential Backoff And Jitter").
/// The wait policy only falls back on it when the backend sends no release
/// notification and reports no holder expiry, so the defaults are short.
///
/// ```
/// use std::time::Duration;
/// use lockkit_core::Backoff;
///
/// let backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(80));
/// let delays: Vec<Duration> = backoff.delays_seeded(7).take(6).collect();
/// // Each delay is at most min(80 ms, 10 ms · 2ⁿ).
/// for (n, delay) in delays.iter().enumerate() {
///     assert!(*delay <= Duration::from_millis(10 << n).min(Duration::from_millis(80)));
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
}

impl Backoff {
    /// The default: 5 ms doubling up to 250 ms.
    pub const DEFAULT: Backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(250));

    /// Starts at `initial` and doubles up to `max`. Checked by
    /// [`LockOptions::validate`](crate::LockOptions::validate): `initial` must be
    /// positive and not above `max`, `max` at most one hour.
    pub const fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max }
    }

    /// The first upper bound.
    pub const fn initial(&self) -> Duration {
        self.initial
    }

    /// The largest upper bound.
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// An endless iterator of jittered delays.
    pub fn delays(&self) -> Delays {
        Delays {
            backoff: *self,
            attempt: 0,
            rng: fastrand::Rng::new(),
        }
    }

    /// Like [`delays`](Self::delays) with a fixed random seed, for reproducible tests.
    pub fn delays_seeded(&self, seed: u64) -> Delays {
        Delays {
            backoff: *self,
            attempt: 0,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        if self.initial.is_zero() {
            Err("backoff initial delay must be positive".into())
        } else if self.initial > self.max {
            Err(format!(
                "backoff initial delay {:?} exceeds its maximum {:?}",
                self.initial, self.max
            ))
        } else if self.max > Duration::from_secs(3600) {
            Err(format!("backoff maximum {:?} exceeds one hour", self.max))
        } else {
            Ok(())
        }
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::DEFAULT
    }
}

/// The delays of a [`Backoff`]; see [`Backoff::delays`].
#[derive(Debug, Clone)]
pub struct Delays {
    backoff: Backoff,
    attempt: u32,
    rng: fastrand::Rng,
}

impl Delays {
    /// Starts over from the initial delay (after progress, e.g. a release notification).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    fn ceiling(&self) -> Duration {
        // initial · 2^attempt, saturating, capped at max.
        let factor = 1u32.checked_shl(self.attempt).unwrap_or(u32::MAX);
        self.backoff
            .initial
            .checked_mul(factor)
            .map_or(self.backoff.max, |d| d.min(self.backoff.max))
    }
}

impl Iterator for Delays {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1).min(31);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Some(Duration::from_nanos(self.rng.u64(0..=nanos)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_double_then_cap() {
        let b = Backoff::new(Duration::from_millis(5), Duration::from_millis(40));
        let mut d = b.delays_seeded(1);
        let ceilings: Vec<u64> = (0..6)
            .map(|_| {
                let c = d.ceiling();
                d.next();
                c.as_millis() as u64
            })
            .collect();
        assert_eq!(ceilings, [5, 10, 20, 40, 40, 40]);
        d.reset();
        assert_eq!(d.ceiling(), Duration::from_millis(5));
    }

    #[test]
    fn delays_are_jittered_within_the_ceiling() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_millis(100));
        let delays: Vec<Duration> = b.delays_seeded(3).take(200).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(100)));
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 150, "full jitter should rarely repeat");
        let below_half = delays
            .iter()
            .filter(|d| **d < Duration::from_millis(50))
            .count();
        assert!(
            (60..=140).contains(&below_half),
            "{below_half} of 200 below half"
        );
    }

    #[test]
    fn never_overflows() {
        let b = Backoff::new(Duration::from_secs(3600), Duration::from_secs(3600));
        assert!(b.delays().take(100).all(|d| d <= Duration::from_secs(3600)));
    }

    #[test]
    fn check_rejects_bad_values() {
        assert!(
            Backoff::new(Duration::ZERO, Duration::from_secs(1))
                .check()
                .is_err()
        );
        assert!(
            Backoff::new(Duration::from_secs(2), Duration::from_secs(1))
                .check()
                .is_err()
        );
        assert!(
            Backoff::new(Duration::from_secs(1), Duration::from_secs(7200))
                .check()
                .is_err()
        );
        assert!(Backoff::DEFAULT.check().is_ok());
    }
}
