//! The worker's conformance suite on every backend: the tests are in `suite/worker.rs`.

mod common;

mod postgres {
    type DB = sqlx::Postgres;
    include!("suite/worker.rs");
}

mod sqlite {
    type DB = sqlx::Sqlite;
    include!("suite/worker.rs");
}

/// On PostgreSQL an enqueue wakes an idle worker through LISTEN/NOTIFY: with a poll interval of
/// a minute, the job still runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_notification_wakes_an_idle_worker() {
    use std::time::Duration;

    use common::TestDb;
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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while common::ledger_rows(&pool).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker slept through the enqueue"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(()).unwrap();
    let stats = running.await.unwrap().unwrap();
    assert_eq!(stats.applied, 1);
}
