//! The worker's conformance suite on every backend (`backends!`), then the behaviour of one
//! backend: PostgreSQL's wake-up by notification, SQLite's leases kept while waiting to write.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use jobguard::queue::{JobState, NewJob, Replay};
use jobguard::{Job, JobError, JobKey, KeyError, Outcome, Queue, Worker, WorkerConfig};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::common::{
    Credit, TestDb, draining, guard_rows, ledger_rows, ledger_total, setup, setup_with,
};

/// Writes its effect, then fails: retryable unless `fatal`, or panics.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Flaky {
    order: u32,
    fatal: bool,
    panic: bool,
}

impl<DB: TestDb> Job<DB> for Flaky {
    const KIND: &'static str = "flaky";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("flaky", [format!("order-{}", self.order)])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        DB::insert_ledger(conn, 9, 1).await?;
        if self.panic {
            panic!("flaky job {} panicked", self.order);
        }
        if self.fatal {
            return Err(JobError::fatal(format!(
                "order {} does not exist",
                self.order
            )));
        }
        Err(JobError::msg("the ledger service timed out"))
    }
}

/// Sleeps inside its transaction, for shutdown tests.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Slow {
    order: u32,
    millis: u64,
}

impl<DB: TestDb> Job<DB> for Slow {
    const KIND: &'static str = "slow";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("slow", [format!("order-{}", self.order)])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        DB::insert_ledger(conn, 8, 1).await?;
        tokio::time::sleep(Duration::from_millis(self.millis)).await;
        Ok(())
    }
}

/// Counts how many of its kind run at once, inside their transaction.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Counted {
    order: u32,
}

/// How many `Counted` jobs run now, and the most that ran at once, per backend: the tests of
/// both backends run at once in this process.
static COUNTED: [(AtomicUsize, AtomicUsize); 2] = [
    (AtomicUsize::new(0), AtomicUsize::new(0)),
    (AtomicUsize::new(0), AtomicUsize::new(0)),
];

fn counted<DB: TestDb>() -> &'static (AtomicUsize, AtomicUsize) {
    &COUNTED[usize::from(DB::BACKEND == "sqlite")]
}

impl<DB: TestDb> Job<DB> for Counted {
    const KIND: &'static str = "counted";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("counted", [format!("order-{}", self.order)])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        let (running, most) = counted::<DB>();
        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
        most.fetch_max(now, Ordering::SeqCst);
        DB::insert_ledger(conn, 6, 1).await?;
        tokio::time::sleep(Duration::from_millis(30)).await;
        running.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

async fn drain<DB: TestDb>(queue: &Queue<DB>) -> jobguard::WorkerStats {
    let worker = Worker::with_config(queue.clone(), draining())
        .unwrap()
        .register::<Credit>()
        .register::<Flaky>()
        .register::<Slow>();
    tokio::time::timeout(Duration::from_secs(60), worker.run(std::future::pending()))
        .await
        .expect("the worker drained the queue in time")
        .unwrap()
}

backends!(fn every_job_is_applied_once_and_completed);
async fn every_job_is_applied_once_and_completed<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_every_job_once").await else {
        return;
    };
    for order in 0..100 {
        let credit = Credit { order, amount: 500 };
        assert!(queue.enqueue_job(&credit).await.unwrap().inserted);
        // The producer enqueues the same work again from another code path.
        assert!(!queue.enqueue_job(&credit).await.unwrap().inserted);
    }
    let stats = drain::<DB>(&queue).await;
    assert_eq!(
        (stats.applied, stats.duplicates, stats.failed, stats.dead),
        (100, 0, 0, 0)
    );
    assert_eq!(ledger_rows(&pool).await, 100);
    assert_eq!(ledger_total(&pool).await, 100 * 500);
    assert_eq!(guard_rows(&pool).await, 100);
    let counts = queue.counts().await.unwrap();
    assert_eq!(
        (counts.completed, counts.available, counts.running),
        (100, 0, 0)
    );
}

