//! `jobguard consume` as real processes against real RabbitMQ, NATS JetStream, Redis, SQS
//! (moto's server) and Kafka (tansu): a consumer killed with SIGKILL after its commit and before
//! its ack, whose message comes back to the next consumer as a duplicate (on Kafka, whose offset
//! was stored with the effect, it does not come back at all); the same for a batch, and a batch
//! killed before its commit; three consumer processes on one queue, each message published three
//! times; and `jobguard bench brokers` with a few messages.
//!
//! The database is a fresh PostgreSQL schema when PostgreSQL answers, else a SQLite file. A
//! broker that does not answer skips its tests with a message, except with `CI=true`, where it
//! fails them. Every child process is killed when its guard is dropped.

use std::time::{Duration, Instant};

use jobguard::JobKey;
use jobguard::broker::Envelope;
use jobguard::broker::kafka::{KafkaConfig, KafkaSink};
use jobguard::broker::nats::{NatsConfig, NatsSink, NatsSource};
use jobguard::broker::rabbitmq::{RabbitConfig, RabbitSink, RabbitSource};
use jobguard::broker::redis::{RedisConfig, RedisSink, RedisSource};
use jobguard::broker::sqs::{self, SqsConfig, SqsSink, SqsSource};
use jobguard_testsupport::{Broker, each_broker};
use serde_json::{Value, json};

use crate::common::{Db, Proc, jobguard, spawn};

mod bench;
mod kafka;
mod sqs_fifo;

/// The longest a consumer process may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(60);
/// What `jobguard consume --crash-after-commit` (a `faults` build) prints between its commit
/// and its ack.
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
/// come. On Kafka, also long enough for a partition that moves in a rebalance to deliver its
/// first message to its new owner on a loaded machine: with 3 s, one run of three consumers
/// that each stop once idle applied 24 of 30 keys, most likely a partition whose new owner
/// saw 3 s pass without a message and stopped, the others having stopped already.
fn idle(broker: Broker) -> &'static str {
    match broker {
        Broker::Sqs => "6s",
        Broker::Kafka => "8s",
        _ => IDLE,
    }
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
    rows(db, sql, None).await.unwrap().remove(0)
}

/// The rows `sql` reads from the test's database on a connection of its own, `$1` bound to
/// `bind` when given.
async fn rows<T>(db: &Db, sql: &'static str, bind: Option<&str>) -> sqlx::Result<Vec<T>>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>
        + for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>
        + Send
        + Unpin,
{
    if db.is_postgres() {
        let pool = sqlx::PgPool::connect(&db.url).await?;
        let query = sqlx::query_as(sql);
        let rows = match bind {
            Some(value) => query.bind(value),
            None => query,
        }
        .fetch_all(&pool)
        .await;
        pool.close().await;
        rows
    } else {
        let pool = jobguard::sqlite::connect(&db.url, 1).await.unwrap();
        let query = sqlx::query_as(sql);
        let rows = match bind {
            Some(value) => query.bind(value),
            None => query,
        }
        .fetch_all(&pool)
        .await;
        pool.close().await;
        rows
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
            if self.0.printed(line) {
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
    // Every copy is a duplicate; a message the broker delivers once more (an SQS visibility
    // that ran out on a loaded machine before the delete) is one more.
    assert_eq!(applied, 30);
    assert!(duplicates >= 60, "{duplicates} duplicates");
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
    #[cfg_attr(not(feature = "faults"), ignore = "needs --features faults")]
    batch_killed_before_commit,
    #[cfg_attr(not(feature = "faults"), ignore = "needs --features faults")]
    batch_killed_after_commit_before_ack,
    #[cfg_attr(not(feature = "faults"), ignore = "needs --features faults")]
    killed_after_commit_before_ack,
    three_consumer_processes,
    demo_through,
);
