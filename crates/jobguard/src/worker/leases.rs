//! Every lease the worker holds, kept alive by one task: from the fetch until the job is
//! settled, whether the job waits for a slot, waits behind the other jobs of its batch, runs
//! again alone after its batch rolled back, waits for SQLite's write lock or makes an external
//! job's call.
//!
//! A lease stops needing heartbeats once the transaction of its own attempt holds the job's
//! row (the claim that completes the job locked it): no other worker can take it then, and an
//! extension would only wait for that transaction. If the transaction rolls back without
//! settling the job (contention, a lost connection, a batch falling back to one job per
//! transaction), the lease needs its heartbeats again until the next attempt's claim.

use std::collections::HashMap;
use std::sync::Mutex;

use super::Worker;
use crate::queue::{Lease, LeasedJob};
use crate::store::Backend;

/// What the worker holds, by job id: the lease and whether it needs heartbeats.
#[derive(Default)]
pub(super) struct Leases {
    held: Mutex<HashMap<i64, (Lease, bool)>>,
}

impl Leases {
    /// The jobs of a fetch: their leases need heartbeats until their claims lock them.
    pub(super) fn hold(&self, jobs: &[LeasedJob]) {
        let mut held = self.held.lock().expect("not poisoned");
        for job in jobs {
            held.insert(job.lease.job_id, (job.lease, true));
        }
    }

    /// The transaction of `lease`'s attempt holds the job's row: no heartbeats meanwhile.
    pub(super) fn locked(&self, lease: Lease) {
        self.set_beating(lease, false);
    }

    /// The transaction that held `lease`'s row rolled back: heartbeats again.
    pub(super) fn unlocked(&self, lease: Lease) {
        self.set_beating(lease, true);
    }

    fn set_beating(&self, lease: Lease, beating: bool) {
        if let Some(entry) = self
            .held
            .lock()
            .expect("not poisoned")
            .get_mut(&lease.job_id)
            && entry.0 == lease
        {
            entry.1 = beating;
        }
    }

    /// `lease` ended: settled, given back, or taken over.
    pub(super) fn end(&self, lease: Lease) {
        let mut held = self.held.lock().expect("not poisoned");
        if held
            .get(&lease.job_id)
            .is_some_and(|(held, _)| *held == lease)
        {
            held.remove(&lease.job_id);
        }
    }

    /// Every lease held: the worker's own rescue leaves them alone.
    pub(super) fn all(&self) -> Vec<Lease> {
        let held = self.held.lock().expect("not poisoned");
        held.values().map(|(lease, _)| *lease).collect()
    }

    /// Every lease still held, forgotten: what shutdown gives back when it cut the jobs short.
    pub(super) fn take(&self) -> Vec<Lease> {
        let mut held = self.held.lock().expect("not poisoned");
        held.drain().map(|(_, (lease, _))| lease).collect()
    }

    /// The leases to extend; with `all`, those whose rows a transaction holds too.
    fn beating(&self, all: bool) -> Vec<Lease> {
        let held = self.held.lock().expect("not poisoned");
        held.values()
            .filter(|(_, beating)| all || *beating)
            .map(|(lease, _)| *lease)
            .collect()
    }

    fn is_beating(&self, lease: Lease) -> bool {
        let held = self.held.lock().expect("not poisoned");
        held.get(&lease.job_id) == Some(&(lease, true))
    }
}

impl<DB: Backend> Worker<DB> {
    /// Extends, every third of the lease, every lease that needs it, in one statement (on
    /// PostgreSQL; heartbeat files on SQLite). Runs until aborted.
    pub(super) async fn keep_leases(&self) {
        let length = self.config.lease;
        loop {
            tokio::time::sleep(length / 3).await;
            // SQLite's heartbeats are files, written without a lock: a job whose transaction
            // holds the write lock keeps one too, so another process's rescue never finds it
            // expired in the moment between a rollback and the retry it writes.
            let beating = self.leases.beating(DB::SINGLE_WRITER);
            if beating.is_empty() {
                continue;
            }
            match self.queue.heartbeat_many(&beating, length).await {
                Ok(lost) => {
                    for lease in lost {
                        // A job that settled or locked its row meanwhile did not lose it.
                        if self.leases.is_beating(lease) {
                            tracing::warn!(
                                job.id = lease.job_id,
                                "lost the lease of a job not started yet; its attempt will be fenced off"
                            );
                        }
                    }
                }
                Err(error) => tracing::warn!(%error, "extending the leases failed"),
            }
        }
    }

    /// Ends `lease` for the worker: no more heartbeats, and on SQLite its file removed.
    pub(super) fn end_lease(&self, lease: Lease) {
        self.leases.end(lease);
        self.queue.end_heartbeats(lease);
    }
}
