//! The worker's loop: rescue expired leases, fetch jobs for free slots and a few ahead of them,
//! queue them for the slots, wait for a slot to free, a wakeup or the poll interval; at shutdown
//! give back the jobs fetched ahead, drain the running ones, then give back what did not finish.
//!
//! Jobs fetched ahead ([`WorkerConfig::prefetch`](super::WorkerConfig::prefetch)) wait for a
//! slot in fetch order, with their leases extended meanwhile (see `leases.rs`): a slot that
//! finishes a job starts the next one at once instead of waiting for the next fetch's round
//! trip.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use tokio::task::JoinSet;

use super::cursor::Cursor;
use super::group::Ready;
use super::{Counters, Worker, WorkerStats};
use crate::dispatch::log_join;
use crate::error::Result;
use crate::queue::{Fetch, LeasedJob, Place};
use crate::retention::{PruneReport, Pruner, Retention};
use crate::steps::Steps;
use crate::store::{Backend, Wakeup};

impl<DB: Backend> Worker<DB> {
    /// Runs until `shutdown` resolves (see [`shutdown_signal`](super::shutdown_signal)), or until the queue is empty
    /// with [`WorkerConfig::stop_when_idle`](super::WorkerConfig::stop_when_idle).
    ///
    /// Refuses to start with [`Error::RetentionTooShort`](crate::Error::RetentionTooShort) when the guard's retention is shorter
    /// than the longest time a duplicate can still arrive, unless overridden. While it runs it
    /// prunes on [`PruneConfig::schedule`](crate::PruneConfig::schedule), one worker per guard table at a time.
    ///
    /// After shutdown is asked it takes no new jobs, lets running jobs finish within
    /// [`WorkerConfig::shutdown_timeout`](super::WorkerConfig::shutdown_timeout), then rolls back the rest and gives their jobs back.
    pub async fn run(mut self, shutdown: impl Future<Output = ()> + Send) -> Result<WorkerStats> {
        let retention = self.retention()?;
        let scheduler = self.scheduler()?;
        self.config.concurrency = self.servable_concurrency();
        self.fetched_kinds = self.kinds_to_fetch();
        let worker = Arc::new(self);
        let counters = Arc::new(Counters::default());
        let (stop_pruning, pruning) = worker.prune_on_schedule(retention, &counters);
        let scheduling = scheduler
            .map(|scheduler| AbortOnDrop(tokio::spawn(scheduler.run(stop_pruning.subscribe()))));
        let concurrency = worker.config.concurrency.max(1);
        let ahead = worker.prefetch();
        // Fetch when half the jobs fetched ahead have started (or half the slots are free, with
        // none fetched ahead): one query for several jobs rather than one per finished job.
        let refill_at = (if ahead > 0 { ahead } else { concurrency } / 2).max(1);
        // Running slots wake the loop when a fetch is due, not at every job's end: the loop
        // runs on the caller's thread, and a wakeup per job costs a thread switch per job.
        let ready = Arc::new(Ready::new(concurrency, concurrency + ahead, refill_at));
        // Aborted when this future ends or is dropped: a worker that is cancelled must let its
        // leases expire, so that another worker rescues its jobs.
        let beating = {
            let worker = Arc::clone(&worker);
            AbortOnDrop(tokio::spawn(async move { worker.keep_leases().await }))
        };
        let mut slots = JoinSet::new();
        let mut wakeup = match DB::listen(worker.queue.pool()).await {
            Ok(wakeup) => wakeup,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for new jobs; polling only");
                None
            }
        };
        let rescue_every = (worker.config.lease / 2).max(Duration::from_millis(100));
        // The last fetch found fewer jobs than it asked for.
        let mut queue_drained = true;
        let mut last_rescue: Option<Instant> = None;
        // The loop's own connection for fetching (see `fetch_on`).
        let mut fetch_conn = None;
        // Where the next fetch starts reading the queue (see `cursor.rs`).
        let mut cursor = Cursor::default();
        let mut shutdown = std::pin::pin!(shutdown);

