//! Process-level faults against the real binary: workers killed with SIGKILL in the middle of
//! their jobs' transactions and right around their commits, a worker frozen with SIGSTOP past
//! its leases while another one takes over, and a job delivered again across processes; and, on
//! PostgreSQL, a worker whose claim waits on another transaction past its lease keeps the job.
//! A worker started before its database is reachable waits for it up to `--connect-timeout`,
//! then exits 1 naming the database; one-shot commands fail at once (`faults/unreachable.rs`).
//! A worker running batches is killed inside a batch's transaction, which applies nothing
//! (`faults/batch.rs`).
//!
//! Whatever the fault, every credit must land in `jobguard_ledger` exactly once: as many ledger
//! rows as distinct keys as jobs, every job completed, none left running. Each scenario runs on
//! a fresh SQLite file, and on a fresh PostgreSQL schema when PostgreSQL answers. Every wait
//! has a deadline and every child process is killed when its guard is dropped, so a failing
//! test fails instead of hanging.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use jobguard::queue::NewJob;
use jobguard::{JobKey, Queue};
use serde_json::{Value, json};

use crate::common::{AnyPool, Db, Proc};
use crate::{each_backend, on_pool};

mod batch;
mod unreachable;

use batch::sigkill_mid_batch;

/// The longest any single command of the binary may take before the test fails.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(40);
/// The longest a queue may take to drain once the faults are over.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(40);

/// Job counts by state, as `jobguard jobs --json` prints them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Counts {
    available: i64,
    running: i64,
    completed: i64,
    dead: i64,
}

impl Counts {
    fn drained(&self) -> bool {
        self.available == 0 && self.running == 0
    }

    fn total(&self) -> i64 {
        self.available + self.running + self.completed + self.dead
    }
}

/// Starts a worker that prints its stats as JSON when it stops.
fn worker(db: &Db, name: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["worker", "--json"];
    args.extend_from_slice(extra);
    db.spawn(name, &args)
}

/// A worker with a one-second lease that polls every 100 ms, so that a lost lease shows soon.
fn short_lease_worker(db: &Db, name: &str, extra: &[&str]) -> Proc {
    let mut args = extra.to_vec();
    args.extend(["--lease", "1s", "--poll", "100ms"]);
    worker(db, name, &args)
}

fn enqueue_credit(db: &Db, payload: &Value) -> Value {
    let payload = payload.to_string();
    db.json(&["enqueue", "credit", "--payload", &payload])
}

/// Enqueues many credits through the library, in the test process: 200 runs of the binary
/// would take seconds.
fn enqueue_credits_direct(db: &Db, ns: std::ops::RangeInclusive<i64>, hold_ms: u64) {
    async fn enqueue_all<DB: jobguard::Backend>(
        queue: Queue<DB>,
        ns: std::ops::RangeInclusive<i64>,
        hold_ms: u64,
    ) {
        queue.migrate().await.unwrap();
        for n in ns {
            let payload = credit(n, hold_ms);
            let key = JobKey::new("credit", [format!("order-{n}")]).unwrap();
            let job = NewJob::new(key, &payload).unwrap().kind("credit").unwrap();
            assert!(queue.enqueue(&job).await.unwrap().inserted);
        }
    }
    on_pool!(db, |pool| enqueue_all(
        Queue::new(pool.clone()),
        ns,
        hold_ms
    ));
}

/// The job counts, read by the test itself: quick enough to poll every few milliseconds.
fn counts_now(db: &Db) -> Counts {
    let counts =
        on_pool!(db, |pool| Queue::new(pool.clone()).counts()).expect("read the job counts");
    Counts {
        available: counts.available,
        running: counts.running,
        completed: counts.completed,
        dead: counts.dead,
    }
}

fn counts(db: &Db) -> Counts {
    let counts = &db.json(&["jobs"])["counts"];
    let get = |state: &str| {
        counts[state]
            .as_i64()
            .unwrap_or_else(|| panic!("no `{state}` count in {counts}"))
    };
    Counts {
        available: get("available"),
        running: get("running"),
        completed: get("completed"),
        dead: get("dead"),
    }
}

/// Every job, as `jobguard jobs --json` lists them.
fn list_jobs(db: &Db) -> Vec<Value> {
    let listed = db.json(&["jobs", "--limit", "100000"]);
    listed["jobs"].as_array().unwrap().clone()
}

