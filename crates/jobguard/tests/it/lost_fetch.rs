//! A fetch whose commit was lost: PostgreSQL's fetch commits without waiting for its WAL
//! flush, so a server crash can put the job's row back to its state before the fetch while the
//! worker that fetched it already holds its token. The next fetch must draw a token the first
//! worker does not hold, so that its heartbeat, its completion and an external job's call are
//! all fenced off. The tests lose the commit by writing the row back as it was, which is what
//! the recovery does to it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use jobguard::external::{ApiKey, ExternalJob};
use jobguard::queue::{DEFAULT_QUEUE, JobState, LeasedJob, Queue};
use jobguard::{Error, JobError, JobKey, KeyError, Worker, WorkerConfig};
use serde::{Deserialize, Serialize};
use sqlx::{Pool, Postgres};

use crate::common::{Credit, TestDb, ledger_rows, setup};

const LONG: Duration = Duration::from_secs(60);

/// Writes job `id`'s row back to what it was before its first fetch, as a crash recovery does
/// to a fetch whose commit it never saw.
async fn lose_the_fetch<DB: TestDb>(pool: &Pool<DB>, id: i64) {
    let mut conn = pool.acquire().await.unwrap();
    DB::fetch_i64(
        &mut conn,
        "update jobguard_jobs set attempt = 0, lease_token = 0, leased_until = null
         where id = $1 returning id",
        id,
    )
    .await
    .unwrap();
}

async fn fetch_one<DB: TestDb>(queue: &Queue<DB>) -> LeasedJob {
    let mut jobs = queue.fetch(DEFAULT_QUEUE, 1, LONG).await.unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    jobs.remove(0)
}

/// Waits until the database's clock, which the fetch draws tokens from, has moved past the
/// token of `lost`: a crash's recovery takes longer than that, and SQLite's clock counts whole
/// milliseconds, so a fetch within the millisecond of the lost one, possible only when a test
/// loses it by hand, would read the same clock.
async fn past_the_clock_of(lost: &LeasedJob) {
    let token_micros = u64::try_from(lost.lease.token).unwrap_or(0);
    loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros();
        if now > u128::from(token_micros) + 1_000 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn fenced(result: &jobguard::Result<()>) -> bool {
    matches!(result, Err(Error::Fenced { .. }))
}

backends!(fn a_job_fetched_again_after_a_lost_fetch_gets_a_new_token);
async fn a_job_fetched_again_after_a_lost_fetch_gets_a_new_token<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("lost_fetch_new_token").await else {
        return;
    };
    let id = queue
        .enqueue_job(&Credit {
            order: 1,
            amount: 500,
        })
        .await
        .unwrap()
        .id;
    let first = fetch_one(&queue).await;
    lose_the_fetch(&pool, id).await;
    past_the_clock_of(&first).await;
    let second = fetch_one(&queue).await;
    assert_eq!(second.lease.job_id, id);
    assert_eq!(
        second.lease.attempt, first.lease.attempt,
        "the same attempt, again"
    );
    assert_ne!(
        second.lease.token, first.lease.token,
        "a token is never drawn twice"
    );

    // The first holder, back after its connection error, is fenced off everywhere.
    assert!(fenced(&queue.extend(first.lease, LONG).await));
    let mut tx = pool.begin().await.unwrap();
    DB::insert_ledger(&mut tx, 7, 500).await.unwrap();
    let completed = queue.complete_tx(&mut tx, first.lease).await;
    assert!(fenced(&completed), "{completed:?}");
    tx.rollback().await.unwrap();
    for stale in [
        queue.retry(first.lease, Duration::ZERO, "stale").await,
        queue.dead_letter(first.lease, "stale").await,
        queue.release(first.lease).await,
    ] {
        assert!(fenced(&stale), "{stale:?}");
    }

    // The second holder completes.
    let mut tx = pool.begin().await.unwrap();
    DB::insert_ledger(&mut tx, 7, 500).await.unwrap();
    queue.complete_tx(&mut tx, second.lease).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(ledger_rows(&pool).await, 1);
}

/// An external job whose calls are counted.
#[derive(Serialize, Deserialize)]
struct Notify {
    order: u32,
}

impl ExternalJob<Postgres> for Notify {
    const KIND: &'static str = "notify";
    const STEP: &'static str = "send";
    type Context = Arc<AtomicUsize>;
    type Output = ();

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("notify", [format!("order-{}", self.order)])
    }

    async fn call(&self, calls: &Arc<AtomicUsize>, _: &ApiKey) -> Result<(), JobError> {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn record(
        &self,
        _: &Arc<AtomicUsize>,
        _: &mut sqlx::PgConnection,
        _: &(),
    ) -> Result<(), JobError> {
        Ok(())
    }
}

/// The worker fetches an external job and, before its call, the fetch is lost and the job
/// fetched again by another holder: the worker makes no call. (The guard table is locked while
/// the fetch is lost, so that the worker waits in its lookup of the key, just before the call.)
#[tokio::test]
async fn postgres_an_external_call_after_a_lost_fetch_is_fenced_off() {
    let Some((pool, queue)) = setup::<Postgres>("lost_fetch_external_call").await else {
        return;
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let worker = Worker::with_config(
        queue.clone(),
        WorkerConfig {
            // The worker's one place holds the job: it fetches nothing more meanwhile.
            concurrency: 1,
            prefetch: Some(0),
            poll_interval: Duration::from_millis(50),
            lease: LONG,
            ..WorkerConfig::default()
        },
    )
    .unwrap()
    .register_external::<Notify>(Arc::clone(&calls));
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("lock table processed_jobs in access exclusive mode")
        .execute(&mut *lock)
        .await
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    let id = queue
        .enqueue_external(&Notify { order: 1 })
        .await
        .unwrap()
        .id;
    // The worker holds the job, and waits in its lookup of the key.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let held = "select count(*) from jobguard_jobs where leased_until is not null";
    while Postgres::count(&pool, held).await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker never fetched"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    lose_the_fetch(&pool, id).await;
    let second = fetch_one(&queue).await;
    lock.rollback().await.unwrap();

    // The worker's attempt ends fenced off, without a call: shutdown lets it finish.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = stop.send(());
    let stats = running.await.unwrap().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the fenced worker called");
    assert_eq!(stats.fenced, 1, "{stats:?}");
    let job = queue.list(Some(JobState::Running), None, 10).await.unwrap();
    assert_eq!(job.len(), 1, "the second holder still holds it: {job:?}");
    let token = sqlx::query_scalar::<_, i64>("select lease_token from jobguard_jobs where id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(token, second.lease.token);
}