        loop {
            while let Some(joined) = slots.try_join_next() {
                log_join(joined, "a job slot panicked outside the job");
            }
            // A slot that panicked left the groups waiting behind it: a slot for each.
            worker.start_slots(&mut slots, &ready, &counters, usize::MAX);
            // On SQLite a running job holds the only write lock, so the queue's own writes wait
            // for it: shutdown must not.
            if last_rescue.is_none_or(|at| at.elapsed() >= rescue_every) {
                // The fetch's connection back to the pool for the rescue, which takes one:
                // with every job slot holding one, the heartbeats' spare is the only other.
                drop(fetch_conn.take());
                // Never this worker's own jobs, whose leases it keeps.
                let held = worker.leases.all();
                let rescue = worker.queue.rescue_holding(
                    worker.config.retry.max_attempts,
                    &held,
                    // Like the fetch, of the kinds this worker runs.
                    worker.fetched_kinds.as_deref(),
                );
                let rescued = tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    rescued = rescue => rescued,
                };
                match rescued {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(jobs = n, "rescued jobs whose lease expired"),
                    Err(error) => tracing::warn!(%error, "rescuing expired leases failed"),
                }
                last_rescue = Some(Instant::now());
            }
            let free = ready.free_places();
            let mut fetched = 0;
            // A fetch past the cursor came back short: the next, from the head, runs at once.
            let mut read_head = false;
            // With batches, enough jobs to fill a batch per free place. Read once for the fetch
            // and its grouping: contention may change it meanwhile.
            let size = worker.batch_size();
            let wanted = free * size;
            if free > 0 && (free >= refill_at || slots.is_empty()) {
                // A short batch lingers for more only when no slot could start it now.
                let linger = !ready.slot_idle();
                let start = cursor.start(Instant::now());
                let fetch = worker.fetch_jobs(&mut fetch_conn, wanted, size, linger, start);
                let fetched_jobs = tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    jobs = fetch => jobs,
                };
                match fetched_jobs {
                    Ok(jobs) => {
                        fetched = jobs.len();
                        read_head = cursor.record(start, wanted, &jobs, Instant::now());
                        queue_drained = fetched < wanted && !read_head;
                        let idle = ready.idle_slots();
                        let groups = worker.group(jobs, size, idle);
                        // A slot for each new group while slots are free; running slots take
                        // the rest as they finish.
                        let waiting = groups.len();
                        for group in groups {
                            ready.push(group);
                        }
                        worker.start_slots(&mut slots, &ready, &counters, waiting);
                    }
                    Err(error) => tracing::warn!(%error, "fetching jobs failed; retrying"),
                }
            }
            if (fetched > 0 && fetched == wanted) || read_head {
                continue;
            }
            if worker.config.stop_when_idle && fetched == 0 && slots.is_empty() && ready.is_empty()
            {
                break;
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = ready.refill.notified() => {}
                // With the queue drained, every slot's end may be the last one.
                Some(joined) = slots.join_next(), if queue_drained && !slots.is_empty() => log_join(joined, "a job slot panicked outside the job"),
                () = next_wakeup(&mut wakeup) => {}
                () = tokio::time::sleep(worker.config.poll_interval) => {}
            }
        }

        drop(fetch_conn);
        // No firing is enqueued once shutdown is asked.
        drop(scheduling);
        // Jobs still waiting for a slot are given back now rather than started.
        for job in ready.stop() {
            worker.end_lease(job.lease);
            worker
                .give_back(
                    job.lease,
                    &counters,
                    "giving back a job fetched ahead failed; its lease will expire",
                )
                .await;
        }
        let drained = tokio::time::timeout(worker.config.shutdown_timeout, async {
            while let Some(joined) = slots.join_next().await {
                log_join(joined, "a job slot panicked outside the job");
            }
        })
        .await;
        drop(beating);
        if drained.is_err() {
            tracing::warn!(
                slots = slots.len(),
                "running jobs did not finish in time; rolling them back"
            );
            slots.abort_all();
            while slots.join_next().await.is_some() {}
        }
        // What is still held was cut short: jobs whose slots were aborted, or a fetch that
        // shutdown interrupted after it leased its jobs.
        for lease in worker.leases.take() {
            worker.queue.end_heartbeats(lease);
            worker
                .give_back(
                    lease,
                    &counters,
                    "giving a job back failed; its lease will expire",
                )
                .await;
        }
        if let Some(mut pruning) = pruning {
            // A prune stops after its current batch.
            let _ = stop_pruning.send(true);
            let timeout = worker.config.shutdown_timeout;
            if tokio::time::timeout(timeout, &mut pruning).await.is_err() {
                pruning.abort();
            }
        }
        Ok(counters.snapshot())
    }

    /// Starts the scheduled prune, if there is a schedule; it stops when the sender says so.
    fn prune_on_schedule(
        &self,
        retention: Retention,
        counters: &Arc<Counters>,
    ) -> (
        tokio::sync::watch::Sender<bool>,
        Option<tokio::task::JoinHandle<()>>,
    ) {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let Some(schedule) = self.config.prune.schedule.clone() else {
            return (stop, None);
        };
        let config = &self.config.prune;
        let mut pruner = Pruner::new(&self.guard, retention)
            .batch(config.batch)
            .pause(config.pause)
            .jobs(&self.queue);
        if let Some(steps) = &config.steps {
            pruner = pruner.steps(Steps::with_config(self.queue.pool().clone(), steps.clone()));
        }
        let counters = Arc::clone(counters);
        let on_round = move |report: Option<&PruneReport>| match report {
            Some(report) => {
                let rows = report.guard_rows + report.step_rows;
                counters.pruned.fetch_add(rows, Ordering::Relaxed);
            }
            None => {
                counters.prunes_skipped.fetch_add(1, Ordering::Relaxed);
            }
        };
        let task = crate::retention::run_schedule(pruner, schedule, stopped, on_round);
        (stop, Some(tokio::spawn(task)))
    }
}

