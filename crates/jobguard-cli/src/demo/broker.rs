//! `jobguard demo --broker NAME`: the seed's experiment through a real broker, and the consumer
//! process it starts and kills, `jobguard demo-process broker-consumer`.
//!
//! Each of N credit jobs is published D times to a queue (RabbitMQ, SQS), a stream (NATS
//! JetStream or Redis) or a topic (Kafka) of the demo's own, as a producer retrying its publishes
//! would. One consumer process is killed with SIGKILL right after its first job committed and
//! before it acknowledged the message, so the broker delivers that message again (on Kafka the
//! guarded consumer's offset committed with the effect, and the message does not come back).
//! The rest are consumed by C jobs at once in this process: once with the naive credit job,
//! which appends on every delivery, and once through the guard.

use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::{FutureExt as _, TryFutureExt as _};
use jobguard::broker::kafka::KafkaSink;
use jobguard::broker::nats::NatsSink;
use jobguard::broker::rabbitmq::RabbitSink;
use jobguard::broker::redis::RedisSink;
use jobguard::broker::sqs::SqsSink;
use jobguard::broker::{Consumer, ConsumerConfig, Delivery, Envelope, Source};
use jobguard::worker::shutdown_signal;
use jobguard::{Job, JobError, JobKey, KeyError, Outcome};
use serde::{Deserialize, Serialize};
use sqlx::Pool;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Semaphore;

use super::DemoReport;
use super::experiment::{self, RunReport, Shape};
use super::ledger::{self, Ledger, LedgerDb};
use super::scenarios::Mode;
use crate::broker::{Broker, BrokerSource, Endpoint, OffsetPolicy, URL_ENV};
use crate::builtin_jobs::{Credit, Example};
use crate::crash_point::{CRASH_POINT, report_line};
use crate::database::{Database, redact};
use crate::{on_pool, report};

/// The longest the demo waits for its deliveries before it fails.
const DEADLINE: Duration = Duration::from_secs(180);

/// The demo's guarded credit job: appends to the guarded ledger, through the consumer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DemoCredit(pub Credit);

impl<DB: LedgerDb> Job<DB> for DemoCredit {
    const KIND: &'static str = "credit";

    fn key(&self) -> Result<JobKey, KeyError> {
        self.0.job_key()
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        DB::append(conn, Ledger::Guarded, self.0.account, self.0.amount).await?;
        Ok(())
    }
}

/// `jobguard demo-process broker-consumer`: the demo's naive or guarded consumer on `pool`'s
/// demo tables, from `endpoint`, until it is killed after its first commit, before the ack.
pub async fn consumer_process<DB: LedgerDb>(
    pool: &Pool<DB>,
    endpoint: &Endpoint,
    mode: Mode,
) -> anyhow::Result<()> {
    match mode {
        Mode::Naive if endpoint.broker == Broker::Kafka => {
            super::kafka::naive_consumer(pool, endpoint, usize::MAX, true).await?;
        }
        Mode::Naive => {
            let source = endpoint.subscribe().await?;
            naive_consumer(pool, source, usize::MAX, true).await?;
        }
        Mode::Guarded => {
            let consumer = guarded_consumer(pool, Settle::Crash)?;
            endpoint.run(consumer, shutdown_signal()).await?;
        }
    }
    Ok(())
}

/// What the guarded consumer does once a message's transaction committed.
enum Settle {
    /// Counts it, and goes on to its ack.
    Count(Arc<Settled>),
    /// After the first applied job, prints [`CRASH_POINT`] and waits there, its thread parked,
    /// to be killed: the message is never acknowledged.
    Crash,
}

