//! NATS JetStream with async-nats: a [`Source`] on a durable pull consumer with explicit acks,
//! AckWait kept alive by progress acks, MaxDeliver and a dead-letter subject, and
//! [`NatsSink`], the outbox's sink, publishing with `Nats-Msg-Id` for the server's dedupe
//! window.
//!
//! # Topology
//!
//! [`declare`] (run by [`NatsSource::connect`] unless [`NatsConfig::declare`] is off) creates,
//! when missing:
//!
//! - the work stream [`NatsConfig::stream`] on [`NatsConfig::subject`], with work-queue
//!   retention: an acknowledged message is removed;
//! - the stream `<stream>_DEAD` on the [dead-letter subject](NatsConfig::dead_letter_subject);
//! - the durable pull consumer [`NatsConfig::consumer`], shared by every consumer process, with
//!   explicit acks, [`ack_wait`](NatsConfig::ack_wait) and no `MaxDeliver` limit: the consumer,
//!   not the server, counts deliveries against [`max_deliveries`](NatsConfig::max_deliveries)
//!   (see below). An existing consumer whose `MaxDeliver` would stop the server first is
//!   updated to no limit.
//!
//! # How messages are settled
//!
//! | the job | the message |
//! |---|---|
//! | running | a progress ack (`+WPI`) every third of AckWait, so it is not redelivered meanwhile |
//! | committed, or its key was already applied | `+ACK`, confirmed by the server (a double ack) |
//! | failed, retryable, deliveries left | `-NAK` with the retry delay |
//! | failed on the last delivery, fatal, or the message cannot run | copied to the dead-letter subject, then `+TERM` |
//!
//! A message whose last allowed delivery never settled (the consumer died running it) is
//! delivered once more after AckWait, whenever a consumer next pulls, and that consumer reads
//! the delivery count from the message's metadata (`delivered`): past
//! [`max_deliveries`](NatsConfig::max_deliveries), it copies the message to the dead-letter
//! subject and terminates it without running the job. A source never counts a message with
//! less than the highest count it saw for it, and runs two copies of one message in one pull
//! once: servers before 2.10.14 can hand a redelivery that failed (its pull request left by a
//! consumer that went away) out again as new, with a count of 1, next to its true count.
//! The decision is never left to the server's max-deliveries advisory: that is a core NATS
//! message, lost when no consumer listens at the moment it is sent, and the message would
//! then stay in the work stream forever. Dead letters carry
//! `Nats-Msg-Id: dead:<stream>:<sequence>`, so a consumer that dies between the copy and the
//! `+TERM` leaves one copy in the dead-letter stream, not two.
//!
//! # Prefetch
//!
//! A [`NatsSource`] pulls only as many messages as the consumer has free slots for, each time
//! it receives (a pull request that returns as soon as some are available): every message it
//! holds is running, and sends progress acks. Messages pulled ahead of free slots would sit in
//! the client while the running jobs outlast AckWait, be delivered again meanwhile, and count
//! deliveries they never failed.
//!
//! # An ack after AckWait
//!
//! A job that outlives AckWait without progress acks (a consumer that stalled) has its
//! message redelivered to another consumer while it still runs. Its ack, when it comes, is
//! taken by the server for the message's stream sequence, whichever delivery is outstanding:
//! it can land on the redelivery while that one still runs. That is harmless here, because
//! the guard and not the ack carries the guarantee: the stalled consumer committed (or it
//! would not ack), and the redelivery waits on the guard row and reports a duplicate. The
//! redelivery's own ack then finds nothing pending, which the consumer ignores. Progress acks
//! keep this rare; acks are double acks so that a lost ack is known, and the message it
//! leaves behind comes back as a duplicate.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::stream::{self, RetentionPolicy};
use async_nats::jetstream::{self, AckKind, Context};
use futures::StreamExt as _;

use super::consumer::{Delivery, Source};
use super::envelope::Envelope;
use crate::error::{Error, Result};
use crate::outbox::{OutboxMessage, Sink, SinkError};
use jobguard_core::url::redact;

