//! RabbitMQ with lapin: a [`Source`] with manual acks, prefetch, requeue on failure and
//! dead-lettering through the queue's dead-letter exchange, and [`RabbitSink`], the outbox's
//! sink, publishing with publisher confirms.
//!
//! # Topology
//!
//! [`declare`] (run by [`RabbitSource::connect`] unless [`RabbitConfig::declare`] is off)
//! creates, when missing:
//!
//! - the queue, a durable **quorum** queue with `x-delivery-limit` set to
//!   [`max_deliveries`](RabbitConfig::max_deliveries)` - 1` and `x-dead-letter-exchange` set to
//!   `<queue>.dead`: the broker counts deliveries (the `x-delivery-count` header) and
//!   dead-letters a message it has delivered that many times, even when every consumer that
//!   took it died;
//! - the fanout exchange `<queue>.dead` and the durable queue `<queue>.dead` bound to it, where
//!   dead letters wait, with RabbitMQ's `x-death` header saying where from and why.
//!
//! # How messages are settled
//!
//! | the job | the message |
//! |---|---|
//! | committed, or its key was already applied | `basic.ack` after the commit |
//! | a batch committed | one `basic.ack` with `multiple` on its highest delivery tag when its messages are all the channel holds unsettled up to that tag, else one `basic.ack` each |
//! | failed, retryable, deliveries left | `basic.reject` with requeue, after the retry delay |
//! | failed on the last delivery, fatal, or the message cannot run | `basic.reject` without requeue: dead-lettered by the broker |
//!
//! A consumer that dies holding messages (prefetched or running) loses its channel, and the
//! broker requeues them; for a job that had committed, the redelivery is a duplicate.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt as _, StreamExt as _};
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};

use super::consumer::{Delivery, Source};
use super::envelope::Envelope;
use crate::error::{Error, Result};
use crate::outbox::{OutboxMessage, Sink, SinkError};
use jobguard_core::url::redact;

const BROKER: &str = "rabbitmq";

/// How long [`RabbitSource::receive`](Source::receive) waits for a first message.
const POLL: Duration = Duration::from_secs(1);

/// How long [`RabbitSink`] waits for the broker to confirm a message.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// The header carrying the full message id, which may be longer than the 255 bytes of the
/// `message_id` property.
pub const MESSAGE_ID_HEADER: &str = "jobguard-message-id";

/// Where a [`RabbitSource`] consumes from, and how.
#[derive(Clone, Debug)]
pub struct RabbitConfig {
    /// The queue.
    pub queue: String,
    /// Messages the broker hands this consumer before it acks any (`basic.qos`), and the jobs
    /// it runs at once (default 10).
    pub prefetch: u16,
    /// Deliveries a message gets before it is dead-lettered (default 5); [`declare`] sets the
    /// queue's `x-delivery-limit` from it.
    pub max_deliveries: u32,
    /// Declare the queue and its dead letters when missing (default true). Off, the queue must
    /// exist, and should be a quorum queue with a dead-letter exchange: a classic queue does
    /// not count deliveries, and without a dead-letter exchange a rejected message is dropped.
    pub declare: bool,
}

impl RabbitConfig {
    /// Consumes `queue` with the defaults.
    pub fn new(queue: impl Into<String>) -> Self {
        RabbitConfig {
            queue: queue.into(),
            prefetch: 10,
            max_deliveries: 5,
            declare: true,
        }
    }

    /// The exchange, and the queue, where the queue's dead letters go: `<queue>.dead`.
    pub fn dead_letters(&self) -> String {
        format!("{}.dead", self.queue)
    }
}

