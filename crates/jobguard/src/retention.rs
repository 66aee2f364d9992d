//! Guard retention: how long keys are remembered, checked against how long duplicates can
//! still arrive, and pruning in batches.
//!
//! The guard table grows by one row per applied job, so it has to be pruned; but a key pruned
//! while its job can still be delivered again is a key forgotten, and the late delivery applies
//! the job a second time. Every job system keeps its dedupe memory for a fixed time and hopes
//! that is long enough. jobguard computes how long it has to be instead, the [`Horizon`]:
//!
//! - **retries**: every retry delay of the worker's [`RetryPolicy`] at its jitter upper bound;
//! - **leases**: one lease per attempt, since an attempt that stalls keeps its job until its
//!   lease runs out, and only then is the job handed out again;
//! - **replay window**: how long after a job is dead-lettered an operator may still replay it
//!   (declared: jobguard cannot know your runbook);
//! - **replayed attempts**: a replay restarts the attempts, so a job replayed at the end of
//!   the window can be retried and leased all over again (zero without a replay window).
//!
//! The terms add up because each can follow the one before: a job retried to its last
//! attempt, each attempt stalling to the end of its lease, dead-lettered, replayed at the end
//! of the window, and retried again. Measured from the first attempt, the horizon also covers
//! a key applied by a later attempt, whose row is younger.
//!
//! **Provider key lifetime.** A job that calls an external API with an idempotency key (a
//! charge) relies on the provider as well as on the guard: a charge whose own record failed is
//! retried, or dead-lettered and replayed, and only the provider's memory of the key stops the
//! second charge. The provider forgets keys after a while (Stripe: 24 hours), so every repeat
//! of a keyed job must reach the provider before then: the horizon must stay below the
//! declared provider key lifetime, or [`RetentionConfig::validate`] fails with
//! [`Error::ProviderKeyLifetimeTooShort`]. A zero lifetime declares that no job calls a keyed
//! external API, and skips the check.
//!
//! **Jobs.** The jobs table keeps a row per job, with its payload. A [`Pruner`] given the
//! queue with [`Pruner::jobs`] also deletes completed jobs after
//! [`keep_completed`](RetentionConfig::keep_completed) (the guard row, not the job row, is the
//! durable record of what was applied, so zero is allowed) and dead jobs after
//! [`keep_dead`](RetentionConfig::keep_dead), which may not be shorter than the replay window:
//! a dead job deleted inside the window could no longer be replayed
//! ([`Error::DeadRetentionTooShort`]).
//!
//! A [`Retention`] is a retention checked against its horizon: building one shorter than the
//! horizon fails with [`Error::RetentionTooShort`] naming both numbers, unless the check is
//! overridden on purpose (then it logs a warning). A [`Pruner`] needs a `Retention`, and so does
//! a [`Worker`](crate::Worker), which refuses to start without one and prunes on a
//! [`PruneSchedule`] (daily by default), one worker at a time.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use jobguard::retention::{Pruner, RetentionConfig};
//! use jobguard::{PgGuard, RetryPolicy};
//!
//! # async fn prune(guard: PgGuard) -> jobguard::Result<()> {
//! const DAY: Duration = Duration::from_secs(24 * 3600);
//! let config = RetentionConfig {
//!     keep: 14 * DAY,
//!     // Charges call a provider that forgets idempotency keys after a day: a dead charge may
//!     // be replayed for 12 hours, so that its repeats still find the provider's key.
//!     replay_window: 12 * 3600 * Duration::from_secs(1),
//!     provider_key_lifetime: DAY,
//!     ..RetentionConfig::default()
//! };
//! // The worker's retry policy and lease bound how late a retry can come.
//! let retention = config.validate(&RetryPolicy::default(), Duration::from_secs(30))?;
//! println!("{}", retention.horizon());
//! if let Some(report) = Pruner::new(&guard, retention).run().await? {
//!     println!("pruned {} guard rows", report.guard_rows);
//! }
//! # Ok(()) }
//! ```

mod prune;
mod schedule;

use std::time::Duration;

use jobguard_core::retention::{Backoff, RetrySchedule};

pub use prune::{PrunePlan, PruneReport, Pruner};
pub use schedule::PruneSchedule;

pub use crate::duration::format_duration;
pub(crate) use schedule::run_schedule;

use crate::error::{Error, Result};
use crate::retry::RetryPolicy;
use crate::steps::StepConfig;

