//! Pruning the guard table, the step ledger's `done` steps and the queue's finished jobs, in
//! batches.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use super::Retention;
use crate::error::Result;
use crate::guard::Guard;
use crate::metrics::{record_oldest_age, record_pruned};
use crate::queue::{JobState, Queue};
use crate::steps::Steps;
use crate::store::Backend;
use crate::store::prune::{PruneBatch, Pruned};

/// A time before any guard row, in microseconds since the Unix epoch (the year 1): where the
/// first batch starts.
const FAR_PAST_MICROS: i64 = -62_135_596_800_000_000;

/// After each batch the pruner rests at least this many times as long as the batch took: it
/// deletes at most a fifth of the time whatever the batch size and the machine, and backs off
/// when the database is slow because it is busy.
const REST_PER_BATCH: u32 = 4;

/// Deletes guard rows older than a [`Retention`], in batches, one pruner per table at a time.
///
/// Each batch is one statement deleting at most [`batch`](Self::batch) of the oldest rows,
/// committed on its own, so no long transaction holds locks or keeps old row versions alive
/// while jobs run; between batches the pruner pauses, at least four times as long as the batch
/// took, so that it deletes at most a fifth of the time. The cutoff (now minus the retention, by
/// the database clock) is fixed when a run starts. A step ledger given with
/// [`steps`](Self::steps) loses its `done` steps of the same age too; `started` steps and steps
/// that need attention are never deleted. A queue given with [`jobs`](Self::jobs) loses its
/// completed jobs older than [`Retention::keep_completed`] and its dead jobs older than
/// [`Retention::keep_dead`] (by when they finished), in batches of the same size; jobs that wait
/// or run are never deleted.
///
/// Only one pruner runs on a table at a time: on PostgreSQL it holds an advisory lock for the
/// table while it runs, on SQLite an in-process lock (SQLite's single writer already serialises
/// the batches of pruners in other processes). A pruner that finds the table taken returns
/// `None` without deleting anything.
///
/// ```no_run
/// use std::time::Duration;
///
/// use jobguard::retention::{Pruner, RetentionConfig};
/// use jobguard::RetryPolicy;
///
/// # async fn f(guard: jobguard::SqliteGuard) -> jobguard::Result<()> {
/// let retention = RetentionConfig::default().validate(&RetryPolicy::default(), Duration::from_secs(30))?;
/// let pruner = Pruner::new(&guard, retention).batch(5_000).pause(Duration::from_millis(20));
/// println!("{} rows to prune", pruner.plan().await?.guard_rows);
/// match pruner.run().await? {
///     Some(report) => println!("pruned {} rows in {} batches", report.guard_rows, report.batches),
///     None => println!("another pruner is running on this table"),
/// }
/// # Ok(()) }
/// ```
pub struct Pruner<DB: Backend> {
    guard: Guard<DB>,
    retention: Retention,
    batch: u32,
    pause: Duration,
    steps: Option<Steps<DB>>,
    jobs: Option<Queue<DB>>,
}

impl<DB: Backend> Clone for Pruner<DB> {
    fn clone(&self) -> Self {
        Pruner {
            guard: self.guard.clone(),
            retention: self.retention.clone(),
            batch: self.batch,
            pause: self.pause,
            steps: self.steps.clone(),
            jobs: self.jobs.clone(),
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Pruner<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pruner")
            .field("guard", &self.guard)
            .field("retention", &self.retention)
            .field("batch", &self.batch)
            .field("pause", &self.pause)
            .field("steps", &self.steps)
            .field("jobs", &self.jobs)
            .finish()
    }
}

/// What a [`Pruner`] run deleted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PruneReport {
    /// Guard rows deleted.
    pub guard_rows: u64,
    /// `done` steps deleted from the step ledger.
    pub step_rows: u64,
    /// Completed jobs deleted from the queue.
    pub completed_jobs: u64,
    /// Dead jobs deleted from the queue.
    pub dead_jobs: u64,
    /// Delete statements run.
    pub batches: u64,
    /// Time since the run started.
    pub elapsed: Duration,
    /// The age of the oldest guard row left, once the run ended; `None` when the table is empty
    /// (and while the run is in progress).
    pub oldest_age: Option<Duration>,
}

/// What a [`Pruner`] run would delete now, from [`Pruner::plan`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrunePlan {
    /// Guard rows older than the retention.
    pub guard_rows: u64,
    /// `done` steps older than the retention.
    pub step_rows: u64,
    /// Completed jobs older than [`Retention::keep_completed`].
    pub completed_jobs: u64,
    /// Dead jobs older than [`Retention::keep_dead`].
    pub dead_jobs: u64,
    /// The age of the oldest guard row; `None` when the table is empty.
    pub oldest_age: Option<Duration>,
}

