//! Periodic jobs with no leader: three `jobguard worker --schedule FILE` processes on one
//! database run the same every-second schedule while the test kills them (SIGKILL, then starts
//! another) and freezes them (SIGSTOP, later SIGCONT) at random. The schedule catches up every
//! missed firing (`missed = "all:1000"`), so every firing from the first scheduler's start to
//! the last firing recorded must be one job, completed, with one ledger row and one guard row:
//! none twice, none missing. Then `jobguard schedules` shows the schedule.
//!
//! `JOBGUARD_PERIODIC_SECS` sets how long the faults last (default 20).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use jobguard::JobKey;
use jobguard::periodic::format_firing;

use crate::common::{Db, Proc, Rng, alone, seed};

const WORKERS: usize = 3;

const SCHEDULE: &str = r#"
[[schedule]]
name = "every-second"
cron = "* * * * * *"
kind = "credit"
payload = { order = "", account = 7, amount = 1 }
firing_field = "order"
missed = "all:1000"
"#;

fn fault_duration() -> Duration {
    let secs = std::env::var("JOBGUARD_PERIODIC_SECS")
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .unwrap_or(20);
    Duration::from_secs(secs.max(3))
}

fn scheduler(db: &Db, name: &str) -> Proc {
    db.spawn(
        name,
        &[
            "worker",
            "--schedule",
            "schedule.toml",
            "--concurrency",
            "2",
            "--lease",
            "1s",
            "--poll",
            "100ms",
            "--shutdown-timeout",
            "5s",
        ],
    )
}

