//! `jobguard retention`: the longest time a duplicate can still arrive after its key was
//! applied (the horizon), term by term, computed from the worker's settings and the declared
//! windows, whether `--keep` covers it, and whether it stays below the provider key lifetime.
//! What it needs is shared with `jobguard worker` and `jobguard prune`, which refuse a retention
//! shorter than the horizon and a horizon that reaches the provider key lifetime.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use comfy_table::{Cell, CellAlignment};
use jobguard::retention::{Horizon, RetentionConfig, format_duration};
use jobguard::{Retention, RetryPolicy};
use serde::Serialize;

use crate::args::parse_duration;
use crate::report::{self, table};

/// What the horizon declares beyond the worker's own retries: shared by `jobguard worker`,
/// `prune` and `retention`.
#[derive(Args, Clone, Debug)]
pub struct DeclaredWindows {
    /// How long after a job is dead-lettered it may still be replayed (`jobguard dead replay`).
    /// With a provider key lifetime, the whole horizon (this window included) must stay below
    /// it: 12h fits under Stripe's 24h.
    #[arg(long, default_value = "12h", value_parser = parse_duration)]
    pub replay_window: Duration,
    /// How long the payment provider keeps an idempotency key (Stripe: 24h); a keyed job
    /// repeated later is charged again, so the horizon must stay below it. 0s when no job calls
    /// a keyed external API.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub provider_key_lifetime: Duration,
}

/// How long finished jobs are kept in the jobs table: shared by `jobguard worker` and `prune`.
#[derive(Args, Clone, Debug)]
pub struct JobKeeping {
    /// How long a completed job is kept after it finished; 0s deletes every completed job
    /// (the guard row is the durable record of what was applied).
    #[arg(long, default_value = "1d", value_parser = parse_duration)]
    pub keep_completed: Duration,
    /// How long a dead job is kept after it died; at least --replay-window, since a deleted
    /// dead job cannot be replayed.
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    pub keep_dead: Duration,
}

/// The worker settings the horizon depends on, as `jobguard worker` takes them.
#[derive(Args, Clone, Debug)]
pub struct WorkerTiming {
    /// The workers' lease (`jobguard worker --lease`).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub lease: Duration,
    /// The workers' first retry delay (`jobguard worker --backoff`); it doubles with each
    /// attempt, up to an hour, over 10 attempts.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub backoff: Duration,
}

impl WorkerTiming {
    /// The retry policy of `jobguard worker --backoff`.
    pub fn retry(&self) -> RetryPolicy {
        retry_policy(self.backoff)
    }
}

/// The retry policy `jobguard worker` runs with.
pub fn retry_policy(backoff: Duration) -> RetryPolicy {
    RetryPolicy {
        base: backoff,
        ..RetryPolicy::default()
    }
}

/// The retention configuration of `--keep`, the declared windows and how long jobs are kept.
pub fn retention_config(
    keep: Duration,
    windows: &DeclaredWindows,
    jobs: &JobKeeping,
    override_horizon: bool,
) -> RetentionConfig {
    RetentionConfig {
        keep,
        replay_window: windows.replay_window,
        provider_key_lifetime: windows.provider_key_lifetime,
        keep_completed: jobs.keep_completed,
        keep_dead: jobs.keep_dead,
        override_horizon,
    }
}

/// Arguments of `jobguard retention`.
#[derive(Args, Debug)]
pub struct RetentionArgs {
    /// A retention to check against the horizon (e.g. 14d); exits non-zero when it is shorter.
    #[arg(long, value_parser = parse_duration)]
    keep: Option<Duration>,
    #[command(flatten)]
    timing: WorkerTiming,
    #[command(flatten)]
    windows: DeclaredWindows,
    /// Print JSON on stdout instead of a table.
    #[arg(long)]
    json: bool,
}

/// One term of the horizon, as printed.
#[derive(Debug, Serialize)]
struct Term {
    name: &'static str,
    seconds: f64,
    duration: String,
    source: String,
}

/// What `jobguard retention --json` prints.
#[derive(Debug, Serialize)]
struct RetentionReport {
    horizon_seconds: f64,
    horizon: String,
    terms: Vec<Term>,
    #[serde(skip_serializing_if = "Option::is_none")]
    keep_seconds: Option<f64>,
    /// Whether `--keep` covers the horizon; absent without `--keep`.
    #[serde(skip_serializing_if = "Option::is_none")]
    covered: Option<bool>,
    /// The refusal `jobguard worker` and `prune` would give, when `--keep` is too short.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// The declared provider key lifetime; 0 when no job calls a keyed external API.
    provider_key_lifetime_seconds: f64,
    /// Whether the horizon stays below the provider key lifetime (true when none is declared).
    provider_key_lifetime_covers: bool,
    /// The refusal `jobguard worker` and `prune` would give, when it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    provider_error: Option<String>,
}

