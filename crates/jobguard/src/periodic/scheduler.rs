//! The scheduler: at each firing of its schedules, enqueues the firing's job and records it in
//! the schedules table, in one transaction. It runs on a timer task of its own, beside a
//! [`Worker`](crate::Worker)'s loop, and does nothing per job.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::watch;

use super::Periodic;
use crate::error::{Error, Result};
use crate::queue::{NewJob, Queue};
use crate::store::schedules::{ScheduleRow, ScheduleSql};
use crate::store::{Backend, is_missing_table};
use crate::unique::UniqueOpts;
use jobguard_core::cron::{ZonedCron, parse_zone};
use jobguard_core::periodic::{firing_key, firing_states, plan};

/// The longest the timer sleeps between two looks at the clock: a clock set forward is
/// noticed within it.
const MAX_SLEEP: Duration = Duration::from_secs(60);

/// How long the timer waits after a round that failed (the database was away).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// What became of one firing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FiringOutcome {
    /// This scheduler enqueued its job.
    Enqueued,
    /// Another scheduler (or this one, before a restart) had enqueued it: the key was taken.
    AlreadyEnqueued,
    /// Missed (no scheduler reached it within the grace) and left out by the policy.
    Missed,
}

impl FiringOutcome {
    /// The outcome's name, as metrics label it.
    pub fn as_str(self) -> &'static str {
        match self {
            FiringOutcome::Enqueued => "enqueued",
            FiringOutcome::AlreadyEnqueued => "already_enqueued",
            FiringOutcome::Missed => "missed",
        }
    }
}

/// One firing a [`Scheduler::tick`] dealt with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Firing {
    /// The schedule.
    pub schedule: String,
    /// The firing's scheduled time, in seconds since the epoch.
    pub at: i64,
    /// What became of it.
    pub outcome: FiringOutcome,
    /// The job that holds the firing's key, unless it was missed.
    pub job: Option<i64>,
}

/// A schedule as the database knows it, for `jobguard schedules` and the console.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ScheduleStatus {
    /// The schedule's name.
    pub name: String,
    /// Its cron expression.
    pub cron: String,
    /// Its time zone.
    pub zone: String,
    /// The kind of its jobs.
    pub kind: String,
    /// Their queue.
    pub queue: String,
    /// Its last firing enqueued (seconds since the epoch).
    pub last_fired_at: Option<i64>,
    /// The job of that firing.
    pub last_job_id: Option<i64>,
    /// That job's state now (`completed`, `dead`...), while the queue still has it.
    pub last_job_state: Option<String>,
    /// Its next firing after now.
    pub next_firing: Option<i64>,
}

/// Enqueues the firings of its schedules, each once, on a [`Queue`].
///
/// A [`Worker`](crate::Worker) with schedules runs one on a timer task; [`Scheduler::tick`]
/// runs one round at a given time, for tests with a clock of their own.
pub struct Scheduler<DB: Backend> {
    queue: Queue<DB>,
    sql: Arc<ScheduleSql>,
    schedules: Vec<Periodic>,
    /// Per schedule, the latest firing this scheduler has decided (enqueued, found taken or
    /// missed): the next round starts after it.
    decided: Mutex<HashMap<String, i64>>,
    /// Called between a round's read of a schedule's row and each firing it enqueues.
    #[cfg(feature = "fault-injection")]
    before_fire: Option<BeforeFire>,
}

/// A test's hook between a round's read and a firing: the schedule's name and the firing.
#[cfg(feature = "fault-injection")]
type BeforeFire = Arc<dyn Fn(&str, i64) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

fn seconds(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(since) => since.as_secs() as i64,
        Err(before) => -(before.duration().as_secs_f64().ceil() as i64),
    }
}

/// The policy of every firing's job: its key stays taken while it waits, runs, and after it
/// completed or died, until retention prunes it.
fn firing_policy() -> UniqueOpts {
    UniqueOpts::new().states(firing_states())
}

