//! Batched execution (`Job::BATCH`, `WorkerConfig::batch_size`) on every backend: a batch
//! commits its jobs together, falls back to one transaction per job when any of them fails,
//! leaves a fenced job out, and counts a key held before the batch, or claimed earlier in the
//! same batch, as a duplicate.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use jobguard::{Job, JobError, JobKey, KeyError, Queue, Worker, WorkerConfig};
use serde::{Deserialize, Serialize};

use crate::common::{TestDb, draining, guard_rows, ledger_rows, setup};

/// What a [`Batched`] job does besides its ledger row.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
enum Act {
    /// Only the ledger row.
    Credit,
    /// The ledger row, then a retryable error.
    Fail,
    /// The ledger row, then a wait inside the transaction while the test's flag is up.
    Stall,
}

/// A job that opts in to batches; `tag` picks the effect counter of the test that runs it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Batched {
    order: u32,
    act: Act,
    tag: usize,
}

/// How many times each test's effects ran, rolled back or not, per backend.
static RUNS: [[AtomicUsize; 2]; 8] = [const { [const { AtomicUsize::new(0) }; 2] }; 8];

fn runs<DB: TestDb>(tag: usize) -> usize {
    RUNS[tag][usize::from(DB::BACKEND == "sqlite")].load(Ordering::SeqCst)
}

/// Whether [`Act::Stall`] jobs stall, per backend.
static STALLING: [AtomicBool; 2] = [const { AtomicBool::new(false) }; 2];

fn stalling<DB: TestDb>() -> &'static AtomicBool {
    &STALLING[usize::from(DB::BACKEND == "sqlite")]
}