fn every_firing_once_under_kills_and_stops(db: &Db) {
    std::fs::write(db.dir.join("schedule.toml"), SCHEDULE).unwrap();
    let seed = seed();
    let mut rng = Rng(seed);
    eprintln!(
        "{}: periodic fault run with seed {seed}; logs in {}",
        db.backend(),
        db.dir.display()
    );
    let mut procs: Vec<Proc> = (0..WORKERS)
        .map(|i| scheduler(db, &format!("s{i}")))
        .collect();
    let mut stopped_until: Vec<Option<Instant>> = vec![None; WORKERS];
    let (mut kills, mut stops, mut generation) = (0, 0, WORKERS);
    let started = Instant::now();
    let mut next_fault = started + rng.millis(500, 1500);
    while started.elapsed() < fault_duration() {
        std::thread::sleep(Duration::from_millis(50));
        let now = Instant::now();
        for (i, until) in stopped_until.iter_mut().enumerate() {
            if until.is_some_and(|until| until <= now) {
                procs[i].signal("CONT");
                *until = None;
            }
        }
        for (i, proc) in procs.iter_mut().enumerate() {
            if let Some(exit) = proc.exited() {
                panic!("scheduler {i} exited: {} {}", exit.status, exit.stderr);
            }
        }
        if now < next_fault {
            continue;
        }
        let i = rng.below(WORKERS as u64) as usize;
        if rng.percent(50) {
            procs[i].sigkill();
            kills += 1;
            generation += 1;
            procs[i] = scheduler(db, &format!("s{generation}"));
            stopped_until[i] = None;
        } else if stopped_until[i].is_none() {
            procs[i].signal("STOP");
            stops += 1;
            stopped_until[i] = Some(now + rng.millis(300, 3000));
        }
        next_fault = now + rng.millis(300, 1500);
    }
    for (i, proc) in procs.iter_mut().enumerate() {
        if stopped_until[i].is_some() {
            proc.signal("CONT");
        }
    }
    // A moment for a frozen scheduler to catch up, then every scheduler stops.
    std::thread::sleep(Duration::from_secs(2));
    for proc in &procs {
        proc.signal("TERM");
    }
    for proc in &mut procs {
        let exit = proc.finish(Duration::from_secs(60));
        assert!(exit.ok, "{}", exit.stderr);
    }
    // The jobs still waiting run; no schedule here.
    let drained = db.run(&["worker", "--until-idle", "--poll", "100ms"]);
    assert!(drained.ok, "{}", drained.stderr);

    let first = db.count("select created_at from jobguard_jobs_schedules");
    let last = db.count("select last_fired_at from jobguard_jobs_schedules");
    let expected: Vec<i64> = (first + 1..=last).collect();
    eprintln!(
        "{}: {kills} kills, {stops} stops; firings {} to {}: {}",
        db.backend(),
        format_firing(first + 1),
        format_firing(last),
        expected.len()
    );
    assert!(expected.len() as u64 >= fault_duration().as_secs() - 2);
    assert!(
        kills + stops >= 3,
        "too few faults: {kills} kills, {stops} stops"
    );

    let periodic = "job_key like 'periodic:every-second:%'";
    assert_eq!(
        db.count(&format!(
            "select count(*) from jobguard_jobs where {periodic}"
        )),
        expected.len() as i64,
        "one job per firing"
    );
    assert_eq!(
        db.count(&format!(
            "select count(*) from jobguard_jobs where {periodic} and state = 'completed'"
        )),
        expected.len() as i64,
        "every firing's job completed"
    );
    assert_eq!(
        db.count(&format!(
            "select count(*) from processed_jobs where {periodic}"
        )),
        expected.len() as i64,
        "one guard row per firing"
    );
    let rows: Vec<(String, i64)> = crate::on_pool!(db, |pool| sqlx::query_as(
        "select job_key, count(*) from jobguard_ledger group by job_key"
    )
    .fetch_all(pool))
    .unwrap();
    let ledger: BTreeMap<String, i64> = rows.into_iter().collect();
    let want: BTreeMap<String, i64> = expected
        .iter()
        .map(|&at| {
            let key = JobKey::new("credit", [format_firing(at)]).unwrap();
            (key.to_string(), 1)
        })
        .collect();
    let twice: Vec<_> = ledger.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "firings applied twice: {twice:?}");
    let missing: Vec<_> = want
        .keys()
        .filter(|key| !ledger.contains_key(*key))
        .collect();
    assert!(missing.is_empty(), "firings never applied: {missing:?}");
    assert_eq!(ledger, want);

    let shown = db.json(&["schedules"]);
    let schedule = &shown["schedules"][0];
    assert_eq!(schedule["name"], "every-second");
    assert_eq!(schedule["last_fired_at"], last);
    assert_eq!(schedule["last_job_state"], "completed");
    let table = db.run(&["schedules"]);
    assert!(table.stdout.contains("every-second"), "{}", table.stdout);
    assert!(
        table.stdout.contains(&format_firing(last)),
        "{}",
        table.stdout
    );
}

// Alone, one backend at a time, as the fault run: three worker processes on a small machine.
#[test]
fn every_firing_once_under_kills_and_stops_on_sqlite() {
    let _alone = alone();
    every_firing_once_under_kills_and_stops(&Db::sqlite("periodic::sqlite"));
}

#[test]
fn every_firing_once_under_kills_and_stops_on_postgres() {
    let _alone = alone();
    if let Some(db) = Db::postgres("periodic::postgres") {
        every_firing_once_under_kills_and_stops(&db);
    }
}

/// A schedule file with a kind no worker runs is refused at start, naming the schedule, and
/// nothing is enqueued.
fn a_bad_schedule_is_refused_before_anything_is_enqueued(db: &Db) {
    std::fs::write(
        db.dir.join("bad.toml"),
        "[[schedule]]\nname = \"mail\"\ncron = \"* * * * * *\"\nkind = \"email\"\n",
    )
    .unwrap();
    let error = db.fails(&["worker", "--schedule", "bad.toml", "--until-idle"]);
    assert!(error.contains("schedule `mail`"), "{error}");
    assert!(error.contains("unknown job kind `email`"), "{error}");
    assert_eq!(db.count("select count(*) from jobguard_jobs"), 0);
}

crate::each_backend!(a_bad_schedule_is_refused_before_anything_is_enqueued);
