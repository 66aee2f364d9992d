//! The broker consumers and outbox sinks against real RabbitMQ, NATS JetStream, Redis, SQS
//! (moto's server) and Kafka (tansu): the consumer suite (`consumer.rs`) runs once per broker and database
//! backend, and the outbox tests once per broker.
//!
//! Each broker's URL comes from `JOBGUARD_TEST_AMQP_URL`, `JOBGUARD_TEST_NATS_URL`,
//! `JOBGUARD_TEST_REDIS_URL`, `JOBGUARD_TEST_SQS_URL` or `JOBGUARD_TEST_KAFKA_URL` (scripts/test
//! sets them), else the broker's default port on 127.0.0.1 (`jobguard_testsupport::Broker`).
//! A broker that does not answer skips its tests with a message, except with `CI=true`, where
//! it fails them. Every test uses queues, streams and subjects of its own.

use std::future::Future;
use std::time::Duration;

use jobguard::broker::nats::{NatsConfig, NatsSink, NatsSource};
use jobguard::broker::rabbitmq::{RabbitConfig, RabbitSink, RabbitSource};
use jobguard::broker::redis::{RedisConfig, RedisSink, RedisSource};
use jobguard::broker::{Consumer, ConsumerStats, Envelope};
use jobguard::outbox::{Outbox, Relay, Sink};
use jobguard::{Guard, JobError, JobKey, MessageId};
use jobguard_testsupport::Broker;
use serde_json::{Value, json};
use sqlx::Sqlite;

use crate::common::TestDb;

use self::kafka::Kafka;

/// How a test wants its source set up.
#[derive(Clone, Copy, Debug)]
struct Settings {
    prefetch: usize,
    max_deliveries: u32,
    /// NATS AckWait, Redis claim threshold, SQS visibility timeout.
    redelivery: Duration,
    /// Kafka: the topic's partitions, when [`TestBroker::prepare`] makes it; publishing into
    /// a topic not prepared makes it with one.
    partitions: i32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            prefetch: 10,
            max_deliveries: 3,
            redelivery: Duration::from_secs(1),
            partitions: 3,
        }
    }
}

/// A real broker, as the suite uses it.
trait TestBroker {
    /// Which broker of the matrix this is: its name, where it is found.
    const BROKER: Broker;

    const NAME: &'static str = Self::BROKER.name();

    /// Whether a message whose effect committed and whose acknowledgement never came is
    /// delivered again (then as a duplicate). Kafka resumes after the offset stored with the
    /// effect, so it does not deliver it again at all.
    const REDELIVERS_COMMITTED: bool = Self::BROKER.redelivers_committed();

    /// The URL of a broker that answers, or `None` to skip.
    fn url() -> Option<String> {
        Self::BROKER.url()
    }

    /// Deletes the test's queue or stream and its dead letters.
    fn reset(url: &str, name: &str) -> impl Future<Output = ()> + Send;

    /// Runs `consumer` on the test's queue or stream, declared when missing, until `stop`
    /// resolves or the consumer is idle.
    fn run<DB: TestDb>(
        consumer: Consumer<DB>,
        url: &str,
        name: &str,
        settings: Settings,
        stop: impl Future<Output = ()> + Send,
    ) -> impl Future<Output = jobguard::Result<ConsumerStats>>;

    /// Makes the test's queue or stream ready before anything is published (Kafka: a topic
    /// with `settings.partitions` partitions); by default, publishing makes it.
    fn prepare(url: &str, name: &str, settings: Settings) -> impl Future<Output = ()> {
        let _ = (url, name, settings);
        async {}
    }

    /// Publishes a raw body to the test's queue or stream.
    fn publish(url: &str, name: &str, bodies: Vec<Vec<u8>>) -> impl Future<Output = ()>;

    /// The bodies in the test's dead letters.
    fn dead_letters(url: &str, name: &str) -> impl Future<Output = Vec<Vec<u8>>>;

    /// Messages still in the test's queue or stream, unsettled: waiting, delivered and not
    /// acknowledged, or (NATS) out of deliveries and never removed.
    fn left_behind(url: &str, name: &str) -> impl Future<Output = u64>;

    /// The outbox sink.
    type Sink: Sink + Publish;

    /// Whether the sink stores a message published twice with one id once.
    const DEDUPES: bool;

    fn sink(url: &str) -> impl Future<Output = Self::Sink>;

    /// Makes `topic` empty and ready to receive.
    fn prepare_topic(url: &str, topic: &str) -> impl Future<Output = ()>;

    /// What arrived on `topic`: each message's id and JSON body.
    fn received(url: &str, topic: &str) -> impl Future<Output = Vec<(String, Value)>>;
}