impl<DB: TestDb> Job<DB> for Batched {
    const KIND: &'static str = "batched";
    const BATCH: bool = true;

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("batched", [format!("order-{}", self.order)])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        RUNS[self.tag][usize::from(DB::BACKEND == "sqlite")].fetch_add(1, Ordering::SeqCst);
        DB::insert_ledger(conn, 5, 1).await?;
        match self.act {
            Act::Credit => {}
            Act::Fail => return Err(JobError::msg("the ledger service timed out")),
            Act::Stall => {
                while stalling::<DB>().load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        Ok(())
    }
}

/// A pool of its own on the test's database, for a worker.
async fn own_pool<DB: TestDb>(pool: &sqlx::Pool<DB>) -> sqlx::Pool<DB> {
    sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(5)
        .acquire_timeout(Duration::from_secs(60))
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap()
}

/// One worker slot taking batches of up to 10.
fn batching() -> WorkerConfig {
    WorkerConfig {
        concurrency: 1,
        batch_size: 10,
        ..draining()
    }
}

async fn enqueue<DB: TestDb>(queue: &Queue<DB>, order: u32, act: Act, tag: usize) {
    let job = Batched { order, act, tag };
    assert!(queue.enqueue_job(&job).await.unwrap().inserted);
}

async fn drain<DB: TestDb>(queue: Queue<DB>, config: WorkerConfig) -> jobguard::WorkerStats {
    let worker = Worker::with_config(queue, config)
        .unwrap()
        .register::<Batched>();
    tokio::time::timeout(Duration::from_secs(120), worker.run(std::future::pending()))
        .await
        .expect("the worker drained the queue in time")
        .unwrap()
}

backends!(fn a_failing_job_rolls_its_batch_back_and_retries_alone);
async fn a_failing_job_rolls_its_batch_back_and_retries_alone<DB: TestDb>() {
    const TAG: usize = 0;
    let Some((pool, queue)) = setup::<DB>("batch_failing_job").await else {
        return;
    };
    for order in 0..10 {
        let act = if order == 4 { Act::Fail } else { Act::Credit };
        enqueue(&queue, order, act, TAG).await;
    }
    let config = WorkerConfig {
        retry: jobguard::RetryPolicy {
            max_attempts: 2,
            base: Duration::ZERO,
            ..Default::default()
        },
        ..batching()
    };
    let stats = drain::<DB>(queue.clone(), config).await;
    assert_eq!(
        (stats.applied, stats.duplicates, stats.failed, stats.dead),
        (9, 0, 1, 1)
    );
    assert_eq!((stats.batches, stats.batches_rolled_back), (0, 1));
    // The batch ran up to the failing job and rolled back; then each job alone: nine
    // applied, and the failing one in its two attempts.
    assert_eq!(runs::<DB>(TAG), 5 + 9 + 2);
    assert_eq!(
        ledger_rows(&pool).await,
        9,
        "the failing job's effect rolled back"
    );
    assert_eq!(guard_rows(&pool).await, 9);
    let counts = queue.counts().await.unwrap();
    assert_eq!((counts.completed, counts.dead), (9, 1));
}

backends!(fn a_batch_commits_its_jobs_together);
async fn a_batch_commits_its_jobs_together<DB: TestDb>() {
    const TAG: usize = 1;
    let Some((pool, queue)) = setup::<DB>("batch_commits_together").await else {
        return;
    };
    for order in 0..30 {
        enqueue(&queue, order, Act::Credit, TAG).await;
    }
    let stats = drain::<DB>(queue.clone(), batching()).await;
    assert_eq!((stats.applied, stats.duplicates, stats.failed), (30, 0, 0));
    assert_eq!((stats.batches, stats.batches_rolled_back), (3, 0));
    assert_eq!(runs::<DB>(TAG), 30, "every effect ran once");
    assert_eq!(ledger_rows(&pool).await, 30);
    assert_eq!(guard_rows(&pool).await, 30);
    if DB::BACKEND == "postgres" {
        // `now()` is the transaction's start: three batches of ten, three times.
        let times = DB::count(
            &pool,
            "select count(distinct applied_at) from processed_jobs",
        )
        .await;
        assert_eq!(times, 3, "30 jobs in batches of 10 are three transactions");
    }
}

backends!(fn a_fenced_job_in_a_batch_claims_nothing);
async fn a_fenced_job_in_a_batch_claims_nothing<DB: TestDb>() {
    const TAG: usize = 2;
    let Some((pool, queue)) = setup::<DB>("batch_fenced_job").await else {
        return;
    };
    for order in 1..=4 {
        enqueue(&queue, order, Act::Credit, TAG).await;
    }
    // Job 2's lease is taken over the moment the worker's fetch takes it, as a rescue and a
    // second fetch would: a trigger bumps its fencing token after the fetch returned it.
    let mut conn = pool.acquire().await.unwrap();
    let takeover: &[&'static str] = if DB::BACKEND == "postgres" {
        &[
            "create function take_over() returns trigger language plpgsql as $$
             begin
                 update jobguard_jobs set lease_token = lease_token + 1 where id = new.id;
                 return null;
             end $$",
            "create trigger take_over after update on jobguard_jobs for each row
             when (new.attempt > old.attempt and new.job_key = 'batched:order-2')
             execute function take_over()",
        ]
    } else {
        &[
            "create trigger take_over after update of attempt on jobguard_jobs
           when new.attempt > old.attempt and new.job_key = 'batched:order-2'
           begin
               update jobguard_jobs set lease_token = lease_token + 1 where id = new.id;
           end",
        ]
    };
    for statement in takeover {
        DB::execute(&mut conn, statement).await.unwrap();
    }
    drop(conn);
    let draining = tokio::spawn(drain::<DB>(queue.clone(), batching()));
    let stats = draining.await.unwrap();
    assert_eq!(
        (stats.applied, stats.fenced, stats.failed, stats.dead),
        (3, 1, 0, 0)
    );
    assert_eq!(runs::<DB>(TAG), 3, "the batch committed the first time");
    assert_eq!(ledger_rows(&pool).await, 3, "the fenced job ran no effect");
    assert_eq!(guard_rows(&pool).await, 3, "the fenced job claimed no key");
    let counts = queue.counts().await.unwrap();
    assert_eq!(
        (counts.completed, counts.running),
        (3, 1),
        "the fenced job is left to the new holder of its lease"
    );
}

backends!(fn a_key_twice_in_one_batch_applies_once);
async fn a_key_twice_in_one_batch_applies_once<DB: TestDb>() {
    const TAG: usize = 3;
    let Some((pool, queue)) = setup::<DB>("batch_key_twice").await else {
        return;
    };
    for order in 1..=3 {
        enqueue(&queue, order, Act::Credit, TAG).await;
    }
    // The queue's unique index on live keys keeps a key from being enqueued twice; the batch
    // does not rely on it. Without the index, a copy of job 2 is a second live job of its key.
    let mut conn = pool.acquire().await.unwrap();
    DB::execute(&mut conn, "drop index jobguard_jobs_live_key")
        .await
        .unwrap();
    for statement in [
        "create temporary table twin as select * from jobguard_jobs where job_key = 'batched:order-2'",
        "update twin set id = 1000",
        "insert into jobguard_jobs select * from twin",
    ] {
        DB::execute(&mut conn, statement).await.unwrap();
    }
    drop(conn);
    let stats = drain::<DB>(queue.clone(), batching()).await;
    assert_eq!(
        (stats.applied, stats.duplicates, stats.failed, stats.dead),
        (3, 1, 0, 0)
    );
    assert_eq!(runs::<DB>(TAG), 3, "the batch committed the first time");
    assert_eq!(
        ledger_rows(&pool).await,
        3,
        "the key's second job ran no effect"
    );
    assert_eq!(guard_rows(&pool).await, 3);
    assert_eq!(queue.counts().await.unwrap().completed, 4);
}

backends!(fn a_key_applied_before_the_batch_is_a_duplicate);
async fn a_key_applied_before_the_batch_is_a_duplicate<DB: TestDb>() {
    const TAG: usize = 6;
    let Some((pool, queue)) = setup::<DB>("batch_key_held").await else {
        return;
    };
    // Key 2 was applied by an earlier delivery, with the same payload.
    let guard = queue.guard(Default::default()).unwrap();
    let earlier = Batched {
        order: 2,
        act: Act::Credit,
        tag: TAG,
    };
    let key = JobKey::new("batched", ["order-2"]).unwrap();
    let outcome = guard
        .run_with_payload(&key, &earlier, async |conn| {
            DB::insert_ledger(conn, 5, 1).await?;
            Ok(())
        })
        .await
        .unwrap();
    assert!(outcome.is_applied());
    for order in 1..=4 {
        enqueue(&queue, order, Act::Credit, TAG).await;
    }
    let stats = drain::<DB>(queue.clone(), batching()).await;
    assert_eq!(
        (stats.applied, stats.duplicates, stats.failed, stats.dead),
        (3, 1, 0, 0)
    );
    assert_eq!(runs::<DB>(TAG), 3, "the batch committed the first time");
    assert_eq!(
        ledger_rows(&pool).await,
        4,
        "three in the batch, one before it"
    );
    assert_eq!(guard_rows(&pool).await, 4);
}

backends!(fn a_batch_stopped_before_its_commit_applies_nothing_and_runs_again);
async fn a_batch_stopped_before_its_commit_applies_nothing_and_runs_again<DB: TestDb>() {
    const TAG: usize = 4;
    let Some((pool, queue)) = setup::<DB>("batch_stopped").await else {
        return;
    };
    for order in 0..4 {
        enqueue(&queue, order, Act::Credit, TAG).await;
    }
    enqueue(&queue, 4, Act::Stall, TAG).await;
    let config = WorkerConfig {
        lease: Duration::from_secs(2),
        stop_when_idle: false,
        ..batching()
    };
    // The worker has a pool of its own, so that its death closes its connections.
    let own = own_pool(&pool).await;
    let worker = Worker::with_config(Queue::new(own.clone()), config)
        .unwrap()
        .register::<Batched>();
    stalling::<DB>().store(true, Ordering::SeqCst);
    let running = tokio::spawn(worker.run(std::future::pending()));
    // Every effect of the batch ran, the last one stalls before the commit.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while runs::<DB>(TAG) < 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the batch never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The worker dies: its tasks are gone, its connections closed with their transaction.
    running.abort();
    let _ = running.await;
    own.close().await;
    assert_eq!(
        ledger_rows(&pool).await,
        0,
        "nothing of the batch committed"
    );
    assert_eq!(guard_rows(&pool).await, 0);
    assert_eq!(queue.counts().await.unwrap().running, 5);

    // The leases expire, the jobs are rescued and run again, once each.
    stalling::<DB>().store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stats = drain::<DB>(queue.clone(), batching()).await;
    assert_eq!(stats.applied, 5);
    assert_eq!(ledger_rows(&pool).await, 5);
    assert_eq!(guard_rows(&pool).await, 5);
    assert_eq!(queue.counts().await.unwrap().completed, 5);
}

backends!(fn two_batching_workers_apply_each_of_a_thousand_keys_once, worker_threads = 4);
async fn two_batching_workers_apply_each_of_a_thousand_keys_once<DB: TestDb>() {
    const TAG: usize = 5;
    const KEYS: u32 = 1000;
    let Some((pool, queue)) = setup::<DB>("batch_thousand").await else {
        return;
    };
    for order in 0..KEYS {
        enqueue(&queue, order, Act::Credit, TAG).await;
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let config = WorkerConfig {
        concurrency: 3,
        batch_size: 50,
        stop_when_idle: false,
        ..draining()
    };
    let mut workers = Vec::new();
    for _ in 0..2 {
        let own = Queue::new(own_pool(&pool).await);
        let worker = Worker::with_config(own, config.clone())
            .unwrap()
            .register::<Batched>();
        let mut stopped = stopped.clone();
        workers.push(tokio::spawn(worker.run(async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        })));
    }
    // Two more deliveries of every key, each enqueued once the one before it finished.
    let delivered = Arc::new(AtomicUsize::new(KEYS as usize));
    for _ in 0..2 {
        let mut waiting: Vec<u32> = (0..KEYS).collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
        while !waiting.is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "deliveries stalled");
            let mut next = Vec::new();
            for order in waiting {
                let job = Batched {
                    order,
                    act: Act::Credit,
                    tag: TAG,
                };
                if queue.enqueue_job(&job).await.unwrap().inserted {
                    delivered.fetch_add(1, Ordering::SeqCst);
                } else {
                    next.push(order);
                }
            }
            waiting = next;
            if !waiting.is_empty() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert_eq!(delivered.load(Ordering::SeqCst), 3 * KEYS as usize);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        let counts = queue.counts().await.unwrap();
        if counts.available + counts.running == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the workers did not drain"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.send(true).unwrap();
    let mut applied = 0;
    let mut duplicates = 0;
    for worker in workers {
        let stats = worker.await.unwrap().unwrap();
        applied += stats.applied;
        duplicates += stats.duplicates;
    }
    assert_eq!(
        ledger_rows(&pool).await,
        i64::from(KEYS),
        "exactly one effect per key"
    );
    assert_eq!(guard_rows(&pool).await, i64::from(KEYS));
    assert_eq!(
        (applied, duplicates),
        (u64::from(KEYS), 2 * u64::from(KEYS))
    );
    assert_eq!(queue.counts().await.unwrap().completed, 3 * i64::from(KEYS));
}

// At a light load a batch would make its later jobs wait for the earlier ones' work: a fetch
// that finds fewer jobs than idle slots spreads them one per slot, and batches fill only once
// jobs outnumber the idle slots.
backends!(fn jobs_fewer_than_idle_slots_run_alone_and_a_backlog_fills_batches);
async fn jobs_fewer_than_idle_slots_run_alone_and_a_backlog_fills_batches<DB: TestDb>() {
    const TAG: usize = 7;
    let Some((pool, queue)) = setup::<DB>("batch_light_load").await else {
        return;
    };
    let jobs: Vec<Batched> = (0..6)
        .map(|order| Batched {
            order,
            act: Act::Credit,
            tag: TAG,
        })
        .collect();
    queue.enqueue_jobs(&jobs).await.unwrap();
    let light = WorkerConfig {
        concurrency: 8,
        batch_size: 10,
        ..draining()
    };
    let stats = drain::<DB>(queue.clone(), light.clone()).await;
    assert_eq!((stats.applied, stats.batches), (6, 0), "{stats:?}");

    let backlog: Vec<Batched> = (100..300)
        .map(|order| Batched {
            order,
            act: Act::Credit,
            tag: TAG,
        })
        .collect();
    queue.enqueue_jobs(&backlog).await.unwrap();
    let busy = WorkerConfig {
        concurrency: 2,
        prefetch: Some(0),
        ..light
    };
    let stats = drain::<DB>(queue.clone(), busy).await;
    assert_eq!(stats.applied, 200, "{stats:?}");
    // Two slots, 200 jobs: the first fetch fills batches of 10; so do the later ones while
    // the backlog lasts.
    assert!(stats.batches >= 10, "{stats:?}");
    assert_eq!(ledger_rows(&pool).await, 206);
}
