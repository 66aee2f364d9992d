//! Offsets that carry no message, told apart from a broker that skipped messages.
//!
//! Not every offset of a partition is a message a consumer receives: each commit or abort of a
//! transactional producer writes a control record (a transaction marker) that no client hands
//! on, a `read_committed` client leaves out the messages of aborted transactions, and
//! compaction removes messages and keeps their offsets. The message after such offsets arrives
//! above the offset the lane expected. So does the message after a broker's skip: a broker that
//! answers a fetch from inside a record batch with the batches after it (tansu) leaves out the
//! rest of that batch. The first is the partition as it is, and the lane goes on from the
//! message; the second must be read again, or messages are lost.
//!
//! [`look`] tells them apart without moving the lane's client: a client of its own reads the
//! partition from an offset before the expected one. A read whose first message is before the
//! expected offset, or that starts at the log start, serves every message from there on (a
//! broker serves the batch that starts at or holds the offset it is asked for, or the batches
//! after it: each batch after the first is served whole). The first message such a read serves
//! at or after the expected offset is the one the lane should have received. A read whose first
//! message is already at or after the expected offset may have been skipped past the same
//! batch: the next read starts twice as far back, down to the log start, so a look costs a few
//! short reads, however long the partition.

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::dispatch::log_join;

/// How long a look at the offsets after a lane's expected one may take, all its reads together,
/// when the lane's first message came above it.
pub(super) const LOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// What the log holds from the offset a lane expected up to (not including) the offset it
/// compares with: the first message the lane received, or the log's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gap {
    /// No message: the offsets between carry none (transaction markers, messages of aborted
    /// transactions, compacted ones).
    Empty,
    /// At least one message the lane has not received: a read from `from` serves it.
    Skipped { from: i64 },
}

/// What one read from an offset before the expected one showed.
#[derive(Debug, PartialEq, Eq)]
enum Read {
    /// The read served every message from the expected offset on: the answer.
    Found(Gap),
    /// Its first message was at or after the expected offset and it may have started after a
    /// batch holding messages before it: a read from further back is needed.
    Unsure,
}

/// Whether the log of `partition` holds a message at an offset in `[expected, before)`, read on
/// a client made from `config` (the consumer's settings, for the same isolation level). `None`
/// when the broker did not answer within `timeout`, or answered with an error (logged).
pub(super) async fn look(
    config: &ClientConfig,
    topic: &str,
    partition: i32,
    expected: i64,
    before: i64,
    timeout: Duration,
) -> Option<Gap> {
    let (config, topic_name) = (config.clone(), topic.to_owned());
    let looked = tokio::task::spawn_blocking(move || {
        look_blocking(&config, &topic_name, partition, expected, before, timeout)
    })
    .await;
    match looked {
        Ok(Ok(gap)) => gap,
        Ok(Err(error)) => {
            tracing::warn!(%error, topic, partition, expected, "cannot read the partition to see what its offsets after the expected one hold");
            None
        }
        Err(error) => {
            log_join(
                Err(error),
                "reading what a partition's offsets hold panicked",
            );
            None
        }
    }
}

fn look_blocking(
    config: &ClientConfig,
    topic: &str,
    partition: i32,
    expected: i64,
    before: i64,
    timeout: Duration,
) -> Result<Option<Gap>, KafkaError> {
    let deadline = Instant::now() + timeout;
    let left = || deadline.saturating_duration_since(Instant::now());
    let mut client = reader(config)?;
    let (low, _) = client.fetch_watermarks(topic, partition, left())?;
    let mut back = 1_i64;
    loop {
        let from = expected.saturating_sub(back).max(low);
        let mut list = TopicPartitionList::with_capacity(1);
        list.add_partition_offset(topic, partition, Offset::Offset(from))?;
        client.assign(&list)?;
        let mut reading = Reading::new(from, low, expected, before);
        let read = loop {
            if left().is_zero() {
                return Ok(None);
            }
            let served = match client.poll(left()) {
                None => return Ok(None),
                Some(Err(KafkaError::PartitionEOF(p))) if p == partition => None,
                Some(Err(error)) => return Err(error),
                Some(Ok(message)) if message.partition() != partition => continue,
                Some(Ok(message)) => Some(message.offset()),
            };
            if let Some(read) = reading.served(served) {
                break read;
            }
        };
        match read {
            Read::Found(gap) => return Ok(Some(gap)),
            Read::Unsure if from > low => back = back.saturating_mul(2),
            // A read from the log start is never unsure.
            Read::Unsure => return Ok(None),
        }
        // A client of its own for each read: librdkafka tells a partition's end once a client.
        client = reader(config)?;
    }
}

