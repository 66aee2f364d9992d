//! `jobguard bench brokers`: messages per second a broker consumer applies one per transaction
//! against in batches, on each broker that answers (RabbitMQ, NATS JetStream, Redis Streams,
//! Amazon SQS, Kafka).
//!
//! For each broker and each mode, the benchmark publishes N credit envelopes to a queue of its
//! own (not timed), then times one consumer from its start until every message was settled,
//! and reads the ledger back: N rows is exactly once.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use futures::StreamExt as _;
use jobguard::broker::kafka::KafkaSink;
use jobguard::broker::nats::NatsSink;
use jobguard::broker::rabbitmq::RabbitSink;
use jobguard::broker::redis::RedisSink;
use jobguard::broker::sqs::SqsSink;
use jobguard::broker::{Consumer, ConsumerConfig, ConsumerStats, Envelope};
use jobguard::{Guard, GuardConfig, JobKey, Outcome, TableName};
use serde::Serialize;
use sqlx::{Executor, Pool};

use super::jobs::BenchCredit;
use crate::broker::{Broker, Endpoint, OffsetPolicy};
use crate::database::{DEFAULT_URL, Database};
use crate::demo::ledger::{BENCH_LEDGER, Ledger, LedgerDb};
use crate::{on_pool, report};

const GUARD: &str = "jobguard_bench_broker_processed_jobs";

/// The longest one drain may take before the benchmark gives up.
const DEADLINE: Duration = Duration::from_secs(600);

/// How long the benchmark waits for a broker to answer before it skips it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Publishes in flight at once.
const PUBLISHING: usize = 128;

/// Arguments of `jobguard bench brokers`.
#[derive(Args)]
pub struct BenchBrokersArgs {
    /// Messages to publish and drain, for each broker and mode.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    messages: u32,
    /// Messages per transaction in the batched run (the per-message run uses 1).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(2..=500))]
    batch_size: u32,
    /// Messages run at once in the per-message run (its prefetch); the batched run's prefetch
    /// is two batches or this, whichever is more.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=500))]
    concurrency: u32,
    /// postgres://user@host/db, or sqlite:path.db for an embedded database.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_URL, hide_env_values = true)]
    database_url: String,
    /// RabbitMQ's URL.
    #[arg(long, default_value = "amqp://127.0.0.1:5672")]
    rabbitmq_url: String,
    /// NATS's URL.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// Redis's URL.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// SQS's endpoint (moto's server here; see `jobguard consume --help` for credentials).
    #[arg(long, default_value = "http://127.0.0.1:9324")]
    sqs_url: String,
    /// Kafka's URL.
    #[arg(long, default_value = "kafka://127.0.0.1:9092")]
    kafka_url: String,
    /// Only these brokers, comma-separated (all by default); the others are reported as
    /// skipped.
    #[arg(long, value_enum, value_delimiter = ',')]
    brokers: Vec<Broker>,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    json: bool,
}

/// The benchmark's result, as printed by `--json`.
#[derive(Debug, Serialize)]
pub struct BrokersBenchReport {
    pub backend: &'static str,
    pub messages: usize,
    pub batch_size: usize,
    pub brokers: Vec<BrokerFigures>,
    /// Brokers that did not answer, and why.
    pub skipped: Vec<Skipped>,
    /// Whether every run on every broker measured applied each message exactly once.
    pub exactly_once: bool,
}

/// One broker's figures.
#[derive(Debug, Serialize)]
pub struct BrokerFigures {
    pub broker: Broker,
    /// One message per transaction.
    pub per_message: Run,
    /// Up to `batch_size` messages per transaction.
    pub batched: Run,
    /// batched / per message messages per second.
    pub ratio: f64,
    pub exactly_once: bool,
}

/// One drain of the queue.
#[derive(Debug, Serialize)]
pub struct Run {
    pub batch_size: usize,
    pub prefetch: usize,
    pub messages_per_s: f64,
    pub seconds: f64,
    /// Rows in the ledger after the drain: the messages' effects.
    pub ledger_rows: i64,
    #[serde(flatten)]
    pub stats: ConsumerStats,
}

/// A broker that was not measured.
#[derive(Debug, Serialize)]
pub struct Skipped {
    pub broker: Broker,
    pub reason: String,
}

/// Runs `jobguard bench brokers`.
pub async fn run(args: BenchBrokersArgs) -> anyhow::Result<ExitCode> {
    let connections = args.concurrency + 4;
    let database = Database::connect(&args.database_url, connections).await?;
    let report = on_pool!(database, pool => measure(&pool, &args).await?);
    report::verdict(&report, args.json, render, report.exactly_once)
}

