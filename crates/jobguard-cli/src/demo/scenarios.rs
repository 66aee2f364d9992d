//! `jobguard demo --scenario NAME`: the at-least-once failures the seed names, made to happen
//! for real through the job queue, with the naive and the guarded credit job side by side.
//!
//! Both jobs run behind the same delivery loop, which acknowledges a job separately from its
//! effect, as RabbitMQ, SQS and most queues do. That is where every failure below lives: the
//! effect commits, and the acknowledgement that should follow is lost, late or overtaken. The
//! naive job applies the redelivery again; the guarded job finds its key and reports a duplicate.
//! (jobguard's own [`Worker`](jobguard::Worker) closes the gap further by completing the job in
//! the effect's transaction.)

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use jobguard::queue::{DEFAULT_QUEUE, NewJob};
use jobguard::{Error, Guard, JobKey, Outcome, Queue, TableName};
use serde::{Deserialize, Serialize};
use sqlx::Pool;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::DemoReport;
use super::experiment::{self, RunReport, Shape};
use super::ledger::{GUARDED_JOBS, LedgerDb, NAIVE_JOBS, credit_guarded, credit_naive};
use crate::builtin_jobs::{Credit, Example};

/// What a worker process prints right after a job's effect committed and before it
/// acknowledges the job; the demo kills it there.
const CRASH_POINT: &str = "JOBGUARD_CRASH_POINT";
/// What a worker process prints after each delivery, with its outcome.
const DELIVERY: &str = "JOBGUARD_DELIVERY";

/// An at-least-once failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// A worker process is killed with SIGKILL after a job's effect commits and before the job
    /// is acknowledged; the job is redelivered to the next worker.
    CrashBeforeAck,
    /// Each job's first attempt succeeds, but answers after its caller's timeout, so the caller
    /// retries it.
    RetryAfterTimeout,
    /// A slow worker outlives its jobs' leases and a second worker runs them concurrently.
    LeaseExpiry,
    /// The producer enqueues the same logical work twice from two code paths, once while the
    /// first job is still waiting and once after it completed.
    DoubleEnqueue,
    /// Charge jobs call a payment provider over HTTP, and worker processes are killed after the
    /// charge and before the database commit: naive, keyed, and keyless with reconciliation.
    Charge,
}

impl Scenario {
    pub fn describe(self) -> &'static str {
        match self {
            Scenario::CrashBeforeAck => {
                "every 5th job's worker process is killed (SIGKILL) after the effect commits, before the ack"
            }
            Scenario::RetryAfterTimeout => {
                "every job's first attempt commits, then answers after its caller's timeout; the caller retries"
            }
            Scenario::LeaseExpiry => {
                "a slow worker outlives its jobs' 500 ms leases; a second worker runs them concurrently"
            }
            Scenario::DoubleEnqueue => {
                "the producer enqueues every job twice: half while it waits, half after it completed"
            }
            Scenario::Charge => {
                "every 5th order's worker process is killed (SIGKILL) after the charge, before the database commit"
            }
        }
    }
}

/// Which job a delivery loop runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The naive credit job: appends to the ledger on every delivery.
    Naive,
    /// The guarded credit job: appends once per job key.
    Guarded,
}

/// `jobguard demo-process scenario-worker`: one delivery loop in its own process, so the crash
/// scenario can kill a real process.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The database of the demo's jobs and ledgers.
    #[arg(long)]
    database_url: String,
    /// The naive or the guarded credit job.
    #[arg(long, value_enum)]
    mode: Mode,
    /// After the effect of every 5th job's first attempt, print JOBGUARD_CRASH_POINT and wait
    /// to be killed, before the ack.
    #[arg(long)]
    crash_before_ack: bool,
}

impl WorkerArgs {
    /// The database the worker process runs on.
    pub fn database_url(&self) -> &str {
        &self.database_url
    }
}