backends!(fn a_key_already_applied_completes_as_a_duplicate);
async fn a_key_already_applied_completes_as_a_duplicate<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_duplicate").await else {
        return;
    };
    let credit = Credit {
        order: 1,
        amount: 500,
    };
    // Applied once already, say by an earlier job whose completion was lost.
    let guard = queue.guard(Default::default()).unwrap();
    let payload = serde_json::to_value(&credit).unwrap();
    let outcome = guard
        .run_with_payload(
            &<Credit as Job<DB>>::key(&credit).unwrap(),
            &payload,
            async |conn| {
                DB::insert_ledger(conn, 7, 500).await?;
                Ok(())
            },
        )
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Applied(())));

    queue.enqueue_job(&credit).await.unwrap();
    let stats = drain::<DB>(&queue).await;
    assert_eq!((stats.applied, stats.duplicates), (0, 1));
    assert_eq!(
        ledger_rows(&pool).await,
        1,
        "the effect was not applied again"
    );
    assert_eq!(queue.counts().await.unwrap().completed, 1);
}

backends!(fn failures_retry_then_dead_letter_and_roll_back_their_effect);
async fn failures_retry_then_dead_letter_and_roll_back_their_effect<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_failures").await else {
        return;
    };
    let retryable = NewJob::from_job::<DB, _>(&Flaky {
        order: 1,
        fatal: false,
        panic: false,
    })
    .unwrap()
    .max_attempts(3);
    let fatal = NewJob::from_job::<DB, _>(&Flaky {
        order: 2,
        fatal: true,
        panic: false,
    })
    .unwrap();
    let panics = NewJob::from_job::<DB, _>(&Flaky {
        order: 3,
        fatal: false,
        panic: true,
    })
    .unwrap()
    .max_attempts(2);
    for job in [&retryable, &fatal, &panics] {
        queue.enqueue(job).await.unwrap();
    }
    let stats = drain::<DB>(&queue).await;
    // 2 retries + 1 dead for the retryable job, 1 dead for the fatal one, 1 retry + 1 dead for
    // the panicking one.
    assert_eq!(
        (stats.failed, stats.dead, stats.applied),
        (3, 3, 0),
        "{stats:?}"
    );
    assert_eq!(
        ledger_rows(&pool).await,
        0,
        "every failed attempt rolled back its effect"
    );
    assert_eq!(guard_rows(&pool).await, 0, "and its guard row");

    let dead = queue.list(Some(JobState::Dead), None, 10).await.unwrap();
    assert_eq!(dead.len(), 3);
    let error_of = |order: &str| {
        dead.iter()
            .find(|j| j.key.ends_with(order))
            .unwrap()
            .last_error
            .clone()
            .unwrap()
    };
    assert!(error_of("order-1").contains("timed out"), "{dead:?}");
    assert!(
        error_of("order-2").contains("order 2 does not exist"),
        "{dead:?}"
    );
    assert!(error_of("order-3").contains("panicked"), "{dead:?}");
    let attempts: Vec<i32> = dead.iter().map(|j| j.attempt).collect();
    assert!(
        attempts.contains(&3) && attempts.contains(&1) && attempts.contains(&2),
        "{attempts:?}"
    );
}

backends!(fn a_worker_runs_no_more_jobs_at_once_than_its_pool_serves);
/// A worker asked to run more jobs at once than its pool can serve runs fewer: each running
/// job holds a connection, and fetch, rescue and heartbeats need two more. With a pool of 3 it
/// runs one job at a time.
async fn a_worker_runs_no_more_jobs_at_once_than_its_pool_serves<DB: TestDb>() {
    let Some((pool, queue)) = setup_with::<DB>("worker_pool_serves", 3).await else {
        return;
    };
    for order in 0..20 {
        queue.enqueue_job(&Counted { order }).await.unwrap();
    }
    let config = WorkerConfig {
        concurrency: 10,
        ..draining()
    };
    let worker = Worker::with_config(queue.clone(), config)
        .unwrap()
        .register::<Counted>();
    let stats = tokio::time::timeout(Duration::from_secs(120), worker.run(std::future::pending()))
        .await
        .expect("the worker drained the queue")
        .unwrap();
    assert_eq!(
        (stats.applied, stats.failed, stats.dead),
        (20, 0, 0),
        "{stats:?}"
    );
    assert_eq!(ledger_rows(&pool).await, 20);
    let most = counted::<DB>().1.load(Ordering::SeqCst);
    assert_eq!(most, 1, "jobs that ran at once with 3 connections");
}

