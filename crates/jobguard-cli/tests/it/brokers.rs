//! `jobguard consume` as real processes against real RabbitMQ, NATS JetStream, Redis, SQS
//! (moto's server) and Kafka (tansu): a consumer killed with SIGKILL after its commit and before
//! its ack, whose message comes back to the next consumer as a duplicate (on Kafka, whose offset
//! was stored with the effect, it does not come back at all); the same for a batch, and a batch
//! killed before its commit; three consumer processes on one queue, each message published three
//! times; and
//! `jobguard bench brokers` with a few messages.
//!
//! The database is a fresh PostgreSQL schema when `JOBGUARD_TEST_DATABASE_URL` is set, else a
//! SQLite file. A broker that does not answer skips its tests with a message, except with
//! `CI=true`, where it fails them. Every child process is killed when its guard is dropped.

use std::time::{Duration, Instant};

use jobguard::JobKey;
use jobguard::broker::Envelope;
use jobguard::broker::kafka::{KafkaConfig, KafkaSink};
use jobguard::broker::nats::{NatsConfig, NatsSink, NatsSource};
use jobguard::broker::rabbitmq::{RabbitConfig, RabbitSink, RabbitSource};
use jobguard::broker::redis::{RedisConfig, RedisSink, RedisSource};
use jobguard::broker::sqs::{self, SqsConfig, SqsSink, SqsSource};
use serde_json::{Value, json};

use crate::common::{Db, Proc, jobguard, service_url, spawn};

/// The longest a consumer process may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(60);
/// What `jobguard consume --crash-after-commit` prints between its commit and its ack.
const CRASH_POINT: &str = "JOBGUARD_CRASH_POINT";
/// Max deliveries and redelivery delay of every consumer here, and of the queues the tests
/// declare for them.
const MAX_DELIVERIES: u32 = 5;
const REDELIVERY: Duration = Duration::from_secs(1);

/// The redelivery delay on `broker`. SQS here is moto, a Python server: on a loaded machine its
/// answers take long enough that one second of visibility leaves too little time between a
/// job's end and its delete, and a finished message is received again (one duplicate more).
fn redelivery(broker: Broker) -> Duration {
    match broker {
        Broker::Sqs => Duration::from_secs(3),
        _ => REDELIVERY,
    }
}

/// Long enough without a message on `broker` that anything still to be delivered again has
/// come.
fn idle(broker: Broker) -> &'static str {
    match broker {
        Broker::Sqs => "6s",
        _ => IDLE,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Broker {
    Rabbitmq,
    Nats,
    Redis,
    Sqs,
    Kafka,
}

impl Broker {
    fn name(self) -> &'static str {
        match self {
            Broker::Rabbitmq => "rabbitmq",
            Broker::Nats => "nats",
            Broker::Redis => "redis",
            Broker::Sqs => "sqs",
            Broker::Kafka => "kafka",
        }
    }

    /// Whether a message whose effect committed and whose ack never came is delivered again:
    /// not on Kafka, where the consumer resumes after the offset stored with the effect.
    fn redelivers_committed(self) -> bool {
        self != Broker::Kafka
    }

    /// The broker's URL when it answers; `None` (skip) otherwise, or a failed test on CI.
    fn url(self) -> Option<String> {
        let (var, default) = match self {
            Broker::Rabbitmq => ("JOBGUARD_TEST_AMQP_URL", "amqp://127.0.0.1:5672"),
            Broker::Nats => ("JOBGUARD_TEST_NATS_URL", "nats://127.0.0.1:4222"),
            Broker::Redis => ("JOBGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379"),
            Broker::Sqs => ("JOBGUARD_TEST_SQS_URL", "http://127.0.0.1:9324"),
            Broker::Kafka => ("JOBGUARD_TEST_KAFKA_URL", "kafka://127.0.0.1:9092"),
        };
        service_url(var, default, "broker")
    }
}

/// Stamps out one test per broker over one `async fn` taking the [`Broker`]:
/// `each_broker!(demo_through)` makes `demo_through::rabbitmq`, `::nats`, `::redis` and
/// `::sqs` and `::kafka`.
macro_rules! each_broker {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            use super::Broker;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn rabbitmq() {
                super::$name(Broker::Rabbitmq).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn nats() {
                super::$name(Broker::Nats).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                super::$name(Broker::Redis).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqs() {
                super::$name(Broker::Sqs).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn kafka() {
                super::$name(Broker::Kafka).await;
            }
        }
    )+};
}

/// A queue of the test's own on a broker.
struct Queue {
    broker: Broker,
    url: String,
    /// RabbitMQ queue, NATS subject, Redis stream, SQS queue (`.` as `-`), Kafka topic.
    name: String,
}

impl Queue {
    fn rabbitmq(&self) -> RabbitConfig {
        RabbitConfig {
            max_deliveries: MAX_DELIVERIES,
            ..RabbitConfig::new(self.name.clone())
        }
    }

    /// As `jobguard consume` names it: the stream is the subject in capitals, `.` as `_`.
    fn nats(&self) -> NatsConfig {
        NatsConfig {
            max_deliveries: MAX_DELIVERIES,
            ack_wait: REDELIVERY,
            ..NatsConfig::new(
                self.name.replace('.', "_").to_uppercase(),
                self.name.clone(),
            )
        }
    }