async fn measure<DB: LedgerDb>(
    pool: &Pool<DB>,
    args: &BenchBrokersArgs,
) -> anyhow::Result<BrokersBenchReport>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let messages = args.messages as usize;
    let batch_size = args.batch_size as usize;
    let concurrency = args.concurrency as usize;
    let envelopes = (0..messages as u64)
        .map(|n| Envelope::for_job::<DB, _>(&BenchCredit { n, amount: 500 }))
        .collect::<jobguard::Result<Vec<_>>>()?;
    let mut report = BrokersBenchReport {
        backend: DB::BACKEND,
        messages,
        batch_size,
        brokers: Vec::new(),
        skipped: Vec::new(),
        exactly_once: true,
    };
    for (broker, url) in [
        (Broker::Rabbitmq, &args.rabbitmq_url),
        (Broker::Nats, &args.nats_url),
        (Broker::Redis, &args.redis_url),
        (Broker::Sqs, &args.sqs_url),
        (Broker::Kafka, &args.kafka_url),
    ] {
        if !args.brokers.is_empty() && !args.brokers.contains(&broker) {
            let reason = "not selected with --brokers".to_owned();
            report.skipped.push(Skipped { broker, reason });
            continue;
        }
        let endpoint = |prefetch: usize| Endpoint {
            broker,
            url: url.clone(),
            queue: format!("jobguard.bench.{}", broker.name()),
            prefetch,
            max_deliveries: 5,
            redelivery: Duration::from_secs(30),
            offsets: OffsetPolicy::default(),
        };
        let reachable = tokio::time::timeout(CONNECT_TIMEOUT, endpoint(1).remove()).await;
        let unreachable = match reachable {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(format!("{error:#}")),
            Err(_) => Some(format!("no answer within {CONNECT_TIMEOUT:?}")),
        };
        if let Some(reason) = unreachable {
            if !args.json {
                eprintln!("{}: skipped, {reason}", broker.title());
            }
            report.skipped.push(Skipped { broker, reason });
            continue;
        }
        // Kafka: a topic, and so a group and stored offsets, of each run's own (a group's
        // committed offsets may outlive a topic made again under the same name).
        let of_run = |endpoint: Endpoint, run: &str| match broker {
            Broker::Kafka => Endpoint {
                queue: format!("{}.{}.{run}", endpoint.queue, std::process::id()),
                ..endpoint
            },
            _ => endpoint,
        };
        let one = of_run(endpoint(concurrency), "one");
        let per_message = drain(pool, &one, &envelopes, 1).await?;
        let batched_prefetch = (batch_size * 2).max(concurrency);
        let many = of_run(endpoint(batched_prefetch), "batched");
        let batched = drain(pool, &many, &envelopes, batch_size).await?;
        if broker == Broker::Kafka {
            one.remove().await?;
            many.remove().await?;
        }
        endpoint(1).remove().await?;
        let exactly_once = [&per_message, &batched]
            .iter()
            .all(|run| run.ledger_rows == messages as i64 && run.stats.applied == messages as u64);
        report.exactly_once &= exactly_once;
        if !args.json {
            eprintln!(
                "{}: {:.0} messages/s one per transaction, {:.0} in batches of {batch_size}",
                broker.title(),
                per_message.messages_per_s,
                batched.messages_per_s
            );
        }
        report.brokers.push(BrokerFigures {
            broker,
            ratio: batched.messages_per_s / per_message.messages_per_s,
            per_message,
            batched,
            exactly_once,
        });
    }
    Ok(report)
}

/// Publishes `envelopes` to a fresh queue on `endpoint`, then times one consumer with
/// `batch_size` until it has settled them all.
async fn drain<DB: LedgerDb>(
    pool: &Pool<DB>,
    endpoint: &Endpoint,
    envelopes: &[Envelope],
    batch_size: usize,
) -> anyhow::Result<Run>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let guard = reset(pool).await?;
    endpoint.remove().await?;
    // Declares the queue before the messages go in, so that none is missed.
    endpoint.declare().await?;
    publish(endpoint, envelopes).await?;

    let settled = Arc::new(Settled {
        count: AtomicUsize::new(0),
        expected: envelopes.len(),
        done: tokio::sync::Notify::new(),
    });
    let config = ConsumerConfig {
        retry_delay: Duration::from_millis(100),
        batch_size,
        ..ConsumerConfig::default()
    };
    let consumer = {
        let settled = Arc::clone(&settled);
        Consumer::with_config(guard, config)
            .register::<BenchCredit>()
            .on_outcome(move |_key: &JobKey, _outcome: &Outcome<()>| settled.one())
    };
    let all_settled = {
        let settled = Arc::clone(&settled);
        async move { settled.done.notified().await }
    };
    let started = Instant::now();
    let stats = tokio::time::timeout(DEADLINE, endpoint.run(consumer, all_settled))
        .await
        .with_context(|| {
            format!(
                "{} did not drain {} messages within {DEADLINE:?}",
                endpoint.broker.title(),
                envelopes.len()
            )
        })??;
    let seconds = started.elapsed().as_secs_f64();
    let (ledger_rows, _) = DB::read(pool, Ledger::Bench).await?;
    Ok(Run {
        batch_size,
        prefetch: endpoint.prefetch,
        messages_per_s: envelopes.len() as f64 / seconds,
        seconds,
        ledger_rows,
        stats,
    })
}