/// The guarded consumer of the demo's credits on `pool`'s demo tables.
fn guarded_consumer<DB: LedgerDb>(pool: &Pool<DB>, settle: Settle) -> anyhow::Result<Consumer<DB>> {
    let config = ConsumerConfig {
        retry_delay: Duration::from_millis(100),
        shutdown_timeout: Duration::from_secs(10),
        stop_when_idle_for: None,
        ..ConsumerConfig::default()
    };
    let consumer = Consumer::with_config(ledger::guard_for(pool)?, config)
        .register::<DemoCredit>()
        .on_outcome(move |key: &JobKey, outcome: &Outcome<()>| match &settle {
            Settle::Count(settled) => settled.one(),
            Settle::Crash if outcome.is_applied() => {
                report_line(&format!("{CRASH_POINT} {key}"));
                // The ack comes after this call returns: it never does. The runtime moves
                // its other tasks off this thread first.
                tokio::task::block_in_place(|| {
                    loop {
                        std::thread::park();
                    }
                });
            }
            Settle::Crash => {}
        });
    Ok(consumer)
}

/// Counts settled deliveries, and says when all expected have been.
struct Settled {
    count: AtomicUsize,
    expected: usize,
    done: tokio::sync::Notify,
}

impl Settled {
    fn new(expected: usize) -> Arc<Self> {
        Arc::new(Settled {
            count: AtomicUsize::new(0),
            expected,
            done: tokio::sync::Notify::new(),
        })
    }

    fn one(&self) {
        if self.count.fetch_add(1, Ordering::SeqCst) + 1 >= self.expected {
            self.done.notify_one();
        }
    }

    async fn all(&self) {
        self.done.notified().await;
    }
}

/// The naive consumer: appends every delivery's credit to the naive ledger, then acks. With
/// `crash`, it prints [`CRASH_POINT`] after its first commit and waits to be killed; otherwise
/// it returns after `expected` deliveries.
async fn naive_consumer<DB: LedgerDb>(
    pool: &Pool<DB>,
    mut source: BrokerSource,
    expected: usize,
    crash: bool,
) -> anyhow::Result<usize> {
    let permits = Arc::new(Semaphore::new(source.prefetch()));
    let settled = Settled::new(expected);
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        if !crash && settled.count.load(Ordering::SeqCst) >= expected {
            break;
        }
        while let Some(joined) = tasks.try_join_next() {
            joined??;
        }
        let first = Arc::clone(&permits).acquire_owned().await?;
        let deliveries = tokio::select! {
            () = settled.all(), if !crash => break,
            deliveries = source.receive(1 + permits.available_permits()) => deliveries?,
        };
        let mut first = Some(first);
        for delivery in deliveries {
            let permit = match first.take() {
                Some(permit) => permit,
                None => Arc::clone(&permits).acquire_owned().await?,
            };
            let (pool, settled) = (pool.clone(), Arc::clone(&settled));
            tasks.spawn(async move {
                let envelope = Envelope::from_bytes(delivery.body())?;
                let credit: Credit = serde_json::from_value(envelope.payload)?;
                ledger::credit_naive(&pool, &credit).await?;
                if crash {
                    report_line(&format!("{CRASH_POINT} {}", credit.job_key()?));
                    std::future::pending::<()>().await;
                }
                delivery.ack().await?;
                settled.one();
                drop(permit);
                anyhow::Ok(())
            });
        }
    }
    while let Some(joined) = tasks.join_next().await {
        joined??;
    }
    source.close().await;
    Ok(settled.count.load(Ordering::SeqCst))
}

/// What `jobguard demo --broker NAME --json` prints: the base demo's fields and the broker's.
#[derive(Debug, Serialize)]
struct BrokerDemoReport {
    broker: Broker,
    broker_url: String,
    /// Consumer processes killed after a commit and before its ack, per run.
    killed_consumers: usize,
    #[serde(flatten)]
    demo: DemoReport,
}

/// Runs the demo through `broker`.
pub async fn run(
    broker: Broker,
    database_url: &str,
    shape: Shape,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let url = std::env::var(URL_ENV).unwrap_or_else(|_| broker.default_url().to_owned());
    let database = redact(database_url);
    let report = on_pool!(Database::connect(database_url, shape.concurrency + 4).await?, pool => {
        run_on(&pool, broker, &url, database_url, database, shape).await?
    });
    let render = |report: &BrokerDemoReport| {
        format!(
            "through {} at {}: each message published {} times; one consumer process killed \
             (SIGKILL) after its commit and before its ack, in each run\n{}",
            broker.title(),
            report.broker_url,
            shape.deliveries,
            super::render(&report.demo)
        )
    };
    report::verdict(&report, json, render, report.demo.exactly_once)
}