impl<DB: Backend> Pruner<DB> {
    /// A pruner of `guard`'s table keeping rows for `retention`, 10,000 rows per batch with a
    /// 10 ms pause between batches.
    pub fn new(guard: &Guard<DB>, retention: Retention) -> Self {
        Pruner {
            guard: guard.clone(),
            retention,
            batch: super::PruneConfig::DEFAULT_BATCH,
            pause: super::PruneConfig::DEFAULT_PAUSE,
            steps: None,
            jobs: None,
        }
    }

    /// Rows deleted per statement (at least 1). Smaller batches hold their locks and write
    /// their WAL in smaller pieces; larger ones finish sooner.
    pub fn batch(mut self, rows: u32) -> Self {
        self.batch = rows.max(1);
        self
    }

    /// The shortest pause between two batches, which lets jobs through. The pruner also rests
    /// at least four times as long as each batch took, so it deletes at most a fifth of the
    /// time and backs off when the database is busy.
    pub fn pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    /// Also prunes `done` steps of this step ledger.
    pub fn steps(mut self, steps: Steps<DB>) -> Self {
        self.steps = Some(steps);
        self
    }

    /// Also prunes this queue's completed and dead jobs, after [`Retention::keep_completed`]
    /// and [`Retention::keep_dead`].
    pub fn jobs(mut self, queue: &Queue<DB>) -> Self {
        self.jobs = Some(queue.clone());
        self
    }

    /// The retention the pruner keeps.
    pub fn retention(&self) -> &Retention {
        &self.retention
    }

    /// Counts what a run would delete now, deleting nothing (a dry run).
    pub async fn plan(&self) -> Result<PrunePlan> {
        let pool = self.guard.pool();
        let cutoff = DB::prune_cutoff(pool, self.retention.keep()).await?;
        let step_rows = match &self.steps {
            Some(steps) => steps.prunable(cutoff).await?,
            None => 0,
        };
        let (mut completed_jobs, mut dead_jobs) = (0, 0);
        if let Some(queue) = &self.jobs {
            let (completed, dead) = self.job_cutoffs().await?;
            completed_jobs = queue.prunable(JobState::Completed, completed).await?;
            dead_jobs = queue.prunable(JobState::Dead, dead).await?;
        }
        Ok(PrunePlan {
            guard_rows: DB::count_guard(pool, self.guard.sql(), cutoff).await?,
            step_rows,
            completed_jobs,
            dead_jobs,
            oldest_age: self.oldest_age().await?,
        })
    }

    /// The cutoffs of completed and dead jobs, by the database clock.
    async fn job_cutoffs(&self) -> Result<(i64, i64)> {
        let pool = self.guard.pool();
        Ok((
            DB::prune_cutoff(pool, self.retention.keep_completed()).await?,
            DB::prune_cutoff(pool, self.retention.keep_dead()).await?,
        ))
    }

    /// The age of the oldest guard row, by the database clock: how far back the guard
    /// remembers. Also sets the `jobguard_guard_oldest_age_seconds` gauge.
    pub async fn oldest_age(&self) -> Result<Option<Duration>> {
        let table = self.guard.table();
        let age = DB::oldest_guard_age(self.guard.pool(), self.guard.sql()).await?;
        record_oldest_age(&table.to_string(), age);
        Ok(age)
    }

    /// Deletes every guard row (and `done` step) older than the retention, batch by batch.
    /// `None` when another pruner holds the table.
    pub async fn run(&self) -> Result<Option<PruneReport>> {
        self.run_with(|_| ControlFlow::Continue(())).await
    }

    /// Like [`run`](Self::run), calling `progress` after every batch with the totals so far;
    /// `progress` returns [`ControlFlow::Break`] to stop after that batch (what was deleted
    /// stays deleted).
    pub async fn run_with(
        &self,
        mut progress: impl FnMut(&PruneReport) -> ControlFlow<()> + Send,
    ) -> Result<Option<PruneReport>> {
        let pool = self.guard.pool();
        let table = self.guard.table();
        let Some(turn) = DB::take_prune_turn(pool, table).await? else {
            return Ok(None);
        };
        let result = self.prune(&mut progress).await;
        DB::end_prune_turn(turn).await;
        let mut report = result?;
        report.oldest_age = self.oldest_age().await?;
        tracing::debug!(
            table = %table,
            guard_rows = report.guard_rows,
            step_rows = report.step_rows,
            completed_jobs = report.completed_jobs,
            dead_jobs = report.dead_jobs,
            batches = report.batches,
            seconds = report.elapsed.as_secs_f64(),
            "pruned"
        );
        Ok(Some(report))
    }