/// How long guard rows are kept, and what is declared about duplicates that come from outside
/// the worker's own retries. Checked into a [`Retention`] by [`validate`](Self::validate).
#[derive(Clone, Debug, PartialEq)]
pub struct RetentionConfig {
    /// How long a guard row is kept after its key was applied (default 14 days).
    pub keep: Duration,
    /// How long after a job is dead-lettered it may still be replayed (default 7 days).
    pub replay_window: Duration,
    /// How long the external API a job calls keeps an idempotency key (Stripe keeps keys 24
    /// hours); the horizon must stay below it. Zero (the default) declares that no job calls a
    /// keyed external API.
    pub provider_key_lifetime: Duration,
    /// How long a completed job's row is kept after it finished (default 1 day; zero allowed:
    /// the guard row is the durable record of what was applied). With zero, a worker on
    /// PostgreSQL deletes each job's row in the statement that completes it, rather than
    /// writing a completed version for the prune to delete: half the index writes of a job's
    /// life, and half the dead rows for vacuum. A job whose unique policy keeps its key while
    /// completed is kept all the same, as its row holds the key.
    pub keep_completed: Duration,
    /// How long a dead job's row is kept after it died (default 7 days); at least the replay
    /// window, since a deleted dead job can no longer be replayed.
    pub keep_dead: Duration,
    /// Accept a retention shorter than the horizon, with a warning. Duplicates that arrive after
    /// `keep` then apply again.
    pub override_horizon: bool,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            keep: RetentionConfig::DEFAULT_KEEP,
            replay_window: RetentionConfig::DEFAULT_REPLAY_WINDOW,
            provider_key_lifetime: Duration::ZERO,
            keep_completed: RetentionConfig::DEFAULT_KEEP_COMPLETED,
            keep_dead: RetentionConfig::DEFAULT_KEEP_DEAD,
            override_horizon: false,
        }
    }
}

impl RetentionConfig {
    /// The retention unless configured: 14 days, the seed's conservative choice.
    pub const DEFAULT_KEEP: Duration = Duration::from_secs(14 * 24 * 3600);
    /// The replay window unless declared: 7 days.
    pub const DEFAULT_REPLAY_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);
    /// How long completed jobs are kept unless configured: 1 day.
    pub const DEFAULT_KEEP_COMPLETED: Duration = Duration::from_secs(24 * 3600);
    /// How long dead jobs are kept unless configured: 7 days, the default replay window.
    pub const DEFAULT_KEEP_DEAD: Duration = Duration::from_secs(7 * 24 * 3600);

    /// The horizon of a worker that retries with `retry` and leases jobs for `lease`, with this
    /// configuration's declared windows.
    pub fn horizon(&self, retry: &RetryPolicy, lease: Duration) -> Horizon {
        Horizon::new(retry, lease, self.replay_window)
    }

    /// Checks `keep` against the horizon of a worker that retries with `retry` and leases jobs
    /// for `lease` (see [`Retention::new`]), the horizon against the provider key lifetime
    /// ([`Error::ProviderKeyLifetimeTooShort`]) and `keep_dead` against the replay window
    /// ([`Error::DeadRetentionTooShort`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use jobguard::retention::RetentionConfig;
    /// use jobguard::{Error, RetryPolicy};
    ///
    /// let lease = Duration::from_secs(30);
    /// let two_weeks = RetentionConfig::default();
    /// assert!(two_weeks.validate(&RetryPolicy::default(), lease).is_ok());
    ///
    /// // One day cannot cover a 7-day replay window.
    /// let one_day = RetentionConfig { keep: Duration::from_secs(86_400), ..two_weeks };
    /// let refused = one_day.validate(&RetryPolicy::default(), lease).unwrap_err();
    /// assert!(matches!(refused, Error::RetentionTooShort { .. }));
    ///
    /// // A provider that forgets keys after a day cannot back a 7-day replay window.
    /// let stripe = RetentionConfig { provider_key_lifetime: Duration::from_secs(86_400), ..two_weeks };
    /// let refused = stripe.validate(&RetryPolicy::default(), lease).unwrap_err();
    /// assert!(matches!(refused, Error::ProviderKeyLifetimeTooShort { .. }));
    /// ```
    pub fn validate(&self, retry: &RetryPolicy, lease: Duration) -> Result<Retention> {
        let horizon = self.horizon(retry, lease);
        self.check_provider_key_lifetime(retry, lease)?;
        if self.keep_dead < self.replay_window {
            return Err(Error::DeadRetentionTooShort {
                keep_dead: self.keep_dead,
                replay_window: self.replay_window,
            });
        }
        let mut retention = Retention::new(self.keep, horizon, self.override_horizon)?;
        retention.keep_completed = self.keep_completed;
        retention.keep_dead = self.keep_dead;
        retention.provider_key_lifetime = self.provider_key_lifetime;
        Ok(retention)
    }

    /// Every repeat of a keyed external job (its retries and leases, its replay within the
    /// window, and the replay's own retries and leases) must reach the provider while it still
    /// remembers the key: the horizon must be shorter than the provider key lifetime. Checked
    /// only when a lifetime is declared, and not subject to `override_horizon`: past it the
    /// provider charges again, whatever the guard keeps.
    pub fn check_provider_key_lifetime(&self, retry: &RetryPolicy, lease: Duration) -> Result<()> {
        let horizon = self.horizon(retry, lease);
        let lifetime = self.provider_key_lifetime;
        if lifetime.is_zero() || horizon.total() < lifetime {
            return Ok(());
        }
        Err(Error::ProviderKeyLifetimeTooShort {
            provider_key_lifetime: lifetime,
            horizon: horizon.total(),
            breakdown: horizon.to_string(),
            replay_window: self.replay_window,
            replay_window_fits: lifetime
                .saturating_sub(
                    horizon
                        .retries
                        .saturating_add(horizon.leases)
                        .saturating_mul(2),
                )
                .saturating_sub(Duration::from_secs(1)),
        })
    }
}