backends!(fn rescue_stops_at_the_retry_policys_attempt_limit_as_failure_does);
/// A job whose lease expired is out of attempts at the same limit as a job that failed: the
/// lesser of its own `max_attempts` and the worker's retry policy. A worker whose policy
/// allows one attempt dead-letters the rescued job instead of running it a second time.
async fn rescue_stops_at_the_retry_policys_attempt_limit_as_failure_does<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_rescue_policy_limit").await else {
        return;
    };
    // The job allows 10 attempts; the worker's policy allows 1.
    let job = NewJob::from_job::<DB, _>(&Credit {
        order: 1,
        amount: 500,
    })
    .unwrap()
    .max_attempts(10);
    queue.enqueue(&job).await.unwrap();
    // A worker that takes the job and dies: attempt 1 is spent, its lease runs out.
    let taken = queue
        .fetch("default", 1, Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    let expired = taken[0].leased_until + Duration::from_millis(50);
    while std::time::SystemTime::now() < expired {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let config = WorkerConfig {
        retry: jobguard::RetryPolicy {
            max_attempts: 1,
            base: Duration::ZERO,
            ..Default::default()
        },
        ..draining()
    };
    let worker = Worker::with_config(queue.clone(), config)
        .unwrap()
        .register::<Credit>();
    let stats = tokio::time::timeout(Duration::from_secs(60), worker.run(std::future::pending()))
        .await
        .expect("the worker stopped when idle")
        .unwrap();

    assert_eq!(stats.applied, 0, "the job got no second attempt: {stats:?}");
    assert_eq!(ledger_rows(&pool).await, 0);
    let dead = queue.list(Some(JobState::Dead), None, 10).await.unwrap();
    assert_eq!(
        dead.len(),
        1,
        "{:?}",
        queue.list(None, None, 10).await.unwrap()
    );
    assert_eq!(dead[0].attempt, 1);
    let error = dead[0].last_error.as_deref().unwrap();
    assert!(error.contains("the lease of attempt 1 expired"), "{error}");
}

backends!(fn unknown_kinds_and_bad_payloads_are_dead_lettered_not_retried);
async fn unknown_kinds_and_bad_payloads_are_dead_lettered_not_retried<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_bad_input").await else {
        return;
    };
    let unknown = NewJob::new(
        JobKey::new("refund", ["order-1"]).unwrap(),
        &json!({"x": 1}),
    )
    .unwrap();
    let malformed = NewJob::new(
        JobKey::new("credit", ["order-2"]).unwrap(),
        &json!({"order": "two"}),
    )
    .unwrap();
    queue.enqueue(&unknown).await.unwrap();
    queue.enqueue(&malformed).await.unwrap();
    let stats = drain::<DB>(&queue).await;
    assert_eq!(
        (stats.dead, stats.failed, stats.applied),
        (2, 0, 0),
        "{stats:?}"
    );
    let dead = queue.list(Some(JobState::Dead), None, 10).await.unwrap();
    let errors: Vec<String> = dead.iter().filter_map(|j| j.last_error.clone()).collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("unknown job kind `refund`")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("does not deserialize into a `credit` job")),
        "{errors:?}"
    );
    assert_eq!(ledger_rows(&pool).await, 0);
}

