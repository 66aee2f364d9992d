//! A queue and a worker set up the way the worker and retention suites drain them.

use std::time::Duration;

use jobguard::{Queue, RetryPolicy, WorkerConfig};
use sqlx::Pool;

use super::TestDb;

/// A worker that runs four jobs at once, polls often, retries at once and stops when the
/// queue is empty.
pub fn draining() -> WorkerConfig {
    WorkerConfig {
        concurrency: 4,
        stop_when_idle: true,
        poll_interval: Duration::from_millis(50),
        retry: RetryPolicy {
            base: Duration::ZERO,
            ..Default::default()
        },
        ..WorkerConfig::default()
    }
}

/// The test's database with the queue and the guard migrated.
pub async fn setup<DB: TestDb>(test: &str) -> Option<(Pool<DB>, Queue<DB>)> {
    setup_with(test, 8).await
}

/// [`setup`] with a pool of `connections`.
pub async fn setup_with<DB: TestDb>(test: &str, connections: u32) -> Option<(Pool<DB>, Queue<DB>)> {
    let pool = DB::open(test, connections).await?;
    let queue = Queue::new(pool.clone());
    queue.migrate().await.unwrap();
    queue
        .guard(Default::default())
        .unwrap()
        .migrate()
        .await
        .unwrap();
    Some((pool, queue))
}
