//! The worker on mixed queues, on every backend: batchable, unbatchable and unknown kinds;
//! batch sizes, concurrency and prefetch drawn at random; retryable failures, fatal failures,
//! panics and slow jobs near the lease. Whatever the mix, the worker never panics, and each job
//! is applied exactly once or is dead with its own error after its own attempts: none dies of
//! an expired lease while it waited behind other jobs. A queue that keeps no completed job
//! (`keep_completed` zero, drawn at random) deletes a job's row as it completes it on
//! PostgreSQL: such a job must have applied once, and the guard holds its key.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use jobguard::queue::NewJob;
use jobguard::{
    Job, JobError, JobKey, KeyError, Queue, RetentionConfig, RetryPolicy, UnknownKinds, Worker,
    WorkerConfig,
};
use proptest::prelude::*;
use serde::{Deserialize, Serialize};

use crate::common::{TestDb, draining, setup};

/// What a job does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Act {
    /// Its ledger row.
    Credit,
    /// Its ledger row, then a retryable error on its first run only: a batch it is in rolls
    /// back, and the job applies on its own.
    FailOnce,
    /// A retryable error on every run: dead after its attempts.
    Fail,
    /// A fatal error: dead at once.
    Fatal,
    /// A panic on every run: dead after its attempts.
    Panic,
    /// Its ledger row after a wait of most of the lease.
    Slow,
}

/// The states a job of `act` may end in with `max_attempts`, and the error a dead one carries.
fn expected(act: Act, max_attempts: u32) -> (&'static [&'static str], Option<&'static str>) {
    match act {
        Act::Credit | Act::Slow => (&["completed"], None),
        // Its failure in a batch of several is part of the same attempt as the run alone that
        // follows; alone, it takes a second attempt.
        Act::FailOnce if max_attempts >= 2 => (&["completed"], None),
        Act::FailOnce => (&["completed", "dead"], Some("the ledger service timed out")),
        Act::Fail => (&["dead"], Some("the ledger service timed out")),
        Act::Fatal => (&["dead"], Some("the account is closed")),
        Act::Panic => (&["dead"], Some("the ledger client panicked")),
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Order {
    case: String,
    order: i64,
    act: Act,
    slow_ms: u64,
}

/// Runs of each job's effect, rolled back or not, by `case/order`.
static RUNS: Mutex<Option<HashMap<String, u32>>> = Mutex::new(None);

fn run_count(order: &Order) -> u32 {
    let mut runs = RUNS.lock().unwrap();
    let runs = runs.get_or_insert_with(HashMap::new);
    let n = runs
        .entry(format!("{}/{}", order.case, order.order))
        .or_default();
    *n += 1;
    *n
}

async fn apply<DB: TestDb>(order: &Order, conn: &mut DB::Connection) -> Result<(), JobError> {
    let run = run_count(order);
    match order.act {
        Act::Credit => {}
        Act::FailOnce if run == 1 => {
            DB::insert_ledger(conn, order.order, 1).await?;
            return Err(JobError::msg("the ledger service timed out"));
        }
        Act::FailOnce => {}
        Act::Fail => return Err(JobError::msg("the ledger service timed out")),
        Act::Fatal => return Err(JobError::fatal("the account is closed")),
        Act::Panic => panic!("the ledger client panicked"),
        Act::Slow => tokio::time::sleep(Duration::from_millis(order.slow_ms)).await,
    }
    DB::insert_ledger(conn, order.order, 1).await?;
    Ok(())
}

/// A kind that opts in to batches.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Batched(Order);

impl<DB: TestDb> Job<DB> for Batched {
    const KIND: &'static str = "batched";
    const BATCH: bool = true;

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("mix", [self.0.order.to_string()])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        apply::<DB>(&self.0, conn).await
    }
}

/// A kind that runs one job per transaction.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Single(Order);

impl<DB: TestDb> Job<DB> for Single {
    const KIND: &'static str = "single";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("mix", [self.0.order.to_string()])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        apply::<DB>(&self.0, conn).await
    }
}

/// Which kind a job is enqueued as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Batched,
    Single,
    /// A kind no worker registered: dead at once.
    Unknown,
}