/// A client that reads assigned partitions, with the partition's end told.
fn reader(config: &ClientConfig) -> Result<BaseConsumer, KafkaError> {
    let mut config = config.clone();
    config
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        // A log start that moved past the read's offset is an error, not a jump.
        .set("auto.offset.reset", "error");
    config.create()
}

/// One read from `from`, judged message by message.
struct Reading {
    from: i64,
    /// The read starts at the log start: it serves every message.
    at_start: bool,
    expected: i64,
    before: i64,
    /// The read served a message before `expected`: it serves every one after.
    below: bool,
}

impl Reading {
    fn new(from: i64, low: i64, expected: i64, before: i64) -> Self {
        Reading {
            from,
            at_start: from <= low,
            expected,
            before,
            below: false,
        }
    }

    /// The read served the message at `offset`, or reached its end (`None`): what it shows, once
    /// it shows it.
    fn served(&mut self, offset: Option<i64>) -> Option<Read> {
        let whole = self.below || self.at_start;
        match offset {
            Some(offset) if offset < self.expected => {
                self.below = true;
                None
            }
            // A message the lane did not receive, whatever came before it.
            Some(offset) if offset < self.before => {
                Some(Read::Found(Gap::Skipped { from: self.from }))
            }
            // The first message at or after `expected` is at or after `before`, or there is none.
            _ if whole => Some(Read::Found(Gap::Empty)),
            _ => Some(Read::Unsure),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Gap, Read, Reading};

    /// What a read from `from` of a log starting at `low` shows of `[expected, before)`, served
    /// `offsets` (`None`: the log's end).
    fn read(
        from: i64,
        low: i64,
        expected: i64,
        before: i64,
        offsets: &[Option<i64>],
    ) -> Option<Read> {
        let mut reading = Reading::new(from, low, expected, before);
        offsets.iter().find_map(|&offset| reading.served(offset))
    }

    #[test]
    fn a_transaction_marker_at_the_expected_offset_is_no_message() {
        // Messages 0..=4, the commit marker at 5, the next message at 6: the lane expected 5.
        assert_eq!(
            read(4, 0, 5, 6, &[Some(4), Some(6)]),
            Some(Read::Found(Gap::Empty))
        );
        // Read from inside the batch 0..=4, a broker (tansu) serves the batch after it: unsure.
        assert_eq!(read(4, 0, 5, 6, &[Some(6)]), Some(Read::Unsure));
        // From the log start, nothing is skipped.
        assert_eq!(
            read(0, 0, 5, 6, &[Some(0), Some(1), Some(6)]),
            Some(Read::Found(Gap::Empty))
        );
        // A log that starts at the expected offset.
        assert_eq!(read(5, 5, 5, 6, &[Some(6)]), Some(Read::Found(Gap::Empty)));
        // A quiet lane: nothing from the expected offset to the log's end.
        assert_eq!(
            read(4, 0, 5, 6, &[Some(4), None]),
            Some(Read::Found(Gap::Empty))
        );
        assert_eq!(read(4, 0, 5, 6, &[None]), Some(Read::Unsure));
    }

    #[test]
    fn a_message_between_is_one_the_broker_skipped() {
        // The lane expected 1, inside the batch 0..=9, and received 10 first.
        assert_eq!(
            read(0, 0, 1, 10, &[Some(0), Some(1)]),
            Some(Read::Found(Gap::Skipped { from: 0 }))
        );
        // Whatever came before it: a message in between is one the lane did not receive.
        assert_eq!(
            read(3, 0, 5, 10, &[Some(7)]),
            Some(Read::Found(Gap::Skipped { from: 3 }))
        );
        // Messages before the expected offset show nothing yet.
        assert_eq!(read(0, 0, 5, 10, &[Some(0), Some(4)]), None);
    }
}
