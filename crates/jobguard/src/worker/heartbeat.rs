//! Keeping a running job's lease: while a job waits or runs outside the transaction that locks
//! its row, its lease is extended so no other worker rescues it.

use std::future::Future;

use super::Worker;
use crate::error::Error;
use crate::queue::Lease;
use crate::store::Backend;

impl<DB: Backend> Worker<DB> {
    /// Runs `work`, extending `lease` every third of its length until it finishes. Most work
    /// finishes before the first beat, and then costs one timer, not a task.
    pub(super) async fn with_heartbeat<T>(&self, lease: Lease, work: impl Future<Output = T>) -> T {
        let length = self.config.lease;
        // Polled alongside `work`, never instead of it: `work` may hold the write lock or the
        // job's row that an extension waits for.
        let beats = async {
            loop {
                tokio::time::sleep(length / 3).await;
                match self.queue.heartbeat(lease, length).await {
                    Ok(()) => {}
                    Err(Error::Fenced { .. }) => {
                        tracing::warn!(
                            job.id = lease.job_id,
                            "lost the lease; this attempt will be fenced off"
                        );
                        std::future::pending::<()>().await;
                    }
                    Err(error) => tracing::warn!(%error, "extending a lease failed"),
                }
            }
        };
        tokio::select! {
            done = work => done,
            () = beats => unreachable!("heartbeats never end"),
        }
    }
}
