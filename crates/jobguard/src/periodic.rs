//! Periodic jobs: a job enqueued at each firing of a cron expression, exactly once per firing
//! however many workers run the schedule, with no leader.
//!
//! Each firing is one job whose key names the schedule and the firing's scheduled time in UTC
//! (`periodic:nightly-report:2026-12-06T03:00:00Z`, see
//! [`jobguard_core::periodic::firing_key`]). It is enqueued under a unique policy that keeps
//! the key while the job waits, runs, and after it completed or died, until retention prunes
//! it: every worker that runs the schedule enqueues the same key for the same firing, the
//! database keeps one job, and a scheduler restarted after a firing finds it taken. The worker
//! runs the job under the guard as any job. No election, no lock held for the schedule.
//!
//! Each schedule has a row in `<jobs table>_schedules` with its last firing enqueued and the
//! job it produced, written in the transaction that enqueues the firing, so a restarted
//! scheduler knows where its schedule stands. Firings that came due while no scheduler ran
//! are *missed*, and [`Missed`] says what to do with them: skip them, enqueue the latest once,
//! or all of them up to a limit. A firing is on time when a scheduler reaches it within the
//! schedule's grace ([`Periodic::grace`], a minute by default) of its scheduled time.
//!
//! ```no_run
//! use jobguard::periodic::{Missed, Periodic};
//! use jobguard::{Job, JobError, JobKey, KeyError, Queue, Worker};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Report {
//!     recipients: String,
//! }
//!
//! impl Job<sqlx::Postgres> for Report {
//!     const KIND: &'static str = "report";
//!     fn key(&self) -> Result<JobKey, KeyError> {
//!         JobKey::new("report", [&self.recipients])
//!     }
//!     async fn run(&self, _conn: &mut sqlx::PgConnection) -> Result<(), JobError> {
//!         Ok(())
//!     }
//! }
//!
//! # async fn f(queue: Queue<sqlx::Postgres>) -> jobguard::Result<()> {
//! let nightly = Periodic::new("nightly-report", "0 3 * * *", "report", &Report {
//!     recipients: "ops".into(),
//! })?
//! .zone("Europe/Paris")?
//! .missed(Missed::Latest);
//! let worker = Worker::new(queue)?.register::<Report>().schedule(nightly);
//! worker.migrate().await?;
//! worker.run(jobguard::worker::shutdown_signal()).await?;
//! # Ok(()) }
//! ```
//!
//! A schedule whose cron expression or time zone is wrong is refused by [`Periodic::new`] and
//! [`Periodic::zone`]; one whose kind no worker registered, or whose payload that kind cannot
//! decode, by [`Worker::run`](crate::Worker::run) before anything is enqueued. Each with
//! [`Error::InvalidSchedule`] naming the schedule.

use jobguard_core::cron;
mod scheduler;

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::queue::DEFAULT_QUEUE;

pub use self::scheduler::{Firing, FiringOutcome, ScheduleStatus, Scheduler};
pub use jobguard_core::periodic::{DEFAULT_ALL_LIMIT, Missed, firing_key, format_firing};

/// How late a scheduler may reach a firing and still count it on time, unless configured.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);

/// A schedule: a job (its kind and payload) enqueued at every firing of a cron expression.
#[derive(Clone, Debug)]
pub struct Periodic {
    pub(crate) name: String,
    pub(crate) expression: String,
    pub(crate) zone_name: String,
    pub(crate) cron: cron::ZonedCron,
    pub(crate) kind: String,
    pub(crate) payload: Value,
    pub(crate) queue: String,
    pub(crate) missed: Missed,
    pub(crate) grace: Duration,
    pub(crate) firing_field: Option<String>,
}