/// Declares the queue of `config` and its dead letters when missing; see the
/// [module documentation](self). Fails when the queue exists with other arguments.
pub async fn declare(channel: &Channel, config: &RabbitConfig) -> Result<()> {
    let queue = short(&config.queue, "queue name")?;
    let dead = short(&config.dead_letters(), "dead-letter queue name")?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let failed = |action: String| move |error| broker_error(action, error);
    channel
        .exchange_declare(
            dead.clone(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(failed(format!("declare the exchange `{dead}`")))?;
    channel
        .queue_declare(dead.clone(), durable, FieldTable::default())
        .await
        .map_err(failed(format!("declare the queue `{dead}`")))?;
    channel
        .queue_bind(
            dead.clone(),
            dead.clone(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(failed(format!("bind `{dead}` to its exchange")))?;
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    arguments.insert(
        "x-delivery-limit".into(),
        AMQPValue::LongLongInt(i64::from(config.max_deliveries.max(1) - 1)),
    );
    arguments.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(dead.as_str().into()),
    );
    channel
        .queue_declare(queue.clone(), durable, arguments)
        .await
        .map_err(failed(format!(
            "declare the quorum queue `{queue}` (if it exists with other arguments, delete it or \
             set RabbitConfig::declare to false)"
        )))?;
    Ok(())
}

/// Deletes the queue of `config` and its dead letters, with the messages they hold. For tests
/// and demos that make their own queues.
pub async fn remove(url: &str, config: &RabbitConfig) -> Result<()> {
    let connection = connect(url).await?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|error| broker_error("open a channel".into(), error))?;
    let dead = short(&config.dead_letters(), "dead-letter queue name")?;
    for queue in [short(&config.queue, "queue name")?, dead.clone()] {
        channel
            .queue_delete(queue.clone(), QueueDeleteOptions::default())
            .await
            .map_err(|error| broker_error(format!("delete the queue `{queue}`"), error))?;
    }
    channel
        .exchange_delete(dead.clone(), ExchangeDeleteOptions::default())
        .await
        .map_err(|error| broker_error(format!("delete the exchange `{dead}`"), error))?;
    let _ = connection.close(200, "removed".into()).await;
    Ok(())
}

/// Consumes a RabbitMQ queue for a [`Consumer`](super::Consumer), with manual acks.
pub struct RabbitSource {
    connection: Connection,
    channel: Channel,
    /// Started on the first receive, so that a source made only to declare takes nothing.
    consumer: Option<lapin::Consumer>,
    config: RabbitConfig,
    unsettled: Unsettled,
}

/// The delivery tags a source's channel handed out and nothing settled yet. Every settlement
/// is sent holding it, and a tag leaves it once its settlement is sent: a `multiple` ack
/// checked against it never covers a tag that is settled on its own (which the broker would
/// answer by closing the channel: an unknown delivery tag).
type Unsettled = Arc<tokio::sync::Mutex<BTreeSet<u64>>>;

impl RabbitSource {
    /// Connects to `url` (`amqp://user:pass@host:5672/vhost`) and declares the queue unless
    /// told not to. Consuming, with the configured prefetch, starts on the first receive.
    pub async fn connect(url: &str, config: RabbitConfig) -> Result<Self> {
        let connection = connect(url).await?;
        Self::on(connection, config).await
    }

    /// Consumes on a connection of the caller's.
    pub async fn on(connection: Connection, config: RabbitConfig) -> Result<Self> {
        let channel = connection
            .create_channel()
            .await
            .map_err(|error| broker_error("open a channel".into(), error))?;
        if config.declare {
            declare(&channel, &config).await?;
        }
        Ok(RabbitSource {
            connection,
            channel,
            consumer: None,
            config,
            unsettled: Unsettled::default(),
        })
    }

    async fn consumer(&mut self) -> Result<&mut lapin::Consumer> {
        if self.consumer.is_none() {
            self.channel
                .basic_qos(self.config.prefetch.max(1), BasicQosOptions::default())
                .await
                .map_err(|error| broker_error("set the prefetch".into(), error))?;
            let consumer = self
                .channel
                .basic_consume(
                    short(&self.config.queue, "queue name")?,
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|error| {
                    broker_error(
                        format!("consume from the queue `{}`", self.config.queue),
                        error,
                    )
                })?;
            self.consumer = Some(consumer);
        }
        Ok(self.consumer.as_mut().expect("just started"))
    }
}

impl Source for RabbitSource {
    type Delivery = RabbitDelivery;

    fn broker(&self) -> &'static str {
        BROKER
    }

    fn prefetch(&self) -> usize {
        usize::from(self.config.prefetch.max(1))
    }

    fn max_deliveries(&self) -> u32 {
        self.config.max_deliveries
    }

    fn progress_interval(&self) -> Option<Duration> {
        // The channel's liveness is what keeps a message: no per-message extension exists.
        None
    }

    async fn receive(&mut self, max: usize) -> Result<Vec<RabbitDelivery>> {
        self.receive_within(max, POLL).await
    }

    async fn receive_within(&mut self, max: usize, wait: Duration) -> Result<Vec<RabbitDelivery>> {
        let queue = self.config.queue.clone();
        let unsettled = Arc::clone(&self.unsettled);
        let consumer = self.consumer().await?;
        let first = if wait.is_zero() {
            match consumer.next().now_or_never() {
                Some(first) => first,
                None => return Ok(Vec::new()),
            }
        } else {
            match tokio::time::timeout(wait, consumer.next()).await {
                Err(_elapsed) => return Ok(Vec::new()),
                Ok(first) => first,
            }
        };
        let mut received = vec![delivered(first, &queue)?];
        while received.len() < max {
            match consumer.next().now_or_never() {
                Some(next) => received.push(delivered(next, &queue)?),
                None => break,
            }
        }
        let mut tags = unsettled.lock().await;
        tags.extend(received.iter().map(|delivery| delivery.delivery_tag));
        drop(tags);
        Ok(received
            .into_iter()
            .map(|delivery| RabbitDelivery {
                delivery,
                unsettled: Arc::clone(&unsettled),
            })
            .collect())
    }

    async fn close(self) {
        if let Some(consumer) = &self.consumer
            && let Err(error) = self
                .channel
                .basic_cancel(consumer.tag(), BasicCancelOptions::default())
                .await
        {
            tracing::debug!(%error, "cancelling the consumer failed");
        }
        // Closing the connection requeues every message still unacknowledged.
        if let Err(error) = self.connection.close(200, "consumer stopped".into()).await {
            tracing::debug!(%error, "closing the connection failed");
        }
    }
}

fn delivered(
    next: Option<lapin::Result<lapin::message::Delivery>>,
    queue: &str,
) -> Result<lapin::message::Delivery> {
    match next {
        Some(Ok(delivery)) => Ok(delivery),
        Some(Err(error)) => Err(broker_error(format!("receive from `{queue}`"), error)),
        None => Err(Error::Broker {
            broker: BROKER,
            action: format!("receive from `{queue}`"),
            source: "the broker cancelled the consumer (the queue was deleted?)".into(),
        }),
    }
}

/// A message from a [`RabbitSource`].
pub struct RabbitDelivery {
    delivery: lapin::message::Delivery,
    unsettled: Unsettled,
}

impl RabbitDelivery {
    /// The broker's delivery count: RabbitMQ quorum queues put `x-delivery-count` on every
    /// delivery after the first; a classic queue only says whether it was redelivered.
    fn delivery_count(&self) -> u32 {
        let counted = self
            .delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|headers| headers.inner().get("x-delivery-count"))
            .and_then(integer);
        match counted {
            Some(count) => u32::try_from(count).unwrap_or(u32::MAX - 1),
            None => u32::from(self.delivery.redelivered),
        }
    }
}

