//! `jobguard consume`: runs the built-in jobs from a broker (RabbitMQ, NATS JetStream, Redis
//! Streams) through the guard until Ctrl-C, or until idle.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use comfy_table::{Cell, CellAlignment};
use futures::FutureExt as _;
use jobguard::broker::{Consumer, ConsumerConfig, ConsumerStats, Source};
use jobguard::worker::shutdown_signal;
use jobguard::{Guard, JobKey, Outcome};
use serde::Serialize;
use sqlx::{Pool, Postgres, Sqlite};

use super::{Target, parse_duration, table};
use crate::broker_demo::{self, Broker, CRASH_POINT, Endpoint, URL_ENV, report_line};
use crate::database::{Database, redact};
use crate::jobs::{self, Credit, ExampleDb, Fail, Noop};
use crate::ledger::LedgerDb;
use crate::scenarios::Mode;

/// Arguments of `jobguard consume`.
#[derive(Args, Debug)]
pub struct ConsumeArgs {
    /// The broker to consume from.
    #[arg(long, value_enum)]
    broker: Broker,
    /// The broker's URL; by default the broker's port on 127.0.0.1 (amqp://127.0.0.1:5672,
    /// nats://127.0.0.1:4222, redis://127.0.0.1:6379).
    #[arg(long, env = URL_ENV, hide_env_values = true)]
    url: Option<String>,
    /// The RabbitMQ queue, the NATS subject (stored in the stream of the same name in capitals,
    /// `.` and `-` as `_`), or the Redis stream. Declared when missing, with its dead letters.
    #[arg(long, default_value = "jobguard.jobs")]
    queue: String,
    /// Messages held unacknowledged at once, and jobs run at once.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    prefetch: u32,
    /// Deliveries a message gets before it is dead-lettered.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    max_deliveries: u32,
    /// NATS: AckWait, extended by progress acks while a job runs. Redis: how long an entry is
    /// idle before another consumer claims it. RabbitMQ redelivers when a consumer's connection
    /// drops, and ignores it.
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
    /// Stop once no message has arrived for this long and no job is running.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    until_idle: Option<Duration>,
    /// After the first job's commit, print JOBGUARD_CRASH_POINT and wait to be killed, never
    /// acknowledging its message (for fault tests and the demo).
    #[arg(long, hide = true)]
    crash_after_commit: bool,
    /// Run the demo's credit job on the demo's tables instead of the built-in jobs.
    #[arg(long, hide = true, value_enum)]
    demo: Option<Mode>,
    #[command(flatten)]
    target: Target,
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

/// Runs `jobguard consume`.
pub async fn consume(args: ConsumeArgs) -> anyhow::Result<ExitCode> {
    if args.redelivery < Duration::from_millis(300) {
        bail!(
            "--redelivery {} is too short: running jobs renew it every third of it; use at \
             least 300ms, and longer than a job can stall",
            humantime::format_duration(args.redelivery)
        );
    }
    let endpoint = Endpoint {
        broker: args.broker,
        url: args
            .url
            .clone()
            .unwrap_or_else(|| args.broker.default_url().to_owned()),
        queue: args.queue.clone(),
        prefetch: args.prefetch as usize,
        max_deliveries: args.max_deliveries,
        redelivery: args.redelivery,
    };
    let connections = args.prefetch + 4;
    match super::connect(&args.target.database_url, connections).await? {
        Database::Postgres(pool) => run::<Postgres>(pool, endpoint, args).await,
        Database::Sqlite(pool) => run::<Sqlite>(pool, endpoint, args).await,
    }
}

async fn run<DB: ExampleDb + LedgerDb>(
    pool: Pool<DB>,
    endpoint: Endpoint,
    args: ConsumeArgs,
) -> anyhow::Result<ExitCode> {
    let database = redact(&args.target.database_url);
    let source = endpoint.source().await.with_context(|| {
        format!(
            "cannot consume `{}` from {} at {}",
            endpoint.queue,
            endpoint.broker.name(),
            redact(&endpoint.url)
        )
    })?;
    match args.demo {
        Some(Mode::Naive) => {
            broker_demo::naive_consumer(&pool, source, usize::MAX, args.crash_after_commit).await?;
            return Ok(ExitCode::SUCCESS);
        }
        Some(Mode::Guarded) => {
            let consumer = broker_demo::guarded_consumer(&pool, args.crash_after_commit, None)?;
            consumer.run(source, shutdown_signal()).await?;
            return Ok(ExitCode::SUCCESS);
        }
        None => {}
    }

    let config = ConsumerConfig {
        retry_delay: args.retry_delay,
        shutdown_timeout: args.shutdown_timeout,
        stop_when_idle_for: args.until_idle,
    };
    let mut consumer = Consumer::with_config(Guard::new(pool.clone()), config)
        .register::<Credit>()
        .register::<Noop>()
        .register::<Fail>();
    if args.crash_after_commit {
        consumer = consumer.before_ack(|key: &JobKey, outcome: &Outcome<()>| {
            if outcome.is_applied() {
                report_line(&format!("{CRASH_POINT} {key}"));
                return std::future::pending().boxed();
            }
            std::future::ready(()).boxed()
        });
    }
    consumer
        .migrate()
        .await
        .with_context(|| format!("cannot create the guard's table in {database}"))?;
    jobs::migrate(&pool)
        .await
        .with_context(|| format!("cannot create the built-in jobs' tables in {database}"))?;

    if !args.target.json {
        eprintln!(
            "jobguard consume: `{}` on {} at {}, into {database} ({}), {} jobs at once, kinds \
             credit, noop, fail; {}",
            endpoint.queue,
            endpoint.broker.name(),
            redact(&endpoint.url),
            DB::BACKEND,
            source.prefetch(),
            match args.until_idle {
                Some(idle) => format!("stops when idle for {}", humantime::format_duration(idle)),
                None => "Ctrl-C to stop".to_owned(),
            }
        );
    }
    let started = Instant::now();
    let stats = consumer.run(source, shutdown_signal()).await?;
    let report = ConsumeReport {
        broker: endpoint.broker,
        url: redact(&endpoint.url),
        queue: endpoint.queue,
        backend: DB::BACKEND,
        database,
        stats,
        seconds: started.elapsed().as_secs_f64(),
    };
    pool.close().await;
    if args.target.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(ExitCode::SUCCESS)
}

fn render(report: &ConsumeReport) -> String {
    let stats = &report.stats;
    let mut table = table(&["outcome", "messages", "meaning"]);
    for (name, n, meaning) in [
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
    ] {
        table.add_row(vec![
            Cell::new(name),
            Cell::new(n).set_alignment(CellAlignment::Right),
            Cell::new(meaning),
        ]);
    }
    format!(
        "consumer stopped after {:.2} s on `{}` ({})\n{table}\n",
        report.seconds,
        report.queue,
        report.broker.name()
    )
}
