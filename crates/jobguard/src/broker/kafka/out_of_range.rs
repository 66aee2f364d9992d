//! A partition assigned at a stored offset its log no longer holds: below the log start
//! (retention or a delete-records removed messages the group had not applied) or past the log
//! end (the topic was deleted and made again, or its log truncated). Either is found when the
//! partition's first message is not at the stored offset, by asking the broker for the log's
//! range; it is logged as an error, counted
//! ([`KAFKA_OFFSET_OUT_OF_RANGE_TOTAL`](crate::metrics::KAFKA_OFFSET_OUT_OF_RANGE_TOTAL)), and
//! met as [`KafkaConfig::below_log_start`] and [`KafkaConfig::past_log_end`] say.
//!
//! [`KafkaConfig::below_log_start`]: super::KafkaConfig::below_log_start
//! [`KafkaConfig::past_log_end`]: super::KafkaConfig::past_log_end

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext};

use super::KafkaConfig;
use crate::broker::offsets::{Offsets, Position};
use crate::dispatch::log_join;
use crate::error::{Error, Result};
use crate::metrics;
use crate::store::Backend;

/// A partition's stored offset is below the first offset its log holds: retention (or a
/// delete-records) removed messages the group had not applied. They are gone from the broker
/// whatever the consumer does; it logs an error with how many and counts
/// [`KAFKA_OFFSET_OUT_OF_RANGE_TOTAL`](crate::metrics::KAFKA_OFFSET_OUT_OF_RANGE_TOTAL) with
/// `reason="below_log_start"`, then:
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum BelowLogStart {
    /// Resumes at the log start, as Kafka's `auto.offset.reset=earliest` would.
    #[default]
    Resume,
    /// Stops the consumer with an error ([`Error::Broker`]) and leaves the stored offset as it
    /// is, for an operator to look.
    Refuse,
}

/// A partition's stored offset is past the end of its log: the topic was deleted and made again
/// under its name (its offsets start over), or its log was truncated. Taking the partition from
/// the stored offset would skip every message below it, silently. The consumer logs an error
/// and counts [`KAFKA_OFFSET_OUT_OF_RANGE_TOTAL`](crate::metrics::KAFKA_OFFSET_OUT_OF_RANGE_TOTAL)
/// with `reason="past_log_end"`, then:
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum PastLogEnd {
    /// Stops the consumer with an error ([`Error::Broker`]); the stored offsets stand. Start it
    /// again with [`PastLogEnd::Reset`], or delete the group's offsets with
    /// [`Offsets::forget`](crate::broker::Offsets::forget), once the topic is known to be new.
    #[default]
    Refuse,
    /// Sets the stored offset to the log start and consumes the partition from there. Keys
    /// already applied from the old topic are duplicates: the guard still holds them.
    Reset,
}

/// The offsets of a partition's log: its first, and the one after its last. `None` when the
/// broker did not say within `timeout` (logged).
pub(super) async fn log_range<C: ConsumerContext + 'static>(
    client: &Arc<BaseConsumer<C>>,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Option<(i64, i64)> {
    let (client, topic_name) = (Arc::clone(client), topic.to_owned());
    let asked = tokio::task::spawn_blocking(move || {
        client.fetch_watermarks(&topic_name, partition, timeout)
    })
    .await;
    match asked {
        Ok(Ok(range)) => Some(range),
        Ok(Err(error)) => {
            tracing::warn!(%error, topic, partition, "cannot read where the partition's log starts and ends");
            None
        }
        Err(error) => {
            log_join(Err(error), "reading a partition's log range panicked");
            None
        }
    }
}

/// Why a partition's log no longer holds the offset stored for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gone {
    /// Below the log start: retention or a delete-records removed messages not applied.
    BelowLogStart,
    /// Past the log end: the topic was made again, or its log truncated.
    PastLogEnd,
}

/// Whether the log `[low, high)` lost the stored offset `expected` (`high` itself is held: the
/// next message to be written).
pub(super) fn stored_offset_gone(expected: i64, low: i64, high: i64) -> Option<Gone> {
    if expected < low {
        Some(Gone::BelowLogStart)
    } else if expected > high {
        Some(Gone::PastLogEnd)
    } else {
        None
    }
}

/// A stored offset the partition's log no longer holds, as the rebalance callback found it
/// before assigning the partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct OutOfRange {
    pub(super) gone: Gone,
    pub(super) stored: i64,
    pub(super) low: i64,
    pub(super) high: i64,
}

impl OutOfRange {
    /// The stored offset `stored`, checked against the log `[low, high)`.
    pub(super) fn check(stored: i64, low: i64, high: i64) -> Option<Self> {
        stored_offset_gone(stored, low, high).map(|gone| OutOfRange {
            gone,
            stored,
            low,
            high,
        })
    }