/// How a delivery loop misbehaves.
#[derive(Clone, Copy, Debug, Default)]
struct Faults {
    /// How long a job's lease lasts.
    lease: Duration,
    /// Jobs taken per fetch.
    batch: u32,
    /// How long a first attempt works before its effect (a slow job).
    slow: Duration,
    /// A caller timeout on first attempts, and how late those attempts answer.
    late_answer: Option<(Duration, Duration)>,
    /// Print [`CRASH_POINT`] after every 5th job's effect and wait to be killed.
    crash_before_ack: bool,
    /// Print [`DELIVERY`] after each delivery, for the process that started this one.
    report_each: bool,
    /// Return after one batch, for the slow worker of the lease scenario.
    one_batch: bool,
}

/// What one delivery loop saw.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Tally {
    deliveries: usize,
    applied: usize,
    duplicates: usize,
    failed: usize,
    /// Acknowledgements refused because the lease had been taken over.
    fenced: usize,
}

impl Tally {
    /// Counts one delivery by its outcome's name.
    fn count(&mut self, outcome: &str) {
        self.deliveries += 1;
        match outcome {
            "applied" => self.applied += 1,
            "duplicate" => self.duplicates += 1,
            _ => self.failed += 1,
        }
    }

    fn add(&mut self, other: &Tally) {
        self.deliveries += other.deliveries;
        self.applied += other.applied;
        self.duplicates += other.duplicates;
        self.failed += other.failed;
        self.fenced += other.fenced;
    }
}

/// Runs `scenario` with `jobs` credit jobs, naive then guarded, and reads the ledgers back.
pub async fn run<DB: LedgerDb>(
    pool: &Pool<DB>,
    url: &str,
    database: String,
    scenario: Scenario,
    jobs: usize,
) -> anyhow::Result<DemoReport> {
    let started = Instant::now();
    let guard = DB::reset(pool).await?;
    let credits = experiment::credits(&Shape {
        jobs,
        deliveries: 1,
        concurrency: 1,
    });
    let mut runs = Vec::new();
    for mode in [Mode::Naive, Mode::Guarded] {
        let queue = queue_for(pool, mode).await?;
        let run_started = Instant::now();
        let tally = match scenario {
            Scenario::CrashBeforeAck => {
                enqueue_all(&queue, &credits, mode).await?;
                crash_before_ack(url, mode).await?
            }
            Scenario::RetryAfterTimeout => {
                enqueue_all(&queue, &credits, mode).await?;
                let faults = Faults {
                    late_answer: Some((Duration::from_millis(200), Duration::from_millis(400))),
                    ..Faults::default()
                };
                deliver(pool, &queue, mode, &guard, faults).await?
            }
            Scenario::LeaseExpiry => {
                enqueue_all(&queue, &credits, mode).await?;
                lease_expiry(pool, &queue, mode, &guard).await?
            }
            Scenario::DoubleEnqueue => double_enqueue(pool, &queue, &credits, mode, &guard).await?,
            Scenario::Charge => bail!("the charge scenario runs in demo::charge"),
        };
        let mut report = RunReport {
            deliveries: tally.deliveries,
            applied: tally.applied,
            duplicates: tally.duplicates,
            failed: tally.failed,
            seconds: run_started.elapsed().as_secs_f64(),
            ..RunReport::default()
        };
        report.deliveries_per_second = tally.deliveries as f64 / report.seconds;
        experiment::read_back(pool, &mut report, mode == Mode::Guarded).await?;
        runs.push(report);
    }
    let shape = Shape {
        jobs,
        deliveries: if scenario == Scenario::DoubleEnqueue {
            2
        } else {
            1
        },
        concurrency: if scenario == Scenario::LeaseExpiry {
            2
        } else {
            1
        },
    };
    let runs = runs.try_into().expect("two runs");
    let mut report = DemoReport::of_experiment::<DB>(database, shape, &credits, runs, started);
    report.scenario = Some(scenario);
    report.scenario_description = Some(scenario.describe());
    // Deliveries fail here on purpose (a caller times out) and the queue retries them: the
    // verdict is the ledger's alone.
    report.exactly_once = report.guarded.effects == jobs as i64
        && report.guarded.balance_total == report.expected_balance_total;
    Ok(report)
}

