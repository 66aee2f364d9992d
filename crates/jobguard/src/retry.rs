//! When a failed job runs again: exponential backoff with jitter, up to a number of attempts.

use std::time::Duration;

use crate::error::{Error, Result};
use jobguard_core::retention::RetrySchedule;

/// Exponential backoff with jitter between attempts of a failed job.
///
/// Attempt `n` (1-based) that fails is retried after `base * 2^(n-1)`, capped at `max_delay`,
/// scaled by a random factor in `[1 - jitter, 1 + jitter]` so that jobs failing together do not
/// retry together. After `max_attempts` attempts the job is dead-lettered.
///
/// Build it with [`RetryPolicy::new`], or check a literal with [`RetryPolicy::validate`]: a
/// jitter outside `[0, 1]` (or NaN) or a delay over [`RetryPolicy::MAX_DELAY`] is an
/// [`Error::InvalidConfig`]. Delays are computed with saturating arithmetic either way, so an
/// unchecked policy never panics: its jitter is read as the nearest value in `[0, 1]` (NaN as
/// 0) and its delays are cut to [`RetryPolicy::MAX_DELAY`].
///
/// ```
/// use std::time::Duration;
/// use jobguard::RetryPolicy;
///
/// let policy = RetryPolicy::default();
/// assert_eq!(policy.max_attempts, 10);
/// // The longest a job can keep being retried, with every delay at its upper bound.
/// assert!(policy.horizon() > Duration::from_secs(600));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts before the job is dead-lettered (at least 1).
    pub max_attempts: u32,
    /// The delay after the first failed attempt.
    pub base: Duration,
    /// The longest delay between two attempts.
    pub max_delay: Duration,
    /// How far each delay may stray from its nominal value, as a fraction in `[0, 1]`.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 10,
            base: Duration::from_secs(1),
            max_delay: Duration::from_secs(3600),
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// The longest delay a policy may have between two attempts: a year. Longer ones are
    /// refused by [`validate`](Self::validate) and cut to it by the delay arithmetic, so that no
    /// computation on a delay (sums, the database's timestamp arithmetic) overflows.
    pub const MAX_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);

    /// A policy, checked with [`validate`](Self::validate).
    ///
    /// ```
    /// use std::time::Duration;
    /// use jobguard::{Error, RetryPolicy};
    ///
    /// let policy = RetryPolicy::new(5, Duration::from_secs(1), Duration::from_secs(60), 0.2)?;
    /// assert_eq!(policy.max_attempts, 5);
    /// let nan = RetryPolicy::new(5, Duration::from_secs(1), Duration::from_secs(60), f64::NAN);
    /// assert!(matches!(nan, Err(Error::InvalidConfig { setting: "retry jitter", .. })));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn new(
        max_attempts: u32,
        base: Duration,
        max_delay: Duration,
        jitter: f64,
    ) -> Result<Self> {
        let policy = RetryPolicy {
            max_attempts,
            base,
            max_delay,
            jitter,
        };
        policy.validate()?;
        Ok(policy)
    }

    /// Checks every field, with [`Error::InvalidConfig`] naming the first one out of range.
    pub fn validate(&self) -> Result<()> {
        let invalid = |setting, reason: String| Err(Error::InvalidConfig { setting, reason });
        if self.max_attempts == 0 {
            return invalid(
                "retry max attempts",
                "0: a job gets at least 1 attempt".into(),
            );
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return invalid(
                "retry jitter",
                format!("{}: use a fraction from 0 to 1", self.jitter),
            );
        }
        for (setting, delay) in [
            ("retry base delay", self.base),
            ("retry max delay", self.max_delay),
        ] {
            if delay > Self::MAX_DELAY {
                return invalid(
                    setting,
                    format!("{delay:?}: the longest delay between attempts is 365 days"),
                );
            }
        }
        Ok(())
    }

    /// The nominal delay after failed attempt `attempt` (1-based), before jitter.
    pub fn nominal_delay(&self, attempt: u32) -> Duration {
        doubled(self.base, attempt, self.max_delay.min(Self::MAX_DELAY))
    }

    /// The delay after failed attempt `attempt`, with jitter drawn from `unit` in `[0, 1)`: the
    /// core's [`Backoff::delay`](jobguard_core::retention::Backoff::delay), which the Python
    /// worker computes too.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        self.backoff().delay(attempt, unit)
    }

    /// The delay after failed attempt `attempt` with fresh jitter.
    pub fn next_delay(&self, attempt: u32) -> Duration {
        self.delay(attempt, random_unit())
    }

    /// Whether attempt `attempt` was the last one.
    pub fn is_exhausted(&self, attempt: u32) -> bool {
        attempt >= self.max_attempts.max(1)
    }

    /// The longest time from a job's first attempt to its last retry starting: the sum of
    /// every delay at its upper bound. Redeliveries by retry can arrive until then.
    pub fn horizon(&self) -> Duration {
        let jitter = self.backoff().jitter_fraction();
        (1..self.max_attempts.max(1))
            .map(|attempt| scaled(self.nominal_delay(attempt), 1.0 + jitter))
            .fold(Duration::ZERO, Duration::saturating_add)
    }
}