impl<DB: Backend> Scheduler<DB> {
    /// A scheduler of `schedules` on `queue`'s database; the schedules' state goes in
    /// `<jobs table>_schedules`. Two schedules of one name are [`Error::InvalidSchedule`].
    pub fn new(queue: Queue<DB>, schedules: Vec<Periodic>) -> Result<Self> {
        let mut names = HashSet::new();
        for schedule in &schedules {
            if !names.insert(schedule.name.as_str()) {
                return Err(Error::InvalidSchedule {
                    schedule: schedule.name.clone(),
                    reason: "two schedules have this name; give each its own".into(),
                });
            }
        }
        let sql = DB::schedule_sql(&queue.sql().table)?;
        Ok(Scheduler {
            queue,
            sql: Arc::new(sql),
            schedules,
            decided: Mutex::default(),
            #[cfg(feature = "fault-injection")]
            before_fire: None,
        })
    }

    /// Fault injection, for tests only (feature `fault-injection`): `hook` runs after a
    /// round read a schedule's row and before each firing it enqueues, with the schedule's
    /// name and the firing's time; the round waits for it, as a scheduler stalled there (a
    /// pause of its process, a slow connection) would.
    #[cfg(feature = "fault-injection")]
    pub fn before_fire(
        mut self,
        hook: impl Fn(&str, i64) -> futures::future::BoxFuture<'static, ()> + Send + Sync + 'static,
    ) -> Self {
        self.before_fire = Some(Arc::new(hook));
        self
    }

    /// Creates the schedules table when missing.
    pub async fn migrate(&self) -> Result<()> {
        Ok(DB::migrate_statements(self.queue.pool(), &self.sql.table, &self.sql.create).await?)
    }

    /// The schedules.
    pub fn schedules(&self) -> &[Periodic] {
        &self.schedules
    }

    /// Writes each schedule's row (its definition, and when it was first run), as a worker
    /// does when it starts.
    pub async fn register(&self, now: SystemTime) -> Result<()> {
        for schedule in &self.schedules {
            self.register_one(schedule, seconds(now)).await?;
        }
        Ok(())
    }

    async fn register_one(&self, schedule: &Periodic, now: i64) -> Result<(i64, Option<i64>)> {
        let row = ScheduleRow {
            name: schedule.name.clone(),
            cron: schedule.expression.clone(),
            zone: schedule.zone_name.clone(),
            kind: schedule.kind.clone(),
            queue: schedule.queue.clone(),
            created_at: now,
            last_fired_at: None,
            last_job_id: None,
        };
        let _turn = self.queue.write_turn().await;
        let mut conn = self.queue.pool().acquire().await?;
        Ok(DB::register_schedule(&mut conn, &self.sql, &row, now).await?)
    }

    /// One round at `now`: for each schedule, the firings due since its last one (and since
    /// it was first run), enqueued or left out as its [`Missed`](super::Missed) policy says.
    /// What became of each, oldest first per schedule.
    pub async fn tick(&self, now: SystemTime) -> Result<Vec<Firing>> {
        let now = seconds(now);
        let mut firings = Vec::new();
        for schedule in &self.schedules {
            firings.extend(self.tick_one(schedule, now).await?);
        }
        Ok(firings)
    }

    async fn tick_one(&self, schedule: &Periodic, now: i64) -> Result<Vec<Firing>> {
        let stored = {
            let mut conn = self.queue.pool().acquire().await?;
            DB::read_schedule(&mut conn, &self.sql, &schedule.name).await?
        };
        let (created_at, last_fired_at) = match stored {
            Some(stored) => stored,
            None => self.register_one(schedule, now).await?,
        };
        let decided = self.decided(&schedule.name);
        let after = created_at
            .max(last_fired_at.unwrap_or(i64::MIN))
            .max(decided);
        let (due, cut) = schedule.cron.due(after, now);
        if cut {
            tracing::warn!(
                schedule = schedule.name,
                "more firings were missed than one round considers; the oldest are not counted"
            );
        }
        let grace = schedule.grace.as_secs() as i64;
        let plan = plan(&due, now, grace, schedule.missed);
        let mut firings = Vec::with_capacity(due.len());
        let mut missed = plan.missed.iter().peekable();
        for &at in &plan.enqueue {
            while let Some(&earlier) = missed.next_if(|&&m| m < at) {
                firings.push(self.missed(schedule, earlier));
            }
            #[cfg(feature = "fault-injection")]
            if let Some(hook) = &self.before_fire {
                hook(&schedule.name, at).await;
            }
            firings.push(self.fire(schedule, at, now).await?);
            self.decide(&schedule.name, at);
        }
        for &at in missed {
            firings.push(self.missed(schedule, at));
        }
        if let Some(&last) = due.last() {
            self.decide(&schedule.name, last);
        }
        Ok(firings)
    }