/// The sinks' `publish` of job envelopes, under one name.
trait Publish {
    fn publish_envelope(&self, to: &str, envelope: &Envelope) -> impl Future<Output = ()>;
}

/// [`Publish`] for sinks whose own `publish(to, envelope)` takes the topic as it is.
macro_rules! publish_as_is {
    ($($sink:ty),+) => {$(
        impl Publish for $sink {
            async fn publish_envelope(&self, to: &str, envelope: &Envelope) {
                self.publish(to, envelope).await.expect("publish");
            }
        }
    )+};
}

publish_as_is!(
    RabbitSink,
    NatsSink,
    RedisSink,
    jobguard::broker::kafka::KafkaSink
);

struct Rabbit;

impl Rabbit {
    /// A source on the test's queue or stream, declared when missing.
    async fn source(url: &str, name: &str, settings: Settings) -> RabbitSource {
        let config = RabbitConfig {
            prefetch: settings.prefetch as u16,
            max_deliveries: settings.max_deliveries,
            ..RabbitConfig::new(Self::queue(name))
        };
        RabbitSource::connect(url, config)
            .await
            .expect("consume from RabbitMQ")
    }

    fn queue(name: &str) -> String {
        format!("jg-test-{name}")
    }

    async fn channel(url: &str) -> (lapin::Connection, lapin::Channel) {
        let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
            .await
            .expect("connect to RabbitMQ");
        let channel = connection.create_channel().await.expect("a channel");
        (connection, channel)
    }
}

impl TestBroker for Rabbit {
    const BROKER: Broker = Broker::Rabbitmq;

    async fn reset(url: &str, name: &str) {
        use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
        let (connection, channel) = Self::channel(url).await;
        let queue = Self::queue(name);
        let dead = RabbitConfig::new(queue.clone()).dead_letters();
        for queue in [&queue, &dead] {
            channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await
                .expect("delete a queue");
        }
        channel
            .exchange_delete(dead.as_str().into(), ExchangeDeleteOptions::default())
            .await
            .expect("delete the dead-letter exchange");
        let _ = connection.close(200, "reset".into()).await;
    }

    async fn run<DB: TestDb>(
        consumer: Consumer<DB>,
        url: &str,
        name: &str,
        settings: Settings,
        stop: impl Future<Output = ()> + Send,
    ) -> jobguard::Result<ConsumerStats> {
        consumer
            .run(Self::source(url, name, settings).await, stop)
            .await
    }

    async fn publish(url: &str, name: &str, bodies: Vec<Vec<u8>>) {
        use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
        let (connection, channel) = Self::channel(url).await;
        // The queue as the test's sources declare it, so that messages published first wait.
        let config = RabbitConfig {
            max_deliveries: Settings::default().max_deliveries,
            ..RabbitConfig::new(Self::queue(name))
        };
        jobguard::broker::rabbitmq::declare(&channel, &config)
            .await
            .expect("declare the queue");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        for body in bodies {
            let confirm = channel
                .basic_publish(
                    "".into(),
                    Self::queue(name).into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &body,
                    lapin::BasicProperties::default(),
                )
                .await
                .expect("publish")
                .await
                .expect("a confirm");
            assert_eq!(confirm, lapin::Confirmation::Ack(None), "not routed");
        }
        let _ = connection.close(200, "published".into()).await;
    }

    async fn dead_letters(url: &str, name: &str) -> Vec<Vec<u8>> {
        use lapin::options::{BasicAckOptions, BasicGetOptions};
        let (connection, channel) = Self::channel(url).await;
        let dead = RabbitConfig::new(Self::queue(name)).dead_letters();
        let mut bodies = Vec::new();
        while let Some(message) = channel
            .basic_get(dead.as_str().into(), BasicGetOptions::default())
            .await
            .expect("get a dead letter")
        {
            message
                .delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .expect("ack");
            bodies.push(message.delivery.data);
        }
        let _ = connection.close(200, "read".into()).await;
        bodies
    }

