//! The Kafka consumer client: a member of the consumer group whose rebalance callback starts
//! every partition it is assigned at the offset stored in the database.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer as _, ConsumerContext, RebalanceProtocol,
};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::OwnedMessage;
use rdkafka::producer::FutureProducer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, ClientContext};
use tokio::sync::mpsc;

use super::out_of_range::OutOfRange;
use super::{
    BelowLogStart, KafkaConfig, MIN_STALLED_AFTER, PastLogEnd, client_config, declare, kafka_error,
    millis, producer,
};
use crate::broker::Offsets;
use crate::error::{Error, Result};
use crate::store::Backend;

/// How long a revocation waits for the transactions running on the revoked partitions, before
/// the partitions are given up anyway (the guard then settles the overlap with their next
/// owner).
const REVOKE_WAIT: Duration = Duration::from_secs(30);

/// How long the rebalance callback waits for a partition's log range.
const WATERMARK_TIMEOUT: Duration = Duration::from_secs(10);

/// What the client thread hands the consumer loop, in the order it happened.
pub(super) enum Event {
    /// A message.
    Message(OwnedMessage),
    /// These partitions are this consumer's now (the whole assignment, or what was added to it
    /// under the cooperative protocol), each started at the offset shown when one was stored,
    /// with what was found when the log no longer holds the stored offset.
    Assigned(Vec<(i32, Option<i64>, Option<OutOfRange>)>),
    /// These partitions are being taken away: the group waits until `done` is sent (or
    /// [`REVOKE_WAIT`]), so that the transactions running on them commit first.
    Revoked {
        partitions: Vec<i32>,
        done: std::sync::mpsc::Sender<()>,
    },
    /// Receiving failed.
    Failed(KafkaError),
}

/// Reads the stored offsets of a topic, by partition, without awaiting.
type ReadStored = Box<dyn Fn() -> Result<BTreeMap<i32, i64>> + Send + Sync>;

/// The consumer's context: on assignment, the stored offsets become the partitions' starting
/// points before any of their messages is fetched; on revocation, the partitions are given up
/// once the transactions running on them ended.
pub(super) struct Rebalancer {
    topic: String,
    read_stored: ReadStored,
    events: mpsc::UnboundedSender<Event>,
    /// Set when the consumer stops: revocations no longer wait for the loop.
    stopping: Arc<AtomicBool>,
    below_log_start: BelowLogStart,
    past_log_end: PastLogEnd,
}

impl ClientContext for Rebalancer {}