    fn redis(&self) -> RedisConfig {
        RedisConfig {
            max_deliveries: MAX_DELIVERIES,
            claim_idle: REDELIVERY,
            ..RedisConfig::new(self.name.clone())
        }
    }

    /// As `jobguard consume` names it: `.` as `-`.
    fn sqs(&self) -> SqsConfig {
        SqsConfig {
            max_deliveries: MAX_DELIVERIES,
            visibility_timeout: redelivery(Broker::Sqs),
            ..SqsConfig::new(sqs::queue_name(&self.name))
        }
    }

    /// As `jobguard consume` consumes it: the group `jobguard.<topic>`.
    fn kafka(&self) -> KafkaConfig {
        KafkaConfig {
            group: format!("jobguard.{}", self.name),
            max_deliveries: MAX_DELIVERIES,
            ..KafkaConfig::new(self.name.clone())
        }
    }

    /// A fresh queue, declared as the consumers declare it so that messages published before
    /// they start wait in it; a Kafka topic has one partition.
    async fn new(broker: Broker, test: &str) -> Option<Queue> {
        Self::with_partitions(broker, test, 1).await
    }

    /// [`new`](Self::new), with `partitions` partitions on Kafka.
    async fn with_partitions(broker: Broker, test: &str, partitions: i32) -> Option<Queue> {
        let url = broker.url()?;
        let queue = Queue {
            broker,
            url,
            name: format!("jgcli.{test}.{}", broker.name()),
        };
        queue.remove().await;
        match broker {
            Broker::Rabbitmq => drop(RabbitSource::connect(&queue.url, queue.rabbitmq()).await),
            Broker::Nats => drop(NatsSource::connect(&queue.url, queue.nats()).await),
            Broker::Redis => drop(RedisSource::connect(&queue.url, queue.redis()).await),
            Broker::Sqs => drop(SqsSource::connect(&queue.url, queue.sqs()).await),
            Broker::Kafka => {
                let config = KafkaConfig {
                    partitions,
                    ..queue.kafka()
                };
                jobguard::broker::kafka::declare(&queue.url, &config)
                    .await
                    .expect("create the topic");
            }
        }
        Some(queue)
    }

    async fn remove(&self) {
        let removed = match self.broker {
            Broker::Rabbitmq => {
                jobguard::broker::rabbitmq::remove(&self.url, &self.rabbitmq()).await
            }
            Broker::Nats => jobguard::broker::nats::remove(&self.url, &self.nats()).await,
            Broker::Redis => jobguard::broker::redis::remove(&self.url, &self.redis()).await,
            Broker::Sqs => sqs::remove(&self.url, &self.sqs()).await,
            Broker::Kafka => jobguard::broker::kafka::remove(&self.url, &self.kafka()).await,
        };
        removed.expect("remove the test's queue");
    }

    /// Publishes every envelope as it is, copies included: no broker-side deduplication.
    async fn publish(&self, envelopes: &[Envelope]) {
        match self.broker {
            Broker::Rabbitmq => {
                let sink = RabbitSink::connect(&self.url, "").await.unwrap();
                for envelope in envelopes {
                    sink.publish(&self.name, envelope).await.unwrap();
                }
                sink.close().await;
            }
            Broker::Nats => {
                let sink = NatsSink::connect(&self.url)
                    .await
                    .unwrap()
                    .without_message_ids();
                for envelope in envelopes {
                    sink.publish(&self.name, envelope).await.unwrap();
                }
            }
            Broker::Redis => {
                let sink = RedisSink::connect(&self.url)
                    .await
                    .unwrap()
                    .dedupe_window(Duration::ZERO);
                for envelope in envelopes {
                    sink.publish(&self.name, envelope).await.unwrap();
                }
            }
            Broker::Sqs => {
                // A standard queue: every copy is stored.
                let sink = SqsSink::connect(&self.url).unwrap();
                for envelope in envelopes {
                    sink.publish(&self.sqs().queue, envelope).await.unwrap();
                }
            }
            Broker::Kafka => {
                let sink = KafkaSink::connect(&self.url).unwrap();
                for envelope in envelopes {
                    sink.publish(&self.name, envelope).await.unwrap();
                }
            }
        }
    }
}

/// The credit job of `jobguard consume`, for `order`.
fn credit(order: usize) -> Envelope {
    let order = format!("order-{order}");
    let key = JobKey::new("credit", [&order]).unwrap();
    Envelope::new(
        "credit",
        key,
        &json!({"order": order, "account": 7, "amount": 10}),
    )
    .unwrap()
}

/// Ledger rows and distinct job keys in `jobguard_ledger`.
async fn ledger(db: &Db) -> (i64, i64) {
    let sql = "select count(*), count(distinct job_key) from jobguard_ledger";
    if db.is_postgres() {
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        let counts = sqlx::query_as(sql).fetch_one(&pool).await.unwrap();
        pool.close().await;
        counts
    } else {
        let pool = jobguard::sqlite::connect(&db.url, 1).await.unwrap();
        let counts = sqlx::query_as(sql).fetch_one(&pool).await.unwrap();
        pool.close().await;
        counts
    }
}

/// A `jobguard consume` process, killed with SIGKILL when dropped unless it ended.
struct Consumer(Proc);

