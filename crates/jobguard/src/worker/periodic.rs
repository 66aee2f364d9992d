//! The worker's periodic schedules: checked when it starts, then fired by a
//! [`Scheduler`](crate::periodic::Scheduler) on a timer task of its own.

use super::Worker;
use crate::error::{Error, Result};
use crate::periodic::{Periodic, Scheduler};
use crate::store::Backend;

impl<DB: Backend> Worker<DB> {
    /// Enqueues a job at every firing of `periodic`, exactly once per firing however many
    /// workers run the same schedule (see [`periodic`](crate::periodic)). Its kind must be
    /// registered with this worker and its payload decode as that kind: [`Worker::run`]
    /// refuses to start otherwise, with [`Error::InvalidSchedule`].
    pub fn schedule(mut self, periodic: Periodic) -> Self {
        self.schedules.push(periodic);
        self
    }

    /// The worker's schedules.
    pub fn schedules(&self) -> &[Periodic] {
        &self.schedules
    }

    /// The scheduler of the worker's schedules, each checked against the registered kinds;
    /// `None` without schedules.
    pub(super) fn scheduler(&self) -> Result<Option<Scheduler<DB>>> {
        if self.schedules.is_empty() {
            return Ok(None);
        }
        for schedule in &self.schedules {
            // A firing's payload, as the worker will decode it.
            let payload = schedule.payload_at(0);
            if let Err(reason) = self.handlers.decode(schedule.kind(), &payload, "worker") {
                return Err(Error::InvalidSchedule {
                    schedule: schedule.name().to_owned(),
                    reason,
                });
            }
        }
        Scheduler::new(self.queue.clone(), self.schedules.clone()).map(Some)
    }

    /// Creates the schedules table, when the worker has schedules.
    pub(super) async fn migrate_schedules(&self) -> Result<()> {
        match self.scheduler_unchecked()? {
            Some(scheduler) => scheduler.migrate().await,
            None => Ok(()),
        }
    }

    fn scheduler_unchecked(&self) -> Result<Option<Scheduler<DB>>> {
        if self.schedules.is_empty() {
            return Ok(None);
        }
        Scheduler::new(self.queue.clone(), self.schedules.clone()).map(Some)
    }
}
