//! Kafka in the broker suite (the [`TestBroker`] the `brokers!` cases run on), and the cases
//! only Kafka has: the offsets stored with the effects, a consumer stopped between its
//! database commit and Kafka's, and a rebalance while a batch runs.
//!
//! Kafka comes from `JOBGUARD_TEST_KAFKA_URL`, else `kafka://127.0.0.1:9092` (scripts/test
//! starts tansu there when nothing answers).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use jobguard::broker::kafka::{
    self, ID_HEADER, KafkaConfig, KafkaSink, PastLogEnd, bootstrap_servers,
};
use jobguard::broker::{Consumer, ConsumerConfig, ConsumerStats, Envelope, Offsets};
use jobguard::{Guard, JobKey, Outcome};
use jobguard_testsupport::Broker;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{Headers as _, Message as _};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use serde_json::Value;

use super::consumer::{Credit, Fixture, effect_runs};
use super::{Settings, TestBroker};
use crate::common::{TestDb, ledger_rows};

pub(super) struct Kafka;

/// A message read back: its `jobguard-id` header, its key and its body.
type ReadBack = (Option<String>, Option<Vec<u8>>, Vec<u8>);

impl Kafka {
    pub(super) fn topic(name: &str) -> String {
        format!("jg-test-{name}")
    }

    pub(super) fn config(name: &str, settings: Settings) -> KafkaConfig {
        KafkaConfig {
            group: Self::topic(name),
            concurrency: settings.prefetch,
            max_deliveries: settings.max_deliveries,
            partitions: settings.partitions,
            session_timeout: Duration::from_secs(6),
            ..KafkaConfig::new(Self::topic(name))
        }
    }

    fn client(url: &str) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set(
            "bootstrap.servers",
            bootstrap_servers(url).expect("a Kafka URL"),
        );
        config
    }

    /// Every message of `topic`, from its first, on a client outside any group.
    fn read_all(url: &str, topic: &str) -> Vec<ReadBack> {
        let consumer: BaseConsumer = Self::client(url)
            .set("group.id", "jobguard-test-reader")
            .set("enable.auto.commit", "false")
            .create()
            .expect("a reader");
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("the topic's metadata");
        let mut messages = Vec::new();
        for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
            let partition = partition.id();
            let (low, high) = consumer
                .fetch_watermarks(topic, partition, Duration::from_secs(10))
                .expect("watermarks");
            if high <= low {
                continue;
            }
            let mut list = TopicPartitionList::new();
            list.add_partition_offset(topic, partition, Offset::Offset(low))
                .unwrap();
            consumer.assign(&list).expect("assign");
            let mut next = low;
            while next < high {
                match consumer.poll(Duration::from_secs(10)) {
                    Some(Ok(message)) if message.partition() == partition => {
                        next = message.offset() + 1;
                        let id = message.headers().and_then(|headers| {
                            headers
                                .iter()
                                .find(|header| header.key == ID_HEADER)
                                .and_then(|header| header.value)
                                .map(|value| String::from_utf8_lossy(value).into_owned())
                        });
                        messages.push((
                            id,
                            message.key().map(<[u8]>::to_vec),
                            message.payload().unwrap_or_default().to_vec(),
                        ));
                    }
                    Some(Ok(_)) => {}
                    Some(Err(error)) => panic!("reading `{topic}`: {error}"),
                    None => panic!("`{topic}` [{partition}] stopped before offset {high}"),
                }
            }
        }
        messages
    }

    /// Where each partition of `topic` ends.
    pub(super) fn high_watermarks(url: &str, topic: &str) -> Vec<(i32, i64)> {
        let consumer: BaseConsumer = Self::client(url).create().expect("a client");
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("the topic's metadata");
        metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions())
            .map(|partition| {
                let (_, high) = consumer
                    .fetch_watermarks(topic, partition.id(), Duration::from_secs(10))
                    .expect("watermarks");
                (partition.id(), high)
            })
            .collect()
    }

    /// The offsets Kafka holds committed for the test's group, by partition.
    fn committed(url: &str, name: &str) -> Vec<(i32, Option<i64>)> {
        let topic = Self::topic(name);
        let consumer: BaseConsumer = Self::client(url)
            .set("group.id", &topic)
            .create()
            .expect("a client");
        let mut list = TopicPartitionList::new();
        for (partition, _) in Self::high_watermarks(url, &topic) {
            list.add_partition(&topic, partition);
        }
        let committed = consumer
            .committed_offsets(list, Duration::from_secs(10))
            .expect("the committed offsets");
        committed
            .elements()
            .iter()
            .map(|element| match element.offset() {
                Offset::Offset(offset) => (element.partition(), Some(offset)),
                _ => (element.partition(), None),
            })
            .collect()
    }
}

