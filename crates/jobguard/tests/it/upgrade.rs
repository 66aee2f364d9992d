//! A rolling upgrade: workers of the schema before the lean lease (which stored a leased job
//! `running`) run beside workers of this one, on a table this one migrated. Whatever order they
//! start, stop and die in, no job is left stored `running` for good, and none runs twice.

use std::time::Duration;

use jobguard::queue::{DEFAULT_QUEUE, JobState};
use jobguard::{Error, Worker, WorkerConfig};

use crate::common::{Credit, TestDb, draining, guard_rows, ledger_rows, setup};

/// The fetch of a worker of the earlier schema, as it ran, with its queue, its limit (10) and a
/// lease of one second written in: it takes every job stored `available`, those a newer
/// worker holds included, and stores them `running`.
fn earlier_fetch(backend: &str) -> &'static str {
    if backend == "postgres" {
        "with picked as (
             select id from jobguard_jobs
             where state = 'available' and queue = 'default' and run_at <= now()
               and not exists (select 1 from jobguard_jobs_queues p
                               where p.name = 'default' and p.paused)
             order by run_at, id
             limit 10
             for update skip locked
         )
         update jobguard_jobs j
         set state = 'running', attempt = j.attempt + 1, lease_token = j.lease_token + 1,
             leased_until = now() + 1000000 * interval '1 microsecond'
         from picked where j.id = picked.id"
    } else {
        "update jobguard_jobs
         set state = 'running', attempt = attempt + 1, lease_token = lease_token + 1,
             leased_until = cast((julianday('now') - 2440587.5) * 86400000000.0 as integer)
                            + 1000000
         where id in (select id from jobguard_jobs
                      where state = 'available' and queue = 'default'
                        and run_at <= cast((julianday('now') - 2440587.5) * 86400000000.0
                                           as integer)
                        and not exists (select 1 from jobguard_jobs_queues p
                                        where p.name = 'default' and p.paused <> 0)
                      order by run_at, id limit 10)"
    }
}

// A worker of the earlier schema fetches two jobs, one of which a newer worker holds, and dies
// with them: they are counted and listed as running, the newer worker's lease is fenced off,
// and once the earlier lease expired a newer worker rescues both and applies each once.
backends!(fn jobs_an_earlier_worker_fetched_and_died_with_run_once);
async fn jobs_an_earlier_worker_fetched_and_died_with_run_once<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("upgrade_earlier_worker_died").await else {
        return;
    };
    for order in [1, 2] {
        queue
            .enqueue_job(&Credit { order, amount: 500 })
            .await
            .unwrap();
    }
    let held = queue
        .fetch(DEFAULT_QUEUE, 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(held.len(), 1);

    // The earlier worker, on its own connection: it takes both, then its process dies.
    let mut earlier = pool.acquire().await.unwrap();
    DB::execute(&mut earlier, earlier_fetch(DB::BACKEND))
        .await
        .unwrap();
    earlier.close().await.unwrap();
    let stored = "select count(*) from jobguard_jobs where state = 'running'";
    assert_eq!(
        DB::count(&pool, stored).await,
        2,
        "stored as the earlier schema does"
    );

    assert_eq!(
        queue.counts().await.unwrap().running,
        2,
        "counted as running"
    );
    let running = queue.list(Some(JobState::Running), None, 10).await.unwrap();
    assert_eq!(running.len(), 2, "listed as running: {running:?}");
    assert!(running.iter().all(|job| job.state == JobState::Running));
    // The newer worker's lease was taken over by the earlier worker's fetch.
    let mut tx = pool.begin().await.unwrap();
    let fenced = queue.complete_tx(&mut tx, held[0].lease).await;
    assert!(matches!(fenced, Err(Error::Fenced { .. })), "{fenced:?}");
    tx.rollback().await.unwrap();

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let worker = Worker::with_config(
        queue.clone(),
        WorkerConfig {
            lease: Duration::from_secs(1),
            ..draining()
        },
    )
    .unwrap()
    .register::<Credit>();
    let stats = tokio::time::timeout(Duration::from_secs(60), worker.run(std::future::pending()))
        .await
        .expect("the worker drained the queue in time")
        .unwrap();
    assert_eq!((stats.applied, stats.duplicates), (2, 0), "{stats:?}");
    assert_eq!((ledger_rows(&pool).await, guard_rows(&pool).await), (2, 2));
    let counts = queue.counts().await.unwrap();
    assert_eq!(
        (counts.completed, counts.running, counts.available),
        (2, 0, 0)
    );
    assert_eq!(
        DB::count(&pool, stored).await,
        0,
        "no job left stored running"
    );
}
