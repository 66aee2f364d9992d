//! Groups of jobs fetched and not started yet, in fetch order, and the slots that run them.
//!
//! A slot is a long-lived task: it takes the oldest waiting group, runs it, and takes the next
//! one at once, so a job that commits hands its slot to the next job without a wakeup of
//! another task. A slot ends when nothing waits; the loop starts one for every group it adds
//! while slots are free. Waiting groups' leases are extended by one task for all of them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::{Counters, Worker};
use crate::error::Error;
use crate::queue::{Lease, LeasedJob};
use crate::store::Backend;

/// A fetched group and the place it holds among the jobs leased (running or waiting).
struct Group {
    jobs: Vec<LeasedJob>,
    place: OwnedSemaphorePermit,
}

/// What the worker's loop and its slots share.
pub(super) struct Ready {
    waiting: Mutex<VecDeque<Group>>,
    /// Held by a slot while it runs groups; closed at shutdown.
    slots: Arc<Semaphore>,
    /// Held by every group leased, running or waiting: what the loop fetches for.
    places: Arc<Semaphore>,
    /// Fetch when this many places are free.
    refill_at: usize,
    /// Wakes the loop when a fetch is due.
    pub(super) refill: Notify,
    /// Set at shutdown: slots take no new group.
    stopping: AtomicBool,
    /// Leases of every group fetched and not finished: given back when shutdown cuts them.
    leases: Mutex<Vec<Lease>>,
}

impl Ready {
    pub(super) fn new(slots: usize, places: usize, refill_at: usize) -> Self {
        Ready {
            waiting: Mutex::default(),
            slots: Arc::new(Semaphore::new(slots)),
            places: Arc::new(Semaphore::new(places)),
            refill_at,
            refill: Notify::new(),
            stopping: AtomicBool::new(false),
            leases: Mutex::default(),
        }
    }

    /// Places free for more jobs (or batches) to fetch.
    pub(super) fn free_places(&self) -> usize {
        self.places.available_permits()
    }

    /// Whether no group waits for a slot.
    pub(super) fn is_empty(&self) -> bool {
        self.waiting.lock().expect("not poisoned").is_empty()
    }

    /// Queues `jobs` behind the groups already waiting, in a place the loop fetched them for.
    pub(super) fn push(&self, jobs: Vec<LeasedJob>) {
        let place = Arc::clone(&self.places)
            .try_acquire_owned()
            .expect("the loop fetches for free places only");
        self.leases
            .lock()
            .expect("not poisoned")
            .extend(jobs.iter().map(|job| job.lease));
        self.waiting
            .lock()
            .expect("not poisoned")
            .push_back(Group { jobs, place });
    }

    /// A free slot, unless none is free or the worker is stopping.
    pub(super) fn free_slot(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.slots).try_acquire_owned().ok()
    }

    fn next(&self) -> Option<Group> {
        if self.stopping.load(Ordering::Acquire) {
            return None;
        }
        self.waiting.lock().expect("not poisoned").pop_front()
    }

    /// Shutdown: no slot takes another group, and the groups still waiting are handed back.
    pub(super) fn stop(&self) -> Vec<LeasedJob> {
        self.stopping.store(true, Ordering::Release);
        self.slots.close();
        let waiting: Vec<Group> = self
            .waiting
            .lock()
            .expect("not poisoned")
            .drain(..)
            .collect();
        let jobs: Vec<LeasedJob> = waiting.into_iter().flat_map(|group| group.jobs).collect();
        let mut leases = self.leases.lock().expect("not poisoned");
        leases.retain(|lease| jobs.iter().all(|job| job.lease != *lease));
        jobs
    }

    /// The leases of groups not finished (running when shutdown cut them).
    pub(super) fn unfinished(&self) -> Vec<Lease> {
        std::mem::take(&mut *self.leases.lock().expect("not poisoned"))
    }

    fn waiting_leases(&self) -> Vec<Lease> {
        let waiting = self.waiting.lock().expect("not poisoned");
        waiting
            .iter()
            .flat_map(|group| group.jobs.iter().map(|job| job.lease))
            .collect()
    }

    fn finished(&self, jobs: &[LeasedJob]) {
        self.leases
            .lock()
            .expect("not poisoned")
            .retain(|lease| jobs.iter().all(|job| job.lease != *lease));
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
            while let Some(group) = ready.next() {
                let Group { jobs, place } = group;
                self.process_batch(&jobs, &counters).await;
                for job in &jobs {
                    self.queue.end_heartbeats(job.lease);
                }
                ready.finished(&jobs);
                drop(place);
                if ready.free_places() >= ready.refill_at {
                    ready.refill.notify_one();
                }
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

    /// Extends the leases of the groups waiting for a slot, every third of the lease, forever.
    pub(super) async fn beat_waiting(self: Arc<Self>, ready: Arc<Ready>) {
        let length = self.config.lease;
        loop {
            tokio::time::sleep(length / 3).await;
            for lease in ready.waiting_leases() {
                match self.queue.heartbeat(lease, length).await {
                    Ok(()) => {}
                    // A group a slot took meanwhile completes its jobs: not a lost lease.
                    Err(Error::Fenced { .. }) if ready.waiting_leases().contains(&lease) => {
                        tracing::warn!(
                            job.id = lease.job_id,
                            "lost the lease of a job waiting for a slot; it will be fenced off"
                        )
                    }
                    Err(Error::Fenced { .. }) => {}
                    Err(error) => tracing::warn!(%error, "extending a lease failed"),
                }
            }
        }
    }
}
