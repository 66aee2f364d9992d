//! Kafka: a consumer whose offsets are stored in the database, in the same transaction as the
//! effects and their guard rows ([`KafkaSource`], run by [`Consumer::run_kafka`]), and
//! [`KafkaSink`], the outbox's sink and a producer of job envelopes, with the idempotent
//! producer.
//!
//! # Where the consumer stands
//!
//! Kafka keeps one committed offset per partition and consumer group, and a consumer commits it
//! after its work: one that dies in between gets the messages again. Here the next offset of
//! each partition is written in the transaction that applies the message (the guard row, the
//! job's effect and the offset commit together, in the table of [`Offsets`]), and when the group
//! assigns a partition to a consumer, its rebalance callback reads the stored offsets and
//! starts the partition there. A consumer killed after its database commit and before Kafka's
//! commit resumes exactly after what it applied: no message comes back. Kafka's own commits
//! (`enable.auto.commit` of the offsets stored after each commit) only spare a group that lost
//! its table re-reading the log; the database is the source of truth.
//!
//! | the message | the partition | the transaction |
//! |---|---|---|
//! | applied | moves on | guard row, effect, next offset |
//! | its key already applied (a copy published again, a rebalance that handed it over twice) | moves on, counted as a duplicate | next offset |
//! | failed, retryable, attempts left | paused, the message retried after a backoff that doubles | rolled back |
//! | failed on its last attempt, fatal, or it cannot run | after the message is produced to the dead-letter topic, moves on | next offset |
//!
//! Each partition's messages run in order, one transaction at a time; partitions run side by
//! side, up to [`KafkaConfig::concurrency`] at once. With [`ConsumerConfig::batch_size`]
//! above 1, up to that many consecutive messages of one partition, of kinds that opted in with
//! [`Job::BATCH`](crate::Job::BATCH), run in one transaction with one offset write; a batch
//! that fails rolls back and its messages run one per transaction.
//!
//! Kafka keeps no delivery count: the consumer counts each run of a partition's head message in
//! the database (the table of [`Offsets`] with `_attempts` after its name), in a transaction
//! committed before the message runs. A message whose consumer is killed running it, on every
//! delivery, is dead-lettered once its runs reach [`KafkaConfig::max_deliveries`], as on the
//! brokers that count deliveries; a message that fails is retried up to that count whichever
//! consumer of the group runs it.
//!
//! # Transactions
//!
//! The consumer reads committed messages only (`isolation.level=read_committed`, unless
//! [`KafkaConfig::client_settings`] says otherwise): an aborted transaction's messages never run.
//! Each transaction's commit or abort leaves a marker at an offset no consumer receives, so the
//! offset stored after a transaction's last message is its marker's, and a partition assigned
//! there receives its first message above it. Before it takes that message, the consumer reads
//! the partition on a client of its own from a little before, to tell offsets that carry no
//! message (markers, aborted or compacted messages: the partition goes on) from messages a broker
//! skipped (read again).
//!
//! # Rebalances
//!
//! A partition taken from a consumer while its transaction runs may be given to another, which
//! starts at the stored offset and runs the same message: the guard serialises the two on the
//! key, one applies and the other reports a duplicate; the offset row never moves back. The
//! consumer polls Kafka all along, whatever its jobs take, so a long job does not make it leave
//! the group.
//!
//! [`ConsumerConfig::batch_size`]: super::ConsumerConfig::batch_size

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::envelope::Envelope;
use crate::error::{Error, Result};
use crate::outbox::{OutboxMessage, Sink, SinkError};
use crate::table::TableName;
use jobguard_core::url::redact;

mod consumer;
mod dead_letter;
mod expected;
mod gap;
mod lane;
mod out_of_range;
mod source;
mod stall;

#[allow(unused_imports)] // Linked from the module documentation.
use super::{Consumer, Offsets};
pub use out_of_range::{BelowLogStart, PastLogEnd};
pub use source::KafkaSource;