impl TestBroker for Kafka {
    const BROKER: Broker = Broker::Kafka;

    async fn reset(url: &str, name: &str) {
        kafka::remove(url, &Self::config(name, Settings::default()))
            .await
            .expect("delete the topics");
    }

    async fn run<DB: TestDb>(
        consumer: Consumer<DB>,
        url: &str,
        name: &str,
        settings: Settings,
        stop: impl Future<Output = ()> + Send,
    ) -> jobguard::Result<ConsumerStats> {
        let source = consumer
            .kafka_source(url, Self::config(name, settings))
            .await?;
        consumer.run_kafka(source, stop).await
    }

    async fn prepare(url: &str, name: &str, settings: Settings) {
        kafka::declare(url, &Self::config(name, settings))
            .await
            .expect("create the topics");
    }

    async fn publish(url: &str, name: &str, bodies: Vec<Vec<u8>>) {
        // A topic not prepared has one partition: the order of the bodies is the order taken.
        let one = Settings {
            partitions: 1,
            ..Settings::default()
        };
        Self::prepare(url, name, one).await;
        let producer: FutureProducer = Self::client(url)
            .set("enable.idempotence", "true")
            .create()
            .expect("a producer");
        let topic = Self::topic(name);
        for body in bodies {
            // Keyed by the job key, as `KafkaSink::publish` does, when the body has one.
            let key = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|value| value.get("key")?.as_str().map(str::to_owned));
            let mut record = FutureRecord::to(&topic).payload(&body);
            if let Some(key) = &key {
                record = record.key(key);
            }
            producer
                .send(record, Duration::from_secs(30))
                .await
                .map_err(|(error, _)| error)
                .expect("produce");
        }
    }

    async fn dead_letters(url: &str, name: &str) -> Vec<Vec<u8>> {
        let topic = Self::config(name, Settings::default()).dead_letter_topic;
        let url = url.to_owned();
        tokio::task::spawn_blocking(move || Self::read_all(&url, &topic))
            .await
            .unwrap()
            .into_iter()
            .map(|(_, _, body)| body)
            .collect()
    }

    async fn left_behind(url: &str, name: &str) -> u64 {
        let (url, name) = (url.to_owned(), name.to_owned());
        tokio::task::spawn_blocking(move || {
            let ends = Self::high_watermarks(&url, &Self::topic(&name));
            let committed = Self::committed(&url, &name);
            ends.iter()
                .map(|(partition, high)| {
                    let done = committed
                        .iter()
                        .find(|(p, _)| p == partition)
                        .and_then(|(_, offset)| *offset)
                        .unwrap_or(0);
                    u64::try_from(high - done).unwrap_or(0)
                })
                .sum()
        })
        .await
        .unwrap()
    }

    type Sink = KafkaSink;
    const DEDUPES: bool = false;

    async fn sink(url: &str) -> KafkaSink {
        KafkaSink::connect(url).expect("connect the sink")
    }

    async fn prepare_topic(url: &str, topic: &str) {
        let config = KafkaConfig {
            partitions: 1,
            ..KafkaConfig::new(topic)
        };
        kafka::remove(url, &config).await.expect("delete the topic");
        kafka::declare(url, &config)
            .await
            .expect("create the topic");
    }

    async fn received(url: &str, topic: &str) -> Vec<(String, Value)> {
        let (url, topic) = (url.to_owned(), topic.to_owned());
        tokio::task::spawn_blocking(move || Self::read_all(&url, &topic))
            .await
            .unwrap()
            .into_iter()
            .map(|(id, key, body)| {
                // Outbox messages carry their id in a header; job envelopes their key.
                let id = id
                    .or_else(|| key.map(|key| String::from_utf8(key).expect("a UTF-8 key")))
                    .expect("an id or a key");
                (id, serde_json::from_slice(&body).expect("JSON"))
            })
            .collect()
    }
}

