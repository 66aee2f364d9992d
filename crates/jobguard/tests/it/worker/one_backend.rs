//! The behaviour of one backend: PostgreSQL's wake-up by notification and its contention
//! retries, SQLite's leases kept while waiting to write.

use super::*;

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

/// Rolled back by a serialization failure on its first three runs, as a hot row under
/// `serializable` would be.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Contended {
    order: u32,
}

static CONTENDED_RUNS: AtomicUsize = AtomicUsize::new(0);

impl Job<sqlx::Postgres> for Contended {
    const KIND: &'static str = "contended";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("contended", [format!("order-{}", self.order)])
    }

    async fn run(&self, conn: &mut sqlx::PgConnection) -> Result<(), JobError> {
        if CONTENDED_RUNS.fetch_add(1, Ordering::SeqCst) < 3 {
            sqlx::query("do $$ begin raise exception 'could not serialize access' using errcode = '40001'; end $$")
                .execute(conn)
                .await?;
        }
        Ok(())
    }
}

/// The worker runs a job rolled back by contention as many times as the guard's
/// `contention_attempts` says, then gives it back, its attempt not counted: contention spends
/// no attempt, so a job allowed one still applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_retries_follow_the_guards_limit() {
    let Some((_pool, queue)) = setup::<sqlx::Postgres>("worker_contention_attempts").await else {
        return;
    };
    queue.enqueue_job(&Contended { order: 1 }).await.unwrap();
    let config = WorkerConfig {
        guard: jobguard::GuardConfig::default().contention_attempts(2),
        retry: jobguard::RetryPolicy {
            max_attempts: 1,
            ..draining().retry
        },
        ..draining()
    };
    let worker = Worker::with_config(queue.clone(), config)
        .unwrap()
        .register::<Contended>();
    let stats = worker.run(std::future::pending()).await.unwrap();
    assert_eq!(
        (stats.applied, stats.released, stats.dead),
        (1, 1, 0),
        "{stats:?}"
    );
    assert_eq!(
        CONTENDED_RUNS.load(Ordering::SeqCst),
        4,
        "two runs, given back, a third rolled back and a fourth that commits"
    );
    let rows = queue
        .list(Some(JobState::Completed), None, 10)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].attempt, 1, "the runs given back spent no attempt");
}