const BROKER: &str = "kafka";

/// How long a produce may wait in the client's queue and for the broker's acknowledgement.
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long an administrative request (create, delete a topic) may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(15);

/// The header a dead letter's reason is in.
pub const REASON_HEADER: &str = "jobguard-reason";

/// The header a dead letter's original `topic/partition/offset` is in.
pub const ORIGIN_HEADER: &str = "jobguard-origin";

/// The shortest [`KafkaConfig::stalled_after`] accepted.
pub const MIN_STALLED_AFTER: Duration = Duration::from_secs(1);

/// Where a [`KafkaSource`] consumes from, and how.
#[derive(Clone, Debug)]
pub struct KafkaConfig {
    /// The topic.
    pub topic: String,
    /// The consumer group, shared by every consumer process (default `jobguard`).
    pub group: String,
    /// Where messages that cannot run or ran out of attempts are produced (default
    /// `<topic>.dead`), with their key and body, and the headers [`REASON_HEADER`] and
    /// [`ORIGIN_HEADER`].
    pub dead_letter_topic: String,
    /// Partitions run at once, each one transaction at a time (default 10).
    pub concurrency: usize,
    /// Messages received and held per partition before the partition is paused (default 100).
    pub buffer: usize,
    /// Runs a message gets before it is dead-lettered (default 5), counted in the database:
    /// failed runs, and runs whose consumer died or stopped before their end.
    pub max_deliveries: u32,
    /// How long the group waits for a consumer's heartbeat before it hands its partitions to
    /// the others (Kafka's `session.timeout.ms`, default 10 s). Heartbeats come from the
    /// client's own thread, whatever the jobs do.
    pub session_timeout: Duration,
    /// How long a partition this consumer owns may stay quiet, its lane with nothing to run,
    /// before its log is asked whether it holds messages the consumer has not received; when it
    /// does, the client fetches the partition again from there (default 10 s). Only a partition
    /// whose next offset is known is checked: assigned at a stored offset, or a message
    /// received since it was assigned with none. A log that starts after the next offset is met
    /// as [`below_log_start`](Self::below_log_start) says, once. Each check of a partition that
    /// stays quiet waits twice as long as the one before, up to five minutes.
    /// At least [`MIN_STALLED_AFTER`]: a shorter wait is refused with
    /// [`Error::InvalidConfig`] when the source connects.
    pub stalled_after: Duration,
    /// Partitions of the topic when it is created (default 3).
    pub partitions: i32,
    /// Create the topic and the dead-letter topic when missing (default true).
    pub declare: bool,
    /// The table the offsets are stored in (default `jobguard_consumer_offsets`).
    pub offsets_table: TableName,
    /// What a partition whose stored offset is below its log start does (default
    /// [`BelowLogStart::Resume`]).
    pub below_log_start: BelowLogStart,
    /// What a partition whose stored offset is past its log end does (default
    /// [`PastLogEnd::Refuse`]).
    pub past_log_end: PastLogEnd,
    /// Further librdkafka settings for the consumer and the dead-letter producer, as
    /// `(name, value)`, applied last.
    pub client_settings: Vec<(String, String)>,
}

impl KafkaConfig {
    /// Consumes `topic` with the defaults.
    pub fn new(topic: impl Into<String>) -> Self {
        let topic = topic.into();
        KafkaConfig {
            dead_letter_topic: format!("{topic}.dead"),
            topic,
            group: "jobguard".to_owned(),
            concurrency: 10,
            buffer: 100,
            max_deliveries: 5,
            session_timeout: Duration::from_secs(10),
            stalled_after: Duration::from_secs(10),
            partitions: 3,
            declare: true,
            offsets_table: TableName::new(crate::store::offsets::DEFAULT_OFFSETS_TABLE)
                .expect("the default name is valid"),
            below_log_start: BelowLogStart::default(),
            past_log_end: PastLogEnd::default(),
            client_settings: Vec::new(),
        }
    }
}