const BROKER: &str = "nats";

/// How long [`NatsSource::receive`](Source::receive) waits for a first message.
const POLL: Duration = Duration::from_secs(1);

/// How many messages' delivery counts a [`NatsSource`] remembers.
const REMEMBERED: usize = 4096;

/// The header a dead letter says why in.
pub const DEAD_REASON_HEADER: &str = "Jobguard-Dead-Reason";
/// The header a dead letter names its original subject in.
pub const DEAD_SUBJECT_HEADER: &str = "Jobguard-Dead-Subject";

/// Where a [`NatsSource`] consumes from, and how.
#[derive(Clone, Debug)]
pub struct NatsConfig {
    /// The work stream.
    pub stream: String,
    /// The subject jobs are published on, and the consumer's filter.
    pub subject: String,
    /// The durable pull consumer's name, shared by every consumer process (default
    /// `jobguard`).
    pub consumer: String,
    /// How long the server waits for an ack before delivering a message again (default 30 s).
    /// A running job sends a progress ack every third of it.
    pub ack_wait: Duration,
    /// Deliveries a message gets (default 5). Counted by the consumer from each message's
    /// delivery count; the server's `MaxDeliver` is left unlimited (see the
    /// [module documentation](self)).
    pub max_deliveries: u32,
    /// Messages pulled ahead, and the jobs run at once (default 10).
    pub prefetch: usize,
    /// Where dead letters are published (default `<subject>.dead`). It must not be one of the
    /// work stream's subjects.
    pub dead_letter_subject: String,
    /// Create the streams and the consumer when missing (default true).
    pub declare: bool,
}

impl NatsConfig {
    /// Consumes the jobs of `subject`, stored in `stream`, with the defaults.
    pub fn new(stream: impl Into<String>, subject: impl Into<String>) -> Self {
        let subject = subject.into();
        NatsConfig {
            stream: stream.into(),
            dead_letter_subject: format!("{subject}.dead"),
            subject,
            consumer: "jobguard".to_owned(),
            ack_wait: Duration::from_secs(30),
            max_deliveries: 5,
            prefetch: 10,
            declare: true,
        }
    }

    /// The stream the dead letters are kept in: `<stream>_DEAD`.
    pub fn dead_letter_stream(&self) -> String {
        format!("{}_DEAD", self.stream)
    }