#[derive(Clone, Debug)]
struct Mix {
    jobs: Vec<(Kind, Act)>,
    batch_size: usize,
    concurrency: usize,
    prefetch: usize,
    max_attempts: u32,
    /// `keep_completed` zero: completed rows are deleted as the jobs complete (PostgreSQL).
    keep_no_completed: bool,
}

const LEASE: Duration = Duration::from_millis(1500);

static CASES: AtomicUsize = AtomicUsize::new(0);

/// Runs a worker over `mix` until the queue is empty and checks how each job ended.
/// `test` names the test: each case has a database of its own, whichever process runs it.
async fn run_mix<DB: TestDb>(test: &str, mix: Mix) {
    let case = format!("{test}_{}", CASES.fetch_add(1, Ordering::SeqCst));
    let Some((pool, queue)) = setup::<DB>(&case).await else {
        return;
    };
    for (order, (kind, act)) in mix.jobs.iter().enumerate() {
        let order = Order {
            case: format!("{}/{case}", DB::BACKEND),
            order: order as i64,
            act: *act,
            // Most of the lease: only heartbeats keep the jobs waiting behind it.
            slow_ms: LEASE.as_millis() as u64 * 2 / 3,
        };
        let job = match kind {
            Kind::Batched => NewJob::from_job::<DB, _>(&Batched(order)).unwrap(),
            Kind::Single => NewJob::from_job::<DB, _>(&Single(order)).unwrap(),
            Kind::Unknown => NewJob::new(
                JobKey::new("mix", [order.order.to_string()]).unwrap(),
                &order,
            )
            .unwrap()
            .kind("retired")
            .unwrap(),
        };
        assert!(queue.enqueue(&job).await.unwrap().inserted);
    }
    let config = WorkerConfig {
        batch_size: mix.batch_size,
        concurrency: mix.concurrency,
        prefetch: Some(mix.prefetch),
        lease: LEASE,
        retry: RetryPolicy {
            max_attempts: mix.max_attempts,
            base: Duration::ZERO,
            ..Default::default()
        },
        // Unknown kinds are fetched and dead-lettered among the others.
        unknown_kinds: UnknownKinds::DeadLetter,
        retention: RetentionConfig {
            keep_completed: if mix.keep_no_completed {
                Duration::ZERO
            } else {
                RetentionConfig::DEFAULT_KEEP_COMPLETED
            },
            ..RetentionConfig::default()
        },
        ..draining()
    };
    let worker = Worker::with_config(queue.clone(), config)
        .unwrap()
        .register::<Batched>()
        .register::<Single>();
    let stats = tokio::time::timeout(Duration::from_secs(300), worker.run(std::future::pending()))
        .await
        .expect("the worker drained the queue")
        .expect("the worker ran");
    check::<DB>(&pool, &queue, &mix, &stats).await;
}

async fn check<DB: TestDb>(
    pool: &sqlx::Pool<DB>,
    queue: &Queue<DB>,
    mix: &Mix,
    stats: &jobguard::WorkerStats,
) {
    let mut rows: HashMap<i64, _> = queue
        .list(None, None, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|row| (row.key.rsplit(':').next().unwrap().parse().unwrap(), row))
        .collect();
    let deletes = mix.keep_no_completed && DB::BACKEND == "postgres";
    if !deletes {
        assert_eq!(
            rows.len(),
            mix.jobs.len(),
            "every job is still in the table"
        );
    }
    let mut applied = 0;
    for (order, &(kind, act)) in mix.jobs.iter().enumerate() {
        let order = order as i64;
        let (states, error) = match kind {
            Kind::Unknown => (&["dead"][..], Some("retired")),
            _ => expected(act, mix.max_attempts),
        };
        let mut conn = pool.acquire().await.unwrap();
        let effects = DB::fetch_i64(
            &mut conn,
            "select count(*) from ledger where account = $1",
            order,
        )
        .await
        .unwrap();
        drop(conn);
        let Some(row) = rows.remove(&order) else {
            // Deleted as it completed: it must have been one that completes, applied once.
            let what = format!("job {order} ({kind:?}, {act:?}) in {mix:?}, deleted");
            assert!(deletes, "every job is still in the table: {what}");
            assert!(states.contains(&"completed"), "{what}");
            assert_eq!(effects, 1, "applied exactly once: {what}");
            applied += 1;
            continue;
        };
        let what = format!("job {order} ({kind:?}, {act:?}) in {mix:?}: {row:?}");
        let state = row.state.as_str();
        assert!(states.contains(&state), "ended {state}: {what}");
        assert!(
            !(deletes && state == "completed"),
            "a completed row was kept: {what}"
        );
        if state == "completed" {
            applied += 1;
            assert_eq!(effects, 1, "applied exactly once: {what}");
        } else {
            assert_eq!(effects, 0, "a dead job applied nothing: {what}");
            let last = row.last_error.as_deref().unwrap_or_default();
            assert!(
                last.contains(error.unwrap()),
                "dead with its own error, not {last:?}: {what}"
            );
            assert!(!last.contains("lease"), "no lease expired: {what}");
            let attempts = match (kind, act) {
                (Kind::Unknown, _) | (_, Act::Fatal | Act::FailOnce) => 1,
                _ => mix.max_attempts as i32,
            };
            assert_eq!(row.attempt, attempts, "dead after its own attempts: {what}");
        }
    }
    assert_eq!(stats.applied, applied, "{stats:?} for {mix:?}");
    assert_eq!(stats.duplicates + stats.fenced, 0, "{stats:?} for {mix:?}");
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        12 => Just(Act::Credit),
        2 => Just(Act::FailOnce),
        1 => Just(Act::Fail),
        1 => Just(Act::Fatal),
        1 => Just(Act::Panic),
        1 => Just(Act::Slow),
    ]
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![6 => Just(Kind::Batched), 3 => Just(Kind::Single), 1 => Just(Kind::Unknown)]
}

