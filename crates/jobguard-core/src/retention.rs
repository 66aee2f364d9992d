//! The retention horizon: how long after a key was applied a duplicate of its job can still
//! arrive, computed from the retry schedule, the lease and the declared replay window.
//!
//! Guard rows pruned before the horizon forget keys whose jobs can still be delivered again.
//!
//! ```
//! use std::time::Duration;
//! use jobguard_core::retention::{Backoff, Horizon};
//!
//! let horizon = Horizon::new(&Backoff::default(), Duration::from_secs(30), Duration::ZERO);
//! assert!(horizon.total() > Duration::from_secs(600));
//! ```

use std::fmt;
use std::time::Duration;

use crate::duration::format_duration;

/// The numbers of an exponential backoff with jitter: attempt `n` that fails is retried after
/// `base * 2^(n-1)`, capped at `max_delay`, scaled by a factor in `[1 - jitter, 1 + jitter]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// Attempts before the job is dead-lettered (at least 1).
    pub max_attempts: u32,
    /// The delay after the first failed attempt.
    pub base: Duration,
    /// The longest delay between two attempts.
    pub max_delay: Duration,
    /// How far each delay may stray from its nominal value, as a fraction in `[0, 1]`.
    pub jitter: f64,
}

impl Default for Backoff {
    /// The defaults of the Rust worker's retry policy: 10 attempts from 1 s, up to 1 h, 20%.
    fn default() -> Self {
        Backoff {
            max_attempts: 10,
            base: Duration::from_secs(1),
            max_delay: Duration::from_secs(3600),
            jitter: 0.2,
        }
    }
}

impl Backoff {
    /// The longest delay between two attempts: a year. Longer ones are cut to it, so that no
    /// computation on a delay overflows.
    pub const MAX_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);

    /// The nominal delay after failed attempt `attempt` (1-based), before jitter.
    pub fn nominal_delay(&self, attempt: u32) -> Duration {
        doubled(self.base, attempt, self.max_delay.min(Self::MAX_DELAY))
    }

    /// The delay after failed attempt `attempt`, with jitter drawn from `unit` in `[0, 1]`
    /// (NaN read as 0.5): the nominal delay scaled by `1 - jitter + 2 * jitter * unit`. The
    /// Rust worker's retry policy and the Python worker compute every retry's delay here.
    ///
    /// ```
    /// use std::time::Duration;
    /// use jobguard_core::retention::Backoff;
    ///
    /// let backoff = Backoff { jitter: 0.5, ..Backoff::default() };
    /// assert_eq!(backoff.delay(3, 0.0), Duration::from_secs(2));
    /// assert_eq!(backoff.delay(3, 1.0), Duration::from_secs(6));
    /// ```
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let jitter = self.jitter_fraction();
        let unit = if unit.is_nan() {
            0.5
        } else {
            unit.clamp(0.0, 1.0)
        };
        scaled(
            self.nominal_delay(attempt),
            1.0 - jitter + 2.0 * jitter * unit,
        )
    }

    /// The last attempt a job enqueued with `job_max_attempts` gets: the lesser of its own
    /// limit and this policy's (each at least 1). An attempt that fails at or past it is
    /// dead-lettered; so is a job whose lease expires on it.
    ///
    /// ```
    /// use jobguard_core::retention::Backoff;
    ///
    /// assert_eq!(Backoff::default().last_attempt(3), 3);
    /// assert_eq!(Backoff::default().last_attempt(25), 10);
    /// ```
    pub fn last_attempt(&self, job_max_attempts: i32) -> i32 {
        let policy = i32::try_from(self.max_attempts.max(1)).unwrap_or(i32::MAX);
        job_max_attempts.max(1).min(policy)
    }

    /// The jitter as a fraction in `[0, 1]`, whatever the field holds (NaN as 0).
    pub fn jitter_fraction(&self) -> f64 {
        if self.jitter.is_nan() {
            0.0
        } else {
            self.jitter.clamp(0.0, 1.0)
        }
    }

    /// Every retry delay at its jitter upper bound, up to the last attempt, saturating instead
    /// of panicking on extreme schedules and without a loop per attempt.
    pub fn retries_horizon(&self) -> Duration {
        retries_horizon(self)
    }
}

/// A retry schedule whose delays bound how late a retry can come.
pub trait RetrySchedule {
    /// The schedule's numbers.
    fn backoff(&self) -> Backoff;
}

impl RetrySchedule for Backoff {
    fn backoff(&self) -> Backoff {
        *self
    }
}

/// `base` doubled for each attempt after the first, up to `cap`: the one exponential backoff
/// that retries and redeliveries share.
pub fn doubled(base: Duration, attempt: u32, cap: Duration) -> Duration {
    let factor = 2_u32.saturating_pow(attempt.saturating_sub(1).min(31));
    base.saturating_mul(factor).min(cap)
}

