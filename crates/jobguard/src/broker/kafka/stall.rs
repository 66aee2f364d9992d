//! A partition this consumer owns whose messages stopped coming: the log holds messages past
//! the last one the lane settled, yet none arrived for [`KafkaConfig::stalled_after`] while the
//! lane had nothing to run. The client's fetch of it is then started again from that offset.
//!
//! Only a lane that knows its next offset is checked: one assigned at a stored offset, or one
//! that received a message since its assignment. A partition assigned with no stored offset
//! starts where the client says (Kafka's committed offset, `auto.offset.reset`); until a message
//! shows where, fetching it "again" could only guess, and a guess of 0 would read the retained
//! log once more. A next offset below the log start (retention removed messages the lane never
//! received) is met as [`KafkaConfig::below_log_start`] says, once: the lane goes on from the
//! log start. A log whose offsets past the next one carry no message (a transactional
//! producer's marker after its last commit, aborted or compacted messages) holds nothing to
//! fetch: the partition is read on a client of its own to tell (`kafka/gap.rs`).
//!
//! The loop pauses and resumes partitions in the client, and so does the rebalance callback on
//! the client's own thread; the client also keeps a pause across a revocation. A pause that
//! reaches the client after the resume meant to end it, or a seek the client dropped, leaves a
//! partition assigned and never fetched: its messages wait in the log for ever and the lane
//! looks idle. This is the check that finds such a partition, whatever left it so.
//!
//! [`KafkaConfig::stalled_after`]: super::KafkaConfig::stalled_after
//! [`KafkaConfig::below_log_start`]: super::KafkaConfig::below_log_start

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::gap::{self, Gap};
use super::out_of_range;

/// The longest wait between two checks of a partition found caught up, or restarted: a
/// partition with nothing to receive is asked about less and less often.
const LONGEST_WAIT: Duration = Duration::from_secs(300);

/// How long a check waits for the broker to say where a partition's log ends.
pub(super) const ASK_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a check may read a partition whose log holds offsets past the next one, to see
/// whether they carry a message, all its reads together.
const LOOK_TIMEOUT: Duration = Duration::from_secs(5);

/// When a lane last heard of its partition, and how long it may stay quiet before the log is
/// asked whether it holds anything the lane has not received.
#[derive(Clone, Copy, Debug)]
pub(super) struct Quiet {
    since: Instant,
    wait: Duration,
    first: Duration,
}

impl Quiet {
    pub(super) fn new(first: Duration) -> Self {
        Quiet {
            since: Instant::now(),
            wait: first,
            first,
        }
    }

    /// A message of the partition came, or the partition was assigned: the wait starts over.
    pub(super) fn heard(&mut self) {
        self.since = Instant::now();
        self.wait = self.first;
    }

    /// Whether the partition was quiet long enough to be checked.
    pub(super) fn due(&self) -> bool {
        self.since.elapsed() >= self.wait
    }

    /// How long past its wait the partition is: the most overdue is checked first.
    pub(super) fn overdue(&self) -> Duration {
        self.since.elapsed().saturating_sub(self.wait)
    }

    /// Checked: the next check waits twice as long, up to [`LONGEST_WAIT`].
    fn checked(&mut self) {
        self.since = Instant::now();
        self.wait = (self.wait * 2).min(LONGEST_WAIT.max(self.first));
    }
}

/// What a check of a quiet partition found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Checked {
    /// Nothing past the next offset, or the broker did not answer: the lane waits on.
    Caught,
    /// The log holds messages past the next offset: the client fetches the partition again
    /// from it, and the lane expects the message there.
    Refetched,
    /// The log starts after the next offset: messages the lane never received were removed
    /// (retention, delete-records). The caller meets it as [`KafkaConfig::below_log_start`]
    /// says, and goes on from `low`.
    ///
    /// [`KafkaConfig::below_log_start`]: super::KafkaConfig::below_log_start
    BelowLogStart { low: i64, high: i64 },
}