/// A consumer of `Credit` jobs on `pool`, stopping once idle for `idle`.
pub(super) async fn credit_consumer<DB: TestDb>(
    pool: &sqlx::Pool<DB>,
    idle: Duration,
    batch: usize,
) -> Consumer<DB> {
    let config = ConsumerConfig {
        retry_delay: Duration::from_millis(100),
        shutdown_timeout: Duration::from_secs(10),
        stop_when_idle_for: Some(idle),
        batch_size: batch,
        batch_linger: Duration::from_millis(50),
    };
    let consumer = Consumer::with_config(Guard::new(pool.clone()), config).register::<Credit>();
    consumer.migrate().await.expect("migrate the guard");
    consumer
}

backends!(fn the_offsets_table_holds_where_each_partition_was_applied_to);
/// After a drain, the offsets table holds, for each partition, the end of the partition: every
/// message before it applied (or a duplicate), in the transactions that wrote it.
async fn the_offsets_table_holds_where_each_partition_was_applied_to<DB: TestDb>() {
    let Some(fixture) = Fixture::<DB, Kafka>::new("offsets").await else {
        return;
    };
    let settings = Settings::default();
    fixture.prepare(settings).await;
    let credits: Vec<Credit> = (0..30).map(|n| Credit::new(n, 10)).collect();
    fixture
        .publish(credits.iter().flat_map(|c| [c.body(), c.body()]).collect())
        .await;
    let consumer = credit_consumer(&fixture.pool, Duration::from_secs(2), 1).await;
    let stats = fixture
        .run(consumer, settings, std::future::pending())
        .await;
    assert_eq!((stats.applied, stats.duplicates), (30, 30), "{stats:?}");

    let topic = Kafka::topic(&fixture.name);
    let ends = Kafka::high_watermarks(&fixture.url, &topic);
    assert_eq!(ends.len(), 3, "{ends:?}");
    let stored = Offsets::new(fixture.pool.clone())
        .read(&topic, &topic)
        .await
        .unwrap();
    let expected: std::collections::BTreeMap<i32, i64> =
        ends.into_iter().filter(|(_, end)| *end > 0).collect();
    assert_eq!(stored, expected);
    assert_eq!(ledger_rows(&fixture.pool).await, 30);
    fixture.cleanup().await;
}