/// The bootstrap servers of a URL: `kafka://host:9092`, `tcp://host:9092`, or
/// `host:9092,host2:9092` as librdkafka takes them.
///
/// ```
/// use jobguard::broker::kafka::bootstrap_servers;
///
/// assert_eq!(bootstrap_servers("kafka://127.0.0.1:9092")?, "127.0.0.1:9092");
/// assert_eq!(bootstrap_servers("a:9092,b:9092")?, "a:9092,b:9092");
/// assert!(bootstrap_servers("amqp://127.0.0.1:5672").is_err());
/// # Ok::<(), jobguard::Error>(())
/// ```
pub fn bootstrap_servers(url: &str) -> Result<String> {
    let servers = match url.split_once("://") {
        Some(("kafka" | "tcp", rest)) => rest.trim_end_matches('/'),
        Some(_) => {
            return Err(Error::Broker {
                broker: BROKER,
                action: format!("use the URL {}", redact(url)),
                source: "a Kafka URL is kafka://host:port, or host:port,host:port".into(),
            });
        }
        None => url,
    };
    if servers.is_empty() || servers.contains('@') || servers.contains('/') {
        return Err(Error::Broker {
            broker: BROKER,
            action: format!("use the URL {}", redact(url)),
            source: "a Kafka URL is kafka://host:port, or host:port,host:port".into(),
        });
    }
    Ok(servers.to_owned())
}

/// The settings every client of `url` starts from.
fn client_config(url: &str) -> Result<ClientConfig> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap_servers(url)?)
        .set("client.id", "jobguard")
        .set("log_level", "4");
    Ok(config)
}

/// The idempotent producer: the broker drops a retried send it already wrote, so a message
/// is written once per `send`, in order per partition.
fn producer(url: &str, settings: &[(String, String)]) -> Result<FutureProducer> {
    let mut config = client_config(url)?;
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", millis(PRODUCE_TIMEOUT).to_string())
        .set("linger.ms", "2");
    for (name, value) in settings {
        config.set(name, value);
    }
    config
        .create()
        .map_err(|error| kafka_error(format!("connect a producer to {}", redact(url)), error))
}

/// Creates the topic and the dead-letter topic of `config` when missing, with
/// [`KafkaConfig::partitions`] partitions, replicated once.
pub async fn declare(url: &str, config: &KafkaConfig) -> Result<()> {
    let admin = admin(url)?;
    let topics = [
        NewTopic::new(&config.topic, config.partitions, TopicReplication::Fixed(1)),
        NewTopic::new(&config.dead_letter_topic, 1, TopicReplication::Fixed(1)),
    ];
    let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
    let results = admin
        .create_topics(&topics, &options)
        .await
        .map_err(|error| kafka_error(format!("create the topic `{}`", config.topic), error))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => {
                return Err(kafka_error(
                    format!("create the topic `{topic}`"),
                    KafkaError::AdminOp(code),
                ));
            }
        }
    }
    Ok(())
}

/// Deletes the topic of `config` and its dead-letter topic, with their messages. For tests and
/// demos that make their own topics.
pub async fn remove(url: &str, config: &KafkaConfig) -> Result<()> {
    let admin = admin(url)?;
    let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
    let results = admin
        .delete_topics(&[&config.topic, &config.dead_letter_topic], &options)
        .await
        .map_err(|error| kafka_error(format!("delete the topic `{}`", config.topic), error))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((topic, code)) => {
                return Err(kafka_error(
                    format!("delete the topic `{topic}`"),
                    KafkaError::AdminOp(code),
                ));
            }
        }
    }
    Ok(())
}

fn admin(url: &str) -> Result<AdminClient<DefaultClientContext>> {
    client_config(url)?
        .create()
        .map_err(|error| kafka_error(format!("connect to {}", redact(url)), error))
}

