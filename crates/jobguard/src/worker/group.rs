//! Grouping fetched jobs, and the groups waiting for a slot: jobs of kinds that batch in
//! groups of up to the batch size, every other job alone, in fetch order; and the slots that
//! run them.
//!
//! A slot is a long-lived task: it takes the oldest waiting group, runs it, and takes the next
//! one at once, so a job that commits hands its slot to the next job without a wakeup of
//! another task. A slot ends when nothing waits; the loop starts one for every group it adds
//! while slots are free. The leases of every job held, waiting or running, are kept by the
//! worker's one lease keeper (see `leases.rs`).
//!
//! Places bound how many groups the worker leases, running or waiting: the loop fetches for the
//! free ones. A fetch asks for a batch's worth of jobs per free place, and jobs that do not
//! batch (another kind, an unknown one) make a group each, so a fetch can fill more places than
//! were free: the groups wait for a slot all the same, and the loop fetches again only when
//! places are free.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::{Counters, Worker};
use crate::queue::LeasedJob;
use crate::store::Backend;

/// What the worker's loop and its slots share.
pub(super) struct Ready {
    waiting: Mutex<VecDeque<Vec<LeasedJob>>>,
    /// Held by a slot while it runs groups; closed at shutdown.
    slots: Arc<Semaphore>,
    /// Groups leased, running or waiting: what the loop fetches for.
    places: usize,
    leased: AtomicUsize,
    /// Fetch when this many places are free.
    refill_at: usize,
    /// Wakes the loop when a fetch is due.
    pub(super) refill: Notify,
    /// Set at shutdown: slots take no new group.
    stopping: AtomicBool,
}

impl Ready {
    pub(super) fn new(slots: usize, places: usize, refill_at: usize) -> Self {
        Ready {
            waiting: Mutex::default(),
            slots: Arc::new(Semaphore::new(slots)),
            places,
            leased: AtomicUsize::new(0),
            refill_at,
            refill: Notify::new(),
            stopping: AtomicBool::new(false),
        }
    }

    /// Places free for more jobs (or batches) to fetch.
    pub(super) fn free_places(&self) -> usize {
        self.places
            .saturating_sub(self.leased.load(Ordering::Acquire))
    }

    /// Whether no group waits for a slot.
    pub(super) fn is_empty(&self) -> bool {
        self.waiting.lock().expect("not poisoned").is_empty()
    }

    /// Queues `jobs` behind the groups already waiting.
    pub(super) fn push(&self, jobs: Vec<LeasedJob>) {
        self.leased.fetch_add(1, Ordering::AcqRel);
        self.waiting.lock().expect("not poisoned").push_back(jobs);
    }

    /// Whether a slot is free: a group pushed now starts at once.
    pub(super) fn slot_idle(&self) -> bool {
        self.slots.available_permits() > 0
    }

    /// Slots free for groups not yet waiting: those pushed now start at once.
    pub(super) fn idle_slots(&self) -> usize {
        let waiting = self.waiting.lock().expect("not poisoned").len();
        self.slots.available_permits().saturating_sub(waiting)
    }

    /// A free slot, unless none is free or the worker is stopping.
    pub(super) fn free_slot(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.slots).try_acquire_owned().ok()
    }

    fn next(&self) -> Option<Vec<LeasedJob>> {
        if self.stopping.load(Ordering::Acquire) {
            return None;
        }
        self.waiting.lock().expect("not poisoned").pop_front()
    }

    /// A group a slot took has ended.
    fn finished(&self) {
        self.leased.fetch_sub(1, Ordering::AcqRel);
    }

    /// Shutdown: no slot takes another group, and the groups still waiting are handed back.
    pub(super) fn stop(&self) -> Vec<LeasedJob> {
        self.stopping.store(true, Ordering::Release);
        self.slots.close();
        let waiting: Vec<Vec<LeasedJob>> = self
            .waiting
            .lock()
            .expect("not poisoned")
            .drain(..)
            .collect();
        waiting.into_iter().flatten().collect()
    }
}

impl<DB: Backend> Worker<DB> {
    /// A slot: runs waiting groups, oldest first, until none waits. Before it ends it looks once
    /// more, with its slot given back, so a group queued meanwhile is never left without one.
    pub(super) async fn run_slot(
        self: Arc<Self>,
        ready: Arc<Ready>,
        counters: Arc<Counters>,
        mut slot: OwnedSemaphorePermit,
    ) {
        loop {
            while let Some(jobs) = ready.next() {
                let mut taken = Taken {
                    worker: &self,
                    ready: &ready,
                    jobs,
                    settled: false,
                };
                self.process_batch(&taken.jobs, &counters).await;
                taken.settled = true;
            }
            drop(slot);
            if ready.is_empty() {
                return;
            }
            match ready.free_slot() {
                Some(again) => slot = again,
                // Another slot holds it, and looks at the waiting groups before it ends.
                None => return,
            }
        }
    }
}

/// A group a slot took, until it ends: its jobs' leases end for the worker, and its place is
/// free for the loop to fetch for.
///
/// Also when the slot panics outside the job (in a job's decoding, or in a tracing subscriber
/// or metrics recorder): the leases of the jobs it did not settle are no longer extended, nor
/// left alone by the worker's own rescue, so they run again once they expire, as a crashed
/// worker's would; and the place is not lost for the rest of the worker's life. A slot aborted
/// at shutdown leaves its leases held, for the shutdown to give back.
struct Taken<'a, DB: Backend> {
    worker: &'a Worker<DB>,
    ready: &'a Ready,
    jobs: Vec<LeasedJob>,
    settled: bool,
}

impl<DB: Backend> Drop for Taken<'_, DB> {
    fn drop(&mut self) {
        let panicked = std::thread::panicking();
        if panicked {
            tracing::error!(
                jobs = self.jobs.len(),
                "a job slot panicked outside the job; its jobs run again when their leases expire"
            );
        }
        if self.settled || panicked {
            for job in &self.jobs {
                self.worker.end_lease(job.lease);
            }
        }
        self.ready.finished();
        if self.ready.free_places() >= self.ready.refill_at {
            self.ready.refill.notify_one();
        }
    }
}

impl<DB: Backend> Worker<DB> {
    /// The tasks for fetched jobs: jobs of batched kinds in groups of up to the batch size, in
    /// fetch order; every other job alone.
    ///
    /// The jobs of a batch run one after another in its transaction, so a job late in a batch
    /// starts only when the jobs before it have done their work. When a fetch brings no more
    /// jobs than there are `idle` slots (a light load), each runs alone and starts at once;
    /// batches fill up to the batch size only when jobs outnumber idle slots.
    pub(super) fn group(
        &self,
        jobs: Vec<LeasedJob>,
        size: usize,
        idle: usize,
    ) -> Vec<Vec<LeasedJob>> {
        // Fewer jobs than idle slots: each alone. More: full batches, as the load that brings
        // them is one batches pay for (a fetch spread thinner would run more transactions
        // exactly when the database has least room for them).
        let size = if jobs.len() <= idle { 1 } else { size };
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
