//! The offset a lane expects: where its partition was assigned (the stored offset) or fetched
//! again (after a stall or a lost unit), met by the first message that comes.
//!
//! A message at it ends the expectation. A first message elsewhere asks the log's range once:
//! a stored offset the log no longer holds is met as the policies say (`kafka/out_of_range.rs`).
//! A first message above it is either the next message, the offsets between carrying none
//! (transaction markers, aborted or compacted messages), or one a broker served after skipping
//! the rest of a record batch (tansu): the log tells which (`kafka/gap.rs`). Offsets that carry
//! no message are passed over; skipped messages are read again from an earlier offset, and the
//! messages of the read from before are dropped until the new read shows. While the log does
//! not say, nothing above the expected offset is taken: the partition waits, paused, for the
//! check of a quiet partition (`kafka/stall.rs`) to fetch it again from there.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext};
use rdkafka::topic_partition_list::Offset;

use super::consumer::Shared;
use super::gap::{self, Gap};
use super::lane::{Lane, Reread};
use super::{out_of_range, stall};
use crate::error::Error;
use crate::store::Backend;

/// How long the first message elsewhere waits for the log's range.
const RANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the loop does with a message of a lane that expects an offset.
pub(super) enum Admit {
    /// Takes it, unless settled already.
    Take,
    /// Drops it: it comes again, or was settled.
    Drop,
    /// Stops the consumer: a policy refused a stored offset the log no longer holds.
    Stop(Error),
}

/// Meets the message at `offset` of `partition` with what its lane expects.
pub(super) async fn admit<DB: Backend, C: ConsumerContext + 'static>(
    lane: &mut Lane<DB>,
    (client, partition): (&Arc<BaseConsumer<C>>, i32),
    offset: i64,
    shared: &Shared<DB>,
) -> Admit {
    let Some(expected) = lane.expected else {
        return Admit::Take;
    };
    let topic = shared.config.topic.as_str();
    if offset != expected && lane.reread.is_none() && !lane.range_checked {
        // Does the log still hold the expected offset at all?
        lane.range_checked = true;
        // Not answered: the partition is read as if it held the expected offset.
        let range = out_of_range::log_range(client, topic, partition, RANGE_TIMEOUT).await;
        if let Some((low, high)) = range
            && let Some(gone) = out_of_range::stored_offset_gone(expected, low, high)
        {
            let config = (&shared.config, &shared.offsets);
            if let Err(error) =
                out_of_range::out_of_range(config, partition, expected, low, high, gone).await
            {
                return Admit::Stop(error);
            }
            lane.expected = None;
            // After a reset, the offsets start over.
            lane.settled_next = low;
            lane.assigned_at = Some(low);
            return Admit::Take;
        }
    }
    if let Some(reread) = &mut lane.reread {
        if offset < expected {
            reread.below |= reread.sought;
        } else if reread.serves(offset) {
            lane.expected = None;
            lane.reread = None;
            return Admit::Take;
        } else if !reread.sought {
            // Of the read from before: the seek is asked again.
            reread.sought = seek(client, topic, partition, reread.from);
        }
        return Admit::Drop;
    }
    if offset == expected {
        lane.expected = None;
        return Admit::Take;
    }
    if offset < expected {
        return Admit::Drop;
    }
    match gap::look(
        &shared.looks,
        topic,
        partition,
        expected,
        offset,
        gap::LOOK_TIMEOUT,
    )
    .await
    {
        Some(Gap::Empty) => {
            tracing::debug!(
                topic,
                partition,
                expected,
                offset,
                "the offsets from the expected one to the first message carry no message \
                 (transaction markers, aborted or compacted messages): going on from the message"
            );
            lane.expected = None;
            Admit::Take
        }
        Some(Gap::Skipped { from }) => {
            tracing::warn!(
                topic,
                partition,
                expected,
                offset,
                from,
                "the broker skipped messages after the expected offset; reading the partition \
                 again from an earlier one, what is before the expected offset dropped"
            );
            crate::metrics::count_kafka_partition_reread(topic);
            let mut reread = Reread::new(from, offset);
            reread.sought = seek(client, topic, partition, from);
            lane.reread = Some(reread);
            Admit::Drop
        }
        None => {
            // Nothing is taken from above the expected offset before the log says what lies
            // between: the partition waits, paused, and the check of a quiet partition fetches
            // it again from the expected offset, which brings this message and a look again.
            tracing::warn!(
                topic,
                partition,
                expected,
                offset,
                "the first message came above the expected offset and the log did not say what \
                 lies between; the partition waits for the check of a quiet partition"
            );
            if client
                .pause(&stall::partition_list(topic, partition))
                .is_ok()
            {
                lane.paused = true;
            }
            Admit::Drop
        }
    }
}

/// The client reads `partition` again from `from`. False when it refused the seek (logged).
fn seek<C: ConsumerContext + 'static>(
    client: &Arc<BaseConsumer<C>>,
    topic: &str,
    partition: i32,
    from: i64,
) -> bool {
    match client.seek(topic, partition, Offset::Offset(from), Duration::ZERO) {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(%error, partition, "cannot read the partition again; asked again at its next message");
            false
        }
    }
}