fn integer(value: &AMQPValue) -> Option<i64> {
    Some(match value {
        AMQPValue::ShortShortInt(n) => i64::from(*n),
        AMQPValue::ShortShortUInt(n) => i64::from(*n),
        AMQPValue::ShortInt(n) => i64::from(*n),
        AMQPValue::ShortUInt(n) => i64::from(*n),
        AMQPValue::LongInt(n) => i64::from(*n),
        AMQPValue::LongUInt(n) => i64::from(*n),
        AMQPValue::LongLongInt(n) => *n,
        _ => return None,
    })
}

impl Delivery for RabbitDelivery {
    fn body(&self) -> &[u8] {
        &self.delivery.data
    }

    fn attempt(&self) -> u32 {
        self.delivery_count().saturating_add(1)
    }

    async fn ack(self) -> Result<()> {
        let mut unsettled = self.unsettled.lock().await;
        let acked = self.delivery.acker.ack(BasicAckOptions::default()).await;
        unsettled.remove(&self.delivery.delivery_tag);
        acked
            .map(drop)
            .map_err(|error| broker_error("ack a message".into(), error))
    }

    async fn ack_all(deliveries: Vec<Self>) -> Result<()> {
        let Some(last) = deliveries
            .iter()
            .max_by_key(|delivery| delivery.delivery.delivery_tag)
        else {
            return Ok(());
        };
        let unsettled = Arc::clone(&last.unsettled);
        if deliveries
            .iter()
            .any(|delivery| !Arc::ptr_eq(&delivery.unsettled, &unsettled))
        {
            // From several channels: each tag means something on its own channel only.
            let mut failed = None;
            for delivery in deliveries {
                if let Err(error) = delivery.ack().await {
                    failed.get_or_insert(error);
                }
            }
            return failed.map_or(Ok(()), Err);
        }
        let tags: BTreeSet<u64> = deliveries
            .iter()
            .map(|delivery| delivery.delivery.delivery_tag)
            .collect();
        let top = last.delivery.delivery_tag;
        let mut held = unsettled.lock().await;
        // One ack with `multiple` settles every tag up to `top` on the channel: only when
        // those are exactly the batch's own.
        let acked = if tags.len() > 1 && held.range(..=top).eq(tags.iter()) {
            last.delivery
                .acker
                .ack(BasicAckOptions { multiple: true })
                .await
                .map(drop)
        } else {
            let mut acked = Ok(());
            for delivery in &deliveries {
                let one = delivery
                    .delivery
                    .acker
                    .ack(BasicAckOptions::default())
                    .await;
                if let (Err(error), Ok(())) = (one, &acked) {
                    acked = Err(error);
                }
            }
            acked
        };
        for tag in &tags {
            held.remove(tag);
        }
        acked.map_err(|error| broker_error("ack a batch of messages".into(), error))
    }

