//! Pickup latency: how long a job waits from its enqueue to the start of its run, while jobs
//! arrive at a fixed rate that the worker keeps up with.
//!
//! One producer offers [`BenchPickup`] jobs at the rate, each stamped with the time its enqueue
//! was sent; each job records, when its run starts, how long ago that was. The clock starts
//! before the enqueue's own statements (insert, commit, notification), as a caller's would.

use std::time::{Duration, Instant};

use anyhow::bail;
use jobguard::Queue;
use jobguard::queue::NewJob;
use tokio::time::MissedTickBehavior;

use super::drain::{POLL_INTERVAL, WorkerShape, check, worker};
use crate::bench::jobs::{BenchPickup, PICKUPS, epoch_micros};
use crate::demo::ledger::LedgerDb;

/// How long the offered load lasts at most: `jobs` is capped at the rate times this.
pub const OFFERED_FOR: Duration = Duration::from_secs(5);

/// How often the pickup runs' worker polls on PostgreSQL: the worker's default, so that the
/// latency measured is the notifications' (on SQLite, which has none, the runs poll every
/// [`POLL_INTERVAL`]).
pub const PICKUP_POLL_POSTGRES: Duration = Duration::from_secs(1);

/// The pickup runs' poll interval on `DB`: on PostgreSQL notifications wake the worker, and
/// a short poll would hide how late they come.
pub fn poll_interval<DB: LedgerDb>() -> Duration {
    if DB::BACKEND == "postgres" {
        PICKUP_POLL_POSTGRES
    } else {
        POLL_INTERVAL
    }
}

/// How long the worker gets, after the last enqueue, to start the jobs still waiting.
const CATCH_UP: Duration = Duration::from_secs(60);

/// A pickup run's latency, measured two ways.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Pickup {
    /// From the enqueue being sent to the run starting: the producer's insert, commit and
    /// notification included, as a caller sees it.
    pub sent: Latency,
    /// From the enqueue returning (its transaction committed and the workers notified) to the
    /// run starting; 0 for a job that started before the enqueue returned.
    pub committed: Latency,
}

/// Pickup latency percentiles and maximum, in milliseconds.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

/// Jobs offered in a pickup run at `rate` jobs/s: `jobs`, at most [`OFFERED_FOR`] of them.
pub fn offered_jobs(jobs: usize, rate: f64) -> usize {
    let in_time = (rate * OFFERED_FOR.as_secs_f64()).ceil() as usize;
    jobs.min(in_time).max(1)
}

/// Offers `jobs` jobs on the empty `queue` at `rate` jobs/s to a worker of `shape`, and returns
/// the percentiles of their pickup latency.
pub async fn measure<DB: LedgerDb>(
    queue: &Queue<DB>,
    shape: WorkerShape,
    jobs: usize,
    rate: f64,
) -> anyhow::Result<Pickup> {
    PICKUPS.lock().expect("not poisoned").start(jobs);
    let mut sent_us = Vec::with_capacity(jobs);
    let mut returned_us = Vec::with_capacity(jobs);
    let worker = worker(queue, shape, false, poll_interval::<DB>())?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let offer = async {
        let offered = offer(queue, jobs, rate, &mut sent_us, &mut returned_us).await;
        let started = match offered {
            Ok(()) => all_started(jobs).await,
            Err(error) => Err(error),
        };
        // Stops the worker whatever happened.
        let _ = stop.send(());
        started
    };
    let run = worker.run(async {
        let _ = stopped.await;
    });
    let mut run = std::pin::pin!(run);
    let started = tokio::select! {
        stats = &mut run => bail!("the worker stopped before the pickup run ended: {stats:?}"),
        started = offer => started,
    };
    let stats = run.await;
    started?;
    check(&stats?)?;
    let pickups = PICKUPS.lock().expect("not poisoned");
    Ok(Pickup {
        sent: Latency::of(pickups.waits(&sent_us)),
        committed: Latency::of(pickups.waits(&returned_us)),
    })
}

impl Latency {
    /// The percentiles of `waits`, in microseconds.
    fn of(mut waits: Vec<u64>) -> Latency {
        let mut ms = |p| percentile(&mut waits, p) / 1000.0;
        Latency {
            p50_ms: ms(0.50),
            p90_ms: ms(0.90),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            max_ms: ms(1.0),
        }
    }
}

/// Enqueues jobs `0..jobs` at `rate` jobs/s: every millisecond, the jobs due by then, in one
/// `enqueue_many`. A slow enqueue delays the next tick, which then sends the jobs that fell
/// due meanwhile, so the offered rate holds on average. Records, per job, when its enqueue was
/// sent and when it returned.
async fn offer<DB: LedgerDb>(
    queue: &Queue<DB>,
    jobs: usize,
    rate: f64,
    sent_us: &mut Vec<u64>,
    returned_us: &mut Vec<u64>,
) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let started = Instant::now();
    let mut sent = 0;
    while sent < jobs {
        tick.tick().await;
        let due = ((started.elapsed().as_secs_f64() * rate) as usize + 1).min(jobs);
        if due == sent {
            continue;
        }
        let enqueued_us = epoch_micros();
        let chunk = (sent as u64..due as u64)
            .map(|n| {
                let job = BenchPickup {
                    n,
                    amount: 500,
                    enqueued_us,
                };
                NewJob::from_job::<DB, _>(&job)
            })
            .collect::<jobguard::Result<Vec<_>>>()?;
        queue.enqueue_many(&chunk).await?;
        let returned = epoch_micros();
        sent_us.resize(due, enqueued_us);
        returned_us.resize(due, returned);
        sent = due;
    }
    Ok(())
}

/// Waits until every one of `jobs` has started, for at most [`CATCH_UP`].
async fn all_started(jobs: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + CATCH_UP;
    loop {
        let recorded = PICKUPS.lock().expect("not poisoned").recorded();
        if recorded >= jobs {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("only {recorded} of {jobs} pickup jobs started within {CATCH_UP:?} of the last");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The `p` quantile of `values` by the nearest rank, sorting them.
fn percentile(values: &mut [u64], p: f64) -> f64 {
    values.sort_unstable();
    let rank = (p * values.len() as f64).ceil() as usize;
    values
        .get(rank.saturating_sub(1))
        .map_or(0.0, |&us| us as f64)
}

#[cfg(test)]
mod tests {
    use super::{offered_jobs, percentile};

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut values: Vec<u64> = (1..=100).rev().collect();
        assert_eq!(percentile(&mut values, 0.50), 50.0);
        assert_eq!(percentile(&mut values, 0.99), 99.0);
        assert_eq!(percentile(&mut [7], 0.99), 7.0);
        assert_eq!(percentile(&mut [], 0.5), 0.0);
    }

    #[test]
    fn offered_jobs_last_at_most_five_seconds() {
        assert_eq!(offered_jobs(20_000, 1_000.0), 5_000);
        assert_eq!(offered_jobs(200, 1_000.0), 200);
        assert_eq!(offered_jobs(200, 0.01), 1);
    }
}
