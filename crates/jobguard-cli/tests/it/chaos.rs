//! The fault run: several `jobguard worker` processes on one database (half of them running
//! credits in batches) while the test enqueues jobs without pause and, at random, kills a
//! worker with SIGKILL (and starts another), freezes
//! one with SIGSTOP for a random time (often past its lease) before SIGCONT, and on PostgreSQL
//! restarts the server in immediate mode (a crash: no checkpoint, every connection cut). The
//! server is a throwaway cluster the test creates with `initdb` and deletes at the end.
//!
//! The jobs: credits (some slow, some enqueued again with the same payload, before or after
//! they ran), and `fail` jobs that fail retryably until their attempts run out or fatally at
//! once. When the faults stop, the workers drain the queue and the test checks that no key was
//! applied twice, that every credit's key was applied exactly once and every `fail` job is
//! dead, that no job is left running or available, and that the guard's rows are the ledger's
//! keys.
//!
//! The faults and jobs are drawn from a seeded generator; the seed is printed, and
//! `JOBGUARD_CHAOS_SEED=<seed>` draws the same ones again (the timing of the processes still
//! differs from run to run). `JOBGUARD_CHAOS_SECS` sets how long the faults last on each
//! backend (default 60). Outside CI a machine without PostgreSQL's `initdb` skips the PostgreSQL
//! run with a loud line; with `CI=true` it fails.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use jobguard::queue::NewJob;
use jobguard::{JobKey, Queue};
use serde_json::{Value, json};

use crate::common::{COMMAND_TIMEOUT, Cluster, Db, Proc, Rng, alone, seed, tail};
use crate::on_pool;

/// Worker processes running at once.
const WORKERS: usize = 4;
/// Their lease; a worker frozen longer than this loses its jobs to the others.
const LEASE: Duration = Duration::from_secs(1);
/// At most this many workers are frozen at once, so that the others make progress.
const MAX_STOPPED: usize = 2;
/// Attempts of a credit: enough that the faults alone never exhaust them.
const CREDIT_ATTEMPTS: u32 = 25;
/// Attempts of a retryable `fail` job before it is dead.
const FAIL_ATTEMPTS: u32 = 3;
/// The longest the queue may take to drain once the faults are over.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// How long the faults last: `JOBGUARD_CHAOS_SECS`, default 60.
fn chaos_duration() -> Duration {
    match std::env::var("JOBGUARD_CHAOS_SECS") {
        Ok(text) if !text.trim().is_empty() => {
            let secs: u64 = text
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("JOBGUARD_CHAOS_SECS={text} is not a number"));
            Duration::from_secs(secs.max(1))
        }
        _ => Duration::from_secs(60),
    }
}

/// A job the test enqueues.
#[derive(Clone, Debug)]
struct Planned {
    key: String,
    kind: &'static str,
    payload: Value,
    max_attempts: u32,
}

/// A row of the jobs table.
#[derive(Debug)]
struct JobRow {
    key: String,
    kind: String,
    state: String,
    attempt: i64,
    /// Read only by the failure messages, through `Debug`.
    #[allow(dead_code)]
    error: Option<String>,
    /// A `fail` job's `fatal` flag.
    fatal: bool,
}

/// Creates the tables before any worker starts, so the workers' own migrations find them.
fn migrate(db: &Db) {
    on_pool!(db, |pool| async {
        Queue::new(pool.clone()).migrate().await.unwrap();
    });
}

/// A worker of the fault run: a few jobs at once, a short lease, quick retries. Every other
/// worker (`w1`, `w3`, ...) runs credits in batches of up to ten, on a queue whose `fail` jobs
/// do not batch: the batched path on a mixed queue, under the same faults.
fn worker(db: &Db, name: &str, until_idle: bool) -> Proc {
    let lease = format!("{}ms", LEASE.as_millis());
    let mut args = vec![
        "worker",
        "--json",
        "--concurrency",
        "4",
        "--lease",
        &lease,
        "--poll",
        "100ms",
        "--backoff",
        "100ms",
        "--shutdown-timeout",
        "20s",
    ];
    if until_idle {
        args.push("--until-idle");
    }
    if name
        .bytes()
        .last()
        .is_some_and(|last| last.is_ascii_digit() && (last - b'0') % 2 == 1)
    {
        args.extend(["--batch-size", "10"]);
    }
    db.spawn(name, &args)
}