backends!(fn a_consumer_stopped_after_its_commit_resumes_from_the_stored_offsets);
/// A consumer applies the first message of the partition and stops between its database commit
/// and handing the offset to Kafka: Kafka's committed offset is still behind, the stored one is
/// not. The next consumer starts at the stored offset: nothing comes again (no duplicate), and
/// nothing is skipped (every other message applied).
async fn a_consumer_stopped_after_its_commit_resumes_from_the_stored_offsets<DB: TestDb>() {
    let Some(fixture) = Fixture::<DB, Kafka>::new("resume").await else {
        return;
    };
    // Orders of the test's own: effect runs are counted across the tests of the process.
    let credits: Vec<Credit> = (0..10)
        .map(|n| Credit {
            order: format!("resume-{n}"),
            ..Credit::new(n, 10)
        })
        .collect();
    fixture
        .publish(credits.iter().map(Credit::body).collect())
        .await;
    let settings = Settings {
        prefetch: 1,
        ..Settings::default()
    };

    let committed = Arc::new(tokio::sync::Notify::new());
    let stop = {
        let committed = Arc::clone(&committed);
        async move { committed.notified().await }
    };
    let consumer = {
        let committed = Arc::clone(&committed);
        let config = ConsumerConfig {
            shutdown_timeout: Duration::ZERO,
            ..ConsumerConfig::default()
        };
        Consumer::with_config(Guard::new(fixture.pool.clone()), config)
            .register::<Credit>()
            .before_ack(move |_key: &JobKey, _outcome: &Outcome<()>| {
                committed.notify_one();
                // Stopped here: Kafka never hears of the commit.
                std::future::pending().boxed()
            })
    };
    consumer.migrate().await.unwrap();
    let first = fixture.run(consumer, settings, stop).await;
    assert_eq!((first.applied, first.released), (1, 1), "{first:?}");
    let topic = Kafka::topic(&fixture.name);
    let stored = Offsets::new(fixture.pool.clone())
        .read(&topic, &topic)
        .await
        .unwrap();
    assert_eq!(
        stored,
        [(0, 1)].into(),
        "the offset committed with the effect"
    );
    let in_kafka = Kafka::committed(&fixture.url, &fixture.name);
    assert!(
        in_kafka
            .iter()
            .all(|(_, offset)| offset.is_none_or(|o| o < 1)),
        "Kafka was told: {in_kafka:?}"
    );

    let consumer = credit_consumer(&fixture.pool, Duration::from_secs(2), 1).await;
    let second = fixture
        .run(consumer, settings, std::future::pending())
        .await;
    assert_eq!((second.applied, second.duplicates), (9, 0), "{second:?}");
    assert_eq!(ledger_rows(&fixture.pool).await, 10);
    for credit in &credits {
        assert_eq!(effect_runs::<DB>(&credit.order), 1, "{}", credit.order);
    }
    fixture.cleanup().await;
}

backends!(fn a_rebalance_while_a_batch_runs_applies_nothing_twice);
/// One consumer runs batches of long jobs on a three-partition topic; a second joins the group
/// while they run, and the group moves partitions between them. The revocation waits for the
/// running batch to commit, and the new owner starts at the stored offset: every credit applied
/// once, none run twice.
async fn a_rebalance_while_a_batch_runs_applies_nothing_twice<DB: TestDb>() {
    let Some(fixture) = Fixture::<DB, Kafka>::new("rebalance").await else {
        return;
    };
    let settings = Settings::default();
    fixture.prepare(settings).await;
    let credits: Vec<Credit> = (0..24)
        .map(|n| Credit {
            order: format!("rebalance-{}-{n}", DB::BACKEND),
            hold_ms: 150,
            ..Credit::new(n, 10)
        })
        .collect();
    fixture
        .publish(credits.iter().map(Credit::body).collect())
        .await;

    let first = credit_consumer(&fixture.pool, Duration::from_secs(3), 4).await;
    let second = credit_consumer(&fixture.pool, Duration::from_secs(3), 4).await;
    let started = Arc::new(tokio::sync::Notify::new());
    let first = first.before_commit({
        let started = Arc::clone(&started);
        move |_keys: Vec<JobKey>| {
            started.notify_one();
            std::future::ready(()).boxed()
        }
    });
    let (a, b) = tokio::join!(
        fixture.run(first, settings, std::future::pending()),
        async {
            // Joins once the first consumer is in the middle of its batches.
            started.notified().await;
            fixture.run(second, settings, std::future::pending()).await
        },
    );
    assert_eq!(a.applied + b.applied, 24, "{a:?} {b:?}");
    assert_eq!(ledger_rows(&fixture.pool).await, 24);
    for credit in &credits {
        assert_eq!(
            effect_runs::<DB>(&credit.order),
            1,
            "{}: {a:?} {b:?}",
            credit.order
        );
    }
    fixture.cleanup().await;
}