    async fn retry(self, delay: Duration) -> Result<()> {
        // RabbitMQ has no delayed requeue: the message is held for the delay, then requeued.
        tokio::time::sleep(delay).await;
        // `basic.reject`, not `basic.nack`: RabbitMQ 4.x quorum queues stopped counting a
        // `basic.nack` with requeue in the delivery count (a nack now means "not processed",
        // a reject "processing failed"), so a message that kept failing would be requeued
        // forever, never reaching `x-delivery-limit` nor the consumer's own `max_deliveries`
        // check. A requeued `basic.reject` is counted on every version.
        let mut unsettled = self.unsettled.lock().await;
        let rejected = self
            .delivery
            .acker
            .reject(BasicRejectOptions { requeue: true })
            .await;
        unsettled.remove(&self.delivery.delivery_tag);
        rejected
            .map(drop)
            .map_err(|error| broker_error("requeue a message".into(), error))
    }

    async fn dead_letter(self, reason: String) -> Result<()> {
        // The broker moves it to the dead-letter exchange, with `x-death` saying it was
        // rejected; the reason itself is in the consumer's log.
        tracing::debug!(reason, "rejecting the message to its dead-letter exchange");
        let mut unsettled = self.unsettled.lock().await;
        let rejected = self
            .delivery
            .acker
            .reject(BasicRejectOptions { requeue: false })
            .await;
        unsettled.remove(&self.delivery.delivery_tag);
        rejected
            .map(drop)
            .map_err(|error| broker_error("dead-letter a message".into(), error))
    }

    async fn progress(&self) -> Result<()> {
        Ok(())
    }
}

/// Publishes to RabbitMQ with publisher confirms: the outbox's [`Sink`], and a producer of
/// job [`Envelope`]s.
///
/// As a sink, each outbox message goes to the configured exchange with its topic as routing
/// key (with the default exchange `""`, the topic is the queue's name). The body is the
/// payload as JSON; the `message_id` property is the [message id](crate::outbox::MessageId)
/// (and the [`MESSAGE_ID_HEADER`] header, when the id is longer than the property's 255 bytes);
/// the message is persistent and published `mandatory`, so a message no queue takes is
/// retried instead of being confirmed into the void.
///
/// | the broker | what the relay does |
/// |---|---|
/// | confirms (`basic.ack`) | delivered: marks the message sent |
/// | returns it unroutable, nacks it, no confirm within 10 s, connection lost | retries after a backoff |
///
/// ```no_run
/// use jobguard::broker::rabbitmq::RabbitSink;
/// use jobguard::outbox::{Outbox, Relay};
///
/// # async fn f(pool: sqlx::PgPool) -> jobguard::Result<()> {
/// // Messages on topic `invoices` go to the queue `invoices`.
/// let sink = RabbitSink::connect("amqp://127.0.0.1:5672", "").await?;
/// let report = Relay::new(Outbox::new(pool), sink).drain().await?;
/// assert_eq!(report.dead, 0);
/// # Ok(()) }
/// ```
pub struct RabbitSink {
    connection: Connection,
    channel: tokio::sync::Mutex<Channel>,
    exchange: ShortString,
}