/// Enqueues one job; whether it was inserted (false: the same key and payload was already
/// waiting or running).
fn enqueue(db: &Db, job: &Planned) -> Result<bool, String> {
    let key = job.key.split_once(':').expect("kind:part");
    let new = NewJob::new(JobKey::new(key.0, [key.1]).unwrap(), &job.payload)
        .unwrap()
        .kind(job.kind)
        .unwrap()
        .max_attempts(job.max_attempts);
    on_pool!(db, |pool| async {
        Queue::new(pool.clone())
            .enqueue(&new)
            .await
            .map(|enqueued| enqueued.inserted)
            .map_err(|error| error.to_string())
    })
}

/// Jobs available (also those waiting for a retry) and running.
fn unfinished(db: &Db) -> Result<(i64, i64), String> {
    on_pool!(db, |pool| async {
        Queue::new(pool.clone())
            .counts()
            .await
            .map(|counts| (counts.available, counts.running))
            .map_err(|error| error.to_string())
    })
}

fn jobs(db: &Db) -> Vec<JobRow> {
    let sql = "select job_key, kind, state, cast(attempt as bigint), last_error, \
               cast(payload as text) from jobguard_jobs order by id";
    let rows: Vec<(String, String, String, i64, Option<String>, String)> =
        on_pool!(db, |pool| sqlx::query_as(sql).fetch_all(pool)).expect("read the jobs");
    rows.into_iter()
        .map(|(key, kind, state, attempt, error, payload)| JobRow {
            key,
            kind,
            state,
            attempt,
            error,
            fatal: serde_json::from_str::<Value>(&payload).unwrap()["fatal"] == json!(true),
        })
        .collect()
}

/// Ledger rows per key.
fn ledger(db: &Db) -> BTreeMap<String, i64> {
    let sql = "select job_key, count(*) from jobguard_ledger group by job_key";
    let rows: Vec<(String, i64)> =
        on_pool!(db, |pool| sqlx::query_as(sql).fetch_all(pool)).expect("read the ledger");
    rows.into_iter().collect()
}

/// The guard's rows: key and kind.
fn guard_rows(db: &Db) -> Vec<(String, String)> {
    let sql = "select job_key, kind from processed_jobs";
    on_pool!(db, |pool| sqlx::query_as(sql).fetch_all(pool)).expect("read the guard")
}

/// What the faults did, for the summary and for the checks that they happened at all.
#[derive(Debug, Default)]
struct Tally {
    kills: u32,
    stops: u32,
    /// Stops longer than the lease: the frozen worker's jobs were up for rescue.
    stops_past_lease: u32,
    restarts: u32,
    /// Workers that exited without being killed, and were started again.
    exits: Vec<String>,
}

/// What the enqueuing thread did.
#[derive(Debug, Default)]
struct Enqueues {
    /// The keys enqueued.
    keys: BTreeSet<String>,
    /// Enqueues that succeeded.
    enqueued: u32,
    /// Enqueues of a key enqueued before, with the same payload.
    again: u32,
    /// Enqueues that failed (the server restarting, or SQLite busy) and were tried again.
    errors: u32,
    /// The last of their errors.
    last_error: Option<String>,
}

/// Sets its flag when dropped, also when the test panics.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A worker slot: its process and, when frozen, when it is to resume.
struct Slot {
    proc: Proc,
    stopped_until: Option<Instant>,
}

/// Draws the next job: mostly new credits (two in five slow), sometimes a credit enqueued
/// again, sometimes a `fail` job, retryable or fatal. A slow credit waits 10 to 200 ms in its
/// transaction after its ledger row: a kill then lands mid-transaction now and then.
fn plan(rng: &mut Rng, n: &mut u64, credits: &mut Vec<Planned>) -> Planned {
    let roll = rng.below(100);
    if roll < 15 && !credits.is_empty() {
        let again = rng.below(credits.len() as u64) as usize;
        return credits[again].clone();
    }
    *n += 1;
    if roll < 22 {
        let fatal = rng.percent(50);
        return Planned {
            key: format!("fail:f{n}"),
            kind: "fail",
            payload: json!({"id": format!("f{n}"), "fatal": fatal}),
            max_attempts: FAIL_ATTEMPTS,
        };
    }
    let mut payload = json!({"order": format!("o{n}"), "account": *n, "amount": 100 + *n});
    if rng.percent(40) {
        payload["hold_ms"] = json!(rng.below(190) + 10);
    }
    let credit = Planned {
        key: format!("credit:o{n}"),
        kind: "credit",
        payload,
        max_attempts: CREDIT_ATTEMPTS,
    };
    credits.push(credit.clone());
    credit
}

