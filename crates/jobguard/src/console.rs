//! What an operator needs to find any job and any key, see why it ran or did not, and act on
//! it: the reads and actions behind `jobguard serve`'s console pages and API and the `jobguard
//! jobs`, `key` and `queue` commands.
//!
//! Reads: [`Console::jobs`] lists jobs newest first by state, kind, queue or key, a page at a
//! time, each filter through an index of its own, so a page costs the same with ten million
//! jobs as with ten; [`Console::job`] shows one job with its payload and the guard row of its
//! key; [`Console::key`] shows everything stored about a key: its guard row (when and by which
//! kind it was applied, the stored result, the payload fingerprint), every job that carried it,
//! its external steps and its outbox messages.
//!
//! Actions (in `console/actions.rs`): [`Console::retry`], [`Console::cancel`],
//! [`Console::delete`], [`Console::pause`] and [`Console::resume`]. Each job action is one
//! statement whose `where` names the states it applies to, so a job that a worker or another
//! operator moved on in the meantime is left as it is; a job in another state is refused with
//! [`Error::JobConflict`] saying why, an unknown id with [`Error::JobNotFound`].
//!
//! ```no_run
//! use jobguard::Queue;
//! use jobguard::console::{Console, JobFilter};
//! use jobguard::queue::JobState;
//!
//! # async fn f(pool: sqlx::PgPool) -> jobguard::Result<()> {
//! let console = Console::new(Queue::new(pool));
//! let dead = console
//!     .jobs(&JobFilter { state: Some(JobState::Dead), limit: 50, ..JobFilter::default() })
//!     .await?;
//! for job in &dead {
//!     console.retry(job.id).await?;
//! }
//! let key = console.key("credit:order-8812").await?;
//! println!("applied at {:?} by {} jobs", key.guard.map(|g| g.applied_at), key.jobs.len());
//! for job in &key.jobs {
//!     println!("job {}: {:?} (duplicate of {:?})", job.job.id, job.outcome.outcome, job.outcome.duplicate_of);
//! }
//! # Ok(()) }
//! ```

mod actions;

pub use actions::CANCELLED;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::guard::GuardConfig;
use crate::outbox::Outbox;
use crate::queue::Queue;
use crate::steps::StepConfig;
use crate::store::Backend;
use crate::store::console::{ConsoleSql, ConsoleTables};
use crate::table::TableName;

use crate::store::console::KeyOutcome as Outcomes;
pub use crate::store::console::{
    JobDetail, JobFilter, JobOutcome, KeyHolder, KeyJob, KeyMessage, KeyOutcome, KeyRecord,
    KeyReport, KeyStep, MAX_PAGE, QueueState,
};
pub use crate::store::queue::JobRow;

/// How many jobs of one key [`Console::key`] lists, newest first.
pub const KEY_JOBS_SHOWN: u32 = 100;

/// The operator's view of a queue and the guard, steps and outbox beside it. Cheap to clone.
pub struct Console<DB: Backend> {
    queue: Queue<DB>,
    sql: Arc<ConsoleSql>,
}

impl<DB: Backend> Clone for Console<DB> {
    fn clone(&self) -> Self {
        Console {
            queue: self.queue.clone(),
            sql: Arc::clone(&self.sql),
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Console<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("queue", &self.queue)
            .finish()
    }
}

impl<DB: Backend> Console<DB> {
    /// A console over `queue` and the guard, step and outbox tables of their default names.
    pub fn new(queue: Queue<DB>) -> Self {
        let guard = GuardConfig::default().table;
        let steps = StepConfig::default().table;
        let outbox = TableName::new(Outbox::<DB>::DEFAULT_TABLE).expect("a valid default name");
        Self::with_tables(queue, guard, steps, outbox)
    }

    /// A console over `queue` and the guard, step and outbox tables of these names.
    pub fn with_tables(
        queue: Queue<DB>,
        guard: TableName,
        steps: TableName,
        outbox: TableName,
    ) -> Self {
        let tables = ConsoleTables {
            jobs: queue.sql().table.clone(),
            guard,
            steps,
            outbox,
        };
        let sql = Arc::new(DB::console_sql(&tables));
        Console { queue, sql }
    }

    /// The periodic schedules beside the queues: each one's last and next firing, and the job
    /// of its last firing with its state (see [`periodic`](crate::periodic)).
    pub async fn schedules(&self) -> Result<Vec<crate::periodic::ScheduleStatus>> {
        crate::periodic::Scheduler::status(&self.queue, std::time::SystemTime::now()).await
    }