/// The core's backoff for transactions rolled back by contention or a lost connection
/// ([`jobguard_core::transient::backoff`]), with a jitter drawn from the clock.
pub(crate) fn contention_backoff(attempt: u32) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let jitter = f64::from(nanos.subsec_nanos() % 1000) / 1000.0;
    jobguard_core::transient::backoff(attempt, jitter)
}

pub(crate) use jobguard_core::retention::doubled;

/// `delay * scale` for a `scale` in `[0, 2]`, saturating instead of panicking on overflow.
fn scaled(delay: Duration, scale: f64) -> Duration {
    Duration::try_from_secs_f64(delay.as_secs_f64() * scale).unwrap_or(Duration::MAX)
}

/// A number in `[0, 1)` good enough for jitter, without a random number generator dependency.
fn random_unit() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    let bits = RandomState::new().hash_one(std::time::Instant::now());
    (bits >> 11) as f64 / (1_u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap() {
        let policy = RetryPolicy {
            max_attempts: 5,
            base: Duration::from_secs(1),
            max_delay: Duration::from_secs(5),
            jitter: 0.0,
        };
        let delays: Vec<_> = (1..=5).map(|a| policy.delay(a, 0.7).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 5, 5]);
        assert_eq!(policy.horizon(), Duration::from_secs(1 + 2 + 4 + 5));
        assert!(policy.is_exhausted(5) && !policy.is_exhausted(4));
    }

    #[test]
    fn jitter_stays_within_its_bounds() {
        let policy = RetryPolicy {
            jitter: 0.5,
            ..RetryPolicy::default()
        };
        assert_eq!(policy.delay(1, 0.0), Duration::from_millis(500));
        assert_eq!(policy.delay(1, 1.0), Duration::from_millis(1500));
        for _ in 0..1000 {
            let d = policy.next_delay(2);
            assert!(
                d >= Duration::from_secs(1) && d <= Duration::from_secs(3),
                "{d:?}"
            );
        }
    }

    #[test]
    fn construction_refuses_what_would_misbehave() {
        let second = Duration::from_secs(1);
        for (jitter, setting) in [
            (f64::NAN, "retry jitter"),
            (-0.1, "retry jitter"),
            (1.5, "retry jitter"),
            (f64::INFINITY, "retry jitter"),
            (f64::NEG_INFINITY, "retry jitter"),
        ] {
            match RetryPolicy::new(3, second, second * 60, jitter) {
                Err(Error::InvalidConfig { setting: s, .. }) => assert_eq!(s, setting),
                other => panic!("jitter {jitter}: {other:?}"),
            }
        }
        assert!(matches!(
            RetryPolicy::new(3, second, Duration::MAX, 0.2),
            Err(Error::InvalidConfig {
                setting: "retry max delay",
                ..
            })
        ));
        assert!(matches!(
            RetryPolicy::new(0, second, second, 0.2),
            Err(Error::InvalidConfig {
                setting: "retry max attempts",
                ..
            })
        ));
        assert!(RetryPolicy::new(3, second, RetryPolicy::MAX_DELAY, 1.0).is_ok());
        assert!(RetryPolicy::default().validate().is_ok());
    }

    #[test]
    fn unchecked_policies_saturate_instead_of_panicking() {
        let huge = RetryPolicy {
            max_attempts: u32::MAX,
            base: Duration::MAX,
            max_delay: Duration::MAX,
            jitter: f64::NAN,
        };
        assert_eq!(huge.delay(40, 0.9), RetryPolicy::MAX_DELAY);
        // Capped, then scaled by 1 + jitter, summed with saturation.
        let wild = RetryPolicy {
            jitter: f64::INFINITY,
            ..huge.clone()
        };
        assert_eq!(wild.delay(1, 1.0), RetryPolicy::MAX_DELAY * 2);
        assert_eq!(
            RetryPolicy {
                max_attempts: 100,
                ..wild
            }
            .horizon(),
            RetryPolicy::MAX_DELAY * 2 * 99
        );
    }

    proptest::proptest! {
        #[test]
        fn backoff_never_panics(
            max_attempts in proptest::num::u32::ANY,
            base_secs in proptest::num::u64::ANY,
            base_nanos in 0_u32..1_000_000_000,
            max_secs in proptest::num::u64::ANY,
            jitter in proptest::num::f64::ANY,
            attempt in proptest::num::u32::ANY,
            unit in proptest::num::f64::ANY,
        ) {
            let policy = RetryPolicy {
                max_attempts: max_attempts % 200,
                base: Duration::new(base_secs, base_nanos),
                max_delay: Duration::from_secs(max_secs),
                jitter,
            };
            let delay = policy.delay(attempt, unit);
            proptest::prop_assert!(delay <= RetryPolicy::MAX_DELAY * 2);
            let _ = policy.next_delay(attempt);
            let _ = policy.horizon();
            let _ = policy.validate();
            if policy.validate().is_ok() {
                proptest::prop_assert!(
                    delay <= policy.max_delay.mul_f64(1.0 + policy.jitter) + Duration::from_micros(1)
                );
            }
        }
    }

    #[test]
    fn huge_attempt_numbers_do_not_overflow() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.nominal_delay(u32::MAX), policy.max_delay);
    }
}