backends!(fn replaying_a_dead_job_whose_key_the_guard_holds_is_a_duplicate);
async fn replaying_a_dead_job_whose_key_the_guard_holds_is_a_duplicate<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_replay").await else {
        return;
    };
    let credit = Credit {
        order: 5,
        amount: 500,
    };
    queue.enqueue_job(&credit).await.unwrap();
    assert_eq!(drain::<DB>(&queue).await.applied, 1);

    // The same work enqueued again and dead-lettered, e.g. by an operator or a broken worker.
    let second = queue.enqueue_job(&credit).await.unwrap();
    assert!(
        second.inserted,
        "the first job is completed, so this is a new job"
    );
    let leased = queue
        .fetch("default", 1, Duration::from_secs(30))
        .await
        .unwrap();
    queue
        .dead_letter(leased[0].lease, "dead-lettered by hand")
        .await
        .unwrap();

    assert_eq!(
        queue.replay(&Replay::Job(second.id)).await.unwrap(),
        vec![second.id]
    );
    let stats = drain::<DB>(&queue).await;
    assert_eq!((stats.applied, stats.duplicates), (0, 1), "{stats:?}");
    assert_eq!(ledger_rows(&pool).await, 1);
}

backends!(fn a_job_fetched_ahead_keeps_its_lease_while_it_waits_for_a_slot);
async fn a_job_fetched_ahead_keeps_its_lease_while_it_waits_for_a_slot<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_prefetch_lease").await else {
        return;
    };
    for (order, millis) in [(1, 1200), (2, 10)] {
        queue.enqueue_job(&Slow { order, millis }).await.unwrap();
    }
    // One slot: the second job is fetched ahead and waits four leases for it, while the
    // worker's own rescue runs every half lease.
    let config = WorkerConfig {
        concurrency: 1,
        prefetch: Some(1),
        lease: Duration::from_millis(300),
        ..draining()
    };
    let worker = Worker::with_config(queue.clone(), config)
        .unwrap()
        .register::<Slow>();
    let stats = tokio::time::timeout(Duration::from_secs(60), worker.run(std::future::pending()))
        .await
        .expect("the worker drained the queue in time")
        .unwrap();

    assert_eq!((stats.applied, stats.fenced), (2, 0), "{stats:?}");
    let jobs = queue
        .list(Some(JobState::Completed), None, 10)
        .await
        .unwrap();
    assert_eq!(
        jobs.iter().map(|job| job.attempt).collect::<Vec<_>>(),
        [1, 1],
        "a waiting job's lease expired and it ran again: {jobs:?}"
    );
    assert_eq!(ledger_rows(&pool).await, 2);
}

backends!(fn a_job_given_back_behind_a_busy_workers_fetches_still_runs);
/// While a backlog keeps its fetches full, the worker reads the queue from past the last job
/// it took, not from the head: a job that lands behind that place (here one given back by
/// another holder, which keeps its early run time) is still run, before a draining worker
/// stops.
async fn a_job_given_back_behind_a_busy_workers_fetches_still_runs<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_behind_the_cursor").await else {
        return;
    };
    // First in the queue's order, and held elsewhere while the worker starts on the rest.
    queue
        .enqueue_job(&Credit {
            order: 1,
            amount: 500,
        })
        .await
        .unwrap();
    let held = queue
        .fetch(jobguard::queue::DEFAULT_QUEUE, 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(held.len(), 1);
    let slow = 200;
    for order in 0..slow {
        queue.enqueue_job(&Slow { order, millis: 5 }).await.unwrap();
    }
    let worker = Worker::with_config(queue.clone(), draining())
        .unwrap()
        .register::<Credit>()
        .register::<Slow>();
    let run = tokio::spawn(worker.run(std::future::pending()));
    // Well into the backlog, with most of it still to run, the job comes back at the head.
    while ledger_rows(&pool).await < 20 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    queue.release(held[0].lease).await.unwrap();
    let stats = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the worker drained the queue in time")
        .unwrap()
        .unwrap();
    assert_eq!(
        (stats.applied, stats.failed, stats.dead),
        (u64::from(slow) + 1, 0, 0),
        "{stats:?}"
    );
    let counts = queue.counts().await.unwrap();
    assert_eq!(
        (counts.completed, counts.available, counts.running),
        (i64::from(slow) + 1, 0, 0)
    );
    assert_eq!(ledger_total(&pool).await, i64::from(slow) + 500);
}