backends!(fn a_partition_resumes_inside_a_record_batch);
/// Messages produced together travel as one record batch; a consumer stopped after the first
/// one leaves the stored offset inside the batch, and the next consumer starts there. tansu
/// answers a fetch from inside a batch with the batches after it: the consumer sees the gap
/// when the next message arrives, finds in the log the messages between (no offsets without a
/// message, such as transaction markers), reads the partition again from before them and drops
/// what is before the stored offset. Every message applies once, none is skipped.
async fn a_partition_resumes_inside_a_record_batch<DB: TestDb>() {
    let Some(fixture) = Fixture::<DB, Kafka>::new("inside_batch").await else {
        return;
    };
    let one = Settings {
        partitions: 1,
        prefetch: 1,
        ..Settings::default()
    };
    fixture.prepare(one).await;
    let credits: Vec<Credit> = (0..10)
        .map(|n| Credit {
            order: format!("inside-batch-{n}"),
            ..Credit::new(n, 10)
        })
        .collect();
    let sink = KafkaSink::connect(&fixture.url).unwrap();
    let topic = Kafka::topic(&fixture.name);
    let envelopes: Vec<Envelope> = credits
        .iter()
        .map(|credit| Envelope::for_job::<DB, _>(credit).unwrap())
        .collect();
    futures::future::try_join_all(envelopes.iter().map(|e| sink.publish(&topic, e)))
        .await
        .unwrap();

    let committed = Arc::new(tokio::sync::Notify::new());
    let stop = {
        let committed = Arc::clone(&committed);
        async move { committed.notified().await }
    };
    let consumer = {
        let committed = Arc::clone(&committed);
        let config = ConsumerConfig {
            shutdown_timeout: Duration::ZERO,
            ..ConsumerConfig::default()
        };
        Consumer::with_config(Guard::new(fixture.pool.clone()), config)
            .register::<Credit>()
            .before_ack(move |_key: &JobKey, _outcome: &Outcome<()>| {
                committed.notify_one();
                std::future::pending().boxed()
            })
    };
    consumer.migrate().await.unwrap();
    let first = fixture.run(consumer, one, stop).await;
    assert_eq!(first.applied, 1, "{first:?}");

    // One more message, in a batch of its own: the first one a broker that skips the rest of
    // the batch (tansu) serves.
    let last = Credit {
        order: "inside-batch-10".to_owned(),
        ..Credit::new(10, 10)
    };
    sink.publish(&topic, &Envelope::for_job::<DB, _>(&last).unwrap())
        .await
        .unwrap();

    let consumer = credit_consumer(&fixture.pool, Duration::from_secs(2), 1).await;
    let second = fixture.run(consumer, one, std::future::pending()).await;
    assert_eq!((second.applied, second.duplicates), (10, 0), "{second:?}");
    assert_eq!(ledger_rows(&fixture.pool).await, 11);
    for credit in credits.iter().chain([&last]) {
        assert_eq!(effect_runs::<DB>(&credit.order), 1, "{}", credit.order);
    }
    fixture.cleanup().await;
}