    fn consumer_config(&self) -> pull::Config {
        pull::Config {
            durable_name: Some(self.consumer.clone()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            // Unlimited: the consumer dead-letters a message delivered more than
            // `max_deliveries` times itself. A server limit would end the deliveries of a
            // message whose last one never settled with only an advisory, which is lost when
            // nobody listens, and leave the message in the stream forever.
            max_deliver: -1,
            filter_subject: self.subject.clone(),
            ..pull::Config::default()
        }
    }

    /// Fails when the server's `MaxDeliver` would stop delivering a message before the
    /// consumer counted `max_deliveries` and dead-lettered it.
    fn check_max_deliver(&self, max_deliver: i64) -> Result<()> {
        if stops_first(max_deliver, self.max_deliveries) {
            return Err(Error::InvalidConfig {
                setting: "NATS consumer MaxDeliver",
                reason: format!(
                    "the consumer `{}` has MaxDeliver {max_deliver}, which is not more than \
                     max_deliveries {}: a message whose last delivery never settles would stay \
                     in the stream; set MaxDeliver to -1 (unlimited) or let jobguard declare the \
                     consumer",
                    self.consumer, self.max_deliveries
                ),
            });
        }
        Ok(())
    }
}

/// Whether a server `MaxDeliver` ends deliveries before the consumer's own count does.
fn stops_first(max_deliver: i64, max_deliveries: u32) -> bool {
    max_deliver > 0 && max_deliver <= i64::from(max_deliveries.max(1))
}

/// Creates the streams and the durable consumer of `config` when missing; see the
/// [module documentation](self).
pub async fn declare(context: &Context, config: &NatsConfig) -> Result<PullConsumer> {
    let work = declare_stream(
        context,
        stream::Config {
            name: config.stream.clone(),
            subjects: vec![config.subject.clone()],
            retention: RetentionPolicy::WorkQueue,
            ..stream::Config::default()
        },
    )
    .await?;
    declare_stream(
        context,
        stream::Config {
            name: config.dead_letter_stream(),
            subjects: vec![config.dead_letter_subject.clone()],
            ..stream::Config::default()
        },
    )
    .await?;
    let mut consumer: PullConsumer = work
        .get_or_create_consumer(&config.consumer, config.consumer_config())
        .await
        .map_err(|error| {
            broker_error(format!("create the consumer `{}`", config.consumer), error)
        })?;
    if stops_first(
        consumer.cached_info().config.max_deliver,
        config.max_deliveries,
    ) {
        // Declared with a server limit (as earlier versions did): lift it.
        consumer = work
            .create_consumer(config.consumer_config())
            .await
            .map_err(|error| {
                broker_error(
                    format!(
                        "lift the MaxDeliver limit of the consumer `{}`",
                        config.consumer
                    ),
                    error,
                )
            })?;
    }
    Ok(consumer)
}

/// Deletes the work stream of `config` and its dead-letter stream, with their messages and
/// consumers. For tests and demos that make their own streams.
pub async fn remove(url: &str, config: &NatsConfig) -> Result<()> {
    let context = jetstream::new(connect(url).await?);
    for stream in [config.stream.clone(), config.dead_letter_stream()] {
        // A stream that does not exist has nothing to delete.
        if context.get_stream(&stream).await.is_ok() {
            context
                .delete_stream(&stream)
                .await
                .map_err(|error| broker_error(format!("delete the stream `{stream}`"), error))?;
        }
    }
    Ok(())
}

/// Consumes a JetStream durable pull consumer for a [`Consumer`](super::Consumer).
pub struct NatsSource {
    consumer: PullConsumer,
    config: NatsConfig,
    counts: DeliveryCounts,
}

/// The highest delivery count seen for each of the last [`REMEMBERED`] stream sequences.
///
/// The count a message carries can go backwards: a server older than 2.10.14 that fails to
/// deliver a redelivery (its pull request was left by a consumer that went away) hands the
/// message out again as new, with a count of 1, next to the redelivery with the true count
/// (nats-io/nats-server#5305). Taken at its word, that copy would run a message whose
/// deliveries ran out.
#[derive(Default)]
struct DeliveryCounts {
    highest: HashMap<u64, i64>,
    order: VecDeque<u64>,
}

impl DeliveryCounts {
    /// Records a delivery of `sequence` counted `delivered`; returns the highest count seen.
    fn observe(&mut self, sequence: u64, delivered: i64) -> i64 {
        if let Some(highest) = self.highest.get_mut(&sequence) {
            *highest = (*highest).max(delivered);
            return *highest;
        }
        if self.order.len() >= REMEMBERED
            && let Some(oldest) = self.order.pop_front()
        {
            self.highest.remove(&oldest);
        }
        self.order.push_back(sequence);
        self.highest.insert(sequence, delivered);
        delivered
    }
}

impl NatsSource {
    /// Connects to `url` (`nats://host:4222`), creates the streams and the consumer unless told
    /// not to, and starts pulling.
    pub async fn connect(url: &str, config: NatsConfig) -> Result<Self> {
        let client = connect(url).await?;
        Self::on(jetstream::new(client), config).await
    }

    /// Consumes through a JetStream context of the caller's.
    pub async fn on(context: Context, config: NatsConfig) -> Result<Self> {
        let consumer: PullConsumer = if config.declare {
            declare(&context, &config).await?
        } else {
            context
                .get_consumer_from_stream(&config.consumer, &config.stream)
                .await
                .map_err(|error| {
                    broker_error(
                        format!(
                            "find the consumer `{}` on the stream `{}`",
                            config.consumer, config.stream
                        ),
                        error,
                    )
                })?
        };
        let max_deliver = consumer.cached_info().config.max_deliver;
        config.check_max_deliver(max_deliver)?;
        Ok(NatsSource {
            consumer,
            config,
            counts: DeliveryCounts::default(),
        })
    }
}

impl Source for NatsSource {
    type Delivery = NatsDelivery;