#[doc(inline)]
pub use jobguard_core::retention::{Horizon, HorizonTerm};

impl RetrySchedule for RetryPolicy {
    fn backoff(&self) -> Backoff {
        Backoff {
            max_attempts: self.max_attempts,
            base: self.base,
            max_delay: self.max_delay,
            jitter: self.jitter,
        }
    }
}

/// A guard retention checked against its [`Horizon`]: what a [`Pruner`] and a
/// [`Worker`](crate::Worker) need.
#[derive(Clone, Debug, PartialEq)]
pub struct Retention {
    keep: Duration,
    horizon: Horizon,
    overridden: bool,
    provider_key_lifetime: Duration,
    keep_completed: Duration,
    keep_dead: Duration,
}

impl Retention {
    /// Keeps guard rows for `keep`, which must cover `horizon`.
    ///
    /// Fails with [`Error::RetentionTooShort`] when `keep` is shorter than the horizon, unless
    /// `override_horizon` is set: then it logs a warning and duplicates that arrive after `keep`
    /// apply again. A zero `keep` is refused either way. Jobs are kept for the defaults of
    /// [`RetentionConfig`] (dead ones at least as long as the horizon's replay window); use
    /// [`RetentionConfig::validate`] to choose them and to check the provider key lifetime.
    pub fn new(keep: Duration, horizon: Horizon, override_horizon: bool) -> Result<Self> {
        if keep.is_zero() {
            return Err(Error::InvalidConfig {
                setting: "guard retention",
                reason: "it must be longer than zero: a zero retention deletes every guard row, \
                         and every delivery after that applies again"
                    .into(),
            });
        }
        let total = horizon.total();
        if keep < total {
            if !override_horizon {
                return Err(Error::RetentionTooShort {
                    retention: keep,
                    horizon: total,
                    breakdown: horizon.to_string(),
                });
            }
            tracing::warn!(
                retention = %format_duration(keep),
                horizon = %horizon,
                "the guard retention is shorter than the horizon, and the check is overridden: \
                 a duplicate that arrives after the retention applies again"
            );
        }
        Ok(Retention {
            keep,
            horizon,
            overridden: keep < total,
            provider_key_lifetime: Duration::ZERO,
            keep_completed: RetentionConfig::DEFAULT_KEEP_COMPLETED,
            keep_dead: RetentionConfig::DEFAULT_KEEP_DEAD.max(horizon.replay_window),
        })
    }

    /// How long guard rows are kept.
    pub fn keep(&self) -> Duration {
        self.keep
    }

    /// The horizon it was checked against.
    pub fn horizon(&self) -> &Horizon {
        &self.horizon
    }

    /// Whether the retention is shorter than the horizon, accepted by an override.
    pub fn is_overridden(&self) -> bool {
        self.overridden
    }

    /// The declared provider key lifetime the horizon stays below; zero when none is declared.
    pub fn provider_key_lifetime(&self) -> Duration {
        self.provider_key_lifetime
    }

