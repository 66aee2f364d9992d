//! `jobguard demo --scenario charge`: charge jobs against a payment provider over HTTP, with
//! worker processes killed after the API call and before the database commit.
//!
//! The same orders are charged three ways (see [`crate::builtin_jobs::charges`]): naive, with the provider's
//! idempotency key, and keyless behind a started/done step with reconciliation. The provider
//! runs in this process and counts the charges it made; the worker processes run the real
//! [`Worker`](jobguard::Worker), and every fifth order's first delivery stops right after the
//! charge, where this process kills it with SIGKILL.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use comfy_table::{Cell, CellAlignment, Table, presets::UTF8_FULL_CONDENSED};
use futures::FutureExt as _;
use jobguard::queue::NewJob;
use jobguard::{GuardConfig, JobKey, Queue, RetryPolicy, TableName, Worker, WorkerConfig};
use jobguard_provider::{Provider, ProviderConfig};
use serde::{Deserialize, Serialize};
use sqlx::Pool;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::DemoReport;
use super::experiment::RunReport;
use super::scenarios::Scenario;
use crate::builtin_jobs::ExampleDb;
use crate::builtin_jobs::charges::{
    self, AfterCall, ChargeOrder, PROVIDER_URL_ENV, PaymentTables, Payments,
};

/// A directory that turns on the crash of a charge worker process: it stops after the API call
/// of every fifth order's first delivery, before the database commit, and waits to be killed.
const CRASH_DIR_ENV: &str = "JOBGUARD_CRASH_AFTER_CALL";
/// What a worker process prints at that point.
const CRASH_POINT: &str = "JOBGUARD_CRASH_POINT";

/// What a worker process prints when it stops, with its counts as JSON.
const STATS: &str = "JOBGUARD_STATS";

/// How long a killed worker's job and step stay leased before another delivery takes them.
const LEASE: Duration = Duration::from_secs(1);

/// How the demo's orders are charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChargeMode {
    /// No idempotency key: the provider charges every call.
    Naive,
    /// The provider's idempotency key, derived from the job key.
    Keyed,
    /// The keyless endpoint behind a started/done step, reconciled through the lookup.
    Keyless,
}

impl ChargeMode {
    fn kind(self) -> &'static str {
        match self {
            ChargeMode::Naive => "charge-naive",
            ChargeMode::Keyed => "charge",
            ChargeMode::Keyless => "charge-keyless",
        }
    }
}

/// The demo's own tables, so it touches nothing else in the database.
fn tables() -> (TableName, TableName, PaymentTables) {
    let name = |name: &str| TableName::new(name).expect("a valid table name");
    (
        name("jobguard_demo_charge_jobs"),
        name("jobguard_demo_charge_guard"),
        PaymentTables {
            charges: name("jobguard_demo_charges"),
            steps: name("jobguard_demo_charge_steps"),
        },
    )
}

/// `jobguard demo-process charge-worker`: the demo's worker, in its own process.
#[derive(Args, Debug)]
pub struct ChargeWorkerArgs {
    /// The database of the demo's charge jobs.
    #[arg(long)]
    database_url: String,
}

impl ChargeWorkerArgs {
    /// The database the worker process runs on.
    pub fn database_url(&self) -> &str {
        &self.database_url
    }
}

fn worker<DB: ExampleDb>(
    pool: &Pool<DB>,
    after_call: Option<AfterCall>,
) -> anyhow::Result<(Queue<DB>, Worker<DB>)> {
    let (jobs, guard, payment_tables) = tables();
    let queue = Queue::with_table(pool.clone(), jobs)?;
    let config = WorkerConfig {
        concurrency: 4,
        lease: LEASE,
        poll_interval: Duration::from_millis(50),
        retry: RetryPolicy {
            base: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            ..RetryPolicy::default()
        },
        stop_when_idle: true,
        guard: GuardConfig::default().table(guard),
        ..WorkerConfig::default()
    };
    let mut payments = Payments::from_env(pool.clone(), payment_tables, LEASE);
    if let Some(hook) = after_call {
        payments = payments.after_call(hook);
    }
    let worker = charges::register(Worker::with_config(queue.clone(), config)?, payments);
    Ok((queue, worker))
}

/// `jobguard demo-process charge-worker`: runs the demo's charge jobs until none is available,
/// then prints its counts.
pub async fn worker_process<DB: ExampleDb>(pool: &Pool<DB>) -> anyhow::Result<()> {
    let crash = std::env::var_os(CRASH_DIR_ENV).map(|dir| crash_after_call(PathBuf::from(dir)));
    let (_queue, worker) = worker(pool, crash)?;
    let stats = worker.run(jobguard::worker::shutdown_signal()).await?;
    println!("{STATS} {}", serde_json::to_string(&stats)?);
    Ok(())
}