/// Enqueues what is pending, in order, until the first error (the server restarting, or
/// SQLite's write lock held by a frozen worker); the rest waits for the next round.
fn flush(db: &Db, pending: &mut VecDeque<Planned>, enqueues: &mut Enqueues) {
    while let Some(job) = pending.front() {
        match enqueue(db, job) {
            Ok(_) => {
                if !enqueues.keys.insert(job.key.clone()) {
                    enqueues.again += 1;
                }
                enqueues.enqueued += 1;
                pending.pop_front();
            }
            Err(error) => {
                enqueues.errors += 1;
                enqueues.last_error = Some(error);
                return;
            }
        }
    }
}

/// Enqueues jobs without pause, on a connection of its own, until `stop`; then enqueues what
/// is still pending and returns. A thread apart from the faults, so that an enqueue waiting
/// for SQLite's write lock or for the server to come back does not hold up the faults.
fn enqueue_until(db: &Db, mut rng: Rng, stop: &AtomicBool) -> Enqueues {
    let mut enqueues = Enqueues::default();
    let mut n = 0;
    let mut credits = Vec::new();
    let mut pending = VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..1 + rng.below(2) {
            pending.push_back(plan(&mut rng, &mut n, &mut credits));
        }
        flush(db, &mut pending, &mut enqueues);
        std::thread::sleep(rng.millis(30, 200));
    }
    let started = Instant::now();
    while !pending.is_empty() {
        assert!(
            started.elapsed() < COMMAND_TIMEOUT,
            "{}: {} jobs could not be enqueued within {COMMAND_TIMEOUT:?}: {enqueues:?}",
            db.backend(),
            pending.len()
        );
        flush(db, &mut pending, &mut enqueues);
        std::thread::sleep(Duration::from_millis(100));
    }
    enqueues
}

/// Starts again any worker that exited on its own, noting why.
fn restart_exited(db: &Db, slots: &mut [Slot], started: Instant, tally: &mut Tally) {
    for (i, slot) in slots.iter_mut().enumerate() {
        if let Some(exit) = slot.proc.exited() {
            tally.exits.push(format!(
                "worker {i} at {:.1} s: {} {}",
                started.elapsed().as_secs_f64(),
                exit.status,
                tail(&exit.stderr)
            ));
            slot.proc = worker(db, &format!("w{i}"), false);
            slot.stopped_until = None;
        }
    }
}

