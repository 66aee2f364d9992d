//! Scenario 5: a worker running batches is SIGKILLed while a batch's transaction is open.
//!
//! 40 credits, each holding its transaction 50 ms after its ledger insert, run by a worker
//! with `--batch-size 10 --concurrency 2`: every batch is ten jobs in one transaction of about
//! half a second, so jobs complete ten at a time, never one by one, and the kill lands inside a
//! batch. The killed batch applies nothing (its ledger rows roll back with its completions),
//! its leases are rescued, and the drain applies each of its jobs once.

use std::time::{Duration, Instant};

use super::{
    assert_exactly_once, counts_now, drain, enqueue_credits_direct, ledger, log, sum, wait_for,
    worker,
};
use crate::common::Db;

const JOBS: i64 = 40;
const BATCH: i64 = 10;

pub(super) fn sigkill_mid_batch(db: &Db) {
    enqueue_credits_direct(db, 1..=JOBS, 50);
    let mut worker = worker(
        db,
        "batch-kill",
        &[
            "--batch-size",
            "10",
            "--batch-linger",
            "0s",
            "--concurrency",
            "2",
            "--lease",
            "2s",
            "--poll",
            "100ms",
        ],
    );
    // Until the first batch commits, and then into the next batch's transaction, every look
    // at the table finds whole batches completed and their ledger rows with them.
    let first = wait_for(db, "a batch's commit", Duration::from_secs(30), |counts| {
        counts.completed > 0
    });
    let mut seen = vec![first.completed];
    let until = Instant::now() + Duration::from_millis(200);
    while Instant::now() < until {
        seen.push(counts_now(db).completed);
        std::thread::sleep(Duration::from_millis(5));
    }
    worker.sigkill();
    let killed = counts_now(db);
    let (rows, _, _) = ledger(db);
    log(
        &db.dir,
        &format!(
            "{}: completed counts seen while batches ran {:?}; at the kill {killed:?}, {rows} ledger rows",
            db.backend(),
            {
                let mut distinct = seen.clone();
                distinct.dedup();
                distinct
            }
        ),
    );
    assert!(
        seen.iter().all(|completed| completed % BATCH == 0),
        "{}: jobs completed outside whole batches: {seen:?}",
        db.backend()
    );
    assert_eq!(killed.completed % BATCH, 0, "{}: {killed:?}", db.backend());
    assert_eq!(
        rows,
        killed.completed,
        "{}: ledger rows of uncommitted batches",
        db.backend()
    );
    assert!(
        killed.running > 0,
        "{}: the kill found no batch running: {killed:?}",
        db.backend()
    );

    let reports = drain(db, "2s");
    let listed = assert_exactly_once(db, JOBS, JOBS);
    let redelivered = listed
        .iter()
        .filter(|job| job["attempt"].as_i64().unwrap() > 1)
        .count() as i64;
    assert!(
        redelivered >= killed.running,
        "{}: {redelivered} jobs ran again, {} were left running by the kill",
        db.backend(),
        killed.running
    );
    assert_eq!(sum(&reports, "duplicates"), 0, "{reports:?}");
}
