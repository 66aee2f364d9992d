//! The brokers `jobguard consume` runs jobs from (RabbitMQ, NATS JetStream, Redis Streams,
//! Amazon SQS, Kafka): which one, where, one source and delivery type over all but Kafka, and
//! how a consumer runs on each ([`Endpoint::run`]: Kafka's stores its offsets with the effects).

use std::time::Duration;

use anyhow::Context as _;
use clap::ValueEnum;
use jobguard::Backend;
use jobguard::broker::kafka::{self, BelowLogStart, KafkaConfig, PastLogEnd};
use jobguard::broker::nats::{self, NatsConfig, NatsDelivery, NatsSource};
use jobguard::broker::rabbitmq::{self, RabbitConfig, RabbitDelivery, RabbitSource};
use jobguard::broker::redis::{self, RedisConfig, RedisDelivery, RedisSource};
use jobguard::broker::sqs::{self, SqsConfig, SqsDelivery, SqsSource};
use jobguard::broker::{Consumer, ConsumerStats, Delivery, Source};
use serde::Serialize;

use crate::database::redact;

/// Where `jobguard consume` and the demo find the broker unless told otherwise.
pub const URL_ENV: &str = "JOBGUARD_BROKER_URL";

/// A broker to consume from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Broker {
    /// RabbitMQ on amqp://127.0.0.1:5672.
    Rabbitmq,
    /// NATS JetStream on nats://127.0.0.1:4222.
    Nats,
    /// Redis Streams on redis://127.0.0.1:6379.
    Redis,
    /// Amazon SQS, or a local server such as moto's on http://127.0.0.1:9324.
    Sqs,
    /// Kafka on kafka://127.0.0.1:9092.
    Kafka,
}

impl Broker {
    /// The broker's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Broker::Rabbitmq => "rabbitmq",
            Broker::Nats => "nats",
            Broker::Redis => "redis",
            Broker::Sqs => "sqs",
            Broker::Kafka => "kafka",
        }
    }

    /// Where the broker listens on this machine by default.
    pub fn default_url(self) -> &'static str {
        match self {
            Broker::Rabbitmq => "amqp://127.0.0.1:5672",
            Broker::Nats => "nats://127.0.0.1:4222",
            Broker::Redis => "redis://127.0.0.1:6379",
            Broker::Sqs => "http://127.0.0.1:9324",
            Broker::Kafka => "kafka://127.0.0.1:9092",
        }
    }

    /// The broker's name in prose.
    pub fn title(self) -> &'static str {
        match self {
            Broker::Rabbitmq => "RabbitMQ",
            Broker::Nats => "NATS JetStream",
            Broker::Redis => "Redis Streams",
            Broker::Sqs => "Amazon SQS",
            Broker::Kafka => "Kafka",
        }
    }
}

/// A queue on a broker and how a consumer takes from it.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub broker: Broker,
    pub url: String,
    /// The RabbitMQ queue, the NATS subject (its stream named after it in capitals), the
    /// Redis stream, the SQS queue (named so with `.` as `-`), or the Kafka topic (its group
    /// `jobguard.<topic>`).
    pub queue: String,
    pub prefetch: usize,
    pub max_deliveries: u32,
    /// NATS AckWait; the Redis claim threshold; the SQS visibility timeout. RabbitMQ
    /// redelivers when the connection drops.
    pub redelivery: Duration,
    /// Kafka: what a partition whose stored offset its log no longer holds does.
    pub offsets: OffsetPolicy,
}

/// What a Kafka consumer does with a partition whose stored offset is outside its log: below
/// its start (retention or deleted records took the messages) or past its end (the topic was
/// made again under its name). Either case is logged as an error and counted.
#[derive(Clone, Copy, Debug, Default)]
pub struct OffsetPolicy {
    /// Below the log start: resume there (the default), or stop with an error.
    pub below_log_start: BelowLogStart,
    /// Past the log end: stop with an error (the default), or reset to the log start.
    pub past_log_end: PastLogEnd,
}

impl Endpoint {
    fn rabbitmq(&self) -> RabbitConfig {
        RabbitConfig {
            prefetch: u16::try_from(self.prefetch).unwrap_or(u16::MAX),
            max_deliveries: self.max_deliveries,
            ..RabbitConfig::new(self.queue.clone())
        }
    }

    fn nats(&self) -> NatsConfig {
        let stream: String = self
            .queue
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect();
        NatsConfig {
            prefetch: self.prefetch,
            max_deliveries: self.max_deliveries,
            ack_wait: self.redelivery,
            ..NatsConfig::new(stream, self.queue.clone())
        }
    }

    fn redis(&self) -> RedisConfig {
        RedisConfig {
            prefetch: self.prefetch,
            max_deliveries: self.max_deliveries,
            claim_idle: self.redelivery,
            ..RedisConfig::new(self.queue.clone())
        }
    }