    super::consumer::source_settings!(ack_wait);

    async fn receive(&mut self, max: usize) -> Result<Vec<NatsDelivery>> {
        self.receive_within(max, POLL).await
    }

    async fn receive_within(&mut self, max: usize, wait: Duration) -> Result<Vec<NatsDelivery>> {
        let pull = || format!("pull from the consumer `{}`", self.config.consumer);
        // One pull request for as many messages as there are free slots, which the server
        // answers as soon as it has some, or after `wait` with none (at once without one). It
        // is read to its end, so no message it brought is left behind unseen (to be delivered
        // again, counted).
        let mut fetch = self.consumer.fetch().max_messages(max.max(1));
        if !wait.is_zero() {
            fetch = fetch.expires(wait);
        }
        let mut batch = fetch
            .messages()
            .await
            .map_err(|error| broker_error(pull(), error))?;
        let mut messages = Vec::new();
        let reading = async {
            while let Some(next) = batch.next().await {
                messages.push(next.map_err(|error| broker_error(pull(), error))?);
            }
            Ok::<_, Error>(())
        };
        // The server ends the request after `wait`; the margin covers a slow answer only.
        match tokio::time::timeout(wait.max(POLL) * 5, reading).await {
            Ok(read) => read?,
            Err(_elapsed) => tracing::debug!("a pull request was not ended by the server in time"),
        }
        // Each message counted with the highest count this source saw it with (see
        // `DeliveryCounts`), and run once per pull: two copies of one stream sequence in a
        // pull are one message, run as the first with the higher count; the second is left
        // unsettled (an ack or a termination is taken for the stream sequence).
        let mut deliveries: Vec<NatsDelivery> = Vec::with_capacity(messages.len());
        for message in messages {
            let (sequence, reported) = match message.info() {
                Ok(info) => (Some(info.stream_sequence), info.delivered),
                Err(_) => (None, 1),
            };
            let delivered = match sequence {
                Some(sequence) => self.counts.observe(sequence, reported),
                None => reported,
            };
            if let Some(sequence) = sequence
                && let Some(kept) = deliveries
                    .iter_mut()
                    .find(|kept| kept.sequence == Some(sequence))
            {
                tracing::debug!(
                    sequence,
                    reported,
                    "a message came twice in one pull; running it once"
                );
                kept.delivered = kept.delivered.max(delivered);
                continue;
            }
            deliveries.push(NatsDelivery {
                message,
                sequence,
                delivered,
                config: self.config.clone(),
            });
        }
        Ok(deliveries)
    }

    async fn close(self) {
        // Messages pulled and not acked are delivered again after AckWait.
        drop(self);
    }
}

/// A message from a [`NatsSource`].
pub struct NatsDelivery {
    message: jetstream::Message,
    /// The message's stream sequence, from its metadata.
    sequence: Option<u64>,
    /// Its delivery count: the highest its source saw for it.
    delivered: i64,
    config: NatsConfig,
}

impl Delivery for NatsDelivery {
    fn body(&self) -> &[u8] {
        &self.message.payload
    }

    fn attempt(&self) -> u32 {
        u32::try_from(self.delivered.max(1)).unwrap_or(u32::MAX)
    }

    async fn ack(self) -> Result<()> {
        self.message
            .double_ack()
            .await
            .map_err(|error| broker_error("ack a message".into(), error))
    }

    async fn ack_all(deliveries: Vec<Self>) -> Result<()> {
        // JetStream acknowledges one message at a time: the double acks of a batch go out
        // together and their answers are awaited together.
        let acks = deliveries.into_iter().map(Delivery::ack);
        let mut acked = Ok(());
        for ack in futures::future::join_all(acks).await {
            if let (Err(error), Ok(())) = (ack, &acked) {
                acked = Err(error);
            }
        }
        acked
    }