backends!(fn shutdown_gives_back_jobs_fetched_ahead_without_starting_them);
async fn shutdown_gives_back_jobs_fetched_ahead_without_starting_them<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_prefetch_shutdown").await else {
        return;
    };
    for (order, millis) in [(1, 800), (2, 10)] {
        queue.enqueue_job(&Slow { order, millis }).await.unwrap();
    }
    let config = WorkerConfig {
        concurrency: 1,
        prefetch: Some(1),
        shutdown_timeout: Duration::from_secs(30),
        poll_interval: Duration::from_millis(50),
        ..WorkerConfig::default()
    };
    let worker = Worker::with_config(queue.clone(), config)
        .unwrap()
        .register::<Slow>();
    let stats = worker
        .run(tokio::time::sleep(Duration::from_millis(300)))
        .await
        .unwrap();

    // The running job finishes; the one waiting for its slot is given back, not started.
    assert_eq!((stats.applied, stats.released), (1, 1), "{stats:?}");
    assert_eq!(ledger_rows(&pool).await, 1);
    let available = queue
        .list(Some(JobState::Available), None, 10)
        .await
        .unwrap();
    assert_eq!(available.len(), 1, "{available:?}");
    assert_eq!(available[0].attempt, 0, "{available:?}");
}

backends!(fn shutdown_waits_for_running_jobs_then_gives_back_the_rest);
async fn shutdown_waits_for_running_jobs_then_gives_back_the_rest<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_shutdown").await else {
        return;
    };
    queue
        .enqueue_job(&Slow {
            order: 1,
            millis: 100,
        })
        .await
        .unwrap();
    // Due a little later, so that on SQLite, where one job writes at a time, the short job
    // is not left waiting behind it.
    let long = NewJob::from_job::<DB, _>(&Slow {
        order: 2,
        millis: 60_000,
    })
    .unwrap();
    queue
        .enqueue(&long.delay(Duration::from_millis(200)))
        .await
        .unwrap();
    let config = WorkerConfig {
        concurrency: 2,
        shutdown_timeout: Duration::from_millis(1500),
        poll_interval: Duration::from_millis(50),
        ..WorkerConfig::default()
    };
    let worker = Worker::with_config(queue.clone(), config)
        .unwrap()
        .register::<Slow>();
    let stats = worker
        .run(tokio::time::sleep(Duration::from_millis(500)))
        .await
        .unwrap();

    assert_eq!((stats.applied, stats.released), (1, 1), "{stats:?}");
    assert_eq!(
        ledger_rows(&pool).await,
        1,
        "the job cut short was rolled back"
    );
    let available = queue
        .list(Some(JobState::Available), None, 10)
        .await
        .unwrap();
    assert_eq!(available.len(), 1);
    assert_eq!(
        available[0].attempt, 0,
        "giving the job back did not use up an attempt"
    );
}