impl Periodic {
    /// The schedule `name`: a job of `kind` with `payload`, at every firing of `cron` (five
    /// fields, minute hour day-of-month month day-of-week, or six with seconds first), in
    /// UTC, on the default queue, skipping missed firings.
    ///
    /// Refused with [`Error::InvalidSchedule`] when `cron` is not a cron expression or never
    /// fires, or `name` cannot be part of a job key.
    pub fn new<P: Serialize + ?Sized>(
        name: &str,
        cron: &str,
        kind: &str,
        payload: &P,
    ) -> Result<Self> {
        let invalid = |reason: String| Error::InvalidSchedule {
            schedule: name.to_owned(),
            reason,
        };
        firing_key(name, 0).map_err(|error| invalid(format!("bad schedule name: {error}")))?;
        let zoned = cron::ZonedCron::new(cron, chrono_tz::Tz::UTC).map_err(invalid)?;
        let payload = serde_json::to_value(payload)
            .map_err(|error| invalid(format!("the payload does not serialize: {error}")))?;
        Ok(Periodic {
            name: name.to_owned(),
            expression: cron.to_owned(),
            zone_name: "UTC".to_owned(),
            cron: zoned,
            kind: kind.to_owned(),
            payload,
            queue: DEFAULT_QUEUE.to_owned(),
            missed: Missed::Skip,
            grace: DEFAULT_GRACE,
            firing_field: None,
        })
    }

    /// Evaluates the cron expression in the IANA time zone `zone` (`Europe/Paris`). Firings
    /// around a daylight-saving change are croner's: a fixed time in a skipped hour fires at
    /// the first instant after it, a fixed time in a repeated hour fires once (the first
    /// pass); an interval (`*/15`) skips the instants of a skipped hour and fires in both
    /// passes of a repeated one. Each firing is still keyed by its UTC instant, so each fires
    /// once. An unknown zone is [`Error::InvalidSchedule`].
    pub fn zone(mut self, zone: &str) -> Result<Self> {
        let invalid = |reason: String| Error::InvalidSchedule {
            schedule: self.name.clone(),
            reason,
        };
        let tz = cron::parse_zone(zone).map_err(invalid)?;
        self.cron = cron::ZonedCron::new(&self.expression, tz).map_err(invalid)?;
        self.zone_name = zone.to_owned();
        Ok(self)
    }

    /// Puts the jobs on `queue`: a worker of that queue runs them, and schedules them.
    pub fn queue(mut self, queue: &str) -> Self {
        queue.clone_into(&mut self.queue);
        self
    }

    /// What to do with firings missed while no scheduler ran.
    pub fn missed(mut self, missed: Missed) -> Self {
        self.missed = missed;
        self
    }

    /// How late a scheduler may reach a firing and still enqueue it as on time; a firing
    /// reached later is missed (see [`Missed`]). A minute unless configured.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Sets the payload's field `field` to each firing's time (`2026-12-06T03:00:00Z`), for
    /// a job that needs to know which firing it runs for (a report of the day before, a row
    /// per firing). The payload must be a JSON object.
    pub fn firing_field(mut self, field: &str) -> Result<Self> {
        if !self.payload.is_object() {
            return Err(Error::InvalidSchedule {
                schedule: self.name,
                reason: format!(
                    "the payload must be a JSON object to carry the firing's time in `{field}`"
                ),
            });
        }
        self.firing_field = Some(field.to_owned());
        Ok(self)
    }

    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cron expression as given.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The time zone's name.
    pub fn zone_name(&self) -> &str {
        &self.zone_name
    }

    /// The kind of the jobs.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The queue of the jobs.
    pub fn queue_name(&self) -> &str {
        &self.queue
    }

    /// The payload field set to each firing's time, if any.
    pub fn firing_field_name(&self) -> Option<&str> {
        self.firing_field.as_deref()
    }

    /// The missed-firings policy.
    pub fn missed_policy(&self) -> Missed {
        self.missed
    }

    /// The first firing strictly after `seconds` since the epoch.
    pub fn next_after(&self, seconds: i64) -> Option<i64> {
        self.cron.next_after(seconds)
    }

    /// The firings after `after` and at or before `through` (seconds since the epoch), oldest
    /// first, as the schedule's time zone gives them.
    pub fn firings(&self, after: i64, through: i64) -> Vec<i64> {
        self.cron.due(after, through).0
    }

    /// The payload of the firing at `at`.
    pub fn payload_at(&self, at: i64) -> Value {
        let mut payload = self.payload.clone();
        if let (Some(field), Some(object)) = (&self.firing_field, payload.as_object_mut()) {
            object.insert(field.clone(), Value::String(format_firing(at)));
        }
        payload
    }
}
