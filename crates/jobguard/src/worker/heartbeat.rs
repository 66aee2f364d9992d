//! Keeping a running job's lease: while a job waits or runs outside the transaction that locks
//! its row, its lease is extended so no other worker rescues it.

use std::future::Future;
use std::sync::Mutex;

use super::Worker;
use crate::error::Error;
use crate::queue::Lease;
use crate::store::Backend;

impl<DB: Backend> Worker<DB> {
    /// Runs `work`, extending `lease` every third of its length until it finishes. Most work
    /// finishes before the first beat, and then costs one timer, not a task.
    pub(super) async fn with_heartbeat<T>(&self, lease: Lease, work: impl Future<Output = T>) -> T {
        self.with_heartbeats(&Mutex::new(vec![lease]), work).await
    }

    /// Runs `work`, extending the leases in `leases` every third of the lease length until it
    /// finishes. A batch takes a lease out of the list once its claim locked the job's row.
    pub(super) async fn with_heartbeats<T>(
        &self,
        leases: &Mutex<Vec<Lease>>,
        work: impl Future<Output = T>,
    ) -> T {
        let length = self.config.lease;
        // Polled alongside `work`, never instead of it: `work` may hold the write lock or the
        // job's row that an extension waits for.
        let beats = async {
            loop {
                tokio::time::sleep(length / 3).await;
                let current = leases.lock().expect("not poisoned").clone();
                for lease in current {
                    match self.queue.heartbeat(lease, length).await {
                        Ok(()) => {}
                        // Lost: the attempt is fenced off when it claims; the other leases
                        // of a batch keep their beats.
                        Err(Error::Fenced { .. }) => tracing::warn!(
                            job.id = lease.job_id,
                            "lost the lease; this attempt will be fenced off"
                        ),
                        Err(error) => tracing::warn!(%error, "extending a lease failed"),
                    }
                }
            }
        };
        tokio::select! {
            done = work => done,
            () = beats => unreachable!("heartbeats never end"),
        }
    }
}