/// Asks the log of `partition` where it starts and ends. When it holds messages from `next` on
/// that the quiet lane never received (offsets past `next` that carry no message, such as a
/// transaction's marker, do not count), the client fetches the partition again from `next` (a
/// seek, and a resume in case it was paused). When it starts after `next`, nothing is fetched:
/// the caller applies the policy for a lost offset, once, and fetches from the log start.
/// Either way the next check waits longer.
pub(super) async fn restart_if_stopped<C: ConsumerContext + 'static>(
    (client, looks): (&Arc<BaseConsumer<C>>, &ClientConfig),
    topic: &str,
    partition: i32,
    next: i64,
    quiet: &mut Quiet,
) -> Checked {
    let quiet_for = quiet.since.elapsed();
    quiet.checked();
    let Some((low, high)) = out_of_range::log_range(client, topic, partition, ASK_TIMEOUT).await
    else {
        return Checked::Caught;
    };
    let found = found(next, low, high);
    if found != Checked::Refetched {
        return found;
    }
    // The offsets past the next one may carry no message: a transaction's marker, aborted or
    // compacted messages. Not answered, the partition is fetched again, which costs nothing.
    let looked = gap::look(looks, topic, partition, next, high, LOOK_TIMEOUT).await;
    if looked == Some(Gap::Empty) {
        tracing::debug!(
            topic,
            partition,
            next,
            log_end = high,
            "the offsets from the partition's next one to its end carry no message"
        );
        return Checked::Caught;
    }
    tracing::warn!(
        topic,
        partition,
        next,
        log_end = high,
        quiet_for = ?quiet_for,
        "the partition holds messages this consumer has not received, and none came while it \
         waited for them: fetching it again from the next offset"
    );
    crate::metrics::count_kafka_partition_restarted(topic);
    if refetch(client, topic, partition, next) {
        Checked::Refetched
    } else {
        Checked::Caught
    }
}

/// What a quiet lane whose next offset is `next` finds in its partition's log `[low, high)`.
/// Below the log start, fetching from `next` would serve the log start, a message after the
/// one the lane expects: dropped as a broker's skip, with the partition read again from its
/// start, message after message, check after check.
fn found(next: i64, low: i64, high: i64) -> Checked {
    if next < low {
        Checked::BelowLogStart { low, high }
    } else if high <= next {
        Checked::Caught
    } else {
        Checked::Refetched
    }
}

/// The client fetches `partition` again from `next`: a seek, and a resume in case it was
/// paused. False when the client refused the seek.
pub(super) fn refetch<C: ConsumerContext + 'static>(
    client: &Arc<BaseConsumer<C>>,
    topic: &str,
    partition: i32,
    next: i64,
) -> bool {
    if let Err(error) = client.seek(topic, partition, Offset::Offset(next), Duration::ZERO) {
        tracing::warn!(%error, partition, "cannot fetch the partition again");
        return false;
    }
    if let Err(error) = client.resume(&partition_list(topic, partition)) {
        tracing::warn!(%error, partition, "cannot resume the partition");
    }
    true
}

/// The one partition `partition` of `topic`, as the client pauses, resumes and seeks them.
pub(super) fn partition_list(topic: &str, partition: i32) -> TopicPartitionList {
    let mut list = TopicPartitionList::with_capacity(1);
    list.add_partition(topic, partition);
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_partition_is_due_after_its_wait_and_each_check_doubles_it() {
        let quiet = Quiet::new(Duration::ZERO);
        assert!(quiet.due());
        let mut quiet = Quiet::new(Duration::from_secs(10));
        assert!(!quiet.due());
        quiet.checked();
        assert_eq!(quiet.wait, Duration::from_secs(20));
        for _ in 0..10 {
            quiet.checked();
        }
        assert_eq!(quiet.wait, LONGEST_WAIT);
        quiet.heard();
        assert_eq!(quiet.wait, Duration::from_secs(10));
    }

    #[test]
    fn a_next_offset_below_the_log_start_is_found_once_and_never_fetched() {
        // The log holds [150, 300).
        assert_eq!(found(150, 150, 300), Checked::Refetched);
        assert_eq!(found(299, 150, 300), Checked::Refetched);
        assert_eq!(found(300, 150, 300), Checked::Caught);
        let below = found(100, 150, 300);
        assert_eq!(
            below,
            Checked::BelowLogStart {
                low: 150,
                high: 300
            }
        );
        // An emptied log: the messages the lane never received are gone all the same.
        assert_eq!(
            found(100, 150, 150),
            Checked::BelowLogStart {
                low: 150,
                high: 150
            }
        );
        // The lane goes on from the log start: the next check finds it there.
        assert_eq!(found(150, 150, 150), Checked::Caught);
    }
}
