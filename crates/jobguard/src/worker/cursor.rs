//! Where the worker's next fetch starts reading the queue.
//!
//! A fetch reads the queue's jobs in order (run time, id) from the head, and on PostgreSQL the
//! head is where the cost is: every job the worker holds (running, or fetched ahead and waiting
//! for a slot) is still there, stored `available`, and is read and passed over; so is every
//! index entry a completed job left, until a vacuum removes it. While a backlog keeps the
//! fetches full, the next fetch starts past the last job the previous one took instead.
//!
//! A job can still land behind that place: one whose enqueue committed late (its run time is
//! its transaction's), one given back by a worker that stopped, one whose expired lease was
//! rescued, one another worker's rolled-back fetch had locked. None is left behind for long:
//! a fetch from past the place that comes back short is followed at once by one from the head,
//! and while the fetches stay full, one in every [`HEAD_EVERY`] reads from the head.

use std::time::{Duration, Instant};

use crate::queue::{LeasedJob, Place};

/// How often, at least, a fetch reads the queue from its head while a backlog keeps the
/// fetches full: the longest a job behind the place of the previous fetch waits for it.
pub(super) const HEAD_EVERY: Duration = Duration::from_millis(100);

/// The place the next fetch starts after, if any.
#[derive(Debug, Default)]
pub(super) struct Cursor {
    /// The last job of the previous fetch, which came back full.
    after: Option<Place>,
    /// When a fetch last read the queue from its head.
    head_read_at: Option<Instant>,
}

impl Cursor {
    /// Where a fetch made `now` starts: after the previous fetch's last job, unless the head
    /// was last read [`HEAD_EVERY`] or longer ago (or never).
    pub(super) fn start(&self, now: Instant) -> Option<Place> {
        let head_read_at = self.head_read_at?;
        if now.saturating_duration_since(head_read_at) >= HEAD_EVERY {
            return None;
        }
        self.after
    }

    /// Records a fetch made `now` from `start` that asked for `wanted` jobs and took `jobs`.
    /// True when it started past a place and came back short: jobs behind that place may be
    /// waiting, and the next fetch, from the head, should not wait for a wakeup.
    pub(super) fn record(
        &mut self,
        start: Option<Place>,
        wanted: usize,
        jobs: &[LeasedJob],
        now: Instant,
    ) -> bool {
        if start.is_none() {
            self.head_read_at = Some(now);
        }
        if jobs.len() < wanted {
            self.after = None;
            return start.is_some();
        }
        self.after = jobs.iter().map(Place::of).max();
        false
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant, UNIX_EPOCH};

    use serde_json::Value;

    use super::{Cursor, HEAD_EVERY};
    use crate::queue::{Lease, LeasedJob, Place};

    fn job(id: i64, run_at_us: u64) -> LeasedJob {
        LeasedJob {
            lease: Lease {
                job_id: id,
                attempt: 1,
                token: 1,
            },
            kind: "k".into(),
            key: format!("k:{id}"),
            payload: Value::Null,
            max_attempts: 3,
            leased_until: UNIX_EPOCH,
            run_at: UNIX_EPOCH + Duration::from_micros(run_at_us),
            replayed: false,
        }
    }

    fn place(id: i64, run_at_us: i64) -> Place {
        Place { run_at_us, id }
    }

    #[test]
    fn the_first_fetch_reads_from_the_head() {
        assert_eq!(Cursor::default().start(Instant::now()), None);
    }

    #[test]
    fn a_full_fetch_moves_the_start_past_its_last_job_in_queue_order() {
        let mut cursor = Cursor::default();
        let now = Instant::now();
        // Returned in any order; the last in (run time, id) order counts, not the last id.
        let jobs = [job(9, 100), job(3, 300), job(5, 300), job(7, 200)];
        assert!(!cursor.record(None, 4, &jobs, now));
        assert_eq!(cursor.start(now), Some(place(5, 300)));
        let more = [job(11, 400), job(10, 500)];
        assert!(!cursor.record(Some(place(5, 300)), 2, &more, now));
        assert_eq!(cursor.start(now), Some(place(10, 500)));
    }

    #[test]
    fn a_short_fetch_past_a_place_sends_the_next_one_to_the_head_at_once() {
        let mut cursor = Cursor::default();
        let now = Instant::now();
        cursor.record(None, 2, &[job(1, 10), job(2, 20)], now);
        let start = cursor.start(now);
        assert_eq!(start, Some(place(2, 20)));
        assert!(cursor.record(start, 2, &[job(3, 30)], now));
        assert_eq!(cursor.start(now), None);
        // From the head, a short fetch is only a short queue: the loop waits as before.
        assert!(!cursor.record(None, 2, &[job(0, 5)], now));
        assert_eq!(cursor.start(now), None);
    }

    #[test]
    fn the_head_is_read_again_at_least_every_interval_while_fetches_stay_full() {
        let mut cursor = Cursor::default();
        let at = Instant::now();
        cursor.record(None, 1, &[job(1, 10)], at);
        assert_eq!(cursor.start(at + HEAD_EVERY / 2), Some(place(1, 10)));
        // Still full from the cursor: the head is not read meanwhile, so its time stays.
        cursor.record(Some(place(1, 10)), 1, &[job(2, 20)], at + HEAD_EVERY / 2);
        assert_eq!(cursor.start(at + HEAD_EVERY), None);
        cursor.record(None, 1, &[job(3, 30)], at + HEAD_EVERY);
        assert_eq!(cursor.start(at + HEAD_EVERY), Some(place(3, 30)));
    }
}