fn mix() -> impl Strategy<Value = Mix> {
    (
        prop::collection::vec((kind(), act()), 1..40),
        1usize..=50,
        1usize..=16,
        0usize..=2,
        1u32..=3,
        any::<bool>(),
    )
        .prop_map(
            |(mut jobs, batch_size, concurrency, ahead, max_attempts, keep_no_completed)| {
                // Slow jobs near the lease, a few per case: enough to make the others wait.
                let mut slow = 0;
                for job in &mut jobs {
                    if job.1 == Act::Slow {
                        slow += 1;
                        if slow > 3 {
                            job.1 = Act::Credit;
                        }
                    }
                }
                Mix {
                    jobs,
                    batch_size,
                    concurrency,
                    prefetch: ahead * concurrency,
                    max_attempts,
                    keep_no_completed,
                }
            },
        )
}

fn property<DB: TestDb>() {
    let cases = std::env::var("JOBGUARD_MIX_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(12);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let config = ProptestConfig {
        cases,
        // Each case is a real worker on a real database: shrinking would take long.
        max_shrink_iters: 8,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(mix in mix())| {
        runtime.block_on(run_mix::<DB>("mix", mix));
    });
}

backends!(fn property, blocking);

// The panic's reproduction: a batching worker with two slots on a queue of batchable,
// unbatchable and unknown kinds fetched more groups than it had places for.
backends!(fn a_batching_worker_runs_a_mixed_queue);
async fn a_batching_worker_runs_a_mixed_queue<DB: TestDb>() {
    let mut jobs = Vec::new();
    for n in 0..30 {
        let kind = match n % 3 {
            0 => Kind::Batched,
            1 => Kind::Single,
            _ => Kind::Unknown,
        };
        let act = if n % 7 == 0 { Act::Fail } else { Act::Credit };
        jobs.push((kind, act));
    }
    run_mix::<DB>(
        "mixed_queue",
        Mix {
            jobs,
            batch_size: 10,
            concurrency: 2,
            prefetch: 0,
            max_attempts: 2,
            keep_no_completed: false,
        },
    )
    .await;
}

// Jobs of a batch that rolled back wait for their turn on the per-job path with their
// leases kept: slow jobs ahead of them take longer than the lease.
backends!(fn jobs_behind_a_rolled_back_batch_keep_their_leases);
async fn jobs_behind_a_rolled_back_batch_keep_their_leases<DB: TestDb>() {
    let mut jobs = vec![(Kind::Batched, Act::Slow); 4];
    jobs.push((Kind::Batched, Act::Fail));
    run_mix::<DB>(
        "behind_rollback",
        Mix {
            jobs,
            batch_size: 5,
            concurrency: 1,
            prefetch: 0,
            max_attempts: 1,
            keep_no_completed: true,
        },
    )
    .await;
}