async fn run_on<DB: LedgerDb>(
    pool: &Pool<DB>,
    broker: Broker,
    url: &str,
    database_url: &str,
    database: String,
    shape: Shape,
) -> anyhow::Result<BrokerDemoReport> {
    let started = Instant::now();
    DB::reset(pool).await?;
    let credits = experiment::credits(&shape);
    let envelopes: Vec<Envelope> = credits
        .iter()
        .map(|credit| Envelope::new("credit", credit.job_key()?, credit))
        .collect::<jobguard::Result<Vec<_>>>()?;
    let copies: Vec<Envelope> = envelopes
        .iter()
        .flat_map(|envelope| std::iter::repeat_n(envelope.clone(), shape.deliveries))
        .collect();
    let expected = copies.len();

    let mut runs = Vec::new();
    for mode in [Mode::Naive, Mode::Guarded] {
        let run_started = Instant::now();
        let endpoint = Endpoint {
            broker,
            url: url.to_owned(),
            queue: match broker {
                // Topics and groups of the run's own: a consumer group's committed offsets may
                // outlive a topic deleted and made again under the same name (tansu keeps
                // them), and would start the new topic's consumers past its end.
                Broker::Kafka => {
                    format!("jobguard-demo-{}-{}", mode_name(mode), std::process::id())
                }
                _ => format!("jobguard-demo-{}", mode_name(mode)),
            },
            prefetch: shape.concurrency as usize,
            max_deliveries: 5,
            redelivery: redelivery(broker),
            offsets: OffsetPolicy::default(),
        };
        endpoint
            .remove()
            .await
            .with_context(|| format!("cannot reach {} at {}", broker.title(), redact(url)))?;
        // Declares the queue, so that what is published waits in it.
        let source = match broker {
            Broker::Kafka => {
                endpoint.declare().await?;
                None
            }
            _ => Some(endpoint.source().await?),
        };
        publish_copies(&endpoint, &copies).await?;
        kill_after_commit(&endpoint, mode, database_url).await?;

        let mut run = RunReport {
            crashes: Some(1),
            ..RunReport::default()
        };
        match mode {
            Mode::Naive => {
                let consumed = match source {
                    Some(source) => naive_consumer(pool, source, expected, false).boxed(),
                    None => super::kafka::naive_consumer(pool, &endpoint, expected, false).boxed(),
                };
                let consumed = tokio::time::timeout(DEADLINE, consumed)
                    .await
                    .context("the naive consumer did not get every delivery in time")??;
                run.deliveries = consumed + 1;
                run.applied = run.deliveries;
            }
            Mode::Guarded => {
                // Kafka resumes after the offset stored with the killed consumer's commit: its
                // message does not come again.
                let redelivered = if broker == Broker::Kafka { 0 } else { 1 };
                let settled = Settled::new(expected - 1 + redelivered);
                let consumer = guarded_consumer(pool, Settle::Count(Arc::clone(&settled)))?;
                let all = async move { settled.all().await };
                let consuming = match source {
                    Some(source) => consumer
                        .run(source, all)
                        .map_err(anyhow::Error::from)
                        .boxed(),
                    None => endpoint.run(consumer, all).boxed(),
                };
                let stats = tokio::time::timeout(DEADLINE, consuming)
                    .await
                    .context("the guarded consumer did not get every delivery in time")??;
                // The killed consumer's delivery applied its job.
                run.applied = stats.applied as usize + 1;
                run.duplicates = stats.duplicates as usize;
                run.failed = (stats.failed + stats.dead) as usize;
                run.deliveries = run.applied + run.duplicates + run.failed;
            }
        }
        endpoint.remove().await?;
        run.seconds = run_started.elapsed().as_secs_f64();
        run.deliveries_per_second = run.deliveries as f64 / run.seconds;
        experiment::read_back(pool, &mut run, mode == Mode::Guarded).await?;
        runs.push(run);
    }
    let runs = runs.try_into().expect("two runs");
    let demo = DemoReport::of_experiment::<DB>(database, shape, &credits, runs, started);
    Ok(BrokerDemoReport {
        broker,
        broker_url: redact(url),
        killed_consumers: 1,
        demo,
    })
}