impl RabbitSink {
    /// Connects to `url` and publishes to `exchange` (`""` for the default exchange).
    pub async fn connect(url: &str, exchange: &str) -> Result<Self> {
        let connection = connect(url).await?;
        let channel = confirming(&connection).await?;
        Ok(RabbitSink {
            connection,
            channel: tokio::sync::Mutex::new(channel),
            exchange: short(exchange, "exchange name")?,
        })
    }

    /// Publishes a job's envelope to `routing_key` (with the default exchange, a queue's name),
    /// with the job key as `message_id`, and waits for the broker's confirm.
    pub async fn publish(&self, routing_key: &str, envelope: &Envelope) -> Result<()> {
        let properties = properties(envelope.key.as_str());
        self.send(routing_key, &envelope.to_bytes(), properties)
            .await
            .map_err(|error| Error::Broker {
                broker: BROKER,
                action: format!("publish job `{}` to `{routing_key}`", envelope.key),
                source: Box::new(error),
            })
    }

    /// Closes the connection.
    pub async fn close(self) {
        let _ = self.connection.close(200, "publisher stopped".into()).await;
    }

    async fn send(
        &self,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> std::result::Result<(), SinkError> {
        let routing_key = ShortString::try_new(routing_key).map_err(|error| {
            SinkError::permanent("the routing key is over 255 bytes").with_source(error)
        })?;
        let channel = self.channel().await?;
        let publishing = async {
            let confirm = channel
                .basic_publish(
                    self.exchange.clone(),
                    routing_key.clone(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    body,
                    properties,
                )
                .await?;
            confirm.await
        };
        let confirmation = tokio::time::timeout(CONFIRM_TIMEOUT, publishing)
            .await
            .map_err(|_| SinkError::retryable("RabbitMQ did not confirm the message within 10s"))?
            .map_err(|error| {
                SinkError::retryable("publishing to RabbitMQ failed").with_source(error)
            })?;
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_returned)) => Err(SinkError::retryable(format!(
                "no queue is bound to routing key `{routing_key}` on exchange `{}`: the message was \
                 returned",
                self.exchange
            ))),
            Confirmation::Nack(_) => Err(SinkError::retryable(
                "RabbitMQ refused (nacked) the message",
            )),
            Confirmation::NotRequested => Err(SinkError::retryable(
                "the channel is not in confirm mode, so delivery cannot be known",
            )),
        }
    }

    /// The publishing channel, reopened when a failure closed it.
    async fn channel(&self) -> std::result::Result<Channel, SinkError> {
        let mut channel = self.channel.lock().await;
        if !channel.status().connected() {
            *channel = confirming(&self.connection).await.map_err(|error| {
                SinkError::retryable("cannot reopen the publishing channel").with_source(error)
            })?;
        }
        Ok(channel.clone())
    }
}

impl Sink for RabbitSink {
    async fn deliver(&self, message: &OutboxMessage) -> std::result::Result<(), SinkError> {
        let body = serde_json::to_vec(&message.payload)
            .map_err(|error| SinkError::permanent("the payload is not JSON").with_source(error))?;
        self.send(&message.topic, &body, properties(message.id.as_str()))
            .await
    }
}

/// Persistent JSON with `id` as `message_id`, or in [`MESSAGE_ID_HEADER`] when it is too long
/// for the property.
fn properties(id: &str) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        MESSAGE_ID_HEADER.into(),
        AMQPValue::LongString(LongString::from(id)),
    );
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_headers(headers);
    match ShortString::try_new(id) {
        Ok(id) => properties.with_message_id(id),
        Err(_) => properties,
    }
}

async fn connect(url: &str) -> Result<Connection> {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .map_err(|error| {
            broker_error(
                format!("connect to {} (is RabbitMQ running there?)", redact(url)),
                error,
            )
        })
}

async fn confirming(connection: &Connection) -> Result<Channel> {
    let channel = connection
        .create_channel()
        .await
        .map_err(|error| broker_error("open a channel".into(), error))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|error| broker_error("enable publisher confirms".into(), error))?;
    Ok(channel)
}

fn short(name: &str, what: &str) -> Result<ShortString> {
    ShortString::try_new(name).map_err(|error| Error::Broker {
        broker: BROKER,
        action: format!("use the {what} `{name}`"),
        source: Box::new(error),
    })
}

fn broker_error(action: String, error: lapin::Error) -> Error {
    Error::Broker {
        broker: BROKER,
        action,
        source: Box::new(error),
    }
}
