//! `jobguard consume`: runs the built-in jobs from a broker (RabbitMQ, NATS JetStream, Redis
//! Streams, Amazon SQS, Kafka) through the guard until Ctrl-C, or until idle.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
use jobguard::Guard;
use jobguard::broker::kafka::{BelowLogStart, PastLogEnd};
use jobguard::broker::{Consumer, ConsumerConfig, ConsumerStats};
use jobguard::worker::shutdown_signal;
use serde::Serialize;
use sqlx::Pool;

use crate::args::{ConnectWait, Target, parse_duration};
use crate::broker::{Broker, Endpoint, OffsetPolicy, URL_ENV};
use crate::builtin_jobs::{self, Credit, ExampleDb, Fail, Noop};
use crate::database::{Startup, redact};
use crate::exporter::MetricsArgs;
use crate::on_pool;
use crate::report;

/// `jobguard consume`: its arguments, and in a `faults` build the crash flags.
#[derive(Args, Debug)]
pub struct ConsumeCommand {
    #[command(flatten)]
    args: ConsumeArgs,
    #[cfg(feature = "faults")]
    #[command(flatten)]
    crash: crate::faults::CrashArgs,
}

/// Arguments of `jobguard consume`, which the demo's consumer process takes too.
#[derive(Args, Debug)]
pub struct ConsumeArgs {
    /// The broker to consume from.
    #[arg(long, value_enum)]
    broker: Broker,
    /// The broker's URL; by default the broker's port on 127.0.0.1 (amqp://127.0.0.1:5672,
    /// nats://127.0.0.1:4222, redis://127.0.0.1:6379, kafka://127.0.0.1:9092, http://127.0.0.1:9324
    /// for SQS, signed with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION when set).
    #[arg(long, env = URL_ENV, hide_env_values = true)]
    url: Option<String>,
    /// The RabbitMQ queue, the NATS subject (stored in the stream of the same name in capitals,
    /// `.` and `-` as `_`), the Redis stream, the SQS queue (`.` as `-`, a final `.fifo` kept: a
    /// FIFO queue), or the Kafka topic (consumed by the group `jobguard.<topic>`, offsets stored
    /// in the database). Declared when missing, with its dead letters.
    #[arg(long, default_value = "jobguard.jobs")]
    queue: String,
    /// Messages held unacknowledged at once, and jobs run at once [default: 10, or two
    /// batches with --batch-size]. Kafka: partitions run at once, each in order.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    prefetch: Option<u32>,
    /// Messages of batchable kinds (the built-in `credit` and `noop`) run up to this many in
    /// one transaction, acknowledged together after its commit; when one fails, the batch rolls
    /// back and its messages run one per transaction. 1 runs every message in its own
    /// transaction. A batch is never larger than --prefetch.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=500))]
    batch_size: u32,
    /// How long a batch the received messages left short waits once for more before it runs.
    #[arg(long, default_value = "2ms", value_parser = parse_duration)]
    batch_linger: Duration,
    /// Deliveries a message gets before it is dead-lettered.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    max_deliveries: u32,
    /// NATS: AckWait, extended by progress acks while a job runs. Redis: how long an entry is
    /// idle before another consumer claims it. SQS: the visibility timeout, in whole seconds,
    /// extended while a job runs. RabbitMQ redelivers when a consumer's connection drops, and
    /// ignores it. Kafka: the group's session timeout (at least 6s), after which a consumer that
    /// stopped heartbeating loses its partitions.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    redelivery: Duration,
    /// The delay before a failed delivery is given back; it doubles with each delivery, up to a
    /// minute.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    retry_delay: Duration,
    /// How long running jobs get to finish after Ctrl-C; then they are rolled back and their
    /// messages left to the broker.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    shutdown_timeout: Duration,
    /// Kafka: what a partition whose stored offset is below its log start does (retention or
    /// deleted records took the messages from there): resume at the log start, as Kafka's
    /// `auto.offset.reset=earliest` would, or stop with an error. Logged and counted either way.
    #[arg(long, value_enum, default_value_t = BelowStart::Resume)]
    kafka_below_log_start: BelowStart,
    /// Kafka: what a partition whose stored offset is past its log end does (the topic was made
    /// again under its name): stop with an error, or reset to the log start (keys applied from
    /// the old topic are then duplicates). Logged and counted either way.
    #[arg(long, value_enum, default_value_t = PastEnd::Refuse)]
    kafka_past_log_end: PastEnd,
    /// Stop once no message has arrived for this long and no job is running.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    until_idle: Option<Duration>,
    #[command(flatten)]
    metrics: MetricsArgs,
    #[command(flatten)]
    wait: ConnectWait,
    #[command(flatten)]
    target: Target,
}

/// `--kafka-below-log-start`.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum BelowStart {
    Resume,
    Refuse,
}

/// `--kafka-past-log-end`.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum PastEnd {
    Refuse,
    Reset,
}

/// What `jobguard consume --json` prints when it stops.
#[derive(Debug, Serialize)]
struct ConsumeReport {
    broker: Broker,
    url: String,
    queue: String,
    backend: &'static str,
    database: String,
    #[serde(flatten)]
    stats: ConsumerStats,
    seconds: f64,
}

