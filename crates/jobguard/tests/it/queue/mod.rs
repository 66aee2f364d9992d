//! The job queue's conformance suite: every test runs on real PostgreSQL and real SQLite
//! (`backends!`). The helpers are here, the tests in one file per topic.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jobguard::queue::{
    Counts, DEFAULT_QUEUE, HELD_COUNT_SPAN, JobRow, JobState, Lease, LeasedJob, MAX_PAYLOAD_BYTES,
    NewJob, Queue, Replay,
};
use jobguard::{Backend, Error, JobKey, KeyError, TableName};
use serde_json::json;
use sqlx::Pool;

use crate::common::{TestDb, ledger_rows};

mod console;
mod enqueue;
mod fetch_and_lease;
mod replay;
mod retry_and_dead;
mod unique;

/// A lease no test outlives.
const LONG: Duration = Duration::from_secs(60);
/// A lease the tests wait out.
const SHORT: Duration = Duration::from_millis(1000);
const HOUR: Duration = Duration::from_secs(3600);
/// How far the database clock and the client clock may disagree, plus round trips.
const SLACK: Duration = Duration::from_secs(5);

/// A migrated queue on the test's own database. Test names get a prefix so that they cannot
/// collide with the guard suite's schemas and files.
async fn open<DB: TestDb>(test: &str, connections: u32) -> Option<(Pool<DB>, Queue<DB>)> {
    let pool = DB::open(&format!("q_{test}"), connections).await?;
    let queue = Queue::new(pool.clone());
    queue.migrate().await.expect("migrate the queue");
    queue.migrate().await.expect("migrate is idempotent");
    Some((pool, queue))
}

fn key(kind: &str, part: impl std::fmt::Display) -> JobKey {
    JobKey::new(kind, [format!("order-{part}")]).expect("valid key")
}

fn job(kind: &str, n: usize) -> NewJob {
    NewJob::new(key(kind, n), &json!({"account": 7, "order": n})).expect("valid job")
}

/// The lease of attempt `attempt` of job `job_id`, drawn with fencing token `token`.
/// A lease of job `job_id` at `attempt`, under a token drawn by its fetch (from the clock:
/// never one the job had before).
#[track_caller]
fn assert_lease(lease: Lease, job_id: i64, attempt: i32) {
    assert_eq!(
        (lease.job_id, lease.attempt),
        (job_id, attempt),
        "{lease:?}"
    );
    assert!(lease.token > 0, "{lease:?}");
}

fn counts(available: i64, running: i64, completed: i64, dead: i64) -> Counts {
    Counts {
        available,
        running,
        completed,
        dead,
    }
}

async fn job_rows<DB: TestDb>(pool: &Pool<DB>) -> i64 {
    DB::count(pool, "select count(*) from jobguard_jobs").await
}

async fn fetch_one<DB: TestDb>(queue: &Queue<DB>, lease: Duration) -> LeasedJob {
    let mut jobs = queue.fetch(DEFAULT_QUEUE, 1, lease).await.unwrap();
    assert_eq!(jobs.len(), 1, "expected one job: {jobs:?}");
    jobs.remove(0)
}

/// Completes a job in a transaction of its own and commits it.
async fn complete<DB: TestDb>(
    pool: &Pool<DB>,
    queue: &Queue<DB>,
    lease: Lease,
) -> jobguard::Result<()> {
    let mut tx = pool.begin().await?;
    queue.complete_tx(&mut tx, lease).await?;
    tx.commit().await?;
    Ok(())
}

async fn row<DB: TestDb>(queue: &Queue<DB>, id: i64) -> JobRow {
    let rows = queue.list(None, None, 1000).await.unwrap();
    rows.into_iter()
        .find(|row| row.id == id)
        .unwrap_or_else(|| panic!("job {id} is not listed"))
}

/// Sleeps until the client clock is past `leased_until` of a [`SHORT`] lease (the database runs
/// on the same host). Fails at once for a lease much longer than asked for, rather than waiting
/// it out.
async fn sleep_past(leased_until: SystemTime) {
    let wait = leased_until
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    assert!(
        wait <= SHORT + SLACK,
        "a lease of {SHORT:?} runs for another {wait:?}"
    );
    tokio::time::sleep(wait + Duration::from_millis(200)).await;
}

fn assert_near(time: SystemTime, expected: SystemTime, what: &str) {
    let ok = time > expected - SLACK && time < expected + SLACK;
    assert!(
        ok,
        "{what}: {time:?} is not within {SLACK:?} of {expected:?}"
    );
}

fn is_fenced(result: &jobguard::Result<()>, lease: Lease) -> bool {
    matches!(result, Err(Error::Fenced { job_id, attempt })
        if *job_id == lease.job_id && *attempt == lease.attempt)
}