impl ConsumerContext for Rebalancer {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let stored = match (self.read_stored)() {
                    Ok(stored) => stored,
                    Err(error) => {
                        // Kafka's committed offsets trail the stored ones: the messages between
                        // come again, and the guard reports them as duplicates.
                        tracing::warn!(%error, "reading the stored offsets failed; starting at Kafka's committed offsets");
                        BTreeMap::new()
                    }
                };
                let mut assigned = Vec::new();
                for element in tpl.elements() {
                    let partition = element.partition();
                    let start = if element.topic() == self.topic {
                        stored.get(&partition).copied()
                    } else {
                        None
                    };
                    assigned.push((partition, start));
                }
                // A stored offset the log no longer holds (retention, a topic made again): the
                // partition starts at its log start when the policy says so, else it is
                // assigned paused and the loop stops the consumer.
                let mut refused = TopicPartitionList::new();
                let assigned: Vec<_> = assigned
                    .into_iter()
                    .map(|(partition, start)| {
                        let Some(stored) = start else {
                            return (partition, None, None);
                        };
                        let range = consumer
                            .fetch_watermarks(&self.topic, partition, WATERMARK_TIMEOUT)
                            .inspect_err(|error| tracing::warn!(%error, partition, "cannot read where the partition's log starts and ends"));
                        match range.ok().and_then(|(low, high)| OutOfRange::check(stored, low, high)) {
                            Some(gone) if gone.resumes(self.below_log_start, self.past_log_end) => {
                                (partition, Some(gone.low), Some(gone))
                            }
                            Some(gone) => {
                                refused.add_partition(&self.topic, partition);
                                (partition, Some(stored), Some(gone))
                            }
                            None => (partition, Some(stored), None),
                        }
                    })
                    .collect();
                for (partition, start, _) in &assigned {
                    if let Some(next) = start
                        && let Err(error) =
                            tpl.set_partition_offset(&self.topic, *partition, Offset::Offset(*next))
                    {
                        tracing::warn!(%error, partition, "cannot start a partition at its stored offset");
                    }
                }
                tracing::debug!(?assigned, "partitions assigned");
                let _ = self.events.send(Event::Assigned(assigned));
                let done = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                log_failure(done, "take the assigned partitions");
                // librdkafka keeps an application's pause of a partition across its revocation
                // and a later assignment: a partition this consumer paused (its lane full, or
                // waiting out a retry) and is handed back would never be fetched again. Every
                // lane starts unpaused, and so does its partition.
                log_failure(consumer.resume(tpl), "resume the assigned partitions");
                if refused.count() > 0 {
                    log_failure(consumer.pause(&refused), "pause the refused partitions");
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                tracing::debug!(?partitions, "partitions revoked");
                let (done, finished) = std::sync::mpsc::channel();
                let sent = self.events.send(Event::Revoked { partitions, done });
                if sent.is_ok() && !self.stopping.load(Ordering::SeqCst) {
                    let _ = finished.recv_timeout(REVOKE_WAIT);
                }
                let done = if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                };
                log_failure(done, "give the revoked partitions up");
            }
            error => {
                tracing::warn!(
                    ?error,
                    "the group's rebalance failed; giving every partition up"
                );
                let partitions = tpl.elements().iter().map(|e| e.partition()).collect();
                let (done, _) = std::sync::mpsc::channel();
                let _ = self.events.send(Event::Revoked { partitions, done });
                log_failure(consumer.unassign(), "give the partitions up");
            }
        }
    }
}

fn log_failure(done: KafkaResult<()>, action: &str) {
    if let Err(error) = done {
        tracing::warn!(%error, "cannot {action}");
    }
}

/// A member of a Kafka consumer group on one topic, for [`Consumer::run_kafka`], which runs its
/// messages with their offsets stored in the database (see the [module documentation]).
///
/// Made by [`Consumer::kafka_source`] from the consumer's own guard, so that the offsets are
/// written on the database the effects are.
///
/// [`Consumer::run_kafka`]: crate::broker::Consumer::run_kafka
/// [`Consumer::kafka_source`]: crate::broker::Consumer::kafka_source
/// [module documentation]: super
pub struct KafkaSource<DB: Backend> {
    pub(super) consumer: Arc<BaseConsumer<Rebalancer>>,
    pub(super) events: mpsc::UnboundedReceiver<Event>,
    sender: mpsc::UnboundedSender<Event>,
    pub(super) stopping: Arc<AtomicBool>,
    pub(super) dead_letters: FutureProducer,
    pub(super) offsets: Offsets<DB>,
    pub(super) config: KafkaConfig,
    /// The settings of the clients that look at what a partition's offsets hold.
    pub(super) looks: ClientConfig,
}

