//! When a failed job runs again: exponential backoff with jitter, up to a number of attempts.

use std::time::Duration;

/// Exponential backoff with jitter between attempts of a failed job.
///
/// Attempt `n` (1-based) that fails is retried after `base * 2^(n-1)`, capped at `max_delay`,
/// scaled by a random factor in `[1 - jitter, 1 + jitter]` so that jobs failing together do not
/// retry together. After `max_attempts` attempts the job is dead-lettered.
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
    /// The nominal delay after failed attempt `attempt` (1-based), before jitter.
    pub fn nominal_delay(&self, attempt: u32) -> Duration {
        let factor = 2_u32.saturating_pow(attempt.saturating_sub(1).min(31));
        self.base.saturating_mul(factor).min(self.max_delay)
    }

    /// The delay after failed attempt `attempt`, with jitter drawn from `unit` in `[0, 1)`.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let jitter = self.jitter.clamp(0.0, 1.0);
        let scale = 1.0 - jitter + 2.0 * jitter * unit.clamp(0.0, 1.0);
        self.nominal_delay(attempt).mul_f64(scale)
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
        let jitter = self.jitter.clamp(0.0, 1.0);
        (1..self.max_attempts.max(1))
            .map(|attempt| self.nominal_delay(attempt).mul_f64(1.0 + jitter))
            .sum()
    }
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
    fn huge_attempt_numbers_do_not_overflow() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.nominal_delay(u32::MAX), policy.max_delay);
    }
}