/// Waits until `proc` catches SIGTERM, as /proc tells (at once where there is no /proc to
/// read, or the process has exited).
fn wait_until_catching_term(proc: &Proc) {
    const SIGTERM: u32 = 15;
    let status = format!("/proc/{}/status", proc.pid());
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    while Instant::now() < deadline {
        let Ok(text) = std::fs::read_to_string(&status) else {
            return;
        };
        let caught = text
            .lines()
            .find_map(|line| line.strip_prefix("SigCgt:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok());
        match caught {
            Some(mask) if mask & (1 << (SIGTERM - 1)) == 0 => {
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => return,
        }
    }
    panic!(
        "{} did not catch SIGTERM within {COMMAND_TIMEOUT:?}",
        proc.name
    );
}

/// The fault run on `db`, with `cluster` restarted in immediate mode on PostgreSQL.
fn chaos(db: &Db, cluster: Option<&Cluster>) {
    let backend = db.backend();
    let seed = seed();
    let duration = chaos_duration();
    eprintln!(
        "{backend}: fault run for {duration:?} with seed {seed} (replay: \
         JOBGUARD_CHAOS_SEED={seed}); logs in {}",
        db.dir.display()
    );
    let mut rng = Rng(seed);
    migrate(db);

    // One or two crashes of the server, somewhere in the middle of the run.
    let mut restarts_at: VecDeque<Duration> = match cluster {
        Some(_) => {
            let mut at: Vec<Duration> = (0..1 + rng.below(2))
                .map(|_| duration.mul_f64(0.25 + 0.5 * (rng.below(1000) as f64 / 1000.0)))
                .collect();
            at.sort();
            at.into()
        }
        None => VecDeque::new(),
    };
    let planned_restarts = restarts_at.len() as u32;

    let mut tally = Tally::default();
    let mut slots: Vec<Slot> = (0..WORKERS)
        .map(|i| Slot {
            proc: worker(db, &format!("w{i}"), false),
            stopped_until: None,
        })
        .collect();
    let started = Instant::now();
    let mut next_fault = started + rng.millis(300, 1500);
    let mut faults = 0_u32;
    // The `pg_ctl restart` under way.
    let mut restarting: Option<Child> = None;
    let stop = AtomicBool::new(false);
    let enqueues = std::thread::scope(|scope| {
        let enqueuer = {
            let (url, dir) = (db.url.clone(), db.dir.clone());
            let rng = Rng(seed ^ 0x5eed);
            let stop = &stop;
            scope.spawn(move || {
                enqueue_until(
                    &Db::at(url, dir, false).acquire_timeout(Duration::from_secs(5)),
                    rng,
                    stop,
                )
            })
        };
        // Whatever happens here, the enqueuing thread stops, or the scope would wait for it.
        let _stop = StopOnDrop(&stop);
        while started.elapsed() < duration {
            std::thread::sleep(rng.millis(20, 150));

            let now = Instant::now();
            for slot in &mut slots {
                if slot.stopped_until.is_some_and(|until| until <= now) {
                    slot.proc.signal("CONT");
                    slot.stopped_until = None;
                }
            }
            restart_exited(db, &mut slots, started, &mut tally);

            if now >= next_fault {
                // The first fault is a kill and the second a stop past the lease, so that a short
                // run has both; then either, at random.
                let kill = match faults {
                    0 => true,
                    1 => false,
                    _ => rng.percent(50),
                };
                let stopped = slots.iter().filter(|s| s.stopped_until.is_some()).count();
                if kill {
                    let i = rng.below(WORKERS as u64) as usize;
                    let slot = &mut slots[i];
                    // A frozen worker is killed too: SIGKILL needs no SIGCONT.
                    slot.proc.sigkill();
                    tally.kills += 1;
                    slot.proc = worker(db, &format!("w{i}"), false);
                    slot.stopped_until = None;
                } else if stopped < MAX_STOPPED {
                    let running: Vec<usize> = (0..WORKERS)
                        .filter(|&i| slots[i].stopped_until.is_none())
                        .collect();
                    let i = running[rng.below(running.len() as u64) as usize];
                    let frozen = if faults == 1 {
                        rng.millis(LEASE.as_millis() as u64 * 3 / 2, 3000)
                    } else {
                        rng.millis(100, 3000)
                    };
                    slots[i].proc.signal("STOP");
                    slots[i].stopped_until = Some(now + frozen);
                    tally.stops += 1;
                    if frozen > LEASE {
                        tally.stops_past_lease += 1;
                    }
                }
                faults += 1;
                next_fault = now + rng.millis(300, 1500);
            }

            if let Some(cluster) = cluster {
                if let Some(pg_ctl) = restarting.as_mut()
                    && pg_ctl.try_wait().expect("wait for pg_ctl").is_some()
                {
                    cluster.end_restart(restarting.take().unwrap());
                    eprintln!(
                        "{backend}: PostgreSQL back at {:.1} s",
                        started.elapsed().as_secs_f64()
                    );
                }
                if restarting.is_none()
                    && restarts_at
                        .front()
                        .is_some_and(|&at| started.elapsed() >= at)
                {
                    restarts_at.pop_front();
                    restarting = Some(cluster.begin_restart_immediate());
                    tally.restarts += 1;
                    eprintln!(
                        "{backend}: restarting PostgreSQL in immediate mode at {:.1} s",
                        started.elapsed().as_secs_f64()
                    );
                }
            }
        }

        // The faults are over: every worker resumes, the last jobs go in, and the queue drains.
        stop.store(true, Ordering::Relaxed);
        if let (Some(cluster), Some(pg_ctl)) = (cluster, restarting.take()) {
            cluster.end_restart(pg_ctl);
        }
        for slot in &mut slots {
            if slot.stopped_until.take().is_some() {
                slot.proc.signal("CONT");
            }
        }
        enqueuer.join().expect("the enqueuing thread")
    });
    let drain_started = Instant::now();
    loop {
        restart_exited(db, &mut slots, started, &mut tally);
        if unfinished(db) == Ok((0, 0)) {
            break;
        }
        assert!(
            drain_started.elapsed() < DRAIN_TIMEOUT,
            "{backend} (seed {seed}): the queue did not drain within {DRAIN_TIMEOUT:?}: \
             (available, running) {:?}; {tally:?}",
            unfinished(db),
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let drained_in = drain_started.elapsed();

    // SIGTERM: each worker finishes what it runs and reports. A worker started by the last
    // fault may not have reached its handlers yet, and would die of the signal.
    let mut reports = Vec::new();
    for slot in &mut slots {
        wait_until_catching_term(&slot.proc);
        slot.proc.signal("TERM");
    }
    for (i, slot) in slots.iter_mut().enumerate() {
        let exit = slot.proc.finish(COMMAND_TIMEOUT);
        assert!(
            exit.status.success(),
            "{backend} (seed {seed}): worker {i} did not stop cleanly ({}):\n{}",
            exit.status,
            tail(&exit.stderr)
        );
        reports.push(serde_json::from_str::<Value>(&exit.stdout).unwrap_or(Value::Null));
    }
    // A last worker that stops when idle: it would find anything the others left behind.
    let last = worker(db, "last", true).finish(COMMAND_TIMEOUT);
    assert!(
        last.status.success(),
        "{backend}: the last worker failed: {}",
        tail(&last.stderr)
    );
    let last: Value = serde_json::from_str(&last.stdout).unwrap_or(Value::Null);
    assert_eq!(
        (last["applied"].as_u64(), last["duplicates"].as_u64()),
        (Some(0), Some(0)),
        "{backend} (seed {seed}): the queue had drained, yet the last worker ran jobs: {last}"
    );

    check(
        db,
        seed,
        &enqueues,
        &tally,
        planned_restarts,
        &reports,
        drained_in,
    );
}

/// The invariants after the run, and the summary.
fn check(
    db: &Db,
    seed: u64,
    enqueues: &Enqueues,
    tally: &Tally,
    planned_restarts: u32,
    reports: &[Value],
    drained_in: Duration,
) {
    let backend = db.backend();
    let context = format!("{backend} (seed {seed})");
    let jobs = jobs(db);
    let ledger = ledger(db);
    let guard = guard_rows(db);

    // Nothing left behind.
    let unfinished: Vec<&JobRow> = jobs
        .iter()
        .filter(|job| job.state != "completed" && job.state != "dead")
        .collect();
    assert!(
        unfinished.is_empty(),
        "{context}: jobs left unfinished: {unfinished:?}"
    );
    // No key applied twice.
    let twice: Vec<(&String, &i64)> = ledger.iter().filter(|(_, rows)| **rows > 1).collect();
    assert!(twice.is_empty(), "{context}: keys applied twice: {twice:?}");

    // Every enqueue is a job, and every job was enqueued by the test.
    let job_keys: BTreeSet<String> = jobs.iter().map(|job| job.key.clone()).collect();
    assert_eq!(
        job_keys, enqueues.keys,
        "{context}: the jobs' keys are the keys enqueued"
    );

    // Every credit applied exactly once, none dead: 25 attempts outlast any of the faults.
    let dead_credits: Vec<&JobRow> = jobs
        .iter()
        .filter(|job| job.kind == "credit" && job.state == "dead")
        .collect();
    assert!(
        dead_credits.is_empty(),
        "{context}: credits dead: {dead_credits:?}"
    );
    let credit_keys: BTreeSet<String> = enqueues
        .keys
        .iter()
        .filter(|key| key.starts_with("credit:"))
        .cloned()
        .collect();
    let ledger_keys: BTreeSet<String> = ledger.keys().cloned().collect();
    let missing: Vec<&String> = credit_keys.difference(&ledger_keys).collect();
    assert!(
        missing.is_empty(),
        "{context}: credits never applied: {missing:?}"
    );
    assert_eq!(
        ledger_keys, credit_keys,
        "{context}: the ledger holds the credits' keys"
    );

    // Every `fail` job dead, with its attempts used up when retryable; none applied.
    let fail_jobs: Vec<&JobRow> = jobs.iter().filter(|job| job.kind == "fail").collect();
    let alive: Vec<&&JobRow> = fail_jobs.iter().filter(|job| job.state != "dead").collect();
    assert!(
        alive.is_empty(),
        "{context}: `fail` jobs not dead: {alive:?}"
    );
    let cut_short: Vec<&&JobRow> = fail_jobs
        .iter()
        .filter(|job| !job.fatal && job.attempt < i64::from(FAIL_ATTEMPTS))
        .collect();
    assert!(
        cut_short.is_empty(),
        "{context}: retryable jobs dead before their {FAIL_ATTEMPTS} attempts: {cut_short:?}"
    );

    // The guard's rows are the ledger's keys: a claim commits with its effect or not at all.
    let guard_keys: BTreeSet<String> = guard.iter().map(|(key, _)| key.clone()).collect();
    assert_eq!(
        guard.len(),
        guard_keys.len(),
        "{context}: guard rows per key"
    );
    assert_eq!(
        guard_keys, ledger_keys,
        "{context}: the guard's keys are the ledger's keys"
    );

    // The faults happened: a run without them would prove nothing.
    assert!(
        tally.kills > 0,
        "{context}: no worker was killed: {tally:?}"
    );
    assert!(
        tally.stops_past_lease > 0,
        "{context}: no worker was frozen past its lease: {tally:?}"
    );
    assert_eq!(
        tally.restarts, planned_restarts,
        "{context}: PostgreSQL restarts"
    );
    assert!(
        enqueues.again > 0,
        "{context}: no key was enqueued twice: {enqueues:?}"
    );
    let ran_again = jobs.iter().filter(|job| job.attempt > 1).count();
    let completed_credits = jobs
        .iter()
        .filter(|job| job.kind == "credit" && job.state == "completed")
        .count();
    let dead = jobs.iter().filter(|job| job.state == "dead").count();
    let fatal_dead = fail_jobs.iter().filter(|job| job.fatal).count();
    let sum = |field: &str| -> u64 { reports.iter().filter_map(|r| r[field].as_u64()).sum() };
    eprintln!(
        "{backend}: fault run, seed {seed}: {kills} kills, {stops} stops ({past} past the \
         lease), {restarts} PostgreSQL restarts, {exits} workers exited on their own; {enq} \
         enqueues ({again} of a key enqueued before, {errors} tried again after an error), {jobs} \
         jobs, {keys} credit keys applied once each, 0 applied twice, {dups} credit jobs \
         completed as duplicates, {dead} dead ({fatal_dead} fatal, the rest retryable after {FAIL_ATTEMPTS} attempts), {ran_again} jobs ran more than once; drained in {drained:.1} \
         s; the last workers reported {applied} applied, {reported_dups} duplicates, {fenced} \
         fenced",
        kills = tally.kills,
        stops = tally.stops,
        past = tally.stops_past_lease,
        restarts = tally.restarts,
        exits = tally.exits.len(),
        enq = enqueues.enqueued,
        again = enqueues.again,
        errors = enqueues.errors,
        jobs = jobs.len(),
        keys = ledger_keys.len(),
        dups = completed_credits - ledger_keys.len(),
        drained = drained_in.as_secs_f64(),
        applied = sum("applied"),
        reported_dups = sum("duplicates"),
        fenced = sum("fenced"),
    );
    for exit in &tally.exits {
        eprintln!("{backend}: {exit}");
    }
    // A worker that exits on its own, while nobody killed it, is a defect: the database
    // coming back must not take the process with it.
    assert!(
        tally.exits.is_empty(),
        "{context}: workers exited on their own: {:#?}",
        tally.exits
    );
}

#[test]
fn chaos_on_sqlite() {
    // Alone, one backend at a time: eight worker processes on a small machine would slow each
    // other past their leases all the time, which is a different test.
    let _alone = alone();
    let db = Db::sqlite("chaos::sqlite");
    chaos(&db, None);
}

#[test]
fn chaos_on_postgres() {
    // Alone, one backend at a time: eight worker processes on a small machine would slow each
    // other past their leases all the time, which is a different test.
    let _alone = alone();
    let dir = Db::scratch("chaos::postgres");
    // Dropped last: the workers and the test's connection go first.
    let Some(cluster) = Cluster::start(&dir) else {
        return;
    };
    let db = Db::at(cluster.url(), dir, true).acquire_timeout(Duration::from_secs(5));
    chaos(&db, Some(&cluster));
}