/// Runs `jobguard retention`.
pub async fn retention(args: RetentionArgs) -> anyhow::Result<ExitCode> {
    let retry = args.timing.retry();
    let config = RetentionConfig {
        replay_window: args.windows.replay_window,
        provider_key_lifetime: args.windows.provider_key_lifetime,
        ..RetentionConfig::default()
    };
    let horizon = config.horizon(&retry, args.timing.lease);
    let provider = config
        .check_provider_key_lifetime(&retry, args.timing.lease)
        .map_err(|error| error.to_string());
    let checked = args
        .keep
        .map(|keep| Retention::new(keep, horizon, false).map_err(|error| error.to_string()));
    let report = RetentionReport {
        horizon_seconds: horizon.total().as_secs_f64(),
        horizon: format_duration(horizon.total()),
        terms: terms(&horizon, &retry, &args),
        keep_seconds: args.keep.map(|keep| keep.as_secs_f64()),
        covered: checked.as_ref().map(Result::is_ok),
        error: checked.and_then(Result::err),
        provider_key_lifetime_seconds: args.windows.provider_key_lifetime.as_secs_f64(),
        provider_key_lifetime_covers: provider.is_ok(),
        provider_error: provider.err(),
    };
    report::print(&report, args.json, |report| render(report, args.keep))?;
    Ok(
        if report.covered == Some(false) || !report.provider_key_lifetime_covers {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        },
    )
}

fn terms(horizon: &Horizon, retry: &RetryPolicy, args: &RetentionArgs) -> Vec<Term> {
    let sources = [
        format!(
            "{} attempts, backoff {} doubling up to {}, each delay at its upper bound (+{:.0}% jitter)",
            retry.max_attempts,
            format_duration(retry.base),
            format_duration(retry.max_delay),
            retry.jitter * 100.0
        ),
        format!(
            "{} attempts x --lease {}",
            retry.max_attempts,
            format_duration(args.timing.lease)
        ),
        "--replay-window".to_owned(),
        "a replay restarts the attempts: retries + leases again".to_owned(),
    ];
    horizon
        .terms()
        .into_iter()
        .zip(sources)
        .map(|(term, source)| Term {
            name: term.name,
            seconds: term.duration.as_secs_f64(),
            duration: format_duration(term.duration),
            source,
        })
        .collect()
}

fn render(report: &RetentionReport, keep: Option<Duration>) -> String {
    let mut table = table(&["term", "duration", "from"]);
    for term in &report.terms {
        table.add_row(vec![
            Cell::new(term.name),
            Cell::new(&term.duration).set_alignment(CellAlignment::Right),
            Cell::new(&term.source),
        ]);
    }
    table.add_row(vec![
        Cell::new("horizon"),
        Cell::new(&report.horizon).set_alignment(CellAlignment::Right),
        Cell::new("the sum: how long after a key was applied a duplicate can still arrive"),
    ]);
    let verdict = match (keep, &report.error) {
        (None, _) => format!(
            "keep guard rows at least {}: `jobguard worker --keep` and `jobguard prune --keep` \
             refuse less\n",
            report.horizon
        ),
        (Some(keep), None) => format!(
            "--keep {} covers the horizon, with {} to spare\n",
            format_duration(keep),
            format_duration(keep.saturating_sub(Duration::from_secs_f64(report.horizon_seconds)))
        ),
        (Some(_), Some(error)) => format!("refused: {error}\n"),
    };
    let provider = match &report.provider_error {
        Some(error) => format!("refused: {error}\n"),
        None if report.provider_key_lifetime_seconds == 0.0 => "no provider key lifetime \
             declared (--provider-key-lifetime 0s): no job calls a keyed external API\n"
            .to_owned(),
        None => format!(
            "the horizon {} stays below the provider key lifetime {}: every repeat of a keyed \
             job reaches the provider while it remembers the key\n",
            report.horizon,
            format_duration(Duration::from_secs_f64(
                report.provider_key_lifetime_seconds
            ))
        ),
    };
    format!("{table}\n{verdict}{provider}")
}
