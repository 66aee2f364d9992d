//! `jobguard relay`: delivers the outbox's messages to a webhook until Ctrl-C, or once.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use jobguard::outbox::{Outbox, OutboxCounts, Relay, RelayConfig, RelayReport, WebhookSink};
use jobguard::worker::shutdown_signal;
use jobguard::{Backend, RetryPolicy};
use serde::Serialize;
use sqlx::Pool;

use crate::args::{ConnectWait, Target, parse_duration};
use crate::database::{Startup, redact};
use crate::on_pool;
use crate::report;

/// Arguments of `jobguard relay`.
#[derive(Args, Debug)]
pub struct RelayArgs {
    /// Where messages go: each is POSTed to URL/TOPIC with its id as `Idempotency-Key`.
    #[arg(long, value_name = "URL")]
    webhook_url: String,
    /// Deliver what is due now, then exit, instead of running until Ctrl-C. Waits for a relay
    /// that holds the outbox's lease for up to twice --lease.
    #[arg(long)]
    once: bool,
    /// Messages read per batch.
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    batch: u32,
    /// Topics delivered at once; the messages of one topic go one at a time, in order.
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    concurrency: u32,
    /// How often an idle relay looks for messages.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    poll: Duration,
    /// The delay before a failed delivery is tried again; it doubles with each attempt, up to
    /// an hour.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    backoff: Duration,
    /// Delivery attempts before a message is dead-lettered.
    #[arg(long, value_name = "N", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    max_attempts: u32,
    /// How long the relay's lease on the outbox lasts unrenewed (at least 300ms): a relay that
    /// dies holds back the others for at most this long.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    lease: Duration,
    #[command(flatten)]
    wait: ConnectWait,
    #[command(flatten)]
    target: Target,
}

/// What `jobguard relay --json` prints when it stops.
#[derive(Debug, Serialize)]
struct RelayRun {
    backend: &'static str,
    database: String,
    webhook_url: String,
    #[serde(flatten)]
    report: RelayReport,
    /// Messages in the outbox by state when the relay stopped.
    outbox: OutboxCounts,
    seconds: f64,
}

/// Runs the relay until Ctrl-C, or until nothing is due with `--once`.
pub async fn relay(args: RelayArgs) -> anyhow::Result<ExitCode> {
    let config = RelayConfig {
        batch_size: args.batch,
        concurrency: args.concurrency as usize,
        poll_interval: args.poll,
        retry: RetryPolicy {
            max_attempts: args.max_attempts,
            base: args.backoff,
            ..RetryPolicy::default()
        },
        lease: args.lease,
    };
    // Mistakes in the flags are reported before connecting.
    config.validate()?;
    let sink = WebhookSink::new(&args.webhook_url)?;
    // Deliveries mark their messages on connections of their own, one per topic at a time.
    let connections = args.concurrency.min(16) + 2;
    let database = Startup::new(&args.target.database_url, args.wait.connect_timeout)
        .connect(&args.target.database_url, connections)
        .await?;
    on_pool!(database, pool => run(pool, sink, config, args).await)
}

async fn run<DB: Backend>(
    pool: Pool<DB>,
    sink: WebhookSink,
    config: RelayConfig,
    args: RelayArgs,
) -> anyhow::Result<ExitCode> {
    let database = redact(&args.target.database_url);
    let relay = start(pool.clone(), sink, config)
        .await
        .with_context(|| format!("cannot start the relay on {database}"))?;
    if !args.target.json {
        eprintln!(
            "jobguard relay: outbox `{}` on {database} ({}) to {}; {}",
            relay.outbox().table(),
            DB::BACKEND,
            args.webhook_url,
            if args.once {
                "delivers what is due, then exits"
            } else {
                "Ctrl-C to stop"
            }
        );
    }
    let started = Instant::now();
    let report = if args.once {
        drain(&relay).await?
    } else {
        relay.run(shutdown_signal()).await?
    };
    let outbox = relay
        .outbox()
        .counts()
        .await
        .context("cannot count the outbox's messages")?;
    let run = RelayRun {
        backend: DB::BACKEND,
        database,
        webhook_url: args.webhook_url,
        report,
        outbox,
        seconds: started.elapsed().as_secs_f64(),
    };
    pool.close().await;
    report::print(&run, args.target.json, |run| {
        format!(
            "relay stopped after {:.2} s\n{}\noutbox now: {} pending, {} sent, {} dead\n",
            run.seconds,
            render(&run.report),
            outbox.pending,
            outbox.sent,
            outbox.dead
        )
    })?;
    Ok(ExitCode::SUCCESS)
}

/// A relay on the default outbox of `pool`, whose tables are created when missing.
pub async fn start<DB: Backend>(
    pool: Pool<DB>,
    sink: WebhookSink,
    config: RelayConfig,
) -> anyhow::Result<Relay<DB, WebhookSink>> {
    let outbox = Outbox::new(pool);
    outbox
        .migrate()
        .await
        .context("cannot create the outbox's tables")?;
    Ok(Relay::with_config(outbox, sink, config)?)
}

/// [`Relay::drain`], waiting up to twice the relay's lease for a relay that holds the lease
/// to let go of it, or for its lease to run out if it died.
pub async fn drain<DB: Backend>(relay: &Relay<DB, WebhookSink>) -> anyhow::Result<RelayReport> {
    let lease = relay.config().lease;
    let started = Instant::now();
    let mut told = false;
    loop {
        match relay.drain().await {
            Err(jobguard::Error::RelayLeaseHeld { .. }) if started.elapsed() < lease * 2 => {
                if !told {
                    tracing::info!("another relay holds the outbox lease; waiting for it");
                    told = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error @ jobguard::Error::RelayLeaseHeld { .. }) => {
                return Err(anyhow::Error::new(error).context(format!(
                    "waited {} for the outbox lease",
                    humantime::format_duration(lease * 2)
                )));
            }
            result => return Ok(result?),
        }
    }
}

/// The report as a table, in the style of the worker's.
pub fn render(report: &RelayReport) -> comfy_table::Table {
    report::outcomes(
        ["messages", "count", "meaning"],
        &[
            ("delivered", report.delivered, "confirmed by the webhook"),
            (
                "retried",
                report.retried,
                "failed, tried again after a backoff",
            ),
            (
                "dead",
                report.dead,
                "refused or out of attempts: dead-lettered",
            ),
        ],
    )
}