async fn queue_for<DB: LedgerDb>(pool: &Pool<DB>, mode: Mode) -> anyhow::Result<Queue<DB>> {
    let table = match mode {
        Mode::Naive => NAIVE_JOBS,
        Mode::Guarded => GUARDED_JOBS,
    };
    let queue = Queue::with_table(pool.clone(), TableName::new(table)?)?;
    queue.migrate().await?;
    Ok(queue)
}

/// The job for a credit. The naive producer keys it by a random id, the pitfall the seed warns
/// about; the guarded producer by the business operation.
fn job_for(credit: &Credit, mode: Mode) -> anyhow::Result<NewJob> {
    let key = match mode {
        Mode::Guarded => credit.job_key()?,
        Mode::Naive => {
            use std::hash::{BuildHasher, RandomState};
            let random = RandomState::new().hash_one(Instant::now());
            JobKey::new("credit", [format!("{random:016x}")])?
        }
    };
    Ok(NewJob::new(key, credit)?)
}

async fn enqueue_all<DB: LedgerDb>(
    queue: &Queue<DB>,
    credits: &[Credit],
    mode: Mode,
) -> anyhow::Result<()> {
    for credit in credits {
        queue.enqueue(&job_for(credit, mode)?).await?;
    }
    Ok(())
}

/// Runs worker processes one after another, killing each at its crash point, until one drains
/// the queue.
async fn crash_before_ack(url: &str, mode: Mode) -> anyhow::Result<Tally> {
    let exe = std::env::current_exe().context("find the jobguard executable")?;
    let mut total = Tally::default();
    for _ in 0..1000 {
        let mut child = tokio::process::Command::new(&exe)
            .args([
                "demo-process",
                "scenario-worker",
                "--database-url",
                url,
                "--crash-before-ack",
                "--mode",
            ])
            .arg(match mode {
                Mode::Naive => "naive",
                Mode::Guarded => "guarded",
            })
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("start a worker process")?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let mut crashed = false;
        while let Some(line) = lines.next_line().await? {
            if let Some(outcome) = line.strip_prefix(DELIVERY) {
                total.count(outcome.trim());
            } else if line.starts_with(CRASH_POINT) {
                // The effect of the delivery just counted committed; the process dies before
                // acknowledging it.
                child.start_kill()?;
                crashed = true;
                break;
            }
        }
        let status = child.wait().await?;
        if !crashed {
            if !status.success() {
                bail!("the worker process failed: {status}");
            }
            return Ok(total);
        }
    }
    bail!("the crash scenario did not drain its queue")
}

/// `jobguard demo-process scenario-worker`: one delivery loop, in this process.
pub async fn worker_process<DB: LedgerDb>(
    pool: &Pool<DB>,
    args: &WorkerArgs,
) -> anyhow::Result<()> {
    let queue = queue_for(pool, args.mode).await?;
    let guard = super::ledger::guard_for(pool)?;
    let faults = Faults {
        crash_before_ack: args.crash_before_ack,
        report_each: true,
        ..Faults::default()
    };
    deliver(pool, &queue, args.mode, &guard, faults).await?;
    Ok(())
}

/// A slow worker takes a batch of jobs and outlives their leases; a fast worker rescues them
/// and runs them while the slow one still does.
async fn lease_expiry<DB: LedgerDb>(
    pool: &Pool<DB>,
    queue: &Queue<DB>,
    mode: Mode,
    guard: &Guard<DB>,
) -> anyhow::Result<Tally> {
    let lease = Duration::from_millis(500);
    let slow = Faults {
        lease,
        batch: 5,
        slow: lease + Duration::from_millis(150),
        one_batch: true,
        ..Faults::default()
    };
    let fast = Faults {
        lease,
        batch: 1,
        ..Faults::default()
    };
    let slow_worker = deliver(pool, queue, mode, guard, slow);
    let fast_worker = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        deliver(pool, queue, mode, guard, fast).await
    };
    let (slow, fast) = tokio::try_join!(slow_worker, fast_worker)?;
    let mut total = slow;
    total.add(&fast);
    Ok(total)
}