    async fn retry(self, delay: Duration) -> Result<()> {
        self.message
            .ack_with(AckKind::Nak(Some(delay)))
            .await
            .map_err(|error| broker_error("nak a message".into(), error))
    }

    async fn dead_letter(self, reason: String) -> Result<()> {
        let sequence = self.sequence.unwrap_or_default();
        let context = &self.message.context;
        publish_dead_letter(
            context,
            &self.config,
            sequence,
            self.message.subject.as_str(),
            self.message.payload.to_vec(),
            &reason,
        )
        .await?;
        self.message
            .double_ack_with(AckKind::Term)
            .await
            .map_err(|error| broker_error("terminate a dead-lettered message".into(), error))
    }

    async fn progress(&self) -> Result<()> {
        self.message
            .ack_with(AckKind::Progress)
            .await
            .map_err(|error| broker_error("send a progress ack".into(), error))
    }
}

/// Publishes a copy of a message to the dead-letter subject and waits for the stream to take it.
async fn publish_dead_letter(
    context: &Context,
    config: &NatsConfig,
    sequence: u64,
    subject: &str,
    payload: Vec<u8>,
    reason: &str,
) -> Result<()> {
    let mut headers = HeaderMap::new();
    headers.insert(
        "Nats-Msg-Id",
        format!("dead:{}:{sequence}", config.stream).as_str(),
    );
    // Header values are one line.
    let reason: String = reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(1000)
        .collect();
    headers.insert(DEAD_REASON_HEADER, reason.as_str());
    headers.insert(DEAD_SUBJECT_HEADER, subject);
    let action = || format!("publish a dead letter to `{}`", config.dead_letter_subject);
    context
        .publish_with_headers(config.dead_letter_subject.clone(), headers, payload.into())
        .await
        .map_err(|error| broker_error(action(), error))?
        .await
        .map_err(|error| broker_error(action(), error))?;
    Ok(())
}

/// Publishes to JetStream, waiting for the stream's ack: the outbox's [`Sink`], and a producer
/// of job [`Envelope`]s.
///
/// As a sink, each outbox message is published on `<prefix><topic>` with the payload as JSON
/// and the [message id](crate::outbox::MessageId) as `Nats-Msg-Id`: a stream with a duplicate
/// window (2 minutes unless configured) stores a message published again within it once, and
/// acknowledges the copy as a duplicate.
///
/// | the server | what the relay does |
/// |---|---|
/// | a stream acknowledges it (stored, or a duplicate) | delivered: marks the message sent |
/// | no stream takes the subject, no answer, an error | retries after a backoff |
///
/// ```no_run
/// use jobguard::broker::nats::NatsSink;
/// use jobguard::outbox::{Outbox, Relay};
///
/// # async fn f(pool: sqlx::PgPool) -> jobguard::Result<()> {
/// // Messages on topic `invoices` go to the subject `events.invoices`.
/// let sink = NatsSink::connect("nats://127.0.0.1:4222").await?.subject_prefix("events.");
/// let report = Relay::new(Outbox::new(pool), sink).drain().await?;
/// assert_eq!(report.dead, 0);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct NatsSink {
    context: Context,
    prefix: String,
    message_ids: bool,
}

impl NatsSink {
    /// Connects to `url`; topics are published as subjects of the same name.
    pub async fn connect(url: &str) -> Result<Self> {
        Ok(Self::on(jetstream::new(connect(url).await?)))
    }

    /// Publishes through a JetStream context of the caller's.
    pub fn on(context: Context) -> Self {
        NatsSink {
            context,
            prefix: String::new(),
            message_ids: true,
        }
    }