/// Applies ten credits of `fixture`'s one-partition topic, then deletes the topic and makes it
/// again under its name with three new credits and a copy of an old one: the stored offset (10)
/// is past the new log's end (4). The credits, old then new.
async fn recreate_the_topic<DB: TestDb>(
    fixture: &Fixture<DB, Kafka>,
) -> (Vec<Credit>, Vec<Credit>) {
    let credit = |n: usize| Credit {
        order: format!("{}-{n}", fixture.name),
        ..Credit::new(n, 10)
    };
    let old: Vec<Credit> = (0..10).map(credit).collect();
    fixture
        .publish(old.iter().map(Credit::body).collect())
        .await;
    let consumer = credit_consumer(&fixture.pool, Duration::from_secs(2), 1).await;
    let stats = fixture
        .run(consumer, Settings::default(), std::future::pending())
        .await;
    assert_eq!(stats.applied, 10, "{stats:?}");
    let topic = Kafka::topic(&fixture.name);
    let offsets = Offsets::new(fixture.pool.clone());
    assert_eq!(
        offsets.read(&topic, &topic).await.unwrap(),
        [(0, 10)].into()
    );

    Kafka::reset(&fixture.url, &fixture.name).await;
    let new: Vec<Credit> = (10..13).map(credit).collect();
    let bodies = new.iter().chain([&old[0]]).map(Credit::body).collect();
    fixture.publish(bodies).await;
    (old, new)
}

backends!(fn a_recreated_topic_is_refused);
/// A topic deleted and made again under its name starts its offsets over, below the offset the
/// group stored for the old one. By default the consumer refuses it, loudly, rather than skip
/// every message below the stored offset: it stops with an error that says what to do, and
/// stores nothing.
async fn a_recreated_topic_is_refused<DB: TestDb>() {
    let Some(fixture) = Fixture::<DB, Kafka>::new("recreated").await else {
        return;
    };
    let (_, new) = recreate_the_topic(&fixture).await;
    let consumer = credit_consumer(&fixture.pool, Duration::from_secs(3), 1).await;
    let ran = Kafka::run(
        consumer,
        &fixture.url,
        &fixture.name,
        Settings::default(),
        std::future::pending(),
    );
    let refused = tokio::time::timeout(super::consumer::DEADLINE, ran)
        .await
        .expect("the consumer stopped before the deadline");
    let error = refused.expect_err("the consumer refuses the recreated topic");
    assert!(
        error.to_string().contains("deleted and made again"),
        "{error}"
    );
    for credit in &new {
        assert_eq!(effect_runs::<DB>(&credit.order), 0, "{}", credit.order);
    }
    let topic = Kafka::topic(&fixture.name);
    let stored = Offsets::new(fixture.pool.clone())
        .read(&topic, &topic)
        .await
        .unwrap();
    assert_eq!(stored, [(0, 10)].into(), "the stored offset stands");
    fixture.cleanup().await;
}

backends!(fn a_recreated_topic_is_consumed_from_its_start_when_told);
/// With [`PastLogEnd::Reset`], the consumer of a topic made again sets the stored offset to the
/// new log's start and consumes it from there: the new credits apply, the copy of an old one is
/// a duplicate (the guard still holds its key), and the stored offset is the new log's end.
async fn a_recreated_topic_is_consumed_from_its_start_when_told<DB: TestDb>() {
    let Some(fixture) = Fixture::<DB, Kafka>::new("reset").await else {
        return;
    };
    let (old, new) = recreate_the_topic(&fixture).await;
    let consumer = credit_consumer(&fixture.pool, Duration::from_secs(3), 1).await;
    let config = KafkaConfig {
        past_log_end: PastLogEnd::Reset,
        ..Kafka::config(&fixture.name, Settings::default())
    };
    let source = consumer.kafka_source(&fixture.url, config).await.unwrap();
    let ran = consumer.run_kafka(source, std::future::pending());
    let stats = tokio::time::timeout(super::consumer::DEADLINE, ran)
        .await
        .expect("the consumer stopped before the deadline")
        .expect("the consumer ran");
    assert_eq!((stats.applied, stats.duplicates), (3, 1), "{stats:?}");
    for credit in new.iter().chain([&old[0]]) {
        assert_eq!(effect_runs::<DB>(&credit.order), 1, "{}", credit.order);
    }
    assert_eq!(ledger_rows(&fixture.pool).await, 13);
    let topic = Kafka::topic(&fixture.name);
    let stored = Offsets::new(fixture.pool.clone())
        .read(&topic, &topic)
        .await
        .unwrap();
    assert_eq!(stored, [(0, 4)].into(), "the new log's end");
    fixture.cleanup().await;
}

