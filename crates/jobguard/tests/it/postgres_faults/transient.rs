//! Transient errors raised by a real PostgreSQL inside a worker's job, classified by the core's
//! table (`jobguard_core::transient`), which the Python worker classifies by too: the session
//! ended by `pg_terminate_backend` (57P01) and a lock not granted in time (55P03) run the job
//! again and spend no attempt, so a job allowed a single attempt still applies, once. A job
//! whose transient error outlasts the guard's runs is given back, its attempt not counted,
//! never dead-lettered.

use std::collections::HashMap;
use std::sync::Mutex;

use jobguard::{Job, JobError, JobKey, KeyError, Queue, RetryPolicy, Worker, WorkerConfig};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use sqlx::postgres::Postgres;

use super::{bounded, raise};
use crate::common::{TestDb, draining, ledger_and_guard_rows, setup};

/// Per order, the runs of its job so far, across deliveries: a job's own failures are decided
/// by how many times it ran, which a rollback cannot undo.
static RUNS: Mutex<Option<HashMap<u32, u32>>> = Mutex::new(None);

fn run_number(order: u32) -> u32 {
    let mut runs = RUNS.lock().unwrap();
    let run = runs
        .get_or_insert_with(HashMap::new)
        .entry(order)
        .or_insert(0);
    *run += 1;
    *run
}

/// What a job's first runs meet before its effect commits.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
enum Fault {
    /// Its session is ended by the server (`pg_terminate_backend`) in its first run.
    Terminated,
    /// `lock_timeout` in its first `n` runs (SQLSTATE 55P03).
    LockTimeout(u32),
}

#[derive(Serialize, Deserialize)]
struct Flaky {
    order: u32,
    fault: Fault,
}

impl Job<Postgres> for Flaky {
    const KIND: &'static str = "flaky";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("flaky", [format!("order-{}", self.order)])
    }

    async fn run(&self, conn: &mut PgConnection) -> Result<(), JobError> {
        Postgres::insert_ledger(conn, 7, 500).await?;
        let run = run_number(self.order);
        match self.fault {
            Fault::Terminated if run == 1 => {
                sqlx::query("select pg_terminate_backend(pg_backend_pid())")
                    .execute(conn)
                    .await?;
            }
            Fault::LockTimeout(n) if run <= n => raise(conn, "55P03").await?,
            _ => {}
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_errors_spend_no_attempt_and_dead_letter_nothing() {
    bounded(async {
        let Some((pool, queue)) = setup::<Postgres>("fault_worker_transient").await else {
            return;
        };
        let queue: Queue<Postgres> = queue;
        let jobs = [
            Flaky {
                order: 1,
                fault: Fault::Terminated,
            },
            Flaky {
                order: 2,
                fault: Fault::LockTimeout(1),
            },
            // More runs than the guard's five: given back, then applied on its next fetch.
            Flaky {
                order: 3,
                fault: Fault::LockTimeout(7),
            },
        ];
        for job in &jobs {
            queue.enqueue_job(job).await.unwrap();
        }
        // One attempt each: a transient error that spent it would dead-letter the job.
        let config = WorkerConfig {
            retry: RetryPolicy {
                max_attempts: 1,
                ..draining().retry
            },
            ..draining()
        };
        let worker = Worker::with_config(queue.clone(), config)
            .unwrap()
            .register::<Flaky>();
        let stats = worker.run(std::future::pending()).await.unwrap();
        assert_eq!(
            (stats.applied, stats.dead, stats.failed),
            (3, 0, 0),
            "{stats:?}"
        );
        assert_eq!(
            stats.released, 1,
            "the job past the guard's runs: {stats:?}"
        );
        assert_eq!(ledger_and_guard_rows(&pool).await, (3, 3));
        let counts = queue.counts().await.unwrap();
        assert_eq!((counts.completed, counts.dead), (3, 0), "{counts:?}");
        let attempts = Postgres::count(
            &pool,
            "select cast(sum(attempt) as bigint) from jobguard_jobs",
        )
        .await;
        assert_eq!(
            attempts, 3,
            "one attempt each, the transient runs not counted"
        );
    })
    .await;
}