    fn decided(&self, name: &str) -> i64 {
        let decided = self.decided.lock().expect("not poisoned");
        decided.get(name).copied().unwrap_or(i64::MIN)
    }

    fn decide(&self, name: &str, at: i64) {
        let mut decided = self.decided.lock().expect("not poisoned");
        let entry = decided.entry(name.to_owned()).or_insert(at);
        *entry = (*entry).max(at);
    }

    fn missed(&self, schedule: &Periodic, at: i64) -> Firing {
        let firing = Firing {
            schedule: schedule.name.clone(),
            at,
            outcome: FiringOutcome::Missed,
            job: None,
        };
        count(&firing);
        firing
    }

    /// Enqueues the firing at `at` and records it as the schedule's last, in one transaction,
    /// on a task of its own: a worker that stops aborts the scheduler's task, and an abort
    /// inside the transaction could hand its pooled connection back still in it, holding its
    /// locks for the connection's next user. The firing's task ends with its transaction.
    async fn fire(&self, schedule: &Periodic, at: i64, now: i64) -> Result<Firing> {
        let (queue, sql, schedule) = (self.queue.clone(), Arc::clone(&self.sql), schedule.clone());
        match tokio::spawn(async move { fire(&queue, &sql, &schedule, at, now).await }).await {
            Ok(firing) => firing,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => Err(Error::Database(sqlx::Error::Protocol(format!(
                "the firing's task ended early: {error}"
            )))),
        }
    }

    /// The next firing of any schedule strictly after `now`.
    pub fn next_firing(&self, now: SystemTime) -> Option<SystemTime> {
        let now = seconds(now);
        self.schedules
            .iter()
            .filter_map(|schedule| schedule.next_after(now))
            .min()
            .and_then(|next| u64::try_from(next).ok())
            .map(|next| UNIX_EPOCH + Duration::from_secs(next))
    }

