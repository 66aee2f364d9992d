//! The benchmarks' job kinds: a no-op, the seed's credit (the queue's and the brokers'
//! benchmarks), and the credit that records how long it waited to be picked up. All three opt
//! in to batches; a worker whose `batch_size` is 1 still runs each in its own transaction.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use jobguard::{Job, JobError, JobKey, KeyError};
use serde::{Deserialize, Serialize};

use crate::demo::ledger::{Ledger, LedgerDb};

/// The account every benchmark credit goes to.
const ACCOUNT: i64 = 7;

/// A job that does nothing but pass through the guard and the queue.
#[derive(Serialize, Deserialize)]
pub struct BenchNoop {
    pub n: u64,
}

/// The seed's credit job, appending to the benchmark's ledger.
#[derive(Serialize, Deserialize)]
pub struct BenchCredit {
    pub n: u64,
    pub amount: i64,
}

/// A credit job that, when its run starts, records how long ago it was enqueued.
#[derive(Serialize, Deserialize)]
pub struct BenchPickup {
    /// Its place in the pickup run, `0..jobs`.
    pub n: u64,
    pub amount: i64,
    /// When the enqueue that carried it was sent, in microseconds since the Unix epoch by the
    /// benchmark's own clock (the worker runs in the same process).
    pub enqueued_us: u64,
}

impl<DB: LedgerDb> Job<DB> for BenchNoop {
    const KIND: &'static str = "bench-noop";
    const BATCH: bool = true;

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("bench-noop", [self.n.to_string()])
    }

    async fn run(&self, _conn: &mut DB::Connection) -> Result<(), JobError> {
        Ok(())
    }
}

impl<DB: LedgerDb> Job<DB> for BenchCredit {
    const KIND: &'static str = "bench-credit";
    const BATCH: bool = true;

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("bench-credit", [format!("order-{}", self.n)])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        DB::append(conn, Ledger::Bench, ACCOUNT, self.amount).await?;
        Ok(())
    }
}

impl<DB: LedgerDb> Job<DB> for BenchPickup {
    const KIND: &'static str = "bench-pickup";
    const BATCH: bool = true;

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("bench-pickup", [format!("order-{}", self.n)])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        PICKUPS
            .lock()
            .expect("not poisoned")
            .record(self.n, epoch_micros());
        DB::append(conn, Ledger::Bench, ACCOUNT, self.amount).await?;
        Ok(())
    }
}

/// Microseconds since the Unix epoch.
pub fn epoch_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}

/// What the pickup jobs recorded: the jobs run in this process, and a job's `run` has nothing
/// but its payload and its transaction, so they report here.
pub static PICKUPS: Mutex<Pickups> = Mutex::new(Pickups::new());

/// When each job of a pickup run started, by its number, in microseconds since the Unix epoch:
/// the first run counts, so a job run again after its batch rolled back keeps its real pickup
/// time.
pub struct Pickups {
    started_us: Vec<Option<u64>>,
    recorded: usize,
}

impl Pickups {
    const fn new() -> Self {
        Pickups {
            started_us: Vec::new(),
            recorded: 0,
        }
    }

    /// Forgets the last run and expects `jobs` jobs numbered `0..jobs`.
    pub fn start(&mut self, jobs: usize) {
        self.started_us = vec![None; jobs];
        self.recorded = 0;
    }

    fn record(&mut self, n: u64, started_us: u64) {
        if let Some(slot @ None) = self.started_us.get_mut(n as usize) {
            *slot = Some(started_us);
            self.recorded += 1;
        }
    }

    /// How many of the expected jobs have started.
    pub fn recorded(&self) -> usize {
        self.recorded
    }

    /// How long each job that started waited since `since[n]` (its enqueue sent, or its
    /// enqueue returned), in microseconds, in job order; a start before it counts as 0.
    pub fn waits(&self, since: &[u64]) -> Vec<u64> {
        self.started_us
            .iter()
            .zip(since)
            .filter_map(|(started, since)| Some(started.as_ref()?.saturating_sub(*since)))
            .collect()
    }
}