/// Counts messages settled, and says when all expected have been.
struct Settled {
    count: AtomicUsize,
    expected: usize,
    done: tokio::sync::Notify,
}

impl Settled {
    fn one(&self) {
        if self.count.fetch_add(1, Ordering::Relaxed) + 1 == self.expected {
            // Stored if the consumer is not waiting yet.
            self.done.notify_one();
        }
    }
}

/// Empty ledger and guard tables for a run.
async fn reset<DB: LedgerDb>(pool: &Pool<DB>) -> anyhow::Result<Guard<DB>>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let mut conn = pool.acquire().await?;
    for table in [GUARD, BENCH_LEDGER] {
        conn.execute(sqlx::AssertSqlSafe(format!("drop table if exists {table}")))
            .await?;
    }
    conn.execute(sqlx::AssertSqlSafe(format!(
        "create table {BENCH_LEDGER} (account bigint not null, amount bigint not null)"
    )))
    .await?;
    drop(conn);
    let guard = Guard::with_config(
        pool.clone(),
        GuardConfig::default().table(TableName::new(GUARD)?),
    )?;
    guard.migrate().await?;
    Ok(guard)
}

/// Publishes every envelope, many at once; not timed.
async fn publish(endpoint: &Endpoint, envelopes: &[Envelope]) -> anyhow::Result<()> {
    let queue = &endpoint.queue_on_broker();
    let published: Vec<jobguard::Result<()>> = match endpoint.broker {
        Broker::Rabbitmq => {
            let sink = RabbitSink::connect(&endpoint.url, "").await?;
            let published = futures::stream::iter(envelopes)
                .map(|envelope| sink.publish(queue, envelope))
                .buffer_unordered(PUBLISHING)
                .collect()
                .await;
            sink.close().await;
            published
        }
        Broker::Nats => {
            let sink = NatsSink::connect(&endpoint.url)
                .await?
                .without_message_ids();
            futures::stream::iter(envelopes)
                .map(|envelope| sink.publish(queue, envelope))
                .buffer_unordered(PUBLISHING)
                .collect()
                .await
        }
        Broker::Redis => {
            let sink = RedisSink::connect(&endpoint.url)
                .await?
                .dedupe_window(Duration::ZERO);
            futures::stream::iter(envelopes)
                .map(|envelope| sink.publish(queue, envelope))
                .buffer_unordered(PUBLISHING)
                .collect()
                .await
        }
        Broker::Sqs => {
            let sink = SqsSink::connect(&endpoint.url)?;
            futures::stream::iter(envelopes)
                .map(|envelope| sink.publish(queue, envelope))
                .buffer_unordered(PUBLISHING)
                .collect()
                .await
        }
        Broker::Kafka => {
            let sink = KafkaSink::connect(&endpoint.url)?;
            futures::stream::iter(envelopes)
                .map(|envelope| sink.publish(queue, envelope))
                .buffer_unordered(PUBLISHING)
                .collect()
                .await
        }
    };
    published.into_iter().collect::<jobguard::Result<()>>()?;
    Ok(())
}

/// The human-readable report.
pub fn render(report: &BrokersBenchReport) -> String {
    let mut out = format!(
        "jobguard bench brokers on {}: {} credit messages per run, batches of {}\n",
        report.backend, report.messages, report.batch_size
    );
    for figures in &report.brokers {
        let (one, batched) = (&figures.per_message, &figures.batched);
        out.push_str(&format!(
            "{:<15} one per transaction {:>8.0} messages/s (prefetch {})   batched {:>8.0} \
             messages/s (prefetch {})   ratio {:.2}   ledger rows {} / {}{}\n",
            figures.broker.title(),
            one.messages_per_s,
            one.prefetch,
            batched.messages_per_s,
            batched.prefetch,
            figures.ratio,
            one.ledger_rows,
            batched.ledger_rows,
            if figures.exactly_once {
                ""
            } else {
                "   NOT exactly once"
            },
        ));
    }
    for skipped in &report.skipped {
        out.push_str(&format!(
            "{:<15} skipped: {}\n",
            skipped.broker.title(),
            skipped.reason
        ));
    }
    out.push_str(if report.exactly_once {
        "verdict: exactly once, every run applied each message once\n"
    } else {
        "verdict: NOT exactly once\n"
    });
    out
}