    /// Whether the policies take the partition up from its log start; if not, it is assigned
    /// paused and the consumer stops.
    pub(super) fn resumes(&self, below: BelowLogStart, past: PastLogEnd) -> bool {
        match self.gone {
            Gone::BelowLogStart => below == BelowLogStart::Resume,
            Gone::PastLogEnd => past == PastLogEnd::Reset,
        }
    }
}

/// Carries out the configured policy for a partition whose stored offset `expected` its log
/// `[low, high)` no longer holds: logged as an error and counted whatever it is. `Ok` when the
/// partition goes on from `low` (the offset stored as `low` after a reset); the error that
/// stops the consumer otherwise.
pub(super) async fn out_of_range<DB: Backend>(
    (config, offsets): (&KafkaConfig, &Offsets<DB>),
    partition: i32,
    expected: i64,
    low: i64,
    high: i64,
    gone: Gone,
) -> Result<()> {
    let topic = config.topic.as_str();
    let refused = |why: String| Error::Broker {
        broker: super::BROKER,
        action: format!("consume partition {partition} of `{topic}` from its stored offset"),
        source: why.into(),
    };
    match (gone, config.below_log_start, config.past_log_end) {
        (Gone::BelowLogStart, BelowLogStart::Resume, _) => {
            tracing::error!(
                topic,
                partition,
                stored = expected,
                log_start = low,
                lost = low - expected,
                "the partition's log starts after its stored offset: messages the group had not \
                 applied were removed (retention, delete-records) and are lost; resuming at the \
                 log start"
            );
            metrics::count_kafka_offset_out_of_range(topic, "below_log_start", "resumed");
            Ok(())
        }
        (Gone::BelowLogStart, _, _) => {
            metrics::count_kafka_offset_out_of_range(topic, "below_log_start", "refused");
            let why = format!(
                "its log starts at offset {low}, after the stored offset {expected}: {} messages \
                 the group had not applied were removed; set BelowLogStart::Resume \
                 (`jobguard consume --kafka-below-log-start resume`) to go on from the log start",
                low - expected
            );
            tracing::error!(topic, partition, "{why}");
            Err(refused(why))
        }
        (Gone::PastLogEnd, _, PastLogEnd::Reset) => {
            tracing::error!(
                topic,
                partition,
                stored = expected,
                log_start = low,
                log_end = high,
                "the partition's log ends before its stored offset: the topic was made again (or \
                 its log truncated); resetting the stored offset to the log start"
            );
            let position = Position {
                group: &config.group,
                topic,
                partition,
                next_offset: low,
            };
            offsets.reset(&position).await?;
            metrics::count_kafka_offset_out_of_range(topic, "past_log_end", "reset");
            Ok(())
        }
        (Gone::PastLogEnd, _, _) => {
            metrics::count_kafka_offset_out_of_range(topic, "past_log_end", "refused");
            let why = format!(
                "its log ends at offset {high}, before the stored offset {expected}: the topic \
                 was deleted and made again, or its log truncated, and every message below the \
                 stored offset would be skipped; once the topic is known to be new, set \
                 PastLogEnd::Reset (`jobguard consume --kafka-past-log-end reset`) or delete the \
                 group's stored offsets (Offsets::forget)"
            );
            tracing::error!(topic, partition, "{why}");
            Err(refused(why))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{BelowLogStart, Gone, OutOfRange, PastLogEnd, stored_offset_gone};

    #[test]
    fn a_stored_offset_is_gone_below_the_log_start_or_past_its_end() {
        // The log holds [150, 300): 300 is the next offset written, still to come.
        assert_eq!(stored_offset_gone(100, 150, 300), Some(Gone::BelowLogStart));
        assert_eq!(stored_offset_gone(149, 150, 300), Some(Gone::BelowLogStart));
        assert_eq!(stored_offset_gone(150, 150, 300), None);
        assert_eq!(stored_offset_gone(300, 150, 300), None);
        assert_eq!(stored_offset_gone(301, 150, 300), Some(Gone::PastLogEnd));
        // A topic made again: its log [0, 4) below the old stored offset.
        assert_eq!(stored_offset_gone(10, 0, 4), Some(Gone::PastLogEnd));
    }

    #[test]
    fn the_defaults_resume_below_the_log_start_and_refuse_past_its_end() {
        let (below, past) = (BelowLogStart::default(), PastLogEnd::default());
        let retention = OutOfRange::check(100, 150, 300).unwrap();
        assert_eq!((retention.gone, retention.low), (Gone::BelowLogStart, 150));
        assert!(retention.resumes(below, past));
        assert!(!retention.resumes(BelowLogStart::Refuse, past));
        let recreated = OutOfRange::check(10, 0, 4).unwrap();
        assert!(!recreated.resumes(below, past));
        assert!(recreated.resumes(below, PastLogEnd::Reset));
        assert_eq!(OutOfRange::check(150, 150, 300), None);
    }
}