impl<DB: Backend> Worker<DB> {
    /// Starts up to `most` slots, while slots are free and groups wait for one.
    fn start_slots(
        self: &Arc<Self>,
        slots: &mut JoinSet<()>,
        ready: &Arc<Ready>,
        counters: &Arc<Counters>,
        most: usize,
    ) {
        let mut started = 0;
        while started < most
            && !ready.is_empty()
            && let Some(slot) = ready.free_slot()
        {
            let (worker, ready, counters) =
                (Arc::clone(self), Arc::clone(ready), Arc::clone(counters));
            slots.spawn(worker.run_slot(ready, counters, slot));
            started += 1;
        }
    }

    /// Jobs (batches, when batching) fetched ahead of free slots.
    fn prefetch(&self) -> usize {
        // On SQLite jobs take the one write lock in turn, and a fetch is an in-process call:
        // jobs waiting ahead only add heartbeats and stretch batches' waits for the lock.
        let default = if DB::SINGLE_WRITER {
            0
        } else {
            2 * self.config.concurrency.max(1)
        };
        self.config.prefetch.unwrap_or(default)
    }

    /// Jobs per transaction for kinds that opted in: 1 when none did, else the batch size
    /// as contention has adapted it (see `batch_limit.rs`).
    fn batch_size(&self) -> usize {
        if self.batched.is_empty() {
            1
        } else {
            self.batch_limit.current()
        }
    }

    /// Up to `limit` jobs. When batching and the fetch left a batch short (a short queue),
    /// waits [`WorkerConfig::batch_linger`](super::WorkerConfig::batch_linger) once for more to
    /// fill it, if `linger`: when every slot is busy, so the batch could not start sooner. With
    /// a slot free a short batch starts at once: the worker has room to spare, and a backlog
    /// (a load above what one job per transaction keeps up with) fills batches without waiting.
    /// Every job fetched is held, its lease kept, from the moment it arrives.
    ///
    /// The first fetch reads the queue past `after`, when given; the one after the linger reads
    /// it from the head.
    async fn fetch_jobs(
        &self,
        conn: &mut Option<PoolConnection<DB>>,
        limit: usize,
        size: usize,
        linger: bool,
        after: Option<Place>,
    ) -> Result<Vec<LeasedJob>> {
        let mut jobs = self.fetch_on(conn, limit, after).await?;
        self.leases.hold(&jobs);
        let batchable = jobs
            .iter()
            .filter(|job| self.batched.contains(&job.kind))
            .count();
        let short = size - batchable % size;
        if linger
            && size > 1
            && batchable > 0
            && short < size
            && !self.config.batch_linger.is_zero()
        {
            tokio::time::sleep(self.config.batch_linger).await;
            let more = self.fetch_on(conn, short, None).await?;
            self.leases.hold(&more);
            jobs.extend(more);
        }
        Ok(jobs)
    }

    /// Up to `limit` jobs of the kinds the worker fetches, past `after` (from the head
    /// without), on the loop's own connection `conn` where the backend allows (taken from the
    /// pool when there is none yet, and dropped after an error), so that a fetch waits neither
    /// for the pool nor for its ping.
    async fn fetch_on(
        &self,
        conn: &mut Option<PoolConnection<DB>>,
        limit: usize,
        after: Option<Place>,
    ) -> Result<Vec<LeasedJob>> {
        let fetch = Fetch {
            queue: &self.config.queue,
            limit: limit as u32,
            lease: self.config.lease,
            after,
            kinds: self.fetched_kinds.as_deref(),
        };
        if DB::SINGLE_WRITER {
            // Its writers take their turn before a connection: none is kept.
            return self.queue.fetch_with(fetch).await;
        }
        let mut kept = match conn.take() {
            Some(kept) => kept,
            None => self.queue.pool().acquire().await?,
        };
        let jobs = self.queue.fetch_on(&mut kept, fetch).await?;
        *conn = Some(kept);
        Ok(jobs)
    }
}

/// A task that ends with its owner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn next_wakeup(wakeup: &mut Option<Wakeup>) {
    match wakeup {
        Some(wakeup) => wakeup.0.next().await,
        None => std::future::pending().await,
    }
}
