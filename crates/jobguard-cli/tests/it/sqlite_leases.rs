//! Leases on SQLite with several worker processes: three `jobguard worker` processes started
//! together on one SQLite file, jobs that hold the write lock for 150 ms, `--lease 500ms` and
//! one attempt per job, on a machine whose every core is kept busy.
//!
//! A job waiting its turn for the write lock (behind the jobs of its own process and of the
//! others) is not a job whose worker died: its lease must hold, so no job ends dead, none
//! runs twice and none is left running. With one attempt per job, any lease taken over
//! wrongly shows as a dead job that never ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use jobguard::queue::{JobState, NewJob};
use jobguard::{JobKey, Queue};
use serde_json::{Value, json};

use crate::common::{AnyPool, Db, Proc, alone};

/// Jobs per run.
const JOBS: i64 = 60;
/// How long each job holds the write lock, in milliseconds.
const HOLD_MS: u64 = 150;
/// Worker processes started together.
const WORKERS: usize = 3;
/// Runs per test: enough for a spurious rescue to show, few enough to keep CI short.
const RUNS: usize = 2;
/// Generous: 60 jobs of 150 ms take 9 s of write lock; a loaded machine can be much slower.
const RUN_TIMEOUT: Duration = Duration::from_secs(180);

/// A busy loop on every core until dropped: the workers' heartbeats and the job they wait for
/// compete with it for the processor, as on a loaded machine.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start() -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..cores)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                })
            })
            .collect();
        Load { stop, threads }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Enqueues `JOBS` credits of one attempt each, holding the write lock `HOLD_MS`.
async fn enqueue(pool: &sqlx::SqlitePool) {
    let queue = Queue::new(pool.clone());
    queue.migrate().await.unwrap();
    for n in 1..=JOBS {
        let payload = json!({
            "order": format!("order-{n}"),
            "account": n,
            "amount": 100 + n,
            "hold_ms": HOLD_MS,
        });
        let key = JobKey::new("credit", [format!("order-{n}")]).unwrap();
        let job = NewJob::new(key, &payload)
            .unwrap()
            .kind("credit")
            .unwrap()
            .max_attempts(1);
        assert!(queue.enqueue(&job).await.unwrap().inserted);
    }
}

fn one_run(run: usize) {
    let db = Db::sqlite(&format!("sqlite_leases::run{run}"));
    let AnyPool::Sqlite(pool) = db.pool() else {
        unreachable!("a SQLite file")
    };
    db.block_on(enqueue(pool));

    let deadline = Instant::now() + RUN_TIMEOUT;
    let reports: Vec<Value> = {
        let _load = Load::start();
        let mut workers: Vec<Proc> = (0..WORKERS)
            .map(|n| {
                let args = ["worker", "--json", "--until-idle", "--lease", "500ms"];
                let args = [&args[..], &["--poll", "50ms", "--concurrency", "10"]].concat();
                db.spawn(&format!("worker-{n}"), &args)
            })
            .collect();
        workers
            .iter_mut()
            .map(|w| w.finish_json(deadline.saturating_duration_since(Instant::now())))
            .collect()
    };

    let (jobs, ledger) = db.block_on(async {
        let jobs = Queue::new(pool.clone())
            .list(None, None, 10_000)
            .await
            .unwrap();
        let ledger: Vec<(String, i64)> =
            sqlx::query_as("select job_key, count(*) from jobguard_ledger group by job_key")
                .fetch_all(pool)
                .await
                .unwrap();
        (jobs, ledger)
    });
    let dead: Vec<_> = jobs
        .iter()
        .filter(|job| job.state == JobState::Dead)
        .map(|job| (job.key.clone(), job.last_error.clone()))
        .collect();
    let stats = |field: &str| -> u64 { reports.iter().map(|r| r[field].as_u64().unwrap()).sum() };
    let summary = format!(
        "run {run}: applied {}, duplicates {}, failed {}, dead {}, fenced {}; dead jobs {dead:?}",
        stats("applied"),
        stats("duplicates"),
        stats("failed"),
        stats("dead"),
        stats("fenced"),
    );
    eprintln!("{summary}");
    assert!(dead.is_empty(), "{summary}");
    assert_eq!(jobs.len() as i64, JOBS, "{summary}");
    assert!(
        jobs.iter().all(|job| job.state == JobState::Completed),
        "nothing left available or running: {summary}"
    );
    assert_eq!(ledger.len() as i64, JOBS, "every key applied: {summary}");
    assert!(
        ledger.iter().all(|(_, n)| *n == 1),
        "every key applied once: {summary}"
    );
    assert_eq!(stats("applied"), JOBS as u64, "{summary}");
}

#[test]
fn three_workers_waiting_for_the_write_lock_keep_their_leases() {
    // Alone: the busy loops load every core, which the other tests did not ask for.
    let _alone = alone();
    let runs = std::env::var("JOBGUARD_SQLITE_LEASE_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(RUNS);
    for run in 0..runs {
        one_run(run);
    }
}