    /// The queue the console acts on.
    pub fn queue(&self) -> &Queue<DB> {
        &self.queue
    }

    /// Jobs matching every filter given, newest first, at most `filter.limit` (1 to
    /// [`MAX_PAGE`]). The next page: the same filter with `before` set to the last id.
    pub async fn jobs(&self, filter: &JobFilter) -> Result<Vec<JobRow>> {
        self.queue.list_where(filter, filter.page()).await
    }

    /// Job `id` with its payload, its lease while it runs, and the guard row of its key; an
    /// unknown id is [`Error::JobNotFound`].
    pub async fn job(&self, id: i64) -> Result<JobDetail> {
        let pool = self.queue.pool();
        let Some(mut detail) = DB::console_job(pool, &self.sql, id).await? else {
            return Err(Error::JobNotFound { id });
        };
        detail.guard = or_absent(
            DB::console_key_record(pool, &self.sql, &detail.job.key).await,
            None,
        )?;
        let key = detail.job.key.clone();
        let applier = self
            .applier(&key, &mut detail.guard, std::slice::from_ref(&detail.job))
            .await?;
        detail.outcome = Outcomes::of(&detail.job, applier);
        Ok(detail)
    }

    /// The job that applied `key`, as its guard row's claim recorded it, once checked to be a
    /// job of the key (among `shown`, or by a read); `guard.applied_by` is set to it.
    async fn applier(
        &self,
        key: &str,
        guard: &mut Option<KeyRecord>,
        shown: &[JobRow],
    ) -> Result<Option<i64>> {
        let Some(record) = guard else {
            return Ok(None);
        };
        let Some(id) = record.applied_by else {
            return Ok(None);
        };
        let of_key = shown.iter().any(|job| job.id == id && job.key == key)
            || DB::console_job(self.queue.pool(), &self.sql, id)
                .await?
                .is_some_and(|job| job.job.key == key);
        record.applied_by = of_key.then_some(id);
        Ok(record.applied_by)
    }

    /// Everything stored about `key`: its guard row (`None` when it was never applied, or was
    /// pruned), the newest [`KEY_JOBS_SHOWN`] jobs that carried it (the one that applied it
    /// and its duplicates alike), its external steps and its outbox messages. Tables that do
    /// not exist yet read as empty.
    pub async fn key(&self, key: &str) -> Result<KeyReport> {
        let pool = self.queue.pool();
        let mut guard = or_absent(DB::console_key_record(pool, &self.sql, key).await, None)?;
        let jobs = self
            .jobs(&JobFilter {
                key: Some(key.to_owned()),
                limit: KEY_JOBS_SHOWN,
                ..JobFilter::default()
            })
            .await?;
        let applier = self.applier(key, &mut guard, &jobs).await?;
        let jobs = jobs
            .into_iter()
            .map(|job| KeyJob {
                outcome: Outcomes::of(&job, applier),
                job,
            })
            .collect();
        let holder = self.queue.holder(key).await?.map(|holder| KeyHolder {
            id: holder.id,
            state: holder.state,
            live: holder.live,
        });
        let steps = or_absent(
            DB::console_key_steps(pool, &self.sql, key).await,
            Vec::new(),
        )?;
        // Every id that starts with `<key>/` and names a topic (which has no `/`): a key
        // `a` must not list the messages of a key `a/b`.
        let prefix = format!("{}/", crate::store::outbox::encode_key(key));
        let end = format!("{}0", &prefix[..prefix.len() - 1]);
        let messages = or_absent(
            DB::console_key_messages(pool, &self.sql, prefix.as_str()..end.as_str()).await,
            Vec::new(),
        )?
        .into_iter()
        .filter(|message| !message.id[prefix.len()..].contains('/'))
        .collect();
        Ok(KeyReport {
            key: key.to_owned(),
            guard,
            jobs,
            holder,
            steps,
            messages,
        })
    }
}

/// A read of a table that does not exist yet (no step ledger, no outbox, no guard) is
/// `absent`, not an error.
fn or_absent<T>(read: sqlx::Result<T>, absent: T) -> Result<T> {
    match read {
        Ok(value) => Ok(value),
        Err(error) if is_missing_table(&error) => Ok(absent),
        Err(error) => Err(error.into()),
    }
}

pub(crate) use crate::store::is_missing_table;