impl Consumer {
    fn start(queue: &Queue, db: &Db, name: &str, extra: &[&str]) -> Consumer {
        let redelivery = format!("{}ms", redelivery(queue.broker).as_millis());
        let mut command = jobguard();
        command
            .args([
                "consume",
                "--broker",
                queue.broker.name(),
                "--url",
                &queue.url,
            ])
            .args(["--queue", &queue.name, "--redelivery", &redelivery])
            .args(["--max-deliveries", &MAX_DELIVERIES.to_string()])
            .args(["--retry-delay", "100ms", "--database-url", &db.url])
            .args(extra);
        Consumer(spawn(&db.dir, name, command))
    }

    fn stderr(&self) -> String {
        self.0.output().1
    }

    /// Waits until the process prints `line`, failing the test if it ends or takes too long.
    async fn wait_for(&mut self, line: &str) {
        let started = Instant::now();
        loop {
            let (out, _) = self.0.output();
            if out.lines().any(|l| l.starts_with(line)) {
                return;
            }
            if let Some(exit) = self.0.exited() {
                panic!(
                    "the consumer ended ({}) before {line}: {}",
                    exit.status, exit.stderr
                );
            }
            assert!(
                started.elapsed() < DEADLINE,
                "no {line} within {DEADLINE:?}: {}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn sigkill(&mut self) {
        self.0.sigkill();
    }

    /// Waits for a consumer started with `--until-idle ... --json` to stop; its report.
    async fn report(mut self) -> Value {
        let started = Instant::now();
        let exit = loop {
            if let Some(exit) = self.0.exited() {
                break exit;
            }
            assert!(
                started.elapsed() <= DEADLINE,
                "the consumer did not stop within {DEADLINE:?}: {}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            exit.ok,
            "the consumer failed ({}): {}",
            exit.status, exit.stderr
        );
        let out = exit.stdout;
        serde_json::from_str(&out).unwrap_or_else(|_| panic!("not JSON: {out}"))
    }
}

/// Long enough without a message that anything still to be delivered again has come.
const IDLE: &str = "3s";

async fn killed_after_commit_before_ack(broker: Broker) {
    let test = "killed";
    let Some(queue) = Queue::new(broker, test).await else {
        return;
    };
    let db = Db::postgres_or_sqlite(&format!("brokers::{test}_{}", broker.name()));
    queue.publish(&[credit(1)]).await;

    let mut first = Consumer::start(
        &queue,
        &db,
        "first",
        &["--prefetch", "1", "--crash-after-commit"],
    );
    first.wait_for(CRASH_POINT).await;
    first.sigkill();
    assert_eq!(
        ledger(&db).await,
        (1, 1),
        "the job committed before the kill"
    );

    let second = Consumer::start(
        &queue,
        &db,
        "second",
        &["--until-idle", idle(broker), "--json"],
    );
    let report = second.report().await;
    assert_eq!(report["applied"], 0, "{report}");
    assert_eq!(
        report["duplicates"].as_u64(),
        Some(u64::from(broker.redelivers_committed())),
        "the redelivery is a duplicate; Kafka resumes after the stored offset: {report}"
    );
    assert_eq!(report["unacked"], 0, "{report}");
    assert_eq!(ledger(&db).await, (1, 1), "the effect exists once");

    // The duplicate was acknowledged: nothing comes back.
    let third = Consumer::start(
        &queue,
        &db,
        "third",
        &["--until-idle", idle(broker), "--json"],
    );
    let report = third.report().await;
    assert_eq!(
        (report["applied"].as_u64(), report["duplicates"].as_u64()),
        (Some(0), Some(0)),
        "{report}"
    );

    queue.remove().await;
}

async fn three_consumer_processes(broker: Broker) {
    let test = "three";
    let Some(queue) = Queue::with_partitions(broker, test, 3).await else {
        return;
    };
    let db = Db::postgres_or_sqlite(&format!("brokers::{test}_{}", broker.name()));
    let envelopes: Vec<Envelope> = (0..30)
        .flat_map(|n| std::iter::repeat_n(credit(n), 3))
        .collect();
    queue.publish(&envelopes).await;

    let consumers: Vec<Consumer> = ["a", "b", "c"]
        .into_iter()
        .map(|name| {
            Consumer::start(
                &queue,
                &db,
                name,
                &["--prefetch", "4", "--until-idle", idle(broker), "--json"],
            )
        })
        .collect();
    let mut applied = 0;
    let mut duplicates = 0;
    for consumer in consumers {
        let report = consumer.report().await;
        applied += report["applied"].as_u64().unwrap();
        duplicates += report["duplicates"].as_u64().unwrap();
        assert_eq!(report["dead"], 0, "{report}");
    }
    assert_eq!((applied, duplicates), (30, 60));
    assert_eq!(ledger(&db).await, (30, 30), "effects equal distinct keys");

    queue.remove().await;
}

/// `jobguard demo --broker NAME --json`: the seed's result through each broker, with its
/// consumer killed between commit and ack.
async fn demo_through(broker: Broker) {
    let Some(url) = broker.url() else {
        return;
    };
    let db = Db::postgres_or_sqlite(&format!("brokers::demo_{}", broker.name()));
    let output = db
        .command(&["demo", "--broker", broker.name(), "--jobs", "30", "--json"])
        .env("JOBGUARD_BROKER_URL", &url)
        .output()
        .expect("run jobguard demo");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["broker"], broker.name());
    assert_eq!(report["killed_consumers"], 1);
    let (naive, guarded) = (&report["naive"], &report["guarded"]);
    // 90 messages, and the killed consumer's message once more; on Kafka the guarded consumer
    // resumes after the offset stored with its effect, and the message does not come again.
    let again = u64::from(broker.redelivers_committed());
    assert_eq!(naive["deliveries"], 91, "{report}");
    assert_eq!(naive["effects"], 91, "{report}");
    assert_eq!(guarded["deliveries"].as_u64(), Some(90 + again), "{report}");
    assert_eq!(guarded["effects"], 30, "{report}");
    assert_eq!(guarded["applied"], 30, "{report}");
    assert_eq!(guarded["duplicates"].as_u64(), Some(60 + again), "{report}");
    assert_eq!(guarded["balance_total"], report["expected_balance_total"]);
    assert_eq!(report["exactly_once"], true);
}

/// The `consume` flags of the batch tests: one batch of ten holds every message, and waits
/// long enough for all of them to arrive.
const ONE_BATCH: [&str; 6] = [
    "--prefetch",
    "10",
    "--batch-size",
    "10",
    "--batch-linger",
    "300ms",
];

impl Consumer {
    /// The keys the process said its transaction claimed, on its crash point line.
    fn crash_keys(&self) -> Vec<String> {
        let (out, _) = self.0.output();
        let line = out
            .lines()
            .find(|line| line.starts_with(CRASH_POINT))
            .expect("the crash point was printed");
        let mut words = line.split_whitespace().skip(1);
        let count: usize = words.next().unwrap().parse().unwrap();
        let keys: Vec<String> = words.map(str::to_owned).collect();
        assert_eq!(keys.len(), count, "{line}");
        keys
    }
}

async fn batch_killed_before_commit(broker: Broker) {
    let test = "batch_before";
    let Some(queue) = Queue::new(broker, test).await else {
        return;
    };
    let db = Db::postgres_or_sqlite(&format!("brokers::{test}_{}", broker.name()));
    let envelopes: Vec<Envelope> = (0..10).map(credit).collect();
    queue.publish(&envelopes).await;

    let mut extra = ONE_BATCH.to_vec();
    extra.push("--crash-before-commit");
    let mut first = Consumer::start(&queue, &db, "first", &extra);
    first.wait_for(CRASH_POINT).await;
    let claimed = first.crash_keys();
    first.sigkill();
    assert!(
        claimed.len() > 1,
        "the transaction was a batch: {claimed:?}"
    );
    assert_eq!(
        ledger(&db).await,
        (0, 0),
        "nothing committed before the kill"
    );

    let mut extra = ONE_BATCH.to_vec();
    extra.extend(["--until-idle", idle(broker), "--json"]);
    let report = Consumer::start(&queue, &db, "second", &extra)
        .report()
        .await;
    assert_eq!(
        (report["applied"].as_u64(), report["duplicates"].as_u64()),
        (Some(10), Some(0)),
        "every message came again and applied: {report}"
    );
    assert_eq!(
        (report["failed"].as_u64(), report["dead"].as_u64()),
        (Some(0), Some(0)),
        "{report}"
    );
    assert_eq!(ledger(&db).await, (10, 10), "each effect exists once");

    queue.remove().await;
}

async fn batch_killed_after_commit_before_ack(broker: Broker) {
    let test = "batch_after";
    let Some(queue) = Queue::new(broker, test).await else {
        return;
    };
    let db = Db::postgres_or_sqlite(&format!("brokers::{test}_{}", broker.name()));
    let envelopes: Vec<Envelope> = (0..10).map(credit).collect();
    queue.publish(&envelopes).await;

    let mut extra = ONE_BATCH.to_vec();
    extra.push("--crash-after-commit");
    let mut first = Consumer::start(&queue, &db, "first", &extra);
    first.wait_for(CRASH_POINT).await;
    first.sigkill();
    let (rows, keys) = ledger(&db).await;
    assert_eq!(rows, keys, "no key applied twice");
    assert!(rows > 1, "a batch of more than one committed: {rows}");

    let mut extra = ONE_BATCH.to_vec();
    extra.extend(["--until-idle", idle(broker), "--json"]);
    let report = Consumer::start(&queue, &db, "second", &extra)
        .report()
        .await;
    // No message of the killed consumer was acknowledged: the committed ones come back as
    // duplicates (on Kafka not at all: the offset committed with them), the others apply.
    let again = if broker.redelivers_committed() {
        rows as u64
    } else {
        0
    };
    assert_eq!(report["duplicates"].as_u64(), Some(again), "{report}");
    assert_eq!(
        report["applied"].as_u64(),
        Some(10 - rows as u64),
        "{report}"
    );
    assert_eq!(report["unacked"], 0, "{report}");
    assert_eq!(ledger(&db).await, (10, 10), "each effect exists once");

    queue.remove().await;
}

/// The next offset of each partition of `topic` in the consumers' offsets table.
async fn stored_offsets(db: &Db, topic: &str) -> Vec<(i32, i64)> {
    let sql = "select partition, next_offset from jobguard_consumer_offsets \
               where topic = $1 order by partition";
    if db.is_postgres() {
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        let rows = sqlx::query_as(sql)
            .bind(topic)
            .fetch_all(&pool)
            .await
            .unwrap();
        pool.close().await;
        rows
    } else {
        let pool = jobguard::sqlite::connect(&db.url, 1).await.unwrap();
        let rows = sqlx::query_as(sql)
            .bind(topic)
            .fetch_all(&pool)
            .await
            .unwrap();
        pool.close().await;
        rows
    }
}

/// Kafka: a consumer process killed with SIGKILL between its database commit and Kafka's
/// offset commit. The offsets table says the partition's next offset is 1, Kafka was never
/// told; the next process starts at the stored offset: no duplicate, no gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_resumes_from_the_stored_offsets_after_sigkill() {
    let test = "resume";
    let Some(queue) = Queue::new(Broker::Kafka, test).await else {
        return;
    };
    let db = Db::postgres_or_sqlite(&format!("brokers::{test}_kafka"));
    let envelopes: Vec<Envelope> = (0..10).map(credit).collect();
    queue.publish(&envelopes).await;

    let mut first = Consumer::start(
        &queue,
        &db,
        "first",
        &["--prefetch", "1", "--crash-after-commit"],
    );
    first.wait_for(CRASH_POINT).await;
    first.sigkill();
    assert_eq!(ledger(&db).await, (1, 1), "the first credit committed");
    assert_eq!(
        stored_offsets(&db, &queue.name).await,
        [(0, 1)],
        "its offset committed with it"
    );

    let second = Consumer::start(&queue, &db, "second", &["--until-idle", IDLE, "--json"]);
    let report = second.report().await;
    assert_eq!(
        (report["applied"].as_u64(), report["duplicates"].as_u64()),
        (Some(9), Some(0)),
        "started after the stored offset: {report}"
    );
    assert_eq!(
        ledger(&db).await,
        (10, 10),
        "every credit once, none skipped"
    );
    assert_eq!(stored_offsets(&db, &queue.name).await, [(0, 10)]);
    queue.remove().await;
}

/// Kafka: consumer processes join and leave a group while every partition holds more messages
/// than a lane buffers, so that each consumer pauses its partitions in the client (a lane holding
/// `buffer`, 100, messages). A starts alone; B joins, then C, each join a rebalance that hands A
/// (and then B) back partitions it had paused; then A leaves on SIGTERM, then B, each leave a
/// rebalance that hands the others back partitions they had paused, until C holds every
/// partition. Each step waits for the group's assignments, read in the consumers' logs. A
/// partition handed back paused must resume (else the ledger stops short, for good): every key
/// applied exactly once, every copy a duplicate (a message run again by a partition's next
/// owner is one more), every partition's stored offset at its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_partitions_handed_back_after_a_rebalance_resume() {
    let test = "handed_back";
    let Some(url) = Broker::Kafka.url() else {
        return;
    };
    // A topic, and so a group, of this run's own: tansu keeps a group's members killed by an
    // earlier run waiting to rejoin.
    let queue = Queue {
        broker: Broker::Kafka,
        url,
        name: format!("jgcli.{test}.{}.kafka", std::process::id()),
    };
    let config = KafkaConfig {
        partitions: 3,
        ..queue.kafka()
    };
    jobguard::broker::kafka::declare(&queue.url, &config)
        .await
        .expect("create the topic");
    let db = Db::postgres_or_sqlite(&format!("brokers::{test}_kafka"));
    const KEYS: usize = 3_000;
    // Each key twice: 6,000 messages, about 2,000 a partition, twenty lane buffers each. Each
    // consumer runs one partition at a time (`--prefetch 1`): the lanes of the others wait full,
    // their partitions paused, when the group hands them back.
    let envelopes: Vec<Envelope> = (0..KEYS)
        .flat_map(|n| std::iter::repeat_n(credit(n), 2))
        .collect();
    queue.publish(&envelopes).await;