    fn sqs(&self) -> SqsConfig {
        SqsConfig {
            prefetch: self.prefetch,
            max_deliveries: self.max_deliveries,
            visibility_timeout: self.redelivery,
            ..SqsConfig::new(sqs::queue_name(&self.queue))
        }
    }

    /// The queue's name on the broker: the SQS queue's with `.` as `-`, else as given.
    pub fn queue_on_broker(&self) -> String {
        match self.broker {
            Broker::Sqs => sqs::queue_name(&self.queue),
            _ => self.queue.clone(),
        }
    }

    /// The Kafka topic's consumer: its group is `jobguard.<topic>`, it runs `prefetch`
    /// partitions at once, and its session lasts `redelivery`, at least 6 s.
    pub fn kafka(&self) -> KafkaConfig {
        KafkaConfig {
            group: format!("jobguard.{}", self.queue),
            concurrency: self.prefetch,
            max_deliveries: self.max_deliveries,
            // Brokers refuse sessions under 6 s by default (group.min.session.timeout.ms).
            session_timeout: self.redelivery.max(Duration::from_secs(6)),
            below_log_start: self.offsets.below_log_start,
            past_log_end: self.offsets.past_log_end,
            ..KafkaConfig::new(self.queue.clone())
        }
    }

    /// Runs `consumer` on the queue, declared when missing, until `shutdown` resolves or the
    /// consumer is idle: through [`source`](Self::source), or on Kafka with its offsets stored
    /// in the consumer's database.
    pub async fn run<DB: Backend>(
        &self,
        consumer: Consumer<DB>,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> anyhow::Result<ConsumerStats> {
        if self.broker == Broker::Kafka {
            let source = consumer
                .kafka_source(&self.url, self.kafka())
                .await
                .with_context(|| self.cannot_consume())?;
            return Ok(consumer.run_kafka(source, shutdown).await?);
        }
        let source = self.subscribe().await?;
        Ok(consumer.run(source, shutdown).await?)
    }

    fn cannot_consume(&self) -> String {
        format!(
            "cannot consume `{}` from {} at {}",
            self.queue_on_broker(),
            self.broker.name(),
            redact(&self.url)
        )
    }

    /// Declares the queue (and its dead letters) when missing, so that what is published
    /// before a consumer starts waits in it.
    pub async fn declare(&self) -> anyhow::Result<()> {
        if self.broker == Broker::Kafka {
            kafka::declare(&self.url, &self.kafka())
                .await
                .with_context(|| self.cannot_consume())?;
        } else {
            drop(self.subscribe().await?);
        }
        Ok(())
    }

    /// A source on the queue, which is declared when missing; it consumes from its first
    /// receive. Kafka has none: its consumer runs through [`run`](Self::run).
    pub async fn source(&self) -> anyhow::Result<BrokerSource> {
        Ok(match self.broker {
            Broker::Kafka => anyhow::bail!(
                "a Kafka consumer stores its offsets in the database: it runs through Endpoint::run"
            ),
            Broker::Rabbitmq => BrokerSource::Rabbitmq(Box::new(
                RabbitSource::connect(&self.url, self.rabbitmq()).await?,
            )),
            Broker::Nats => {
                BrokerSource::Nats(Box::new(NatsSource::connect(&self.url, self.nats()).await?))
            }
            Broker::Redis => BrokerSource::Redis(Box::new(
                RedisSource::connect(&self.url, self.redis()).await?,
            )),
            Broker::Sqs => {
                BrokerSource::Sqs(Box::new(SqsSource::connect(&self.url, self.sqs()).await?))
            }
        })
    }

    /// [`source`](Self::source), with an error that names the queue and the broker.
    pub async fn subscribe(&self) -> anyhow::Result<BrokerSource> {
        self.source().await.with_context(|| self.cannot_consume())
    }

    /// Deletes the queue and its dead letters.
    pub async fn remove(&self) -> anyhow::Result<()> {
        match self.broker {
            Broker::Rabbitmq => rabbitmq::remove(&self.url, &self.rabbitmq()).await?,
            Broker::Nats => nats::remove(&self.url, &self.nats()).await?,
            Broker::Redis => redis::remove(&self.url, &self.redis()).await?,
            Broker::Sqs => sqs::remove(&self.url, &self.sqs()).await?,
            Broker::Kafka => kafka::remove(&self.url, &self.kafka()).await?,
        }
        Ok(())
    }
}

/// A source on any of the brokers (boxed: their sizes differ by a kilobyte).
pub enum BrokerSource {
    Rabbitmq(Box<RabbitSource>),
    Nats(Box<NatsSource>),
    Redis(Box<RedisSource>),
    Sqs(Box<SqsSource>),
}

/// A message from any of the brokers.
pub enum BrokerDelivery {
    Rabbitmq(RabbitDelivery),
    Nats(NatsDelivery),
    Redis(RedisDelivery),
    Sqs(SqsDelivery),
}

/// Runs the same expression on whichever broker's value `$value` holds.
macro_rules! each {
    ($value:expr, $enum:ident, $inner:ident => $body:expr) => {
        match $value {
            $enum::Rabbitmq($inner) => $body,
            $enum::Nats($inner) => $body,
            $enum::Redis($inner) => $body,
            $enum::Sqs($inner) => $body,
        }
    };
}

impl Source for BrokerSource {
    type Delivery = BrokerDelivery;