    /// How long completed jobs are kept after they finished.
    pub fn keep_completed(&self) -> Duration {
        self.keep_completed
    }

    /// How long dead jobs are kept after they died.
    pub fn keep_dead(&self) -> Duration {
        self.keep_dead
    }
}

/// How a [`Worker`](crate::Worker) prunes the guard table (and the step ledger) by itself.
#[derive(Clone, Debug)]
pub struct PruneConfig {
    /// When to prune; `None` never prunes. Daily at 03:00 UTC unless configured.
    pub schedule: Option<PruneSchedule>,
    /// Rows deleted per statement (default 10,000, at least 1).
    pub batch: u32,
    /// The shortest pause between two batches, which lets jobs through (default 10 ms); the
    /// pruner also rests four times as long as each batch took.
    pub pause: Duration,
    /// A step ledger whose `done` steps are pruned with the guard rows, if any.
    pub steps: Option<StepConfig>,
}

impl Default for PruneConfig {
    fn default() -> Self {
        PruneConfig {
            schedule: Some(PruneSchedule::default()),
            batch: PruneConfig::DEFAULT_BATCH,
            pause: PruneConfig::DEFAULT_PAUSE,
            steps: None,
        }
    }
}

impl PruneConfig {
    /// Rows deleted per statement unless configured.
    pub const DEFAULT_BATCH: u32 = 10_000;
    /// The pause between batches unless configured.
    pub const DEFAULT_PAUSE: Duration = Duration::from_millis(10);
}