    async fn prune(
        &self,
        progress: &mut (impl FnMut(&PruneReport) -> ControlFlow<()> + Send),
    ) -> Result<PruneReport> {
        let mut run = Run {
            report: PruneReport::default(),
            started: Instant::now(),
            progress,
        };
        let pool = self.guard.pool();
        let cutoff = DB::prune_cutoff(pool, self.retention.keep()).await?;
        let guard_label = self.guard.table().to_string();
        let guard_rows = self.batches(
            &mut run,
            cutoff,
            Rows::Guard,
            &guard_label,
            |batch| async move {
                let _writer = self.guard.write_turn().await;
                Ok(DB::prune_guard(pool, self.guard.sql(), batch).await?)
            },
        );
        if guard_rows.await?.is_break() {
            return Ok(run.report);
        }
        if let Some(steps) = &self.steps {
            let steps_label = steps.table().to_string();
            let step_rows = self.batches(
                &mut run,
                cutoff,
                Rows::Steps,
                &steps_label,
                |batch| async move {
                    let _writer = self.guard.write_turn().await;
                    // Steps are deleted oldest first by a plain limit: no keyset to carry on.
                    let deleted = steps.prune_batch(batch.cutoff, batch.limit).await?;
                    Ok(Pruned {
                        deleted,
                        last: None,
                    })
                },
            );
            if step_rows.await?.is_break() {
                return Ok(run.report);
            }
        }
        let Some(queue) = &self.jobs else {
            return Ok(run.report);
        };
        let jobs_label = queue.sql().table.to_string();
        let (completed, dead) = self.job_cutoffs().await?;
        for (state, rows, cutoff) in [
            (JobState::Completed, Rows::CompletedJobs, completed),
            (JobState::Dead, Rows::DeadJobs, dead),
        ] {
            // The queue takes the writer's turn itself.
            let jobs = self.batches(&mut run, cutoff, rows, &jobs_label, |batch| {
                queue.prune_finished(state, batch)
            });
            if jobs.await?.is_break() {
                break;
            }
        }
        Ok(run.report)
    }

    /// Deletes `rows` older than `cutoff` with `delete`, one batch at a time, until a batch
    /// comes back short ([`ControlFlow::Continue`]: on to the next table) or `progress` asks to
    /// stop ([`ControlFlow::Break`]). Each batch starts where the last one ended, rather than at
    /// the start of the index, where the entries of the rows just deleted still wait for vacuum.
    async fn batches<F, Fut>(
        &self,
        run: &mut Run<'_, impl FnMut(&PruneReport) -> ControlFlow<()> + Send>,
        cutoff: i64,
        rows: Rows,
        label: &str,
        mut delete: F,
    ) -> Result<ControlFlow<()>>
    where
        F: FnMut(PruneBatch) -> Fut,
        Fut: Future<Output = Result<Pruned>>,
    {
        let mut after = FAR_PAST_MICROS;
        loop {
            let batch_started = Instant::now();
            let batch = PruneBatch {
                cutoff,
                after,
                limit: self.batch,
            };
            let Pruned { deleted, last } = delete(batch).await?;
            let took = batch_started.elapsed();
            after = last.unwrap_or(after);
            record_pruned(label, deleted);
            *rows.count(&mut run.report) += deleted;
            run.report.batches += 1;
            run.report.elapsed = run.started.elapsed();
            if (run.progress)(&run.report).is_break() {
                return Ok(ControlFlow::Break(()));
            }
            if deleted < u64::from(self.batch) {
                return Ok(ControlFlow::Continue(()));
            }
            self.rest(took).await;
        }
    }

    /// The pause after a batch that took `took`.
    async fn rest(&self, took: Duration) {
        tokio::time::sleep(self.pause.max(took * REST_PER_BATCH)).await;
    }
}

/// A run's report so far, when it started, and the caller's progress callback.
struct Run<'a, P> {
    report: PruneReport,
    started: Instant,
    progress: &'a mut P,
}

/// The rows a run of batches deletes: the report's count it adds to.
#[derive(Clone, Copy)]
enum Rows {
    Guard,
    Steps,
    CompletedJobs,
    DeadJobs,
}

impl Rows {
    fn count(self, report: &mut PruneReport) -> &mut u64 {
        match self {
            Rows::Guard => &mut report.guard_rows,
            Rows::Steps => &mut report.step_rows,
            Rows::CompletedJobs => &mut report.completed_jobs,
            Rows::DeadJobs => &mut report.dead_jobs,
        }
    }
}
