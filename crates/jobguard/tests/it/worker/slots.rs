//! How many jobs a worker runs at once, and the jobs it fetched ahead: they keep their lease
//! while they wait for a slot, and one given back behind its fetches still runs.

use super::*;

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