/// [`Backoff::retries_horizon`] of a policy.
#[cfg(test)]
fn retries_horizon(retry: &RetryPolicy) -> Duration {
    retry.backoff().retries_horizon()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn retries_match_the_policy_horizon() {
        for policy in [
            RetryPolicy::default(),
            RetryPolicy {
                max_attempts: 1,
                ..RetryPolicy::default()
            },
            RetryPolicy {
                max_attempts: 30,
                base: Duration::from_millis(250),
                max_delay: Duration::from_secs(600),
                jitter: 0.5,
            },
            RetryPolicy {
                jitter: 0.0,
                base: Duration::ZERO,
                ..RetryPolicy::default()
            },
        ] {
            let ours = retries_horizon(&policy).as_secs_f64();
            let theirs = policy.horizon().as_secs_f64();
            assert!(
                (ours - theirs).abs() < 1e-6,
                "{policy:?}: {ours} vs {theirs}"
            );
        }
    }

    #[test]
    fn extreme_policies_saturate_instead_of_panicking() {
        let policy = RetryPolicy {
            max_attempts: u32::MAX,
            base: Duration::from_secs(1),
            max_delay: Duration::MAX,
            jitter: f64::NAN,
        };
        // Every delay is capped at RetryPolicy::MAX_DELAY (365 days); a NaN jitter is read at
        // its widest here, so each of the four billion delays counts twice the cap.
        let cap = RetryPolicy::MAX_DELAY.saturating_mul(2);
        // The first 25 delays double up to the cap; the rest sit at it.
        let horizon = retries_horizon(&policy);
        assert!(horizon <= cap.saturating_mul(u32::MAX - 1), "{horizon:?}");
        assert!(horizon >= cap.saturating_mul(u32::MAX - 26), "{horizon:?}");
        let horizon = Horizon::new(&policy, Duration::MAX, Duration::MAX);
        assert_eq!(horizon.total(), Duration::MAX);
    }

    #[test]
    fn the_default_worker_is_covered_by_two_weeks() {
        let config = RetentionConfig::default();
        let retention = config
            .validate(&RetryPolicy::default(), Duration::from_secs(30))
            .unwrap();
        assert!(!retention.is_overridden());
        // 1 + 2 + ... + 256 s, each up to 1.2 times longer.
        assert_eq!(retention.horizon().retries, Duration::from_millis(613_200));
        assert_eq!(retention.horizon().leases, Duration::from_secs(300));
        assert_eq!(
            retention.horizon().to_string(),
            "7d 30m 26s (retries 10m 13s + leases 5m + replay window 7d + replayed attempts \
             15m 13s)"
        );
    }

    #[test]
    fn a_short_retention_is_refused_with_its_numbers_unless_overridden() {
        let config = RetentionConfig {
            keep: DAY,
            ..RetentionConfig::default()
        };
        let error = config
            .validate(&RetryPolicy::default(), Duration::from_secs(30))
            .unwrap_err();
        let Error::RetentionTooShort {
            retention, horizon, ..
        } = &error
        else {
            panic!("{error:?}");
        };
        assert_eq!(*retention, DAY);
        assert_eq!(*horizon, DAY * 7 + Duration::from_millis(1_826_400));
        let message = error.to_string();
        for needle in [
            "1d",
            "7d 30m 26s",
            "replay window 7d",
            "at least 7d 30m 26s",
        ] {
            assert!(
                message.contains(needle),
                "{needle:?} missing from: {message}"
            );
        }

        let overridden = RetentionConfig {
            override_horizon: true,
            ..config
        };
        let retention = overridden
            .validate(&RetryPolicy::default(), Duration::from_secs(30))
            .unwrap();
        assert!(retention.is_overridden());
        assert_eq!(retention.keep(), DAY);
    }

    #[test]
    fn keyed_jobs_must_reach_the_provider_before_it_forgets_the_key() {
        let lease = Duration::from_secs(30);
        // The CLI's old defaults: a 7-day replay window behind a provider that forgets keys
        // after a day. A charge replayed on day 2 would charge again.
        let stripe = RetentionConfig {
            provider_key_lifetime: DAY,
            ..RetentionConfig::default()
        };
        let error = stripe.validate(&RetryPolicy::default(), lease).unwrap_err();
        let Error::ProviderKeyLifetimeTooShort {
            provider_key_lifetime,
            horizon,
            ..
        } = &error
        else {
            panic!("{error:?}");
        };
        assert_eq!(*provider_key_lifetime, DAY);
        assert_eq!(*horizon, DAY * 7 + Duration::from_millis(1_826_400));
        let message = error.to_string();
        for needle in ["provider key lifetime 1d", "replay window 7d", "7d 30m 26s"] {
            assert!(
                message.contains(needle),
                "{needle:?} missing from: {message}"
            );
        }
        // Overriding the guard's horizon does not silence it: the provider charges again.
        let overridden = RetentionConfig {
            override_horizon: true,
            ..stripe.clone()
        };
        assert!(overridden.validate(&RetryPolicy::default(), lease).is_err());

        // Half a day of replay, plus the attempts before and after, fits under a day.
        let fits = RetentionConfig {
            replay_window: DAY / 2,
            ..stripe.clone()
        };
        let retention = fits.validate(&RetryPolicy::default(), lease).unwrap();
        assert_eq!(retention.provider_key_lifetime(), DAY);

        // The replay's fresh attempts count: a window that fits alone but not with them.
        let window = DAY - Duration::from_secs(20 * 60);
        let tight = RetentionConfig {
            replay_window: window,
            ..stripe
        };
        let horizon = tight.horizon(&RetryPolicy::default(), lease);
        assert!(horizon.retries + horizon.leases + window < DAY);
        assert!(tight.validate(&RetryPolicy::default(), lease).is_err());

        // No provider declared: no keyed external jobs, no check.
        assert!(
            RetentionConfig::default()
                .validate(&RetryPolicy::default(), lease)
                .is_ok()
        );
    }

    #[test]
    fn dead_jobs_are_kept_through_the_replay_window() {
        let lease = Duration::from_secs(30);
        let short = RetentionConfig {
            keep_dead: DAY,
            ..RetentionConfig::default()
        };
        let error = short.validate(&RetryPolicy::default(), lease).unwrap_err();
        assert!(
            matches!(error, Error::DeadRetentionTooShort { .. }),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(
            message.contains("1d") && message.contains("7d"),
            "{message}"
        );

        let config = RetentionConfig {
            keep_completed: Duration::ZERO,
            keep_dead: DAY * 7,
            ..RetentionConfig::default()
        };
        let retention = config.validate(&RetryPolicy::default(), lease).unwrap();
        assert_eq!(retention.keep_completed(), Duration::ZERO);
        assert_eq!(retention.keep_dead(), DAY * 7);
    }

    #[test]
    fn zero_retention_is_refused_even_overridden() {
        let config = RetentionConfig {
            keep: Duration::ZERO,
            override_horizon: true,
            ..RetentionConfig::default()
        };
        let error = config
            .validate(&RetryPolicy::default(), Duration::from_secs(1))
            .unwrap_err();
        assert!(matches!(error, Error::InvalidConfig { .. }), "{error:?}");
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(format_duration(DAY * 14), "14d");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_secs(90_061)), "1d 1h 1m 1s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1s");
    }
}