/// On PostgreSQL an enqueue wakes an idle worker through LISTEN/NOTIFY: with a poll interval of
/// a minute, the job still runs at once; so does one enqueued in a transaction inside the 20 ms
/// in which a queue is announced once from transactions, and jobs enqueued back to back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_notification_wakes_an_idle_worker() {
    use std::time::Duration;

    use crate::common::TestDb;
    use jobguard::queue::NewJob;
    use jobguard::{Job, JobError, JobKey, KeyError, Queue, Worker, WorkerConfig};
    use sqlx::Postgres;

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Ping {
        n: u32,
    }

    impl Job<Postgres> for Ping {
        const KIND: &'static str = "ping";

        fn key(&self) -> Result<JobKey, KeyError> {
            JobKey::new("ping", [self.n.to_string()])
        }

        async fn run(&self, conn: &mut sqlx::PgConnection) -> Result<(), JobError> {
            Postgres::insert_ledger(conn, 1, 1).await?;
            Ok(())
        }
    }

    /// Waits up to 10 s for the ledger to hold `rows` rows; `what` names the wake-up missed.
    async fn wait_for_ledger(pool: &sqlx::PgPool, rows: i64, what: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while crate::common::ledger_rows(pool).await < rows {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    let Some(pool) = Postgres::open("worker_notify", 6).await else {
        return;
    };
    let queue = Queue::new(pool.clone());
    let config = WorkerConfig {
        poll_interval: Duration::from_secs(60),
        ..WorkerConfig::default()
    };
    let worker = Worker::with_config(queue.clone(), config)
        .unwrap()
        .register::<Ping>();
    // Both tables, the queue's and the guard's.
    worker.migrate().await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async move {
        let _ = stopped.await;
    }));
    // Let the worker find the queue empty and go idle.
    tokio::time::sleep(Duration::from_millis(500)).await;

    queue
        .enqueue(&NewJob::from_job::<Postgres, _>(&Ping { n: 1 }).unwrap())
        .await
        .unwrap();
    wait_for_ledger(&pool, 1, "the worker slept through the enqueue").await;
    // A job enqueued in a transaction right after another is not announced on its own (at most
    // one notification per queue every 20 ms from inside transactions), but at the end of that
    // window. Here the announced job rolls back with its notification, so only the window's
    // trailing notification can wake the worker.
    let mut first = pool.begin().await.unwrap();
    let announced = NewJob::from_job::<Postgres, _>(&Ping { n: 2 }).unwrap();
    queue.enqueue_tx(&mut first, &announced).await.unwrap();
    let mut second = pool.begin().await.unwrap();
    let unannounced = NewJob::from_job::<Postgres, _>(&Ping { n: 3 }).unwrap();
    queue.enqueue_tx(&mut second, &unannounced).await.unwrap();
    second.commit().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.rollback().await.unwrap();
    wait_for_ledger(
        &pool,
        2,
        "the worker slept through an enqueue inside the notification window",
    )
    .await;
    // Enqueues that commit on their own are announced after their commit, at most once per
    // queue every millisecond; a job inside that window is announced when it ends.
    for n in [4, 5, 6] {
        queue
            .enqueue(&NewJob::from_job::<Postgres, _>(&Ping { n }).unwrap())
            .await
            .unwrap();
    }
    wait_for_ledger(
        &pool,
        5,
        "the worker slept through enqueues made back to back",
    )
    .await;
    stop.send(()).unwrap();
    let stats = running.await.unwrap().unwrap();
    assert_eq!(stats.applied, 5);
}