/// Path one enqueues every job; path two enqueues the first half again while they wait, and
/// the second half again after they completed.
async fn double_enqueue<DB: LedgerDb>(
    pool: &Pool<DB>,
    queue: &Queue<DB>,
    credits: &[Credit],
    mode: Mode,
    guard: &Guard<DB>,
) -> anyhow::Result<Tally> {
    let (early, late) = credits.split_at(credits.len() / 2);
    enqueue_all(queue, credits, mode).await?;
    enqueue_all(queue, early, mode).await?;
    let mut total = deliver(pool, queue, mode, guard, Faults::default()).await?;
    enqueue_all(queue, late, mode).await?;
    total.add(&deliver(pool, queue, mode, guard, Faults::default()).await?);
    Ok(total)
}

/// Takes jobs until the queue has none waiting or running, runs each with the naive or the
/// guarded credit job, then acknowledges it separately.
async fn deliver<DB: LedgerDb>(
    pool: &Pool<DB>,
    queue: &Queue<DB>,
    mode: Mode,
    guard: &Guard<DB>,
    faults: Faults,
) -> anyhow::Result<Tally> {
    let lease = if faults.lease.is_zero() {
        Duration::from_secs(1)
    } else {
        faults.lease
    };
    let mut tally = Tally::default();
    loop {
        queue.rescue().await?;
        let jobs = queue
            .fetch(DEFAULT_QUEUE, faults.batch.max(1), lease)
            .await?;
        if jobs.is_empty() {
            let counts = queue.counts().await?;
            if counts.available + counts.running == 0 || faults.one_batch {
                return Ok(tally);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        for job in &jobs {
            let credit: Credit = serde_json::from_value(job.payload.clone())?;
            let first = job.lease.attempt == 1;
            let attempt = async {
                if first {
                    tokio::time::sleep(faults.slow).await;
                }
                let outcome = match mode {
                    Mode::Naive => credit_naive(pool, &credit)
                        .await
                        .map(|()| Outcome::Applied(()))?,
                    Mode::Guarded => credit_guarded(guard, credit.clone()).await?,
                };
                if let (true, Some((_, late))) = (first, faults.late_answer) {
                    tokio::time::sleep(late).await;
                }
                Ok::<_, anyhow::Error>(outcome)
            };
            let answered = match faults.late_answer {
                Some((timeout, _)) if first => tokio::time::timeout(timeout, attempt).await,
                _ => Ok(attempt.await),
            };
            let label = match &answered {
                Ok(Ok(Outcome::Applied(()))) => "applied",
                Ok(Ok(Outcome::Duplicate(_))) => "duplicate",
                // The attempt's effect committed, but the caller stopped waiting for it.
                Err(_elapsed) => "applied",
                Ok(Err(_)) => "failed",
            };
            tally.count(label);
            if faults.report_each {
                report(&format!("{DELIVERY} {label}"))?;
            }
            let retry_reason = match answered {
                Ok(Ok(_)) => None,
                Ok(Err(error)) => Some(error.to_string()),
                Err(_elapsed) => Some("the caller timed out waiting for the answer".to_owned()),
            };
            if let Some(reason) = retry_reason {
                tally.failed += usize::from(label == "applied");
                settle(
                    queue.retry(job.lease, Duration::ZERO, &reason).await,
                    &mut tally,
                )?;
                continue;
            }
            if faults.crash_before_ack && first && job.lease.job_id % 5 == 0 {
                report(CRASH_POINT)?;
                std::future::pending::<()>().await;
            }
            // The acknowledgement, separate from the effect's transaction.
            let mut conn = pool.acquire().await?;
            settle(queue.complete_tx(&mut conn, job.lease).await, &mut tally)?;
        }
        if faults.one_batch {
            return Ok(tally);
        }
    }
}

/// A line for the process that started this one, flushed at once: this process may be killed
/// right after.
fn report(line: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()?;
    Ok(())
}

/// Counts an acknowledgement refused because the lease was taken over; fails on other errors.
fn settle(result: jobguard::Result<()>, tally: &mut Tally) -> anyhow::Result<()> {
    match result {
        Ok(()) => Ok(()),
        Err(Error::Fenced { .. }) => {
            tally.fenced += 1;
            Ok(())
        }
        Err(error) => Err(error.into()),
    }
}