impl ConsumeArgs {
    /// The queue to consume from, checked.
    pub fn endpoint(&self) -> anyhow::Result<Endpoint> {
        if self.redelivery < Duration::from_millis(300) {
            bail!(
                "--redelivery {} is too short: running jobs renew it every third of it; use at \
                 least 300ms, and longer than a job can stall",
                humantime::format_duration(self.redelivery)
            );
        }
        if self.broker == Broker::Sqs
            && (self.redelivery < Duration::from_secs(1) || self.redelivery.subsec_nanos() != 0)
        {
            bail!(
                "--redelivery {} is not a whole number of seconds: it is the SQS visibility \
                 timeout, which SQS takes in whole seconds, at least 1s",
                humantime::format_duration(self.redelivery)
            );
        }
        Ok(Endpoint {
            broker: self.broker,
            url: self
                .url
                .clone()
                .unwrap_or_else(|| self.broker.default_url().to_owned()),
            queue: self.queue.clone(),
            prefetch: self.prefetch() as usize,
            max_deliveries: self.max_deliveries,
            redelivery: self.redelivery,
            offsets: OffsetPolicy {
                below_log_start: match self.kafka_below_log_start {
                    BelowStart::Resume => BelowLogStart::Resume,
                    BelowStart::Refuse => BelowLogStart::Refuse,
                },
                past_log_end: match self.kafka_past_log_end {
                    PastEnd::Refuse => PastLogEnd::Refuse,
                    PastEnd::Reset => PastLogEnd::Reset,
                },
            },
        })
    }

    /// The database the jobs run on.
    pub fn database_url(&self) -> &str {
        &self.target.database_url
    }

    /// Messages held unacknowledged at once: as asked, else 10, or room for two batches.
    fn prefetch(&self) -> u32 {
        self.prefetch
            .unwrap_or_else(|| (self.batch_size * 2).max(10))
    }

    /// Connections in the pool: one per job running at once, and a few to spare.
    pub fn connections(&self) -> u32 {
        self.prefetch() + 4
    }
}

/// Runs `jobguard consume`.
pub async fn consume(command: ConsumeCommand) -> anyhow::Result<ExitCode> {
    let args = &command.args;
    let endpoint = args.endpoint()?;
    // Ctrl-C and SIGTERM are caught from here on, one signal for the whole run: a stop asked
    // while the consumer still starts ends it cleanly instead of killing it.
    let signal = shutdown_signal().boxed().shared();
    let _ = signal.clone().now_or_never();
    let startup = Startup::new(args.database_url(), args.wait.connect_timeout);
    let database = tokio::select! {
        database = startup.connect(args.database_url(), args.connections()) => database?,
        () = signal.clone() => {
            eprintln!("jobguard consume: stopped while starting; no message was taken");
            return Ok(ExitCode::SUCCESS);
        }
    };
    on_pool!(database, pool => run(pool, endpoint, command, signal).await)
}

async fn run<DB: ExampleDb>(
    pool: Pool<DB>,
    endpoint: Endpoint,
    command: ConsumeCommand,
    signal: Shared<BoxFuture<'static, ()>>,
) -> anyhow::Result<ExitCode> {
    let args = command.args;
    let database = redact(&args.target.database_url);
    let config = ConsumerConfig {
        retry_delay: args.retry_delay,
        shutdown_timeout: args.shutdown_timeout,
        stop_when_idle_for: args.until_idle,
        batch_size: args.batch_size as usize,
        batch_linger: args.batch_linger,
    };
    let consumer = Consumer::with_config(Guard::new(pool.clone()), config)
        .register::<Credit>()
        .register::<Noop>()
        .register::<Fail>();
    #[cfg(feature = "faults")]
    let consumer = command.crash.install(consumer);
    consumer
        .migrate()
        .await
        .with_context(|| format!("cannot create the guard's table in {database}"))?;
    builtin_jobs::migrate(&pool)
        .await
        .with_context(|| format!("cannot create the built-in jobs' tables in {database}"))?;

    if !args.target.json {
        eprintln!(
            "jobguard consume: `{}` on {} at {}, into {database} ({}), {} jobs at once{}, kinds \
             credit, noop, fail; {}",
            endpoint.queue_on_broker(),
            endpoint.broker.name(),
            redact(&endpoint.url),
            DB::BACKEND,
            endpoint.prefetch,
            match args.batch_size {
                1 => String::new(),
                size => format!(" in batches of up to {size}"),
            },
            match args.until_idle {
                Some(idle) => format!("stops when idle for {}", humantime::format_duration(idle)),
                None => "Ctrl-C to stop".to_owned(),
            }
        );
    }
    // Before the first message, so that every outcome is counted.
    if let Some(endpoint) = args.metrics.start(pool.clone(), signal.clone()).await? {
        eprintln!(
            "jobguard consume: metrics on http://{}/metrics, health on /health",
            endpoint.address
        );
    }
    let started = Instant::now();
    let stats = endpoint.run(consumer, signal).await?;
    let report = ConsumeReport {
        broker: endpoint.broker,
        url: redact(&endpoint.url),
        queue: endpoint.queue_on_broker(),
        backend: DB::BACKEND,
        database,
        stats,
        seconds: started.elapsed().as_secs_f64(),
    };
    pool.close().await;
    report::print(&report, args.target.json, render)?;
    Ok(ExitCode::SUCCESS)
}

fn render(report: &ConsumeReport) -> String {
    let stats = &report.stats;
    let table = report::outcomes(
        ["outcome", "messages", "meaning"],
        &[
            (
                "applied",
                stats.applied,
                "effect committed with the guard row, then acked",
            ),
            (
                "duplicates",
                stats.duplicates,
                "key already applied: acked, effect skipped",
            ),
            ("failed", stats.failed, "given back for another delivery"),
            ("dead", stats.dead, "sent to the broker's dead letters"),
            (
                "unacked",
                stats.unacked,
                "the broker did not take the ack: comes again as a duplicate",
            ),
            (
                "released",
                stats.released,
                "still running at shutdown: rolled back, left to the broker",
            ),
        ],
    );
    format!(
        "consumer stopped after {:.2} s on `{}` ({})\n{table}\n",
        report.seconds,
        report.queue,
        report.broker.name()
    )
}