/// How long a message waits unacknowledged before it is delivered again: 2 s, and 10 s on SQS,
/// whose local server (moto, in Python) answers slowly enough on a loaded machine that a message
/// the naive consumer (which never extends it) finished was received again before its delete
/// with 5 s.
fn redelivery(broker: Broker) -> Duration {
    match broker {
        Broker::Sqs => Duration::from_secs(10),
        _ => Duration::from_secs(2),
    }
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Naive => "naive",
        Mode::Guarded => "guarded",
    }
}

/// Starts a consumer process (`jobguard demo-process broker-consumer`) that takes one message,
/// commits its job and prints the crash point, and kills it there with SIGKILL: its message is
/// never acknowledged.
async fn kill_after_commit(
    endpoint: &Endpoint,
    mode: Mode,
    database_url: &str,
) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("find the jobguard executable")?;
    let mut child = tokio::process::Command::new(exe)
        .args(["demo-process", "broker-consumer"])
        .args(["--broker", endpoint.broker.name(), "--url"])
        .arg(&endpoint.url)
        .args(["--queue", &endpoint.queue, "--prefetch", "1"])
        .args(["--max-deliveries", &endpoint.max_deliveries.to_string()])
        .arg("--redelivery")
        .arg(format!("{}ms", endpoint.redelivery.as_millis()))
        .args(["--database-url", database_url, "--mode", mode_name(mode)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("start a consumer process")?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let reached = tokio::time::timeout(DEADLINE, async {
        while let Some(line) = lines.next_line().await? {
            if line.starts_with(CRASH_POINT) {
                return anyhow::Ok(true);
            }
        }
        Ok(false)
    })
    .await;
    child.start_kill()?;
    let output = child.wait_with_output().await?;
    match reached {
        Ok(Ok(true)) => Ok(()),
        Ok(Ok(false)) => bail!(
            "the consumer process ended before its crash point ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Ok(Err(error)) => Err(error),
        Err(_) => bail!("the consumer process did not reach its crash point in time"),
    }
}

/// Publishes every body, without the broker's deduplication: each copy arrives.
async fn publish_copies(endpoint: &Endpoint, envelopes: &[Envelope]) -> anyhow::Result<()> {
    match endpoint.broker {
        Broker::Rabbitmq => {
            let sink = RabbitSink::connect(&endpoint.url, "").await?;
            for envelope in envelopes {
                sink.publish(&endpoint.queue, envelope).await?;
            }
            sink.close().await;
        }
        Broker::Nats => {
            let sink = NatsSink::connect(&endpoint.url)
                .await?
                .without_message_ids();
            for envelope in envelopes {
                sink.publish(&endpoint.queue, envelope).await?;
            }
        }
        Broker::Redis => {
            let sink = RedisSink::connect(&endpoint.url)
                .await?
                .dedupe_window(Duration::ZERO);
            for envelope in envelopes {
                sink.publish(&endpoint.queue, envelope).await?;
            }
        }
        Broker::Sqs => {
            // A standard queue: no deduplication, every copy is stored.
            let sink = SqsSink::connect(&endpoint.url)?;
            for envelope in envelopes {
                sink.publish(&endpoint.queue_on_broker(), envelope).await?;
            }
        }
        Broker::Kafka => {
            // The idempotent producer drops its own retries, never a second send. One at a
            // time, each message its own record batch: the killed consumer's stored offset is
            // then where a batch starts, which tansu serves at once (from inside a batch it
            // serves the batches after it, and the consumer reads the partition again).
            let sink = KafkaSink::connect(&endpoint.url)?;
            for envelope in envelopes {
                sink.publish(&endpoint.queue, envelope).await?;
            }
        }
    }
    Ok(())
}