/// The demo's crash: after the first API call of every fifth order, before the commit, the
/// worker prints [`CRASH_POINT`] and waits to be killed. A marker file in `dir` per order
/// makes it once per order, across worker processes.
fn crash_after_call(dir: PathBuf) -> AfterCall {
    Arc::new(move |order: &str| {
        let every_fifth = order
            .rsplit('-')
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n % 5 == 0);
        let marker = dir.join(order.replace('/', "_"));
        if !every_fifth || marker.exists() || std::fs::write(&marker, b"").is_err() {
            return std::future::ready(()).boxed();
        }
        {
            use std::io::Write;
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "{CRASH_POINT} {order}");
            let _ = stdout.flush();
        }
        std::future::pending().boxed()
    })
}

/// Runs the three ways of charging `jobs` orders and reports what the provider charged.
pub async fn run<DB: ExampleDb>(
    pool: &Pool<DB>,
    url: &str,
    database: String,
    jobs: usize,
) -> anyhow::Result<DemoReport> {
    let started = Instant::now();
    let (_queue, setup) = worker(pool, None)?;
    setup.migrate().await?;
    let (jobs_table, guard_table, payment_tables) = tables();
    charges::migrate(pool, &payment_tables).await?;
    let orders: Vec<ChargeOrder> = (0..jobs)
        .map(|n| ChargeOrder {
            order: format!("order-{n}"),
            amount: 1_000 + n as i64,
        })
        .collect();
    let expected_balance_total = orders.iter().map(|order| order.amount).sum();

    let mut runs = Vec::new();
    for mode in [ChargeMode::Naive, ChargeMode::Keyed, ChargeMode::Keyless] {
        for table in [
            &jobs_table,
            &guard_table,
            &payment_tables.charges,
            &payment_tables.steps,
        ] {
            DB::clear(pool, table).await?;
        }
        runs.push(run_mode(pool, url, mode, &orders, &payment_tables.charges).await?);
    }
    let keyless = runs.pop().expect("three runs");
    let keyed = runs.pop().expect("three runs");
    let naive = runs.pop().expect("three runs");
    let once = |run: &RunReport| {
        run.provider_charges == Some(jobs as i64)
            && run.effects == jobs as i64
            && run.balance_total == expected_balance_total
            && run.orders_charged_more_than_once == Some(0)
    };
    let exactly_once = once(&keyed) && once(&keyless);
    Ok(DemoReport {
        backend: DB::BACKEND,
        database,
        scenario: Some(Scenario::Charge),
        scenario_description: Some(Scenario::Charge.describe()),
        jobs,
        deliveries: 1,
        concurrency: 4,
        expected_balance_total,
        provider_charges: keyed.provider_charges,
        naive,
        guarded: keyed,
        keyless: Some(keyless),
        exactly_once,
        seconds: started.elapsed().as_secs_f64(),
    })
}

