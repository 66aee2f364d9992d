//! Shutdown: running jobs finish, jobs fetched ahead are given back without starting.

use super::*;

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