    let mut a = kafka_member(&queue, &db, "a");
    wait_for_assignments(&mut a, 1).await;
    wait_for_ledger(&db, 1, &mut [&mut a]).await;
    let mut b = kafka_member(&queue, &db, "b");
    // A is handed back partitions it paused, B gets its own.
    wait_for_assignments(&mut b, 1).await;
    wait_for_assignments(&mut a, 2).await;
    let mut c = kafka_member(&queue, &db, "c");
    wait_for_assignments(&mut c, 1).await;
    wait_for_assignments(&mut b, 2).await;
    a.0.signal("TERM");
    let a = a.report().await;
    // B and C share A's partitions.
    wait_for_assignments(&mut b, 3).await;
    wait_for_assignments(&mut c, 2).await;
    b.0.signal("TERM");
    let b = b.report().await;
    wait_for_assignments(&mut c, 3).await;
    let keys = KEYS as i64;
    wait_for_ledger(&db, keys, &mut [&mut c]).await;
    c.0.signal("TERM");
    let c = c.report().await;
    let reports = [&a, &b, &c];
    let total = |field: &str| -> u64 { reports.iter().map(|r| r[field].as_u64().unwrap()).sum() };
    assert_eq!(
        (total("applied"), total("dead")),
        (KEYS as u64, 0),
        "a {a}, b {b}, c {c}"
    );
    assert!(total("duplicates") >= KEYS as u64, "a {a}, b {b}, c {c}");
    assert_eq!(
        ledger(&db).await,
        (keys, keys),
        "every key applied exactly once"
    );
    let ends = tokio::task::spawn_blocking({
        let (url, topic) = (queue.url.clone(), queue.name.clone());
        move || kafka_ends(&url, &topic)
    })
    .await
    .unwrap();
    assert_eq!(ends.iter().map(|(_, end)| end).sum::<i64>(), 2 * keys);
    assert_eq!(stored_offsets(&db, &queue.name).await, ends);
    queue.remove().await;
}