impl<DB: Backend> KafkaSource<DB> {
    /// Connects to `url`, creates the topics unless told not to, creates the offsets table when
    /// missing, and subscribes to [`KafkaConfig::topic`]; the group is joined when the consumer
    /// starts polling.
    pub(crate) async fn connect(
        url: &str,
        config: KafkaConfig,
        pool: sqlx::Pool<DB>,
    ) -> Result<Self> {
        if config.stalled_after < MIN_STALLED_AFTER {
            return Err(Error::InvalidConfig {
                setting: "Kafka stalled_after",
                reason: format!(
                    "{:?} is shorter than the least accepted, {MIN_STALLED_AFTER:?}: a partition \
                     is only stalled when it stays quiet across several fetches, and a shorter \
                     wait asks the broker about every quiet partition in turn",
                    config.stalled_after
                ),
            });
        }
        let offsets = Offsets::in_table(pool, &config.offsets_table)?;
        offsets.migrate().await?;
        if config.declare {
            declare(url, &config).await?;
        }
        let (sender, events) = mpsc::unbounded_channel();
        let stopping = Arc::new(AtomicBool::new(false));
        let reader = offsets.clone();
        let (group, topic) = (config.group.clone(), config.topic.clone());
        let context = Rebalancer {
            topic: config.topic.clone(),
            read_stored: Box::new(move || reader.read_blocking(&group, &topic)),
            events: sender.clone(),
            stopping: Arc::clone(&stopping),
            below_log_start: config.below_log_start,
            past_log_end: config.past_log_end,
        };
        let mut client = client_config(url)?;
        client
            .set("group.id", &config.group)
            // Kafka's commits follow the database's: the offsets stored after each commit,
            // sent every second, at each revocation and when the consumer closes.
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "1000")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            // Messages of committed transactions only (and every message not in a
            // transaction): those of aborted ones never run, and an open transaction holds the
            // partition back until it ends.
            .set("isolation.level", "read_committed")
            .set(
                "session.timeout.ms",
                millis(config.session_timeout).to_string(),
            );
        for (name, value) in &config.client_settings {
            client.set(name, value);
        }
        // The clients that look at what a partition's offsets hold read as the consumer does.
        let mut looks = client_config(url)?;
        looks
            .set("group.id", &config.group)
            .set("isolation.level", "read_committed");
        for (name, value) in &config.client_settings {
            looks.set(name, value);
        }
        let consumer: BaseConsumer<Rebalancer> = client
            .create_with_context(context)
            .map_err(|error| kafka_error(format!("join the group `{}`", config.group), error))?;
        consumer
            .subscribe(&[&config.topic])
            .map_err(|error| kafka_error(format!("subscribe to `{}`", config.topic), error))?;
        let dead_letters = producer(url, &config.client_settings)?;
        Ok(KafkaSource {
            consumer: Arc::new(consumer),
            events,
            sender,
            stopping,
            dead_letters,
            offsets,
            config,
            looks,
        })
    }

    /// The configuration it consumes with.
    pub fn config(&self) -> &KafkaConfig {
        &self.config
    }

    /// The offsets table the consumer writes.
    pub fn offsets(&self) -> &Offsets<DB> {
        &self.offsets
    }

    /// Starts the thread that polls the client: it serves the group's rebalances and
    /// heartbeats, and hands messages to the loop, until `stopping` is set. Then it commits
    /// the offsets stored in the client and leaves the group.
    pub(super) fn start(&self) -> std::thread::JoinHandle<()> {
        let consumer = Arc::clone(&self.consumer);
        let events = self.sender.clone();
        let stopping = Arc::clone(&self.stopping);
        std::thread::Builder::new()
            .name("jobguard-kafka".to_owned())
            .spawn(move || {
                while !stopping.load(Ordering::SeqCst) {
                    let event = match consumer.poll(Duration::from_millis(100)) {
                        None => continue,
                        Some(Ok(message)) => Event::Message(message.detach()),
                        Some(Err(error)) => Event::Failed(error),
                    };
                    if events.send(event).is_err() {
                        break;
                    }
                }
                stopping.store(true, Ordering::SeqCst);
                if let Err(error) = consumer.commit_consumer_state(CommitMode::Sync) {
                    tracing::debug!(%error, "no offsets committed to Kafka at close");
                }
                // The last holder closes the client and leaves the group.
                drop(consumer);
            })
            .expect("a thread for the Kafka client")
    }
}
