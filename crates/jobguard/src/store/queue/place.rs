//! A job's place in the order a queue gives jobs out, where a worker's next fetch starts
//! (see `worker/cursor.rs`).

use super::LeasedJob;

/// A job's place in the order a queue gives jobs out: its run time (microseconds since the
/// Unix epoch) and its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Place {
    pub(crate) run_at_us: i64,
    pub(crate) id: i64,
}

impl Place {
    /// The place of `job`.
    pub(crate) fn of(job: &LeasedJob) -> Place {
        Place {
            run_at_us: crate::time::time_to_micros(job.run_at),
            id: job.lease.job_id,
        }
    }
}