/// The longest time after a key was applied during which a duplicate of its job can still
/// arrive, term by term. See the [module documentation](self) for what each term covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Horizon {
    /// Every retry delay at its jitter upper bound, up to the last attempt.
    pub retries: Duration,
    /// One lease per attempt.
    pub leases: Duration,
    /// How long a dead-lettered job may still be replayed.
    pub replay_window: Duration,
    /// The retries and leases of a replayed job, whose attempts start again; zero without a
    /// replay window.
    pub replayed_attempts: Duration,
}

/// One term of a [`Horizon`], for printing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HorizonTerm {
    /// The term's name: `retries`, `leases`, `replay window`, `replayed attempts`.
    pub name: &'static str,
    /// Its length.
    pub duration: Duration,
    /// Where it comes from.
    pub source: &'static str,
}

impl Horizon {
    /// The horizon of a worker that retries with `retry` and leases jobs for `lease`, plus the
    /// declared windows.
    ///
    /// ```
    /// use std::time::Duration;
    /// use jobguard_core::retention::{Backoff, Horizon};
    ///
    /// let retry = Backoff {
    ///     max_attempts: 4,
    ///     base: Duration::from_secs(10),
    ///     max_delay: Duration::from_secs(3600),
    ///     jitter: 0.5,
    /// };
    /// let horizon = Horizon::new(&retry, Duration::from_secs(30), Duration::ZERO);
    /// // Delays of 10, 20 and 40 s, each up to 1.5 times longer; four leases of 30 s.
    /// assert_eq!(horizon.retries, Duration::from_secs(105));
    /// assert_eq!(horizon.leases, Duration::from_secs(120));
    /// assert_eq!(horizon.total(), Duration::from_secs(225));
    ///
    /// // With a replay window, a replayed job's attempts count again.
    /// let replayable = Horizon::new(&retry, Duration::from_secs(30), Duration::from_secs(3600));
    /// assert_eq!(replayable.replayed_attempts, Duration::from_secs(225));
    /// assert_eq!(replayable.total(), Duration::from_secs(3600 + 2 * 225));
    /// ```
    pub fn new<R: RetrySchedule + ?Sized>(
        retry: &R,
        lease: Duration,
        replay_window: Duration,
    ) -> Self {
        let retry = retry.backoff();
        let retries = retry.retries_horizon();
        let leases = lease.saturating_mul(retry.max_attempts.max(1));
        let replayed_attempts = if replay_window.is_zero() {
            Duration::ZERO
        } else {
            retries.saturating_add(leases)
        };
        Horizon {
            retries,
            leases,
            replay_window,
            replayed_attempts,
        }
    }

    /// The whole horizon: the sum of its terms.
    pub fn total(&self) -> Duration {
        self.terms().iter().fold(Duration::ZERO, |sum, term| {
            sum.saturating_add(term.duration)
        })
    }

    /// The terms, in the order they add up.
    pub fn terms(&self) -> [HorizonTerm; 4] {
        [
            HorizonTerm {
                name: "retries",
                duration: self.retries,
                source: "every retry delay of the retry policy at its jitter upper bound",
            },
            HorizonTerm {
                name: "leases",
                duration: self.leases,
                source: "one lease per attempt: a stalled attempt keeps its job until then",
            },
            HorizonTerm {
                name: "replay window",
                duration: self.replay_window,
                source: "declared: how long a dead-lettered job may still be replayed",
            },
            HorizonTerm {
                name: "replayed attempts",
                duration: self.replayed_attempts,
                source: "a replay restarts the attempts: its retries and leases again",
            },
        ]
    }
}

impl fmt::Display for Horizon {
    /// `7d 30m 26s (retries 10m 13s + leases 5m + replay window 7d + replayed attempts 15m 13s)`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (", format_duration(self.total()))?;
        for (n, term) in self.terms().iter().enumerate() {
            let plus = if n == 0 { "" } else { " + " };
            write!(f, "{plus}{} {}", term.name, format_duration(term.duration))?;
        }
        f.write_str(")")
    }
}

/// [`Backoff::retries_horizon`]: a worker that refuses to start must say why, not panic.
fn retries_horizon(retry: &Backoff) -> Duration {
    let jitter = if retry.jitter.is_nan() {
        1.0
    } else {
        retry.jitter.clamp(0.0, 1.0)
    };
    let upper = |delay: Duration| {
        Duration::try_from_secs_f64(delay.as_secs_f64() * (1.0 + jitter)).unwrap_or(Duration::MAX)
    };
    let delays = retry.max_attempts.max(1) - 1;
    let mut sum = Duration::ZERO;
    // Delays double up to the cap, or for 31 doublings, then stay where they are.
    for attempt in 1..=delays {
        let nominal = retry.nominal_delay(attempt);
        if nominal >= retry.max_delay || attempt >= 32 {
            let rest = delays - attempt + 1;
            return sum.saturating_add(upper(nominal).saturating_mul(rest));
        }
        sum = sum.saturating_add(upper(nominal));
    }
    sum
}

/// `delay * scale` for a `scale` in `[0, 2]`, saturating instead of panicking on overflow.
fn scaled(delay: Duration, scale: f64) -> Duration {
    Duration::try_from_secs_f64(delay.as_secs_f64() * scale).unwrap_or(Duration::MAX)
}