/// A `jobguard consume --broker kafka --json` process that logs its assignments, until SIGTERM.
fn kafka_member(queue: &Queue, db: &Db, name: &str) -> Consumer {
    let mut command = jobguard();
    command
        .env("JOBGUARD_LOG", "warn,jobguard::broker::kafka=debug")
        .args(["consume", "--broker", "kafka", "--url", &queue.url])
        .args(["--queue", &queue.name, "--database-url", &db.url])
        .args(["--prefetch", "1", "--retry-delay", "100ms"])
        .arg("--json");
    Consumer(spawn(&db.dir, name, command))
}

/// Waits until `consumer` logged `count` assignments of the group (its first, or others after
/// rebalances), failing the test if it ends first or after [`DEADLINE`].
async fn wait_for_assignments(consumer: &mut Consumer, count: usize) {
    let started = Instant::now();
    loop {
        let assigned = consumer.stderr().matches("partitions assigned").count();
        if assigned >= count {
            return;
        }
        if let Some(exit) = consumer.0.exited() {
            panic!(
                "the consumer ended after {assigned} of {count} assignments: {}",
                exit.stderr
            );
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{assigned} of {count} assignments within {DEADLINE:?}: {}",
            consumer.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `jobguard_ledger` holds at least `rows` rows while `consumers` run; the rows it
/// holds then. Fails the test when a consumer ends first, or when no row was added for
/// [`DEADLINE`]: the partitions left stopped.
async fn wait_for_ledger(db: &Db, rows: i64, consumers: &mut [&mut Consumer]) -> i64 {
    let mut started = Instant::now();
    let mut last = -1;
    loop {
        let held = ledger_rows_so_far(db).await;
        if held >= rows {
            return held;
        }
        if held > last {
            (last, started) = (held, Instant::now());
        }
        for consumer in consumers.iter_mut() {
            if let Some(exit) = consumer.0.exited() {
                panic!(
                    "a consumer stopped with {held} of {rows} rows applied: {}",
                    exit.stdout
                );
            }
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{held} of {rows} rows applied, none for {DEADLINE:?}: a partition stopped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The rows of `jobguard_ledger`, 0 before a consumer made it.
async fn ledger_rows_so_far(db: &Db) -> i64 {
    let sql = "select count(*) from jobguard_ledger";
    let rows: Option<(i64,)> = if db.is_postgres() {
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        let rows = sqlx::query_as(sql).fetch_one(&pool).await.ok();
        pool.close().await;
        rows
    } else {
        let pool = jobguard::sqlite::connect(&db.url, 1).await.unwrap();
        let rows = sqlx::query_as(sql).fetch_one(&pool).await.ok();
        pool.close().await;
        rows
    };
    rows.map_or(0, |(rows,)| rows)
}

/// Where each partition of `topic` ends, by partition.
fn kafka_ends(url: &str, topic: &str) -> Vec<(i32, i64)> {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set(
            "bootstrap.servers",
            jobguard::broker::kafka::bootstrap_servers(url).unwrap(),
        )
        .create()
        .expect("a client");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("the topic's metadata");
    let mut ends: Vec<(i32, i64)> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions())
        .map(|partition| {
            let (_, high) = consumer
                .fetch_watermarks(topic, partition.id(), Duration::from_secs(10))
                .expect("watermarks");
            (partition.id(), high)
        })
        .collect();
    ends.sort();
    ends
}

/// `jobguard consume --metrics-bind` serves `/health` and the outcomes it counted at
/// `/metrics`: a message published twice is applied once and found a duplicate once.
async fn consumer_serves_its_metrics(broker: Broker) {
    let test = "metrics";
    let Some(queue) = Queue::new(broker, test).await else {
        return;
    };
    let db = Db::postgres_or_sqlite(&format!("brokers::{test}_{}", broker.name()));
    queue.publish(&[credit(1), credit(1)]).await;
    let mut consumer = Consumer::start(&queue, &db, "metrics", &["--metrics-bind", "127.0.0.1:0"]);
    let started = Instant::now();
    let address = loop {
        let stderr = consumer.stderr();
        if let Some(address) = stderr
            .split("metrics on http://")
            .nth(1)
            .and_then(|rest| rest.split("/metrics").next())
        {
            break address.to_owned();
        }
        assert!(consumer.0.running(), "the consumer ended: {stderr}");
        assert!(started.elapsed() < DEADLINE, "no metrics address: {stderr}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let health = reqwest::get(format!("http://{address}/health"))
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let expected = [
        r#"jobguard_outcomes_total{kind="credit",outcome="applied"} 1"#,
        r#"jobguard_outcomes_total{kind="credit",outcome="duplicate"} 1"#,
    ];
    loop {
        let text = reqwest::get(format!("http://{address}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if expected.iter().all(|line| text.lines().any(|l| l == *line)) {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the consumer's metrics never showed {expected:?}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    consumer.sigkill();
    queue.remove().await;
}

each_broker!(
    consumer_serves_its_metrics,
    batch_killed_before_commit,
    batch_killed_after_commit_before_ack,
    killed_after_commit_before_ack,
    three_consumer_processes,
    demo_through,
);

/// `jobguard bench brokers` with a few messages: every broker that answers is measured one
/// per transaction and in batches, each run applying every message once; one that does not
/// answer is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_brokers_applies_every_message_once() {
    let db = Db::postgres_or_sqlite("brokers::bench");
    let brokers = [
        Broker::Rabbitmq,
        Broker::Nats,
        Broker::Redis,
        Broker::Sqs,
        Broker::Kafka,
    ];
    // A broker that does not answer gets a port nothing listens on, and must be skipped.
    let urls: Vec<(Broker, Option<String>)> = brokers.iter().map(|b| (*b, b.url())).collect();
    let flag = |broker: Broker| format!("--{}-url", broker.name());
    let mut args: Vec<String> = [
        "bench",
        "brokers",
        "--messages",
        "120",
        "--batch-size",
        "20",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend([
        "--concurrency".to_owned(),
        "4".to_owned(),
        "--json".to_owned(),
    ]);
    for (broker, url) in &urls {
        let url = url.clone().unwrap_or_else(|| match broker {
            Broker::Rabbitmq => "amqp://127.0.0.1:1".to_owned(),
            Broker::Nats => "nats://127.0.0.1:1".to_owned(),
            Broker::Redis => "redis://127.0.0.1:1".to_owned(),
            Broker::Sqs => "http://127.0.0.1:1".to_owned(),
            Broker::Kafka => "kafka://127.0.0.1:1".to_owned(),
        });
        args.extend([flag(*broker), url]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = db
        .command(&args)
        .output()
        .expect("run jobguard bench brokers");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["messages"], 120, "{report}");
    assert_eq!(report["batch_size"], 20, "{report}");
    assert_eq!(report["exactly_once"], true, "{report}");
    let measured = report["brokers"].as_array().expect("brokers");
    let skipped = report["skipped"].as_array().expect("skipped");
    for (broker, url) in &urls {
        let name = broker.name();
        if url.is_none() {
            assert!(skipped.iter().any(|s| s["broker"] == name), "{report}");
            continue;
        }
        let figures = measured
            .iter()
            .find(|f| f["broker"] == name)
            .unwrap_or_else(|| panic!("{name} was not measured: {report}"));
        for (run, size) in [("per_message", 1), ("batched", 20)] {
            let run = &figures[run];
            assert_eq!(run["batch_size"], size, "{report}");
            assert_eq!(run["ledger_rows"], 120, "{report}");
            assert_eq!(run["applied"], 120, "{report}");
            assert_eq!(run["duplicates"], 0, "{report}");
            assert!(run["messages_per_s"].as_f64().unwrap() > 0.0, "{report}");
        }
        assert!(figures["ratio"].as_f64().unwrap() > 0.0, "{report}");
        assert_eq!(figures["exactly_once"], true, "{report}");
    }
}

/// `--brokers redis` measures Redis alone and reports every other broker as not selected,
/// without trying to reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_brokers_measures_only_the_selected_brokers() {
    let Some(url) = Broker::Redis.url() else {
        return;
    };
    let db = Db::postgres_or_sqlite("brokers::bench_selected");
    let output = db
        .command(&[
            "bench",
            "brokers",
            "--brokers",
            "redis",
            "--messages",
            "40",
            "--batch-size",
            "10",
            "--concurrency",
            "4",
            "--redis-url",
            &url,
            // Nothing listens here: a broker not selected is never dialled.
            "--rabbitmq-url",
            "amqp://127.0.0.1:1",
            "--json",
        ])
        .output()
        .expect("run jobguard bench brokers");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let measured = report["brokers"].as_array().expect("brokers");
    assert_eq!(measured.len(), 1, "{report}");
    assert_eq!(measured[0]["broker"], "redis", "{report}");
    assert_eq!(measured[0]["batched"]["ledger_rows"], 40, "{report}");
    let skipped = report["skipped"].as_array().expect("skipped");
    for name in ["rabbitmq", "nats", "sqs", "kafka"] {
        let entry = skipped
            .iter()
            .find(|s| s["broker"] == name)
            .unwrap_or_else(|| panic!("{name} not reported: {report}"));
        assert_eq!(entry["reason"], "not selected with --brokers", "{report}");
    }
}

/// SQS FIFO under SIGKILL: consumer processes on one FIFO queue, each message group an
/// account's credits in order, killed with SIGKILL at random moments (mid-job, between commit
/// and delete, with messages of their groups waiting behind) and started again. Every key is
/// applied once, none is lost or dead-lettered, and each account's ledger rows were written in
/// the order its credits were sent: a group's credits never ran at once or out of order. The
/// seed is printed; `JOBGUARD_CHAOS_SEED` replays a run's choices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_fifo_order_holds_with_consumers_killed_at_random() {
    const GROUPS: usize = 4;
    const PER_GROUP: usize = 25;
    const CONSUMERS: usize = 3;
    const KILLS: usize = 6;
    // Deliveries to spare: each kill and each message given back behind a failed one is a
    // receive more, and a message received this often without settling is dead-lettered.
    const DELIVERIES: &str = "50";
    let Some(url) = Broker::Sqs.url() else {
        return;
    };
    let queue = Queue {
        broker: Broker::Sqs,
        url,
        name: "jgcli.fifo-chaos.fifo".to_owned(),
    };
    let config = SqsConfig {
        max_deliveries: DELIVERIES.parse().unwrap(),
        ..queue.sqs()
    };
    assert!(config.is_fifo(), "{}", config.queue);
    sqs::remove(&queue.url, &config).await.unwrap();
    drop(
        SqsSource::connect(&queue.url, config.clone())
            .await
            .unwrap(),
    );
    let db = Db::postgres_or_sqlite("brokers::sqs_fifo_chaos");

    let sink = SqsSink::connect(&queue.url).unwrap();
    for seq in 0..PER_GROUP {
        for group in 1..=GROUPS {
            let order = format!("g{group}-{seq:03}");
            let key = JobKey::new("credit", [&order]).unwrap();
            let envelope = Envelope::new(
                "credit",
                key,
                &json!({"order": order, "account": group, "amount": 1, "hold_ms": 30}),
            )
            .unwrap();
            sink.publish_in_group(&config.queue, &envelope, &format!("account-{group}"))
                .await
                .unwrap();
        }
    }

    let seed = std::env::var("JOBGUARD_CHAOS_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("sqs_fifo_order_holds_with_consumers_killed_at_random: JOBGUARD_CHAOS_SEED={seed}");
    let mut state = seed;
    let mut below = move |n: u64| {
        // xorshift64
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let start = |n: usize| {
        let redelivery = format!("{}ms", redelivery(Broker::Sqs).as_millis());
        let mut command = jobguard();
        command
            .args(["consume", "--broker", "sqs", "--url", &queue.url])
            .args(["--queue", &queue.name, "--redelivery", &redelivery])
            .args(["--max-deliveries", DELIVERIES, "--retry-delay", "100ms"])
            .args(["--prefetch", "10", "--until-idle", "8s", "--json"])
            .args(["--database-url", &db.url]);
        Consumer(spawn(&db.dir, &format!("fifo-{n}"), command))
    };
    let mut started = 0;
    let mut consumers: Vec<Consumer> = (0..CONSUMERS)
        .map(|_| {
            started += 1;
            start(started)
        })
        .collect();
    let mut kills = 0;
    while kills < KILLS {
        tokio::time::sleep(Duration::from_millis(300 + below(1200))).await;
        let victim = below(CONSUMERS as u64) as usize;
        if consumers[victim].0.running() {
            consumers[victim].sigkill();
            kills += 1;
        }
        started += 1;
        consumers[victim] = start(started);
    }
    let mut dead = 0;
    for consumer in consumers {
        let report = consumer.report().await;
        dead += report["dead"].as_u64().unwrap();
    }
    // Anything a killed consumer held and no survivor took up yet.
    let report = start(started + 1).report().await;
    dead += report["dead"].as_u64().unwrap();

    let rows = ledger_in_order(&db).await;
    let total = (GROUPS * PER_GROUP) as i64;
    assert_eq!(
        ledger(&db).await,
        (total, total),
        "each key applied once, none lost (seed {seed})"
    );
    assert_eq!(dead, 0, "nothing dead-lettered (seed {seed})");
    for group in 1..=GROUPS as i64 {
        let orders: Vec<&str> = rows
            .iter()
            .filter(|(account, _)| *account == group)
            .map(|(_, key)| key.as_str())
            .collect();
        let sent: Vec<String> = (0..PER_GROUP)
            .map(|seq| format!("credit:g{group}-{seq:03}"))
            .collect();
        assert_eq!(
            orders, sent,
            "account {group}'s credits applied in the order sent (seed {seed})"
        );
    }
    let client = sqs::client(&queue.url).unwrap();
    for name in [&config.queue, &config.dead_letter_queue] {
        let url = client
            .get_queue_url()
            .queue_name(name.as_str())
            .send()
            .await
            .unwrap()
            .queue_url
            .unwrap();
        let left = client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .send()
            .await
            .unwrap();
        assert!(left.messages().is_empty(), "{name} is empty: {left:?}");
    }
    sqs::remove(&queue.url, &config).await.unwrap();
}

/// `jobguard_ledger`'s rows in the order they were written: account and job key.
async fn ledger_in_order(db: &Db) -> Vec<(i64, String)> {
    let sql = "select account, job_key from jobguard_ledger order by id";
    if db.is_postgres() {
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        let rows = sqlx::query_as(sql).fetch_all(&pool).await.unwrap();
        pool.close().await;
        rows
    } else {
        let pool = jobguard::sqlite::connect(&db.url, 1).await.unwrap();
        let rows = sqlx::query_as(sql).fetch_all(&pool).await.unwrap();
        pool.close().await;
        rows
    }
}