    async fn left_behind(url: &str, name: &str) -> u64 {
        use lapin::options::QueueDeclareOptions;
        let (connection, channel) = Self::channel(url).await;
        let queue = channel
            .queue_declare(
                Self::queue(name).into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await
            .expect("the queue");
        let _ = connection.close(200, "counted".into()).await;
        u64::from(queue.message_count())
    }

    type Sink = RabbitSink;
    const DEDUPES: bool = false;

    async fn sink(url: &str) -> RabbitSink {
        RabbitSink::connect(url, "")
            .await
            .expect("connect the sink")
    }

    async fn prepare_topic(url: &str, topic: &str) {
        use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
        let (connection, channel) = Self::channel(url).await;
        channel
            .queue_delete(topic.into(), QueueDeleteOptions::default())
            .await
            .expect("delete the queue");
        channel
            .queue_declare(
                topic.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await
            .expect("declare the queue");
        let _ = connection.close(200, "prepared".into()).await;
    }

    async fn received(url: &str, topic: &str) -> Vec<(String, Value)> {
        use lapin::options::{BasicAckOptions, BasicGetOptions};
        let (connection, channel) = Self::channel(url).await;
        let mut received = Vec::new();
        while let Some(message) = channel
            .basic_get(topic.into(), BasicGetOptions::default())
            .await
            .expect("get a message")
        {
            let delivery = message.delivery;
            delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .unwrap();
            let id = delivery
                .properties
                .message_id()
                .as_ref()
                .expect("a message id")
                .to_string();
            received.push((id, serde_json::from_slice(&delivery.data).expect("JSON")));
        }
        let _ = connection.close(200, "read".into()).await;
        received
    }
}

struct Nats;

impl Nats {
    /// A source on the test's queue or stream, declared when missing.
    async fn source(url: &str, name: &str, settings: Settings) -> NatsSource {
        let config = NatsConfig {
            prefetch: settings.prefetch,
            max_deliveries: settings.max_deliveries,
            ack_wait: settings.redelivery,
            ..Self::config(name)
        };
        NatsSource::connect(url, config)
            .await
            .expect("consume from NATS")
    }

    fn config(name: &str) -> NatsConfig {
        let token = name.replace(['-', '.'], "_");
        NatsConfig::new(
            format!("JG_TEST_{}", token.to_uppercase()),
            format!("jg.test.{token}"),
        )
    }

    fn topic_stream(topic: &str) -> String {
        topic.replace('.', "_").to_uppercase()
    }

    async fn context(url: &str) -> async_nats::jetstream::Context {
        let client = async_nats::connect(url).await.expect("connect to NATS");
        async_nats::jetstream::new(client)
    }
}

impl TestBroker for Nats {
    const BROKER: Broker = Broker::Nats;

    async fn reset(url: &str, name: &str) {
        let context = Self::context(url).await;
        let config = Self::config(name);
        for stream in [config.stream.clone(), config.dead_letter_stream()] {
            let _ = context.delete_stream(&stream).await;
        }
    }

    async fn run<DB: TestDb>(
        consumer: Consumer<DB>,
        url: &str,
        name: &str,
        settings: Settings,
        stop: impl Future<Output = ()> + Send,
    ) -> jobguard::Result<ConsumerStats> {
        consumer
            .run(Self::source(url, name, settings).await, stop)
            .await
    }

    async fn publish(url: &str, name: &str, bodies: Vec<Vec<u8>>) {
        let context = Self::context(url).await;
        let config = Self::config(name);
        // The stream as the sources declare it, so that messages published first wait.
        context
            .get_or_create_stream(async_nats::jetstream::stream::Config {
                name: config.stream.clone(),
                subjects: vec![config.subject.clone()],
                retention: async_nats::jetstream::stream::RetentionPolicy::WorkQueue,
                ..Default::default()
            })
            .await
            .expect("create the stream");
        for body in bodies {
            context
                .publish(config.subject.clone(), body.into())
                .await
                .expect("publish")
                .await
                .expect("the stream's ack");
        }
    }

    async fn dead_letters(url: &str, name: &str) -> Vec<Vec<u8>> {
        let context = Self::context(url).await;
        let Ok(mut stream) = context
            .get_stream(Self::config(name).dead_letter_stream())
            .await
        else {
            return Vec::new();
        };
        let state = stream.info().await.expect("stream info").state.clone();
        let mut bodies = Vec::new();
        for sequence in state.first_sequence..=state.last_sequence {
            if let Ok(message) = stream.get_raw_message(sequence).await {
                bodies.push(message.payload.to_vec());
            }
        }
        bodies
    }

    async fn left_behind(url: &str, name: &str) -> u64 {
        let context = Self::context(url).await;
        let mut stream = context
            .get_stream(Self::config(name).stream)
            .await
            .expect("the stream");
        // Work-queue retention: a message is removed once acknowledged or terminated.
        stream.info().await.expect("stream info").state.messages
    }

    type Sink = NatsSink;
    const DEDUPES: bool = true;

    async fn sink(url: &str) -> NatsSink {
        NatsSink::connect(url).await.expect("connect the sink")
    }

    async fn prepare_topic(url: &str, topic: &str) {
        let context = Self::context(url).await;
        let stream = Self::topic_stream(topic);
        let _ = context.delete_stream(&stream).await;
        context
            .create_stream(async_nats::jetstream::stream::Config {
                name: stream,
                subjects: vec![topic.to_owned()],
                ..Default::default()
            })
            .await
            .expect("create the stream");
    }

    async fn received(url: &str, topic: &str) -> Vec<(String, Value)> {
        let context = Self::context(url).await;
        let mut stream = context
            .get_stream(Self::topic_stream(topic))
            .await
            .expect("the stream");
        let state = stream.info().await.expect("stream info").state.clone();
        let mut received = Vec::new();
        for sequence in state.first_sequence..=state.last_sequence {
            let Ok(message) = stream.get_raw_message(sequence).await else {
                continue;
            };
            let id = message
                .headers
                .get("Nats-Msg-Id")
                .expect("a Nats-Msg-Id")
                .to_string();
            received.push((id, serde_json::from_slice(&message.payload).expect("JSON")));
        }
        received
    }
}

struct Redis;

impl Redis {
    /// A source on the test's queue or stream, declared when missing.
    async fn source(url: &str, name: &str, settings: Settings) -> RedisSource {
        let config = RedisConfig {
            prefetch: settings.prefetch,
            max_deliveries: settings.max_deliveries,
            claim_idle: settings.redelivery,
            ..Self::config(name)
        };
        RedisSource::connect(url, config)
            .await
            .expect("consume from Redis")
    }

    fn config(name: &str) -> RedisConfig {
        RedisConfig::new(format!("jg:test:{name}"))
    }

    async fn conn(url: &str) -> redis::aio::MultiplexedConnection {
        redis::Client::open(url)
            .expect("a Redis URL")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to Redis")
    }
}

impl TestBroker for Redis {
    const BROKER: Broker = Broker::Redis;

    async fn reset(url: &str, name: &str) {
        let config = Self::config(name);
        let _: i64 = redis::cmd("DEL")
            .arg(&config.stream)
            .arg(&config.dead_letter_stream)
            .query_async(&mut Self::conn(url).await)
            .await
            .expect("delete the streams");
    }

    async fn run<DB: TestDb>(
        consumer: Consumer<DB>,
        url: &str,
        name: &str,
        settings: Settings,
        stop: impl Future<Output = ()> + Send,
    ) -> jobguard::Result<ConsumerStats> {
        consumer
            .run(Self::source(url, name, settings).await, stop)
            .await
    }

    async fn publish(url: &str, name: &str, bodies: Vec<Vec<u8>>) {
        let mut conn = Self::conn(url).await;
        for body in bodies {
            let _: String = redis::cmd("XADD")
                .arg(Self::config(name).stream)
                .arg("*")
                .arg(jobguard::broker::redis::BODY_FIELD)
                .arg(body)
                .query_async(&mut conn)
                .await
                .expect("XADD");
        }
    }

    async fn dead_letters(url: &str, name: &str) -> Vec<Vec<u8>> {
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(Self::config(name).dead_letter_stream)
            .arg("-")
            .arg("+")
            .query_async(&mut Self::conn(url).await)
            .await
            .expect("XRANGE");
        reply
            .ids
            .iter()
            .map(|entry| {
                redis::from_redis_value_ref(&entry.map[jobguard::broker::redis::BODY_FIELD])
                    .expect("a body")
            })
            .collect()
    }

    async fn left_behind(url: &str, name: &str) -> u64 {
        let config = Self::config(name);
        let pending: redis::streams::StreamPendingReply = redis::cmd("XPENDING")
            .arg(&config.stream)
            .arg(&config.group)
            .query_async(&mut Self::conn(url).await)
            .await
            .expect("XPENDING");
        pending.count() as u64
    }

    type Sink = RedisSink;
    const DEDUPES: bool = true;

    async fn sink(url: &str) -> RedisSink {
        RedisSink::connect(url).await.expect("connect the sink")
    }

    async fn prepare_topic(url: &str, topic: &str) {
        let mut conn = Self::conn(url).await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("jobguard:appended:{topic}:*"))
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        let _: i64 = redis::cmd("DEL")
            .arg(topic)
            .arg(keys)
            .query_async(&mut conn)
            .await
            .expect("DEL");
    }

    async fn received(url: &str, topic: &str) -> Vec<(String, Value)> {
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(topic)
            .arg("-")
            .arg("+")
            .query_async(&mut Self::conn(url).await)
            .await
            .expect("XRANGE");
        reply
            .ids
            .iter()
            .map(|entry| {
                let id: String = redis::from_redis_value_ref(&entry.map["id"]).expect("an id");
                let body: Vec<u8> =
                    redis::from_redis_value_ref(&entry.map[jobguard::broker::redis::BODY_FIELD])
                        .expect("a body");
                (id, serde_json::from_slice(&body).expect("JSON"))
            })
            .collect()
    }
}

/// Stamps out one `#[tokio::test]` per broker and database backend over a generic
/// `async fn name<DB: TestDb, Broker: TestBroker>()`: `brokers!(fn name);` gives the tests
/// `name::rabbitmq::postgres`, `name::rabbitmq::sqlite`, and so on for NATS, Redis, SQS and
/// Kafka.
macro_rules! brokers {
    (fn $name:ident) => {
        brokers!(@each $name, Rabbit rabbitmq, Nats nats, Redis redis, Sqs sqs, Kafka kafka);
    };
    (@each $name:ident, $($broker:ident $module:ident),*) => {
        mod $name {
            $(
                jobguard_testsupport::cases!(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $module {
                        postgres => super::super::$name::<sqlx::Postgres, crate::brokers::$broker>(),
                        sqlite => super::super::$name::<sqlx::Sqlite, crate::brokers::$broker>(),
                    }
                );
            )*
        }
    };
}

mod batch;
mod consumer;
mod kafka;
mod kafka_stall;
mod kafka_transactions;
mod nats;
mod rabbitmq;
mod sqs;

use self::sqs::Sqs;

/// The outbox relayed to the broker: a committed job's message arrives with its stable id, a
/// rolled-back job's never does; a job envelope published twice with one id arrives once where
/// the broker deduplicates, and with its id every time.
async fn outbox_to<B: TestBroker>() {
    let Some(url) = B::url() else {
        return;
    };
    let pool = Sqlite::open(&format!("outbox_{}", B::NAME), 4)
        .await
        .expect("a SQLite file");
    let topic = format!("jgtest.outbox.{}", B::NAME);
    B::prepare_topic(&url, &topic).await;
    let guard = Guard::new(pool.clone());
    let outbox = Outbox::new(pool.clone());
    guard.migrate().await.unwrap();
    outbox.migrate().await.unwrap();

    let committed = JobKey::new("invoice", ["order-1"]).unwrap();
    let outcome = guard
        .run(&committed, async |conn| {
            outbox
                .publish_tx(conn, &committed, &topic, &json!({"order": 1}))
                .await?;
            Ok(())
        })
        .await
        .unwrap();
    assert!(outcome.is_applied());
    let rolled_back = JobKey::new("invoice", ["order-2"]).unwrap();
    let failed = guard
        .run(&rolled_back, async |conn| {
            outbox
                .publish_tx(conn, &rolled_back, &topic, &json!({"order": 2}))
                .await?;
            Err::<(), _>(JobError::fatal("the order is void"))
        })
        .await;
    assert!(failed.is_err());

    let report = Relay::new(outbox.clone(), B::sink(&url).await)
        .drain()
        .await
        .unwrap();
    assert_eq!((report.delivered, report.dead), (1, 0), "{report:?}");
    let id = MessageId::new(&committed, &topic).unwrap();
    assert_eq!(
        B::received(&url, &topic).await,
        vec![(id.to_string(), json!({"order": 1}))]
    );

    // A producer publishing one job twice: the same id both times.
    let key = JobKey::new("credit", ["order-3"]).unwrap();
    let envelope = Envelope::new("credit", key.clone(), &json!({"amount": 5})).unwrap();
    let sink = B::sink(&url).await;
    sink.publish_envelope(&topic, &envelope).await;
    sink.publish_envelope(&topic, &envelope).await;
    let copies: Vec<_> = B::received(&url, &topic)
        .await
        .into_iter()
        .filter(|(id, _)| id != id_of_committed(&committed, &topic).as_str())
        .collect();
    assert_eq!(copies.len(), if B::DEDUPES { 1 } else { 2 }, "{copies:?}");
    for (id, body) in copies {
        assert_eq!(id, key.as_str());
        assert_eq!(
            Envelope::from_bytes(&serde_json::to_vec(&body).unwrap()).unwrap(),
            envelope
        );
    }
    pool.close().await;
}

fn id_of_committed(key: &JobKey, topic: &str) -> String {
    MessageId::new(key, topic).unwrap().to_string()
}

jobguard_testsupport::cases!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn outbox_to {
        rabbitmq => super::outbox_to::<super::Rabbit>(),
        nats => super::outbox_to::<super::Nats>(),
        redis => super::outbox_to::<super::Redis>(),
        sqs => super::outbox_to::<super::Sqs>(),
        kafka => super::outbox_to::<super::Kafka>(),
    }
);