backends!(fn a_partition_the_client_stopped_fetching_is_fetched_again);
/// The client pauses a partition behind the consumer's back once its first ten messages are
/// settled, as a pause that reached the client after the resume meant to end it would; ten more
/// are then published. The lane is idle and its partition's log holds messages it never
/// received: after `stalled_after` the consumer fetches the partition again from its next
/// offset, and every message applies once. Without that check the consumer goes idle with ten
/// applied and ten left in the log.
async fn a_partition_the_client_stopped_fetching_is_fetched_again<DB: TestDb>() {
    let Some(fixture) = Fixture::<DB, Kafka>::new("stalled").await else {
        return;
    };
    let one = Settings {
        partitions: 1,
        prefetch: 1,
        ..Settings::default()
    };
    fixture.prepare(one).await;
    let credits: Vec<Credit> = (0..20)
        .map(|n| Credit {
            order: format!("stalled-{n}"),
            ..Credit::new(n, 10)
        })
        .collect();
    fixture
        .publish(credits[..10].iter().map(Credit::body).collect())
        .await;
    let consumer = credit_consumer(&fixture.pool, Duration::from_secs(6), 1)
        .await
        .kafka_pause_unseen_at(10);
    let config = KafkaConfig {
        stalled_after: Duration::from_secs(1),
        ..Kafka::config(&fixture.name, one)
    };
    let source = consumer
        .kafka_source(&fixture.url, config)
        .await
        .expect("join the group");
    let run = tokio::spawn(consumer.run_kafka(source, std::future::pending()));
    let started = std::time::Instant::now();
    while ledger_rows(&fixture.pool).await < 10 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the first ten applied"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fixture
        .publish(credits[10..].iter().map(Credit::body).collect())
        .await;
    let stats = run.await.unwrap().expect("the consumer ran");
    assert_eq!((stats.applied, stats.duplicates), (20, 0), "{stats:?}");
    assert_eq!(ledger_rows(&fixture.pool).await, 20);
    for credit in &credits {
        assert_eq!(effect_runs::<DB>(&credit.order), 1, "{}", credit.order);
    }
    fixture.cleanup().await;
}

backends!(fn a_stalled_after_shorter_than_the_least_accepted_is_a_typed_error);
/// A `stalled_after` under [`kafka::MIN_STALLED_AFTER`] would ask the broker about every quiet
/// partition in turn: the source refuses it before it joins the group or creates anything.
async fn a_stalled_after_shorter_than_the_least_accepted_is_a_typed_error<DB: TestDb>() {
    let Some(fixture) = Fixture::<DB, Kafka>::new("stalled_zero").await else {
        return;
    };
    let consumer = credit_consumer(&fixture.pool, Duration::from_secs(1), 1).await;
    for stalled_after in [Duration::ZERO, kafka::MIN_STALLED_AFTER / 2] {
        let config = KafkaConfig {
            stalled_after,
            ..Kafka::config(&fixture.name, Settings::default())
        };
        let refused = consumer.kafka_source(&fixture.url, config).await;
        match refused {
            Err(jobguard::Error::InvalidConfig { setting, reason }) => {
                assert_eq!(setting, "Kafka stalled_after");
                assert!(
                    reason.contains("shorter than the least accepted"),
                    "{reason}"
                );
            }
            Err(other) => panic!("another error: {other}"),
            Ok(_) => panic!("{stalled_after:?} was accepted"),
        }
    }
    let accepted = KafkaConfig {
        stalled_after: kafka::MIN_STALLED_AFTER,
        ..Kafka::config(&fixture.name, Settings::default())
    };
    assert!(consumer.kafka_source(&fixture.url, accepted).await.is_ok());
    fixture.cleanup().await;
}
