//! A rolling upgrade: workers of the schema before the lean lease (which stored a leased job
//! `running`) run beside workers of this one, on a table this one migrated. Whatever order they
//! start, stop and die in, no job is left stored `running` for good, and none runs twice.

use std::time::Duration;

use jobguard::queue::{DEFAULT_QUEUE, JobState};
use jobguard::{Claim, Error, Job, Worker, WorkerConfig};

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

/// A statement of an earlier worker's on the job `$1` it holds under `token`, fenced as that
/// schema fenced it (`state = 'running'`), returning the job's id. A heartbeat extends the
/// lease by a minute; a completion completes the job.
fn earlier_fenced(backend: &str, token: i64, completes: bool) -> &'static str {
    let set = match (backend, completes) {
        ("postgres", false) => "leased_until = now() + interval '1 minute'".to_owned(),
        ("postgres", true) => {
            "state = 'completed', finished_at = now(), leased_until = null".to_owned()
        }
        (_, false) => "leased_until = cast((julianday('now') - 2440587.5) * 86400000000.0 \
                       as integer) + 60000000"
            .to_owned(),
        (_, true) => "state = 'completed', leased_until = null, \
                      finished_at = cast((julianday('now') - 2440587.5) * 86400000000.0 \
                      as integer)"
            .to_owned(),
    };
    format!(
        "update jobguard_jobs set {set}
         where id = $1 and lease_token = {token} and state = 'running' returning id"
    )
    .leak()
}

/// Runs an [`earlier_fenced`] statement on the job `id`: `None` when it changed no row, which
/// the earlier worker takes as its lease taken over (fenced: its effect rolled back).
async fn earlier_statement<DB: crate::common::TestDb>(
    conn: &mut DB::Connection,
    sql: &'static str,
    id: i64,
) -> Option<i64> {
    match DB::fetch_i64(conn, sql, id).await {
        Ok(id) => Some(id),
        Err(sqlx::Error::RowNotFound) => None,
        Err(error) => panic!("{sql}: {error}"),
    }
}

// An upgrade under a live lease: a worker of the earlier schema fetches a job, then new workers
// start (each migrating the table, as a worker, `App.migrate()` or Django's `migrate` does:
// on SQLite at every start, on PostgreSQL once per schema, here made to run again each time)
// and drain the queue. The earlier worker still holds its job: its heartbeat and its completion
// find it, its effect commits, and the job is completed once, by it.
backends!(fn an_earlier_worker_completes_the_job_it_holds_across_an_upgrade);
async fn an_earlier_worker_completes_the_job_it_holds_across_an_upgrade<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("upgrade_earlier_worker_lives").await else {
        return;
    };
    let credit = Credit {
        order: 1,
        amount: 500,
    };
    queue.enqueue_job(&credit).await.unwrap();

    let mut earlier = pool.acquire().await.unwrap();
    DB::execute(&mut earlier, earlier_fetch(DB::BACKEND))
        .await
        .unwrap();
    let stored = "select count(*) from jobguard_jobs where state = 'running'";
    assert_eq!(
        DB::count(&pool, stored).await,
        1,
        "fetched as the earlier schema does"
    );
    let id = DB::count(&pool, "select id from jobguard_jobs").await;
    let token = DB::count(&pool, "select lease_token from jobguard_jobs").await;

    for start in 0..3 {
        if DB::BACKEND == "postgres" {
            // The table as an earlier jobguard left it: no marker of this schema's statements.
            DB::execute(&mut earlier, "comment on table jobguard_jobs is null")
                .await
                .unwrap();
        }
        let worker = Worker::with_config(queue.clone(), draining())
            .unwrap()
            .register::<Credit>();
        worker.migrate().await.unwrap();
        let stats =
            tokio::time::timeout(Duration::from_secs(60), worker.run(std::future::pending()))
                .await
                .expect("the new worker stopped once idle")
                .unwrap();
        assert_eq!(
            (stats.applied, stats.duplicates),
            (0, 0),
            "start {start}: the new worker leaves the held job alone: {stats:?}"
        );
        let heartbeat = earlier_fenced(DB::BACKEND, token, false);
        assert_eq!(
            earlier_statement::<DB>(&mut earlier, heartbeat, id).await,
            Some(id),
            "start {start}: the earlier worker's heartbeat still finds the job it holds"
        );
    }
    assert_eq!(queue.counts().await.unwrap().running, 1);

    // The earlier worker's job ends: its completion, its guard row and its effect, together.
    let guard = queue.guard(Default::default()).unwrap();
    let key = <Credit as Job<DB>>::key(&credit).unwrap();
    let mut tx = pool.begin().await.unwrap();
    let completion = earlier_fenced(DB::BACKEND, token, true);
    assert_eq!(
        earlier_statement::<DB>(&mut tx, completion, id).await,
        Some(id),
        "the earlier worker's completion is not fenced off"
    );
    assert!(matches!(
        guard.claim_tx(&mut tx, &key).await.unwrap(),
        Claim::Claimed
    ));
    DB::insert_ledger(&mut tx, 7, credit.amount).await.unwrap();
    tx.commit().await.unwrap();

    let counts = queue.counts().await.unwrap();
    assert_eq!(
        (
            counts.completed,
            counts.running,
            counts.available,
            counts.dead
        ),
        (1, 0, 0, 0)
    );
    assert_eq!((ledger_rows(&pool).await, guard_rows(&pool).await), (1, 1));
    assert_eq!(
        DB::count(&pool, stored).await,
        0,
        "no job left stored running"
    );
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