    fn broker(&self) -> &'static str {
        each!(self, BrokerSource, source => source.broker())
    }

    fn prefetch(&self) -> usize {
        each!(self, BrokerSource, source => source.prefetch())
    }

    fn max_deliveries(&self) -> u32 {
        each!(self, BrokerSource, source => source.max_deliveries())
    }

    fn progress_interval(&self) -> Option<Duration> {
        each!(self, BrokerSource, source => source.progress_interval())
    }

    async fn receive(&mut self, max: usize) -> jobguard::Result<Vec<BrokerDelivery>> {
        Ok(match self {
            BrokerSource::Rabbitmq(source) => source
                .receive(max)
                .await?
                .into_iter()
                .map(BrokerDelivery::Rabbitmq)
                .collect(),
            BrokerSource::Nats(source) => source
                .receive(max)
                .await?
                .into_iter()
                .map(BrokerDelivery::Nats)
                .collect(),
            BrokerSource::Redis(source) => source
                .receive(max)
                .await?
                .into_iter()
                .map(BrokerDelivery::Redis)
                .collect(),
            BrokerSource::Sqs(source) => source
                .receive(max)
                .await?
                .into_iter()
                .map(BrokerDelivery::Sqs)
                .collect(),
        })
    }

    async fn receive_within(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> jobguard::Result<Vec<BrokerDelivery>> {
        Ok(match self {
            BrokerSource::Rabbitmq(source) => source
                .receive_within(max, wait)
                .await?
                .into_iter()
                .map(BrokerDelivery::Rabbitmq)
                .collect(),
            BrokerSource::Nats(source) => source
                .receive_within(max, wait)
                .await?
                .into_iter()
                .map(BrokerDelivery::Nats)
                .collect(),
            BrokerSource::Redis(source) => source
                .receive_within(max, wait)
                .await?
                .into_iter()
                .map(BrokerDelivery::Redis)
                .collect(),
            BrokerSource::Sqs(source) => source
                .receive_within(max, wait)
                .await?
                .into_iter()
                .map(BrokerDelivery::Sqs)
                .collect(),
        })
    }

    async fn close(self) {
        each!(self, BrokerSource, source => (*source).close().await)
    }
}

impl Delivery for BrokerDelivery {
    fn body(&self) -> &[u8] {
        each!(self, BrokerDelivery, delivery => delivery.body())
    }

    fn attempt(&self) -> u32 {
        each!(self, BrokerDelivery, delivery => delivery.attempt())
    }

    async fn ack(self) -> jobguard::Result<()> {
        each!(self, BrokerDelivery, delivery => delivery.ack().await)
    }

    async fn retry(self, delay: Duration) -> jobguard::Result<()> {
        each!(self, BrokerDelivery, delivery => delivery.retry(delay).await)
    }

    async fn dead_letter(self, reason: String) -> jobguard::Result<()> {
        each!(self, BrokerDelivery, delivery => delivery.dead_letter(reason).await)
    }

    async fn progress(&self) -> jobguard::Result<()> {
        each!(self, BrokerDelivery, delivery => delivery.progress().await)
    }

    fn order_group(&self) -> Option<&str> {
        each!(self, BrokerDelivery, delivery => delivery.order_group())
    }

    async fn ack_all(deliveries: Vec<Self>) -> jobguard::Result<()> {
        // A batch comes from one source, so from one broker: handed to that broker whole.
        let mut rabbitmq = Vec::new();
        let mut nats = Vec::new();
        let mut redis = Vec::new();
        let mut sqs = Vec::new();
        for delivery in deliveries {
            match delivery {
                BrokerDelivery::Rabbitmq(delivery) => rabbitmq.push(delivery),
                BrokerDelivery::Nats(delivery) => nats.push(delivery),
                BrokerDelivery::Redis(delivery) => redis.push(delivery),
                BrokerDelivery::Sqs(delivery) => sqs.push(delivery),
            }
        }
        let acked = [
            Delivery::ack_all(rabbitmq).await,
            Delivery::ack_all(nats).await,
            Delivery::ack_all(redis).await,
            Delivery::ack_all(sqs).await,
        ];
        acked.into_iter().collect()
    }
}