    /// Registers the schedules, then runs a round at every firing until `stop` turns true.
    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            match self.register(SystemTime::now()).await {
                Ok(()) => break,
                Err(error) => tracing::warn!(%error, "cannot record the schedules; retrying"),
            }
            tokio::select! {
                () = tokio::time::sleep(RETRY_AFTER) => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
        }
        loop {
            let wait = match self.tick(SystemTime::now()).await {
                Ok(_) => {
                    let now = SystemTime::now();
                    self.next_firing(now)
                        .map_or(MAX_SLEEP, |next| {
                            next.duration_since(now).unwrap_or_default()
                        })
                        .min(MAX_SLEEP)
                }
                Err(error) => {
                    tracing::warn!(%error, "enqueueing periodic firings failed; retrying");
                    RETRY_AFTER
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
        }
    }

    /// Every schedule the database of `queue` knows, with its last and next firing and the
    /// state of its last firing's job; none when no scheduler ever ran there.
    pub async fn status(queue: &Queue<DB>, now: SystemTime) -> Result<Vec<ScheduleStatus>> {
        let sql = DB::schedule_sql(&queue.sql().table)?;
        let rows = {
            let mut conn = queue.pool().acquire().await?;
            match DB::list_schedules(&mut conn, &sql).await {
                Ok(rows) => rows,
                Err(error) if is_missing_table(&error) => return Ok(Vec::new()),
                Err(error) => return Err(error.into()),
            }
        };
        let now = seconds(now);
        let mut statuses = Vec::with_capacity(rows.len());
        for row in rows {
            let next_firing = parse_zone(&row.zone)
                .and_then(|zone| ZonedCron::new(&row.cron, zone))
                .ok()
                .and_then(|cron| cron.next_after(now));
            let last_job_state = match row.last_fired_at {
                Some(at) => {
                    let key = firing_key(&row.name, at)?;
                    queue
                        .holder(key.as_str())
                        .await?
                        .map(|holder| holder.state.to_string())
                }
                None => None,
            };
            statuses.push(ScheduleStatus {
                name: row.name,
                cron: row.cron,
                zone: row.zone,
                kind: row.kind,
                queue: row.queue,
                last_fired_at: row.last_fired_at,
                last_job_id: row.last_job_id,
                last_job_state,
                next_firing,
            });
        }
        Ok(statuses)
    }
}

fn count(firing: &Firing) {
    crate::metrics::count_periodic_firing(&firing.schedule, firing.outcome.as_str());
}

/// Enqueues the firing of `schedule` at `at` and records it as the schedule's last, in one
/// transaction that first takes the firing on the schedule's row
/// ([`schedules::advance`](jobguard_core::sql::schedules::advance)): a firing at or before the
/// schedule's last is never enqueued again, even once its job completed and was pruned. The
/// key is the firing's too: a job that holds it (a schedule's row deleted and made again) is
/// found, not duplicated.
async fn fire<DB: Backend>(
    queue: &Queue<DB>,
    sql: &ScheduleSql,
    schedule: &Periodic,
    at: i64,
    now: i64,
) -> Result<Firing> {
    let key = firing_key(&schedule.name, at)?;
    let job = NewJob::new(key, &schedule.payload_at(at))?
        .kind(&schedule.kind)?
        .queue(&schedule.queue)?
        .unique(firing_policy());
    let _turn = queue.write_turn().await;
    let mut conn = queue.pool().acquire().await?;
    let mut tx = DB::begin_on(&mut conn).await?;
    // The firing is taken on the schedule's row before its job is enqueued: the row, not the
    // job (which completes and is pruned), remembers that it fired.
    if !DB::advance_schedule(&mut tx, sql, &schedule.name, at, now).await? {
        let job = DB::firing_job(&mut tx, sql, &schedule.name, at).await?;
        tx.rollback().await?;
        let firing = Firing {
            schedule: schedule.name.clone(),
            at,
            outcome: FiringOutcome::AlreadyEnqueued,
            job,
        };
        count(&firing);
        return Ok(firing);
    }
    let enqueued = match queue.enqueue_tx(&mut tx, &job).await {
        Ok(enqueued) => enqueued,
        // The schedule's payload changed since a scheduler enqueued this firing: it is
        // taken all the same.
        Err(Error::KeyReused { key }) => {
            tracing::warn!(
                schedule = schedule.name,
                key,
                "the firing was enqueued with another payload or kind; leaving it"
            );
            let firing = Firing {
                schedule: schedule.name.clone(),
                at,
                outcome: FiringOutcome::AlreadyEnqueued,
                job: None,
            };
            count(&firing);
            return Ok(firing);
        }
        Err(error) => return Err(error),
    };
    DB::record_firing(&mut tx, sql, &schedule.name, at, enqueued.id, now).await?;
    tx.commit().await?;
    let firing = Firing {
        schedule: schedule.name.clone(),
        at,
        outcome: match enqueued.inserted {
            true => FiringOutcome::Enqueued,
            false => FiringOutcome::AlreadyEnqueued,
        },
        job: Some(enqueued.id),
    };
    count(&firing);
    tracing::debug!(
        schedule = schedule.name,
        at = jobguard_core::periodic::format_firing(at),
        outcome = firing.outcome.as_str(),
        job = enqueued.id,
        "periodic firing"
    );
    Ok(firing)
}
