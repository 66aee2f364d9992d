//! A partition's lane: the messages this consumer received of it and has not settled, and
//! where the partition stands for this consumer (owned, running, paused, waiting out a retry,
//! expecting its stored offset, quiet).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::stall::Quiet;
use crate::broker::consumer::Decoded;
use crate::store::Backend;

/// A message received from a partition, decoded.
pub(super) struct Received<DB: Backend> {
    pub(super) offset: i64,
    pub(super) key: Option<Vec<u8>>,
    pub(super) body: Vec<u8>,
    pub(super) decoded: Decoded<DB>,
}

/// One partition's messages, as this consumer holds them.
pub(super) struct Lane<DB: Backend> {
    /// Received, not yet settled, in offset order.
    pub(super) queue: VecDeque<Received<DB>>,
    /// Whether the group assigns the partition to this consumer.
    pub(super) owned: bool,
    /// Bumped on every assignment and revocation: a unit's result from before is stale.
    pub(super) generation: u64,
    /// Whether a unit of the lane runs.
    pub(super) running: bool,
    /// Failed attempts of the message at the head, as this process saw them: a head that
    /// failed runs alone. Its runs are counted in the database (`Offsets::count_attempt_tx`).
    pub(super) failures: u32,
    /// When the head may be tried again, after a failure.
    pub(super) retry_at: Option<Instant>,
    /// Whether the partition is paused in the client.
    pub(super) paused: bool,
    /// When a short batch stops waiting for more messages.
    pub(super) ready_at: Option<Instant>,
    /// The offset the partition was assigned or fetched again at, until the first message at or
    /// after it arrives: a message above it is checked against the log (`kafka/gap.rs`).
    pub(super) expected: Option<i64>,
    /// The partition is read again from an earlier offset because the broker skipped past
    /// `expected`.
    pub(super) reread: Option<Reread>,
    /// Whether the partition's log was asked whether it still holds `expected`.
    pub(super) range_checked: bool,
    /// The offset after the last message this process settled: anything before it was
    /// applied or dead-lettered, and is skipped when it comes again.
    pub(super) settled_next: i64,
    /// Where the partition was assigned at, once known: its stored offset (or the log start a
    /// policy resumed at), else the offset of the first message received of it. A partition
    /// assigned with no stored offset starts where the client says (Kafka's committed offset,
    /// `auto.offset.reset`), which the lane learns only from a message.
    pub(super) assigned_at: Option<i64>,
    /// When a message of the partition last came, for the check of a partition that stopped.
    pub(super) quiet: Quiet,
}

/// A partition read again from an earlier offset, because the broker skipped messages after
/// the one the lane expected. Until the client takes the seek, and for a while after, it hands
/// on messages of the read from before: all at or after the first message that showed the skip
/// (tansu serves some batches of such a read twice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Reread {
    /// Where the partition is read again from: an offset whose read serves the skipped
    /// messages.
    pub(super) from: i64,
    /// The first message above the expected offset, which showed the skip.
    pub(super) shown_at: i64,
    /// Whether the client took the seek: refused, it is asked again at the next message.
    pub(super) sought: bool,
    /// Whether a message before the expected offset came since the seek.
    pub(super) below: bool,
}

impl Reread {
    pub(super) fn new(from: i64, shown_at: i64) -> Self {
        Reread {
            from,
            shown_at,
            sought: false,
            below: false,
        }
    }

    /// Whether the message at `offset`, at or after the expected one, is of the new read: the
    /// seek was taken, and the message is below the one that showed the skip (the read from
    /// before the seek serves none), or a message before the expected offset came.
    pub(super) fn serves(&self, offset: i64) -> bool {
        self.sought && (offset < self.shown_at || self.below)
    }
}

impl<DB: Backend> Lane<DB> {
    pub(super) fn new(stalled_after: Duration) -> Self {
        Lane {
            queue: VecDeque::new(),
            owned: false,
            generation: 0,
            running: false,
            failures: 0,
            retry_at: None,
            paused: false,
            ready_at: None,
            expected: None,
            reread: None,
            range_checked: false,
            settled_next: 0,
            assigned_at: None,
            quiet: Quiet::new(stalled_after),
        }
    }

    /// The offset the partition goes on from, when the lane knows it: past what it settled and
    /// what it expects, never below where the partition was assigned at. `None` until the
    /// lane knows where the partition was assigned at: nothing is to be fetched again then.
    pub(super) fn next_offset(&self) -> Option<i64> {
        let at = self.assigned_at?;
        Some(at.max(self.settled_next).max(self.expected.unwrap_or(at)))
    }

    /// The client fetches the partition again from `next`, unpaused: the lane expects the
    /// message at `next` (a first message above it is met as after an assignment).
    /// `range_checked` says whether the log was just asked and holds `next`; if not, a first
    /// message elsewhere asks it before anything else.
    pub(super) fn expect_from(&mut self, next: i64, range_checked: bool) {
        self.paused = false;
        self.expected = Some(next);
        self.reread = None;
        self.range_checked = range_checked;
    }

    /// A new assignment or revocation: what the lane held belongs to the old one.
    pub(super) fn reset(&mut self, owned: bool) {
        self.owned = owned;
        self.generation += 1;
        self.queue.clear();
        self.failures = 0;
        self.retry_at = None;
        // As the client holds it once the partition is assigned again: the rebalance callback
        // resumes every partition it assigns (`source.rs`).
        self.paused = false;
        self.ready_at = None;
        self.expected = None;
        self.reread = None;
        self.range_checked = false;
        self.assigned_at = None;
        self.quiet.heard();
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use std::time::Duration;

    use super::{Lane, Reread};

    #[test]
    fn a_reread_takes_messages_of_the_new_read_only() {
        // Expected 1, the broker served 10 first: read again from 0.
        let mut reread = Reread::new(0, 10);
        // The client refused the seek: nothing is of a new read.
        assert!(!reread.serves(1));
        reread.sought = true;
        // Below the message that showed the skip: the read from before served none.
        assert!(reread.serves(1));
        assert!(reread.serves(9));
        // The read from before may serve it again (tansu repeats batches in one answer).
        assert!(!reread.serves(10));
        assert!(!reread.serves(11));
        // After a message before the expected offset, every message is of the new read.
        reread.below = true;
        assert!(reread.serves(10));
    }

    #[test]
    fn a_lane_knows_its_next_offset_only_once_it_knows_where_it_was_assigned_at() {
        let mut lane = Lane::<sqlx::Sqlite>::new(Duration::from_secs(10));
        lane.reset(true);
        // Assigned with no stored offset: settled_next (0) is no position of the partition.
        assert_eq!(lane.next_offset(), None);
        lane.assigned_at = Some(40);
        assert_eq!(lane.next_offset(), Some(40));
        lane.settled_next = 45;
        assert_eq!(lane.next_offset(), Some(45));
        lane.expect_from(50, true);
        assert_eq!(lane.next_offset(), Some(50));
        // Never below where the partition was assigned at, whatever settled before.
        lane.reset(true);
        lane.assigned_at = Some(60);
        assert_eq!(lane.next_offset(), Some(60));
    }
}
