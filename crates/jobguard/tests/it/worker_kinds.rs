//! Workers running different kinds on one queue, on every backend: a worker fetches only the
//! kinds it registered, so a job of another kind waits, its attempts untouched, until a worker
//! that registered its kind takes it; one job per transaction and in batches alike.

use std::time::Duration;

use jobguard::{
    Job, JobError, JobKey, KeyError, Queue, RetryPolicy, Worker, WorkerConfig, WorkerStats,
};
use serde::{Deserialize, Serialize};

use crate::common::{Credit, TestDb, draining, setup};

/// A batchable deposit: one ledger row on account 1.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Deposit {
    order: u32,
}

impl<DB: TestDb> Job<DB> for Deposit {
    const KIND: &'static str = "deposit";
    const BATCH: bool = true;

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("deposit", [format!("order-{}", self.order)])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        DB::insert_ledger(conn, 1, 1).await?;
        Ok(())
    }
}

/// The kind the first worker does not run (another service's, or a Python worker's): one
/// ledger row on account 2.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Refund {
    order: u32,
}

impl<DB: TestDb> Job<DB> for Refund {
    const KIND: &'static str = "refund";
    const BATCH: bool = true;

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("refund", [format!("order-{}", self.order)])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        DB::insert_ledger(conn, 2, 1).await?;
        Ok(())
    }
}

const JOBS: u32 = 60;

async fn drain<DB: TestDb>(worker: Worker<DB>) -> WorkerStats {
    tokio::time::timeout(Duration::from_secs(120), worker.run(std::future::pending()))
        .await
        .expect("the worker drained its kinds in time")
        .expect("the worker ran")
}

/// `JOBS` jobs of the first worker's kind (`deposit` in batches when `batched`, else `credit`)
/// and as many `refund`s, interleaved; a worker of the first kind drains, then one of
/// `refund`.
async fn each_kind_waits_for_its_worker<DB: TestDb>(test: &str, batched: bool) {
    let Some((pool, queue)) = setup::<DB>(test).await else {
        return;
    };
    for order in 0..JOBS {
        if batched {
            queue.enqueue_job(&Deposit { order }).await.unwrap();
        } else {
            queue
                .enqueue_job(&Credit { order, amount: 1 })
                .await
                .unwrap();
        }
        queue.enqueue_job(&Refund { order }).await.unwrap();
    }
    let config = WorkerConfig {
        batch_size: if batched { 8 } else { 1 },
        concurrency: 2,
        ..draining()
    };
    let worker = Worker::with_config(queue.clone(), config.clone()).unwrap();
    let worker = if batched {
        worker.register::<Deposit>()
    } else {
        worker.register::<Credit>()
    };
    let first = drain(worker).await;
    assert_eq!(
        (first.applied, first.dead, first.failed),
        (u64::from(JOBS), 0, 0),
        "{first:?}"
    );
    if batched {
        assert!(first.batches > 0, "the batched path ran: {first:?}");
    }
    let account = if batched { 1 } else { 7 };
    assert_eq!(ledger_of::<DB>(&pool, account).await, i64::from(JOBS));
    // Not fetched, so neither leased nor counted as an attempt.
    let waiting = DB::count(
        &pool,
        "select count(*) from jobguard_jobs
         where kind = 'refund' and state = 'available' and attempt = 0 and leased_until is null",
    )
    .await;
    assert_eq!(waiting, i64::from(JOBS), "{:?}", states::<DB>(&queue).await);
    assert_eq!(ledger_of::<DB>(&pool, 2).await, 0);

    let second = Worker::with_config(queue.clone(), config)
        .unwrap()
        .register::<Refund>();
    let second = drain(second).await;
    assert_eq!(
        (second.applied, second.dead, second.failed),
        (u64::from(JOBS), 0, 0),
        "{second:?}"
    );
    assert_eq!(ledger_of::<DB>(&pool, 2).await, i64::from(JOBS));
    let completed = DB::count(
        &pool,
        "select count(*) from jobguard_jobs where state = 'completed' and attempt = 1",
    )
    .await;
    assert_eq!(completed, 2 * i64::from(JOBS));
}

async fn ledger_of<DB: TestDb>(pool: &sqlx::Pool<DB>, account: i64) -> i64 {
    let sql = match account {
        1 => "select count(*) from ledger where account = 1",
        2 => "select count(*) from ledger where account = 2",
        _ => "select count(*) from ledger where account = 7",
    };
    DB::count(pool, sql).await
}

/// The jobs' states and kinds, for a failure's message.
async fn states<DB: TestDb>(queue: &Queue<DB>) -> Vec<(String, String, i32)> {
    queue
        .list(None, None, 500)
        .await
        .unwrap()
        .into_iter()
        .map(|job| (job.kind, format!("{:?}", job.state), job.attempt))
        .collect()
}

backends!(fn a_kind_no_worker_registered_waits_one_job_per_transaction);
async fn a_kind_no_worker_registered_waits_one_job_per_transaction<DB: TestDb>() {
    each_kind_waits_for_its_worker::<DB>("kinds_single", false).await;
}

backends!(fn a_kind_no_worker_registered_waits_in_batches);
async fn a_kind_no_worker_registered_waits_in_batches<DB: TestDb>() {
    each_kind_waits_for_its_worker::<DB>("kinds_batched", true).await;
}

// A worker rescues the expired leases of its own kinds only: the retry policy that counts for
// a job is one its kind runs under, never another kind's shorter one.
backends!(fn an_expired_lease_is_rescued_by_a_worker_of_its_kind_only);
async fn an_expired_lease_is_rescued_by_a_worker_of_its_kind_only<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("kinds_rescue").await else {
        return;
    };
    queue.enqueue_job(&Refund { order: 1 }).await.unwrap();
    // A worker of `refund` leased it and died: its first attempt is spent, its lease expires.
    let leased = queue
        .fetch(
            jobguard::queue::DEFAULT_QUEUE,
            1,
            Duration::from_millis(200),
        )
        .await
        .unwrap();
    assert_eq!(leased.len(), 1);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A worker of another kind, whose policy gives a job one attempt, rescues at start.
    let one_attempt = WorkerConfig {
        retry: RetryPolicy {
            max_attempts: 1,
            ..draining().retry
        },
        ..draining()
    };
    let other = Worker::with_config(queue.clone(), one_attempt)
        .unwrap()
        .register::<Deposit>();
    drain(other).await;
    assert_eq!(
        states::<DB>(&queue).await,
        [("refund".to_owned(), "Running".to_owned(), 1)],
        "a worker of another kind left the refund alone"
    );

    // Its own kind's worker (five attempts) gives it back and runs it.
    let own = Worker::with_config(queue.clone(), draining())
        .unwrap()
        .register::<Refund>();
    let stats = drain(own).await;
    assert_eq!((stats.applied, stats.dead), (1, 0), "{stats:?}");
    assert_eq!(ledger_of::<DB>(&pool, 2).await, 1);
    assert_eq!(
        states::<DB>(&queue).await,
        [("refund".to_owned(), "Completed".to_owned(), 2)]
    );
}
