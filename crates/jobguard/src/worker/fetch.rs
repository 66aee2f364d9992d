//! The worker's loop: rescue expired leases, fetch jobs for free slots and a few ahead of them,
//! spawn each, wait for a slot, a wakeup or the poll interval; at shutdown give back the jobs
//! fetched ahead, drain the running ones, then give back what did not finish.
//!
//! Jobs fetched ahead ([`WorkerConfig::prefetch`](super::WorkerConfig::prefetch)) wait for a
//! slot in their own task, in fetch order, with their leases extended meanwhile: a slot that
//! frees starts the next job at once instead of waiting for the next fetch's round trip.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::{Counters, Worker, WorkerStats};
use crate::dispatch::log_join;
use crate::error::Result;
use crate::queue::{Lease, LeasedJob};
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
        self.config.concurrency = self.servable_concurrency();
        let worker = Arc::new(self);
        let counters = Arc::new(Counters::default());
        let (stop_pruning, pruning) = worker.prune_on_schedule(retention, &counters);
        let leases: Arc<Mutex<HashSet<Lease>>> = Arc::default();
        // `slots` are held by running jobs; `leased` by jobs running or waiting for a slot.
        let slots = Arc::new(Semaphore::new(worker.config.concurrency.max(1)));
        let ahead = worker.prefetch();
        let leased = Arc::new(Semaphore::new(worker.config.concurrency.max(1) + ahead));
        let mut tasks = JoinSet::new();
        let mut wakeup = match DB::listen(worker.queue.pool()).await {
            Ok(wakeup) => wakeup,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for new jobs; polling only");
                None
            }
        };
        let rescue_every = (worker.config.lease / 2).max(Duration::from_millis(100));
        // Fetch when half the jobs fetched ahead have started (or half the slots are free, with
        // none fetched ahead): one query for several jobs rather than one per finished job.
        let refill_at = (if ahead > 0 {
            ahead
        } else {
            worker.config.concurrency
        } / 2)
            .max(1);
        // Running tasks wake the loop when a fetch is due, not at every job's end: the loop
        // runs on the caller's thread, and a wakeup per job costs a thread switch per job.
        let refill = Arc::new(Notify::new());
        // The last fetch found fewer jobs than it asked for.
        let mut queue_drained = true;
        let mut last_rescue: Option<Instant> = None;
        let mut shutdown = std::pin::pin!(shutdown);

        loop {
            while let Some(joined) = tasks.try_join_next() {
                log_join(joined, "a job task panicked outside the job");
            }
            // On SQLite a running job holds the only write lock, so the queue's own writes wait
            // for it: shutdown must not.
            if last_rescue.is_none_or(|at| at.elapsed() >= rescue_every) {
                let rescued = tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    rescued = worker.queue.rescue_within(worker.config.retry.max_attempts) => rescued,
                };
                match rescued {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(jobs = n, "rescued jobs whose lease expired"),
                    Err(error) => tracing::warn!(%error, "rescuing expired leases failed"),
                }
                last_rescue = Some(Instant::now());
            }
            let free = leased.available_permits();
            let mut fetched = 0;
            // With batches, enough jobs to fill a batch per free place.
            let wanted = free * worker.batch_size();
            if free > 0 && (free >= refill_at || tasks.is_empty()) {
                let fetch = worker.fetch_jobs(wanted);
                let fetched_jobs = tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    jobs = fetch => jobs,
                };
                match fetched_jobs {
                    Ok(jobs) => {
                        fetched = jobs.len();
                        queue_drained = fetched < wanted;
                        for group in worker.group(jobs) {
                            let place = Arc::clone(&leased)
                                .acquire_owned()
                                .await
                                .expect("never closed");
                            let group_leases: Vec<Lease> =
                                group.iter().map(|job| job.lease).collect();
                            leases
                                .lock()
                                .expect("not poisoned")
                                .extend(group_leases.iter().copied());
                            let (worker, counters, leases, slots) = (
                                Arc::clone(&worker),
                                Arc::clone(&counters),
                                Arc::clone(&leases),
                                Arc::clone(&slots),
                            );
                            let (leased, refill) = (Arc::clone(&leased), Arc::clone(&refill));
                            // A free slot is taken here, in fetch order, not by whichever task
                            // runs first.
                            let ready = Arc::clone(&slots).try_acquire_owned().ok();
                            tasks.spawn(async move {
                                worker.start_in_turn(group, &counters, slots, ready).await;
                                drop(place);
                                if leased.available_permits() >= refill_at {
                                    refill.notify_one();
                                }
                                let mut held = leases.lock().expect("not poisoned");
                                for lease in group_leases {
                                    worker.queue.end_heartbeats(lease);
                                    held.remove(&lease);
                                }
                            });
                        }
                    }
                    Err(error) => tracing::warn!(%error, "fetching jobs failed; retrying"),
                }
            }
            if fetched > 0 && fetched == wanted {
                continue;
            }
            if worker.config.stop_when_idle && fetched == 0 && tasks.is_empty() {
                break;
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = refill.notified() => {}
                // With the queue drained, every job's end may be the last one.
                Some(joined) = tasks.join_next(), if queue_drained && !tasks.is_empty() => log_join(joined, "a job task panicked outside the job"),
                () = next_wakeup(&mut wakeup) => {}
                () = tokio::time::sleep(worker.config.poll_interval) => {}
            }
        }

        // Jobs still waiting for a slot are given back now rather than started.
        slots.close();
        let drained = tokio::time::timeout(worker.config.shutdown_timeout, async {
            while let Some(joined) = tasks.join_next().await {
                log_join(joined, "a job task panicked outside the job");
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                jobs = tasks.len(),
                "running jobs did not finish in time; rolling them back"
            );
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
            let unfinished: Vec<Lease> = leases.lock().expect("not poisoned").drain().collect();
            for lease in unfinished {
                match worker.queue.release(lease).await {
                    Ok(()) => {
                        counters.released.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error) => {
                        tracing::warn!(%error, job.id = lease.job_id, "giving a job back failed; its lease will expire")
                    }
                }
            }
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
    /// Runs `group` once a slot is free, extending its leases while it waits; gives its jobs
    /// back when the worker stops first (the slots are closed at shutdown).
    async fn start_in_turn(
        &self,
        group: Vec<LeasedJob>,
        counters: &Counters,
        slots: Arc<Semaphore>,
        ready: Option<OwnedSemaphorePermit>,
    ) {
        // Most groups find a slot free or wait less than a heartbeat's period: no timer then.
        let slot = match ready {
            Some(slot) => Ok(slot),
            None => {
                let waiting = Mutex::new(group.iter().map(|job| job.lease).collect());
                self.with_heartbeats(&waiting, slots.acquire_owned()).await
            }
        };
        match slot {
            Ok(slot) => self.process_batch(group, counters, slot).await,
            Err(_closed) => {
                for job in &group {
                    match self.queue.release(job.lease).await {
                        Ok(()) => {
                            counters.released.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(error) => tracing::warn!(
                            %error,
                            job.id = job.lease.job_id,
                            "giving back a job fetched ahead failed; its lease will expire"
                        ),
                    }
                }
            }
        }
    }

    /// Jobs (batches, when batching) fetched ahead of free slots.
    fn prefetch(&self) -> usize {
        // On SQLite jobs take the one write lock in turn, and a fetch is an in-process call:
        // jobs waiting ahead only add heartbeats and stretch batches' waits for the lock.
        let default = if DB::SINGLE_WRITER {
            0
        } else {
            self.config.concurrency.max(1)
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
    /// fill it.
    async fn fetch_jobs(&self, limit: usize) -> Result<Vec<LeasedJob>> {
        let (queue, lease) = (&self.config.queue, self.config.lease);
        let mut jobs = self.queue.fetch(queue, limit as u32, lease).await?;
        let size = self.batch_size();
        let batchable = jobs
            .iter()
            .filter(|job| self.batched.contains(&job.kind))
            .count();
        let short = size - batchable % size;
        if size > 1 && batchable > 0 && short < size && !self.config.batch_linger.is_zero() {
            tokio::time::sleep(self.config.batch_linger).await;
            jobs.extend(self.queue.fetch(queue, short as u32, lease).await?);
        }
        Ok(jobs)
    }

    /// The tasks for fetched jobs: jobs of batched kinds in groups of up to the batch size, in
    /// fetch order; every other job alone.
    fn group(&self, jobs: Vec<LeasedJob>) -> Vec<Vec<LeasedJob>> {
        let size = self.batch_size();
        let mut groups = Vec::new();
        let mut batch = Vec::new();
        for job in jobs {
            if size > 1 && self.batched.contains(&job.kind) {
                batch.push(job);
                if batch.len() == size {
                    groups.push(std::mem::take(&mut batch));
                }
            } else {
                groups.push(vec![job]);
            }
        }
        if !batch.is_empty() {
            groups.push(batch);
        }
        groups
    }
}

async fn next_wakeup(wakeup: &mut Option<Wakeup>) {
    match wakeup {
        Some(wakeup) => wakeup.0.next().await,
        None => std::future::pending().await,
    }
}