async fn run_mode<DB: ExampleDb>(
    pool: &Pool<DB>,
    url: &str,
    mode: ChargeMode,
    orders: &[ChargeOrder],
    charges_table: &TableName,
) -> anyhow::Result<RunReport> {
    let started = Instant::now();
    let provider = Provider::start(ProviderConfig::default())
        .await
        .context("start the payment provider")?;
    let (queue, _worker) = worker(pool, None)?;
    for order in orders {
        let key = JobKey::new(mode.kind(), [&order.order])?;
        queue
            .enqueue(&NewJob::new(key, order)?.kind(mode.kind())?)
            .await?;
    }
    let crash_dir = std::env::temp_dir().join(format!(
        "jobguard-charge-demo-{}-{}",
        std::process::id(),
        mode.kind()
    ));
    std::fs::create_dir_all(&crash_dir)
        .with_context(|| format!("create {}", crash_dir.display()))?;
    let processes = run_workers(url, &provider.url(), &crash_dir, &queue).await;
    let _ = std::fs::remove_dir_all(&crash_dir);
    let processes = processes?;

    let charged = provider.provider().charges();
    provider.stop().await;
    let mut per_order: BTreeMap<&str, i64> = BTreeMap::new();
    for charge in &charged {
        *per_order.entry(charge.order.as_str()).or_default() += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    // A killed process never reports its counts: every commit recorded one charge, so the
    // recorded charges are the applied deliveries; duplicates and failures are those of the
    // processes that finished.
    let effects = DB::recorded_charges(pool, charges_table).await?;
    let deliveries = effects as u64 + processes.duplicates + processes.failed + processes.crashes;
    Ok(RunReport {
        deliveries: deliveries as usize,
        effects,
        applied: effects as usize,
        duplicates: processes.duplicates as usize,
        failed: processes.failed as usize,
        balance_total: charged.iter().map(|charge| charge.amount).sum(),
        seconds,
        deliveries_per_second: deliveries as f64 / seconds,
        first_error: None,
        provider_charges: Some(charged.len() as i64),
        orders_charged_more_than_once: Some(per_order.values().filter(|n| **n > 1).count()),
        crashes: Some(processes.crashes as usize),
    })
}

/// What the worker processes of one run did.
#[derive(Debug, Default)]
struct Processes {
    duplicates: u64,
    failed: u64,
    crashes: u64,
}

/// Starts worker processes one after another, killing each at its crash point, until the queue
/// has nothing waiting or running.
async fn run_workers<DB: ExampleDb>(
    url: &str,
    provider_url: &str,
    crash_dir: &Path,
    queue: &Queue<DB>,
) -> anyhow::Result<Processes> {
    let exe = std::env::current_exe().context("find the jobguard executable")?;
    let mut total = Processes::default();
    for _ in 0..500 {
        let mut child = tokio::process::Command::new(&exe)
            .args(["demo-process", "charge-worker", "--database-url", url])
            .env(PROVIDER_URL_ENV, provider_url)
            .env(CRASH_DIR_ENV, PathBuf::from(crash_dir))
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("start a worker process")?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let mut killed = false;
        // Read to the end: two of the process's jobs may reach their crash point at once, and
        // the second's line is already in the pipe when the first's kills it.
        while let Some(line) = lines.next_line().await? {
            if line.starts_with(CRASH_POINT) {
                // The charge happened; the process dies before its transaction commits.
                if !killed {
                    child.start_kill()?;
                    killed = true;
                }
                continue;
            }
            if let Some(stats) = line.strip_prefix(STATS) {
                let stats: serde_json::Value = serde_json::from_str(stats.trim())?;
                let get = |field: &str| stats[field].as_u64().unwrap_or_default();
                total.duplicates += get("duplicates");
                total.failed += get("failed");
            }
        }
        let status = child.wait().await?;
        let counts = queue.counts().await?;
        if counts.available + counts.running == 0 {
            // A marker is written after an order's first call, before its line is printed: a
            // process killed for another order's crash point in between dies at this one's
            // too, with no line. The markers count every attempt that called and never
            // committed.
            total.crashes = std::fs::read_dir(crash_dir)
                .with_context(|| format!("read {}", crash_dir.display()))?
                .count() as u64;
            return Ok(total);
        }
        if status.code().is_some_and(|code| code != 0) {
            bail!("a worker process failed: {status}");
        }
        // Jobs wait out a killed worker's lease, or a retry's backoff.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the charge demo's queue did not drain")
}

/// The human-readable report.
pub fn render(report: &DemoReport) -> String {
    let mut out = format!(
        "jobguard demo --scenario charge: {} orders charged at a payment provider over HTTP\n{}\n",
        report.jobs,
        Scenario::Charge.describe()
    );
    out += &format!("database: {} ({})\n\n", report.database, report.backend);
    let runs = [
        ("naive (no key)", &report.naive),
        ("keyed", &report.guarded),
        (
            "keyless + reconcile",
            report.keyless.as_ref().unwrap_or(&report.guarded),
        ),
    ];
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header([
        "job",
        "worker kills",
        "provider charges",
        "orders charged twice",
        "charges recorded",
        "amount charged",
        "seconds",
    ]);
    let right = |value: String| Cell::new(value).set_alignment(CellAlignment::Right);
    for (name, run) in runs {
        table.add_row(vec![
            Cell::new(name),
            right(run.crashes.unwrap_or_default().to_string()),
            right(run.provider_charges.unwrap_or_default().to_string()),
            right(
                run.orders_charged_more_than_once
                    .unwrap_or_default()
                    .to_string(),
            ),
            right(run.effects.to_string()),
            right(run.balance_total.to_string()),
            right(format!("{:.2}", run.seconds)),
        ]);
    }
    out += &format!("{table}\n\n");
    let naive = &report.naive;
    out += &format!(
        "naive: {} charges for {} orders; {} customers paid twice while the database recorded {} charges\n",
        naive.provider_charges.unwrap_or_default(),
        report.jobs,
        naive.orders_charged_more_than_once.unwrap_or_default(),
        naive.effects,
    );
    if report.exactly_once {
        out += &format!(
            "verdict: exactly once at the provider. keyed and keyless each made {} charges for {} orders, \
             one per order, amount {} as expected\n",
            report.jobs, report.jobs, report.expected_balance_total
        );
    } else {
        out += "verdict: NOT exactly once: an order was charged more or less than once\n";
    }
    out += &format!("time: {:.2} s\n", report.seconds);
    out
}