    /// Publishes topic `t` on the subject `<prefix>t`.
    pub fn subject_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Leaves `Nats-Msg-Id` off: every publish is stored, even within the duplicate window.
    /// For producers that must not be deduplicated by the server (a demo of duplicates);
    /// receivers then deduplicate alone.
    pub fn without_message_ids(mut self) -> Self {
        self.message_ids = false;
        self
    }

    /// Publishes a job's envelope on `subject` with the job key as `Nats-Msg-Id`, and waits for
    /// the stream's ack. Published again within the stream's duplicate window, it is stored
    /// once.
    pub async fn publish(&self, subject: &str, envelope: &Envelope) -> Result<()> {
        self.send(subject, envelope.key.as_str(), envelope.to_bytes())
            .await
            .map_err(|error| Error::Broker {
                broker: BROKER,
                action: format!("publish job `{}` on `{subject}`", envelope.key),
                source: Box::new(error),
            })
    }

    async fn send(
        &self,
        subject: &str,
        id: &str,
        body: Vec<u8>,
    ) -> std::result::Result<(), SinkError> {
        let mut headers = HeaderMap::new();
        if self.message_ids {
            headers.insert("Nats-Msg-Id", id);
        }
        let failed = |error| {
            SinkError::retryable(format!("publishing on `{subject}` failed")).with_source(error)
        };
        let ack = self
            .context
            .publish_with_headers(subject.to_owned(), headers, body.into())
            .await
            .map_err(failed)?;
        ack.await.map_err(|error| {
            SinkError::retryable(format!(
                "no stream acknowledged the message on `{subject}` (is there a stream on it?)"
            ))
            .with_source(error)
        })?;
        Ok(())
    }
}

impl Sink for NatsSink {
    async fn deliver(&self, message: &OutboxMessage) -> std::result::Result<(), SinkError> {
        let body = serde_json::to_vec(&message.payload)
            .map_err(|error| SinkError::permanent("the payload is not JSON").with_source(error))?;
        let subject = format!("{}{}", self.prefix, message.topic);
        self.send(&subject, message.id.as_str(), body).await
    }
}

async fn connect(url: &str) -> Result<async_nats::Client> {
    async_nats::connect(url).await.map_err(|error| {
        broker_error(
            format!("connect to {} (is NATS running there?)", redact(url)),
            error,
        )
    })
}

/// Gets or creates a stream. Consumers started together race to create it: the server can
/// refuse the loser's create (JetStream answered "subjects overlap with an existing stream" to
/// the second of two creates of one stream), though the stream it wanted now exists. So a
/// failed create is followed by one more look: the stream found is used, and only when there is
/// still none is the create's error returned.
async fn declare_stream(context: &Context, config: stream::Config) -> Result<stream::Stream> {
    let name = config.name.clone();
    match context.get_or_create_stream(config).await {
        Ok(stream) => Ok(stream),
        Err(error) => match context.get_stream(&name).await {
            Ok(stream) => Ok(stream),
            Err(_) => Err(broker_error(format!("create the stream `{name}`"), error)),
        },
    }
}

fn broker_error(
    action: String,
    error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
) -> Error {
    Error::Broker {
        broker: BROKER,
        action,
        source: error.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_count_never_goes_backwards() {
        let mut counts = DeliveryCounts::default();
        assert_eq!(counts.observe(1, 1), 1);
        assert_eq!(counts.observe(1, 5), 5);
        // The server handed the message out again as new.
        assert_eq!(counts.observe(1, 1), 5);
        assert_eq!(counts.observe(2, 1), 1);
        assert_eq!(counts.observe(1, 6), 6);
    }

    #[test]
    fn delivery_counts_are_remembered_for_a_bounded_number_of_messages() {
        let mut counts = DeliveryCounts::default();
        for sequence in 0..(REMEMBERED as u64 + 10) {
            counts.observe(sequence, 3);
        }
        assert_eq!(counts.highest.len(), REMEMBERED);
        assert_eq!(counts.order.len(), REMEMBERED);
        // The oldest were forgotten.
        assert_eq!(counts.observe(0, 1), 1);
    }
}