/// On SQLite a job waiting for the write lock keeps its lease, however long another process
/// holds the lock: here the other process holds it for four leases and then rescues expired
/// leases at once, before the waiting job gets the lock. The job has one attempt, so a lease
/// taken from it would leave it dead without having run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_job_waiting_for_the_write_lock_keeps_its_lease() {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::common::TestDb;
    use jobguard::external::{ApiKey, ExternalJob};
    use jobguard::queue::NewJob;
    use jobguard::{JobError, JobKey, KeyError, Queue, Worker, WorkerConfig};
    use sqlx::Sqlite;
    use tokio::sync::Notify;

    /// Lets the test take the write lock after the job was fetched and before its
    /// transaction begins.
    #[derive(Default)]
    struct Gate {
        called: Notify,
        go: Notify,
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Gated {
        n: u32,
    }

    impl ExternalJob<Sqlite> for Gated {
        const KIND: &'static str = "gated";
        type Context = Arc<Gate>;
        type Output = ();

        fn key(&self) -> Result<JobKey, KeyError> {
            JobKey::new("gated", [self.n.to_string()])
        }

        async fn call(&self, gate: &Arc<Gate>, _key: &ApiKey) -> Result<(), JobError> {
            gate.called.notify_one();
            gate.go.notified().await;
            Ok(())
        }

        async fn record(
            &self,
            _gate: &Arc<Gate>,
            conn: &mut sqlx::SqliteConnection,
            _output: &(),
        ) -> Result<(), JobError> {
            Sqlite::insert_ledger(conn, 1, 1).await?;
            Ok(())
        }
    }

    let pool = Sqlite::open("worker_waits_for_the_lock", 8).await.unwrap();
    let queue = Queue::new(pool.clone());
    let lease = Duration::from_millis(300);
    let config = WorkerConfig {
        concurrency: 1,
        lease,
        poll_interval: Duration::from_millis(50),
        stop_when_idle: true,
        ..WorkerConfig::default()
    };
    let gate = Arc::new(Gate::default());
    let worker = Worker::with_config(queue.clone(), config)
        .unwrap()
        .register_external::<Gated>(Arc::clone(&gate));
    worker.migrate().await.unwrap();
    let job = NewJob::from_external::<Sqlite, _>(&Gated { n: 1 })
        .unwrap()
        .max_attempts(1);
    queue.enqueue(&job).await.unwrap();

    // The other process: a pool of its own on the same file, with one connection.
    let file = pool.connect_options().get_filename().display().to_string();
    let other = jobguard::sqlite::connect(&format!("sqlite:{file}"), 1)
        .await
        .unwrap();
    let other_queue = Queue::new(other.clone());

    let running = tokio::spawn(worker.run(std::future::pending()));
    tokio::time::timeout(Duration::from_secs(30), gate.called.notified())
        .await
        .expect("the worker fetched the job");
    let mut holder = other.acquire().await.unwrap();
    sqlx::query("begin immediate")
        .execute(&mut *holder)
        .await
        .unwrap();
    gate.go.notify_one();
    // The job waits for the write lock for four leases.
    tokio::time::sleep(lease * 4).await;
    // The other process's rescue waits for its connection, which it gets the moment the lock
    // is let go, ahead of the job still polling for it.
    let rescue = tokio::spawn(async move { other_queue.rescue().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    sqlx::query("commit").execute(&mut *holder).await.unwrap();
    drop(holder);

    let rescued = tokio::time::timeout(Duration::from_secs(60), rescue)
        .await
        .expect("the rescue ran")
        .unwrap()
        .unwrap();
    let stats = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the worker stopped when idle")
        .unwrap()
        .unwrap();
    let jobs = queue.list(None, None, 10).await.unwrap();
    assert_eq!(rescued, 0, "the waiting job's lease was taken: {jobs:?}");
    assert_eq!(stats.applied, 1, "{stats:?} {jobs:?}");
    assert_eq!(crate::common::ledger_rows(&pool).await, 1);
    let counts = queue.counts().await.unwrap();
    assert_eq!((counts.completed, counts.dead, counts.running), (1, 0, 0));
    other.close().await;
}

/// Rolled back by a serialization failure on every run, as a hot row under `serializable`
/// would be.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct AlwaysContended {
    order: u32,
}

static CONTENDED_RUNS: AtomicUsize = AtomicUsize::new(0);

impl Job<sqlx::Postgres> for AlwaysContended {
    const KIND: &'static str = "always_contended";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("contended", [format!("order-{}", self.order)])
    }

    async fn run(&self, conn: &mut sqlx::PgConnection) -> Result<(), JobError> {
        CONTENDED_RUNS.fetch_add(1, Ordering::SeqCst);
        sqlx::query("do $$ begin raise exception 'could not serialize access' using errcode = '40001'; end $$")
            .execute(conn)
            .await?;
        Ok(())
    }
}

/// The worker runs a job rolled back by contention as many times as the guard's
/// `contention_attempts` says, then counts the attempt as failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_retries_follow_the_guards_limit() {
    let Some((_pool, queue)) = setup::<sqlx::Postgres>("worker_contention_attempts").await else {
        return;
    };
    queue
        .enqueue_job(&AlwaysContended { order: 1 })
        .await
        .unwrap();
    let config = WorkerConfig {
        guard: jobguard::GuardConfig::default().contention_attempts(2),
        retry: jobguard::RetryPolicy {
            max_attempts: 1,
            ..Default::default()
        },
        ..draining()
    };
    let worker = Worker::with_config(queue.clone(), config)
        .unwrap()
        .register::<AlwaysContended>();
    let stats = worker.run(std::future::pending()).await.unwrap();
    assert_eq!(stats.dead, 1, "{stats:?}");
    assert_eq!(
        CONTENDED_RUNS.load(Ordering::SeqCst),
        2,
        "two runs, as configured"
    );
    let rows = queue.list(Some(JobState::Dead), None, 10).await.unwrap();
    let error = rows[0].last_error.as_deref().unwrap_or_default();
    assert!(error.contains("could not serialize"), "{error}");
}