/// Polls the counts until `done` holds, failing after `timeout`.
fn wait_for(db: &Db, what: &str, timeout: Duration, done: impl Fn(&Counts) -> bool) -> Counts {
    let started = Instant::now();
    loop {
        let counts = counts_now(db);
        if done(&counts) {
            return counts;
        }
        assert!(
            started.elapsed() < timeout,
            "{}: {what} did not happen within {timeout:?}; counts {counts:?}",
            db.backend()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Runs `worker --until-idle` until no job is available or running: jobs leased by a
/// killed worker stay running until their lease expires and a worker rescues them, and an
/// idle worker stops as soon as it finds nothing to fetch. Returns the drains' reports.
fn drain(db: &Db, lease: &str) -> Vec<Value> {
    let started = Instant::now();
    let mut reports = Vec::new();
    loop {
        let report = worker(
            db,
            "drain",
            &["--until-idle", "--lease", lease, "--poll", "50ms"],
        )
        .finish_json(COMMAND_TIMEOUT);
        reports.push(report);
        let counts = counts(db);
        if counts.drained() {
            return reports;
        }
        assert!(
            started.elapsed() < DRAIN_TIMEOUT,
            "{}: the queue did not drain within {DRAIN_TIMEOUT:?}; counts {counts:?}, \
             reports {reports:?}",
            db.backend()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Ledger rows, distinct keys among them, and the keys.
fn ledger(db: &Db) -> (i64, i64, BTreeSet<String>) {
    let counts = "select count(*), count(distinct job_key) from jobguard_ledger";
    let keys = "select job_key from jobguard_ledger";
    let ((rows, distinct), keys): ((i64, i64), Vec<String>) = on_pool!(db, |pool| async {
        let counts = sqlx::query_as(counts).fetch_one(pool).await.unwrap();
        (
            counts,
            sqlx::query_scalar(keys).fetch_all(pool).await.unwrap(),
        )
    });
    (rows, distinct, keys.into_iter().collect())
}

/// What must hold after any scenario: `jobs` jobs, all completed, none running, the
/// counts adding up to the jobs listed; one ledger row for each of `keys` distinct keys,
/// and the ledger's keys are the jobs' keys.
fn assert_exactly_once(db: &Db, jobs: i64, keys: i64) -> Vec<Value> {
    let backend = db.backend();
    let counts = counts(db);
    assert_eq!(
        counts,
        Counts {
            available: 0,
            running: 0,
            completed: jobs,
            dead: 0
        },
        "{backend}"
    );
    let listed = list_jobs(db);
    assert_eq!(
        listed.len() as i64,
        counts.total(),
        "{backend}: jobs listed"
    );
    assert!(
        listed.iter().all(|job| job["state"] == "completed"),
        "{backend}: {listed:?}"
    );
    let job_keys: BTreeSet<String> = listed
        .iter()
        .map(|job| job["key"].as_str().unwrap().to_owned())
        .collect();
    let (rows, distinct, ledger_keys) = ledger(db);
    assert_eq!(
        (rows, distinct),
        (keys, keys),
        "{backend}: ledger rows and distinct keys"
    );
    assert_eq!(
        ledger_keys, job_keys,
        "{backend}: the ledger's keys are the jobs' keys"
    );
    listed
}

/// The payload of credit `n`, as `jobguard enqueue` stores it (`hold_ms` only when non-zero).
fn credit(n: i64, hold_ms: u64) -> Value {
    let mut payload = json!({"order": format!("order-{n}"), "account": n, "amount": 100 + n});
    if hold_ms > 0 {
        payload["hold_ms"] = json!(hold_ms);
    }
    payload
}

/// A worker report's counter.
fn stat(report: &Value, field: &str) -> u64 {
    report[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no `{field}` in {report}"))
}

fn sum(reports: &[Value], field: &str) -> u64 {
    reports.iter().map(|report| stat(report, field)).sum()
}

/// The warning lines of a worker's log, for the report.
fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|line| line.contains("WARN") || line.contains("ERROR"))
        .collect()
}

fn log(path: &Path, what: &str) {
    eprintln!("[{}] {what}", path.display());
}

/// Scenario 1: 30 slow credits (200 ms inside their transaction after the ledger insert); a
/// worker running four at once is SIGKILLed three times while its jobs are mid-transaction,
/// then the queue is drained. The killed transactions roll back with their ledger rows; their
/// jobs run again when their leases expire.
fn sigkill_mid_job(db: &Db) {
    const JOBS: i64 = 30;
    for n in 1..=JOBS {
        let enqueued = enqueue_credit(db, &credit(n, 200));
        assert_eq!(enqueued["inserted"], true, "{enqueued}");
    }
    let mut orphaned = Vec::new();
    for round in 1..=3 {
        let before = counts(db).completed;
        let mut worker = worker(
            db,
            &format!("kill-{round}"),
            &["--concurrency", "4", "--lease", "2s", "--poll", "100ms"],
        );
        wait_for(
            db,
            "three more completions",
            Duration::from_secs(20),
            |counts| counts.completed >= before + 3,
        );
        // Into the next jobs' 200 ms hold: their ledger rows are written, not committed.
        std::thread::sleep(Duration::from_millis(100));
        worker.sigkill();
        let counts = counts(db);
        log(
            &db.dir,
            &format!("{}: killed worker {round}: {counts:?}", db.backend()),
        );
        assert_eq!(counts.total(), JOBS);
        orphaned.push(counts.running);
    }
    // A worker running four 200 ms jobs holds two to four leases at almost any moment; a kill
    // lands between a batch's commits and the next fetch only by a few milliseconds' chance.
    assert!(
        orphaned.iter().sum::<i64>() > 0,
        "{}: no kill left a job running: {orphaned:?}",
        db.backend()
    );

    let reports = drain(db, "2s");
    let listed = assert_exactly_once(db, JOBS, JOBS);
    let redelivered = listed
        .iter()
        .filter(|job| job["attempt"].as_i64().unwrap() > 1)
        .count();
    assert!(
        redelivered > 0,
        "{}: no job ran twice: {listed:?}",
        db.backend()
    );
    // Nothing ran again after a commit, so no duplicates; the drains apply what is left.
    assert_eq!(sum(&reports, "duplicates"), 0, "{reports:?}");
    assert!(sum(&reports, "applied") <= JOBS as u64);
    log(
        &db.dir,
        &format!(
            "{}: leases orphaned by the kills {orphaned:?}, {redelivered} jobs ran again, \
             drains {reports:?}",
            db.backend()
        ),
    );
}

/// Scenario 2: 200 instant credits; a worker is SIGKILLed 0 to 45 ms after its first commit, so
/// kills land among commits, again with a new worker each time, until nothing is left to fetch
/// or ten workers were killed (a worker takes about half a second to start on PostgreSQL, and
/// commits only a few jobs in 45 ms there); then the queue is drained.
fn sigkill_around_commits(db: &Db) {
    const JOBS: i64 = 200;
    enqueue_credits_direct(db, 1..=JOBS, 0);
    let started = Instant::now();
    let mut rounds = Vec::new();
    let mut before = counts_now(db);
    for round in 1..=10_u64 {
        let mut worker = worker(
            db,
            &format!("kill-{round}"),
            &["--concurrency", "8", "--lease", "1s", "--poll", "50ms"],
        );
        wait_for(db, "a commit", Duration::from_secs(20), |counts| {
            counts.completed > before.completed
        });
        // A different moment each round, 0 to 45 ms into the run of commits.
        std::thread::sleep(Duration::from_millis(round * 15 % 50));
        worker.sigkill();
        let after = counts_now(db);
        assert_eq!(after.total(), JOBS);
        assert_eq!(after.dead, 0);
        rounds.push((after.completed - before.completed, after.running));
        before = after;
        // Jobs still running are leases of killed workers: the drain rescues them.
        if after.available == 0 || started.elapsed() > Duration::from_secs(8) {
            break;
        }
    }
    log(
        &db.dir,
        &format!(
            "{}: per kill, (jobs completed, jobs left running): {rounds:?}",
            db.backend()
        ),
    );
    assert!(
        rounds.len() >= 2,
        "{}: one worker completed everything before its kill: {rounds:?}",
        db.backend()
    );
    let reports = drain(db, "1s");
    let listed = assert_exactly_once(db, JOBS, JOBS);
    assert_eq!(sum(&reports, "duplicates"), 0, "{reports:?}");
    let redelivered = listed
        .iter()
        .filter(|job| job["attempt"].as_i64().unwrap() > 1)
        .count();
    log(
        &db.dir,
        &format!(
            "{}: {redelivered} jobs ran again; drains {:?}",
            db.backend(),
            reports
                .iter()
                .map(|r| (stat(r, "applied"), stat(r, "fenced")))
                .collect::<Vec<_>>()
        ),
    );
}

/// Scenario 3: worker A, two slow jobs at a time with a 1 s lease, is frozen with SIGSTOP for
/// longer than its leases; worker B takes over what it can: jobs A leased but had not started
/// are rescued and run by B, and A is fenced off them when it resumes. Jobs A had started hold
/// their rows in A's open transaction: on PostgreSQL B skips them, and on SQLite A holds the
/// only write lock, so B waits for A to resume. A then finishes, is stopped with SIGTERM, and
/// reports.
fn sigstop_past_the_lease(db: &Db) {
    const JOBS: i64 = 20;
    for n in 1..=JOBS {
        enqueue_credit(db, &credit(n, 300));
    }
    let mut a = short_lease_worker(db, "a", &["--concurrency", "2"]);
    wait_for(
        db,
        "worker A to take jobs",
        Duration::from_secs(20),
        |counts| counts.running > 0 || counts.completed > 0,
    );
    std::thread::sleep(Duration::from_millis(150));
    a.signal("STOP");
    let at_stop = counts_now(db);
    // Past A's leases, so B's first rescue finds them expired.
    std::thread::sleep(Duration::from_millis(1300));

    let b_started = Instant::now();
    let mut b = short_lease_worker(db, "b", &["--until-idle"]);
    // On PostgreSQL B must finish while A is stopped; on SQLite it waits for A's write lock
    // (unless A was stopped between two transactions), so A is resumed after a while.
    let patience = if db.is_postgres() { 20 } else { 2 };
    let b_exit = b.wait(Duration::from_secs(patience));
    let b_while_stopped = b_exit.is_some();
    if db.is_postgres() {
        // Nothing of A's blocks B on PostgreSQL: its locked rows are skipped.
        assert!(
            b_while_stopped,
            "postgres: worker B did not finish while A was stopped; B's stderr:\n{}",
            std::fs::read_to_string(&b.stderr).unwrap_or_default()
        );
    }
    let at_resume = counts_now(db);
    a.signal("CONT");
    let b_exit = match b_exit {
        Some(exit) => exit,
        None => b.finish(COMMAND_TIMEOUT),
    };
    let b_seconds = b_started.elapsed().as_secs_f64();
    assert!(b_exit.status.success(), "worker B: {}", b_exit.stderr);
    let b_report = b_exit.json;

    // A finishes its own transactions and more jobs; SIGTERM lets its running jobs finish.
    std::thread::sleep(Duration::from_secs(2));
    a.signal("TERM");
    let a_exit = a.finish(COMMAND_TIMEOUT);
    assert!(a_exit.status.success(), "worker A: {}", a_exit.stderr);
    let a_report = a_exit.json;
    assert_ne!(a_report, Value::Null, "worker A: {}", a_exit.stdout);
    log(
        &db.dir,
        &format!(
            "{backend}: at SIGSTOP {at_stop:?}; at SIGCONT {at_resume:?}; B finished while A \
             was stopped: {b_while_stopped}, after {b_seconds:.2} s\n  A {a_report}\n  \
             A's warnings: {:?}\n  B {b_report}\n  B's warnings: {:?}",
            warnings(&a_exit.stderr),
            warnings(&b_exit.stderr),
            backend = db.backend(),
        ),
    );

    let drains = drain(db, "1s");
    assert_exactly_once(db, JOBS, JOBS);
    // Every worker here stopped gracefully and reported: together they committed each effect
    // once, and nothing was delivered again after its commit.
    let mut reports = vec![a_report, b_report];
    reports.extend(drains);
    assert_eq!(sum(&reports, "applied"), JOBS as u64, "{reports:?}");
    assert_eq!(sum(&reports, "duplicates"), 0, "{reports:?}");
    assert_eq!(sum(&reports, "dead"), 0, "{reports:?}");
    // SIGTERM lets A's running jobs finish (30 s allowed), none is rolled back and given back.
    assert_eq!(stat(&reports[0], "released"), 0, "{reports:?}");
}

/// Scenario 4: the same credit enqueued again after its job completed is a new job, run by
/// another worker process; the guard completes it as a duplicate without a second ledger row.
fn duplicate_across_processes(db: &Db) {
    let payload = json!({"order": "dup-1", "account": 7, "amount": 500});
    let first = enqueue_credit(db, &payload);
    assert_eq!(first["inserted"], true, "{first}");
    // `hold_ms: 0` is the default and left out of the stored payload: the same job.
    let mut explicit = payload.clone();
    explicit["hold_ms"] = json!(0);
    let same = enqueue_credit(db, &explicit);
    assert_eq!(
        (&same["inserted"], &same["id"]),
        (&json!(false), &first["id"]),
        "{same}"
    );

    let report = worker(db, "first", &["--until-idle"]).finish_json(COMMAND_TIMEOUT);
    assert_eq!(
        (stat(&report, "applied"), stat(&report, "duplicates")),
        (1, 0),
        "{report}"
    );
    let again = enqueue_credit(db, &payload);
    assert_eq!(again["inserted"], true, "the first job completed: {again}");
    assert_ne!(again["id"], first["id"]);
    let report = worker(db, "second", &["--until-idle"]).finish_json(COMMAND_TIMEOUT);
    assert_eq!(
        (stat(&report, "applied"), stat(&report, "duplicates")),
        (0, 1),
        "{report}"
    );
    let listed = assert_exactly_once(db, 2, 1);
    assert!(listed.iter().all(|job| job["key"] == "credit:dup-1"));
}

/// PostgreSQL only: a worker that stalls while its claim waits keeps the job, and applies it
/// once when it resumes. Worker A's statement completes the job under its lease, locking the
/// job's row, then waits to claim the key behind another transaction holding the key's guard
/// row (here the test's own; in production, a concurrent delivery of the same key). A is
/// frozen with SIGSTOP past its lease: the job is not rescued, because A's transaction holds
/// its row. The other transaction rolls back, A's claim goes on, and when A resumes it applies
/// the job, commits, and leaves no transaction open.
fn stalled_claim_keeps_the_job(db: &Db) {
    use sqlx::Connection as _;

    let key = JobKey::new("credit", ["order-fenced"]).unwrap();
    let AnyPool::Postgres(pool) = db.pool() else {
        unreachable!("PostgreSQL only")
    };
    let guard = jobguard::PgGuard::new(pool.clone());
    let queue = Queue::new(pool.clone());
    // Both tables before any worker starts: the workers find them migrated and run no DDL.
    db.block_on(async {
        queue.migrate().await.unwrap();
        guard.migrate().await.unwrap();
    });
    let backend_state = |pid: i32| -> Option<String> {
        db.block_on(async {
            sqlx::query_scalar("select state from pg_stat_activity where pid = $1")
                .bind(pid)
                .fetch_optional(pool)
                .await
                .unwrap()
        })
    };

    // The test's transaction holds the key's guard row, uncommitted.
    let (mut holder, holder_pid) = db.block_on(async {
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        let pid: i32 = sqlx::query_scalar("select pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        sqlx::query("begin").execute(&mut conn).await.unwrap();
        let claim = guard.claim_tx(&mut conn, &key).await.unwrap();
        assert_eq!(claim, jobguard::Claim::Claimed);
        (conn, pid)
    });
    let mut a = short_lease_worker(db, "a", &["--concurrency", "1"]);
    enqueue_credit(
        db,
        &json!({"order": "order-fenced", "account": 1, "amount": 5}),
    );
    // A's job connection, waiting for the test's transaction.
    let started = Instant::now();
    let a_pid = loop {
        let waiting: Vec<i32> = db.block_on(async {
            sqlx::query_scalar(
                "select pid from pg_stat_activity where $1 = any(pg_blocking_pids(pid))",
            )
            .bind(holder_pid)
            .fetch_all(pool)
            .await
            .unwrap()
        });
        if let [pid] = waiting[..] {
            break pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "worker A's claim never waited for the test's transaction"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    a.signal("STOP");
    std::thread::sleep(Duration::from_millis(1300));
    let rescued = db.block_on(queue.rescue()).unwrap();
    assert_eq!(
        rescued, 0,
        "A's transaction holds the job's row, so its lease is not expired"
    );
    db.block_on(async {
        sqlx::query("rollback").execute(&mut holder).await.unwrap();
        holder.close().await.unwrap();
    });
    // A's statement goes on without A: it claims the key, and waits for A in its transaction.
    let started = Instant::now();
    while backend_state(a_pid).as_deref() != Some("idle in transaction") {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "A's claim never finished"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    a.signal("CONT");

    let started = Instant::now();
    while counts_now(db).completed < 1 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "worker A did not finish the job after it resumed: {:?}",
            (counts_now(db), backend_state(a_pid))
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = Instant::now();
    while backend_state(a_pid).as_deref() == Some("idle in transaction") {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "A left its transaction open"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    a.signal("TERM");
    let a_report = a.finish_json(COMMAND_TIMEOUT);
    assert_eq!(
        (stat(&a_report, "applied"), stat(&a_report, "fenced")),
        (1, 0),
        "{a_report}"
    );
    assert_exactly_once(db, 1, 1);
}

each_backend!(
    sigkill_mid_job,
    sigkill_mid_batch,
    sigkill_around_commits,
    sigstop_past_the_lease,
    duplicate_across_processes,
);

#[test]
fn stalled_claim_keeps_the_job_on_postgres() {
    let Some(db) = Db::postgres("faults::stalled") else {
        return;
    };
    stalled_claim_keeps_the_job(&db);
}