/// Produces to Kafka with the idempotent producer: the outbox's [`Sink`], and a producer of job
/// [`Envelope`]s.
///
/// A job's envelope is produced with the job key as the message key, so that every copy of a
/// job lands on the same partition and is taken in order there. As a sink, each outbox message
/// goes to the topic `<prefix><topic>`, keyed by the key of the job that published it, with the
/// [message id](crate::outbox::MessageId) in the header `jobguard-id` for receivers to
/// deduplicate on: the idempotent producer drops the client's own retries, not a relay's
/// second delivery after it died before recording the first.
///
/// | Kafka | what the relay does |
/// |---|---|
/// | the write acknowledged by every in-sync replica | delivered: marks the message sent |
/// | no answer in 30 s, an error | retries after a backoff |
///
/// ```no_run
/// use jobguard::broker::kafka::KafkaSink;
/// use jobguard::outbox::{Outbox, Relay};
///
/// # async fn f(pool: sqlx::PgPool) -> jobguard::Result<()> {
/// let sink = KafkaSink::connect("kafka://127.0.0.1:9092")?.topic_prefix("events.");
/// let report = Relay::new(Outbox::new(pool), sink).drain().await?;
/// assert_eq!(report.dead, 0);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct KafkaSink {
    producer: FutureProducer,
    prefix: String,
}

/// The header an outbox message's id is in.
pub const ID_HEADER: &str = "jobguard-id";

impl KafkaSink {
    /// A producer to `url` (`kafka://host:9092`); topics are produced to under their own name.
    pub fn connect(url: &str) -> Result<Self> {
        Ok(KafkaSink {
            producer: producer(url, &[])?,
            prefix: String::new(),
        })
    }

    /// Produces topic `t` to the Kafka topic `<prefix>t`.
    pub fn topic_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Produces a job's envelope to `topic`, keyed by the job key; returns when the broker
    /// acknowledged it.
    pub async fn publish(&self, topic: &str, envelope: &Envelope) -> Result<()> {
        let body = envelope.to_bytes();
        let record = FutureRecord::to(topic)
            .key(envelope.key.as_str())
            .payload(&body);
        self.producer
            .send(record, PRODUCE_TIMEOUT)
            .await
            .map_err(|(error, _)| {
                kafka_error(
                    format!("produce job `{}` to `{topic}`", envelope.key),
                    error,
                )
            })?;
        Ok(())
    }

    /// Waits until every message handed to the producer was acknowledged, or `timeout`.
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        use rdkafka::producer::Producer as _;
        self.producer
            .flush(timeout)
            .map_err(|error| kafka_error("flush the producer".into(), error))
    }
}

impl Sink for KafkaSink {
    async fn deliver(&self, message: &OutboxMessage) -> std::result::Result<(), SinkError> {
        let body = serde_json::to_vec(&message.payload)
            .map_err(|error| SinkError::permanent("the payload is not JSON").with_source(error))?;
        let topic = format!("{}{}", self.prefix, message.topic);
        // The id is `<job key>/<topic>`: its key part routes every message of a job alike.
        let key = message
            .id
            .as_str()
            .rsplit_once('/')
            .map_or(message.id.as_str(), |(key, _)| key);
        let headers = OwnedHeaders::new().insert(Header {
            key: ID_HEADER,
            value: Some(message.id.as_str()),
        });
        let record = FutureRecord::to(&topic)
            .key(key)
            .payload(&body)
            .headers(headers);
        match self.producer.send(record, PRODUCE_TIMEOUT).await {
            Ok(_) => Ok(()),
            Err((error, _)) => Err(SinkError::retryable(format!(
                "producing to the topic `{topic}` failed"
            ))
            .with_source(error)),
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn kafka_error(action: String, error: KafkaError) -> Error {
    Error::Broker {
        broker: BROKER,
        action,
        source: Box::new(error),
    }
}
