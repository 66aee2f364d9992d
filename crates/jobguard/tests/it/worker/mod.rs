//! The worker's conformance suite on every backend (`backends!`), then the behaviour of one
//! backend: PostgreSQL's wake-up by notification, SQLite's leases kept while waiting to write.
//! The job kinds and the drain are here, the tests in one file per topic.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use jobguard::queue::{JobState, NewJob, Replay};
use jobguard::{
    Job, JobError, JobKey, KeyError, Outcome, Queue, UnknownKinds, Worker, WorkerConfig,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::common::{
    Credit, TestDb, draining, guard_rows, ledger_rows, ledger_total, setup, setup_with,
};

mod one_backend;
mod outcomes;
mod shutdown;
mod slots;

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
    drain_with(queue, draining()).await
}

/// [`drain`] with a configuration of the test's own.
async fn drain_with<DB: TestDb>(queue: &Queue<DB>, config: WorkerConfig) -> jobguard::WorkerStats {
    let worker = Worker::with_config(queue.clone(), config)
        .unwrap()
        .register::<Credit>()
        .register::<Flaky>()
        .register::<Slow>();
    tokio::time::timeout(Duration::from_secs(60), worker.run(std::future::pending()))
        .await
        .expect("the worker drained the queue in time")
        .unwrap()
}
