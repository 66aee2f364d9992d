//! Periodic jobs on both backends, with the scheduler's clock in the test's hands
//! ([`Scheduler::tick`] at a given time): missed firings by policy after a downtime, several
//! schedulers enqueueing each firing once, a restart enqueueing nothing again, a time zone's
//! daylight-saving change, and bad schedules refused at start.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use jobguard::periodic::{Firing, FiringOutcome, Missed, Periodic, Scheduler};
use jobguard::retention::{Pruner, RetentionConfig};
use jobguard::{Error, Queue, Worker};
use serde_json::json;
use sqlx::Pool;
use tokio::sync::Notify;

use crate::common::{Credit, TestDb, draining, ledger_rows, setup};

/// 2026-01-01T00:00:00Z, a minute boundary.
const T: i64 = 1_767_225_600;

fn at(seconds: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(seconds as u64)
}

/// Every minute, on the credit job.
fn minutely(missed: Missed) -> Periodic {
    Periodic::new(
        "minutely",
        "* * * * *",
        "credit",
        &json!({"order": 1, "amount": 5}),
    )
    .unwrap()
    .missed(missed)
    .grace(Duration::from_secs(5))
}

async fn jobs<DB: TestDb>(pool: &Pool<DB>) -> i64 {
    DB::count(
        pool,
        "select count(*) from jobguard_jobs where job_key like 'periodic:%'",
    )
    .await
}

fn outcomes(firings: &[Firing], outcome: FiringOutcome) -> Vec<i64> {
    firings
        .iter()
        .filter(|firing| firing.outcome == outcome)
        .map(|firing| firing.at)
        .collect()
}

/// The first firing at `T` on time, then no scheduler for the ten firings `T+1m`..`T+10m`;
/// a new one starts at `T+10m30s`, past the grace of the last of them. Returns its round.
async fn after_downtime<DB: TestDb>(queue: &Queue<DB>, missed: Missed) -> Vec<Firing> {
    let first = Scheduler::new(queue.clone(), vec![minutely(missed)]).unwrap();
    first.migrate().await.unwrap();
    first.register(at(T - 30)).await.unwrap();
    let round = first.tick(at(T + 1)).await.unwrap();
    assert_eq!(outcomes(&round, FiringOutcome::Enqueued), [T]);
    drop(first);
    let restarted = Scheduler::new(queue.clone(), vec![minutely(missed)]).unwrap();
    restarted.tick(at(T + 630)).await.unwrap()
}

fn downtime() -> Vec<i64> {
    (1..=10).map(|n| T + n * 60).collect()
}

backends!(fn skip_enqueues_no_missed_firing);
async fn skip_enqueues_no_missed_firing<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("periodic_skip").await else {
        return;
    };
    let round = after_downtime(&queue, Missed::Skip).await;
    assert_eq!(outcomes(&round, FiringOutcome::Missed), downtime());
    assert!(outcomes(&round, FiringOutcome::Enqueued).is_empty());
    assert_eq!(jobs(&pool).await, 1);
    // The schedule goes on at its next firing.
    let scheduler = Scheduler::new(queue.clone(), vec![minutely(Missed::Skip)]).unwrap();
    let next = scheduler.tick(at(T + 661)).await.unwrap();
    assert_eq!(outcomes(&next, FiringOutcome::Enqueued), [T + 660]);
    assert_eq!(jobs(&pool).await, 2);
}

backends!(fn latest_enqueues_one_catch_up);
async fn latest_enqueues_one_catch_up<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("periodic_latest").await else {
        return;
    };
    let round = after_downtime(&queue, Missed::Latest).await;
    assert_eq!(outcomes(&round, FiringOutcome::Enqueued), [T + 600]);
    assert_eq!(outcomes(&round, FiringOutcome::Missed), downtime()[..9]);
    assert_eq!(jobs(&pool).await, 2);
    // Restarted again at the same time: nothing is due after the catch-up.
    let again = Scheduler::new(queue.clone(), vec![minutely(Missed::Latest)]).unwrap();
    assert!(again.tick(at(T + 630)).await.unwrap().is_empty());
    assert_eq!(jobs(&pool).await, 2);
}

backends!(fn all_enqueues_every_missed_firing_up_to_its_limit);
async fn all_enqueues_every_missed_firing_up_to_its_limit<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("periodic_all").await else {
        return;
    };
    let round = after_downtime(&queue, Missed::All { limit: 100 }).await;
    assert_eq!(outcomes(&round, FiringOutcome::Enqueued), downtime());
    assert!(outcomes(&round, FiringOutcome::Missed).is_empty());
    assert_eq!(jobs(&pool).await, 11);

    let Some((pool, queue)) = setup::<DB>("periodic_all_limit").await else {
        return;
    };
    let round = after_downtime(&queue, Missed::All { limit: 3 }).await;
    assert_eq!(outcomes(&round, FiringOutcome::Enqueued), downtime()[7..]);
    assert_eq!(outcomes(&round, FiringOutcome::Missed), downtime()[..7]);
    assert_eq!(jobs(&pool).await, 4);
}

// No leader: three schedulers tick the same firings at once; each firing is one job, and the
// schedule's row names the last one.
backends!(fn schedulers_running_together_enqueue_each_firing_once);
async fn schedulers_running_together_enqueue_each_firing_once<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("periodic_together").await else {
        return;
    };
    let schedule = || {
        Periodic::new(
            "every-second",
            "* * * * * *",
            "credit",
            &json!({"order": 1, "amount": 5}),
        )
        .unwrap()
        .missed(Missed::All { limit: 1000 })
    };
    let schedulers: Vec<Scheduler<DB>> = (0..3)
        .map(|_| Scheduler::new(queue.clone(), vec![schedule()]).unwrap())
        .collect();
    schedulers[0].migrate().await.unwrap();
    schedulers[0].register(at(T)).await.unwrap();
    let mut enqueued = Vec::new();
    let mut taken = 0;
    for second in 1..=20 {
        let now = at(T + second);
        let rounds = futures::future::join_all(schedulers.iter().map(|s| s.tick(now))).await;
        for round in rounds {
            let round = round.unwrap();
            enqueued.extend(outcomes(&round, FiringOutcome::Enqueued));
            taken += outcomes(&round, FiringOutcome::AlreadyEnqueued).len();
        }
    }
    enqueued.sort_unstable();
    assert_eq!(enqueued, (1..=20).map(|s| T + s).collect::<Vec<_>>());
    // A scheduler that reads the row after another recorded the firing has nothing due; one
    // that read it before finds the key taken.
    assert!(taken <= 40, "{taken}");
    assert_eq!(jobs(&pool).await, 20);
    let keys = DB::count(
        &pool,
        "select count(distinct job_key) from jobguard_jobs where job_key like 'periodic:every-second:%'",
    )
    .await;
    assert_eq!(keys, 20);
    let status = Scheduler::status(&queue, at(T + 20)).await.unwrap();
    assert_eq!(status.len(), 1);
    assert_eq!(status[0].last_fired_at, Some(T + 20));
    assert_eq!(status[0].next_firing, Some(T + 21));
    assert_eq!(status[0].last_job_state.as_deref(), Some("available"));
}

// The worker runs the firings' jobs under the guard: each applies once, and a completed
// firing keeps its key, so a scheduler that comes back does not enqueue it again.
backends!(fn a_completed_firing_is_not_enqueued_again);
async fn a_completed_firing_is_not_enqueued_again<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("periodic_completed").await else {
        return;
    };
    let scheduler =
        Scheduler::new(queue.clone(), vec![minutely(Missed::All { limit: 100 })]).unwrap();
    scheduler.migrate().await.unwrap();
    scheduler.register(at(T - 1)).await.unwrap();
    scheduler.tick(at(T + 121)).await.unwrap();
    let worker = Worker::with_config(queue.clone(), draining())
        .unwrap()
        .register::<Credit>();
    let stats = worker.run(std::future::pending()).await.unwrap();
    assert_eq!(stats.applied, 3);
    // A scheduler that forgot everything (its row gone) fires the same times again: the keys
    // are held by the completed jobs.
    let mut conn = pool.acquire().await.unwrap();
    DB::execute(&mut conn, "delete from jobguard_jobs_schedules")
        .await
        .unwrap();
    drop(conn);
    let forgetful =
        Scheduler::new(queue.clone(), vec![minutely(Missed::All { limit: 100 })]).unwrap();
    forgetful.register(at(T - 1)).await.unwrap();
    let round = forgetful.tick(at(T + 121)).await.unwrap();
    assert_eq!(
        outcomes(&round, FiringOutcome::AlreadyEnqueued),
        [T, T + 60, T + 120]
    );
    assert_eq!(jobs(&pool).await, 3);
    let status = Scheduler::status(&queue, at(T + 121)).await.unwrap();
    assert_eq!(status[0].last_job_state.as_deref(), Some("completed"));
}

// A scheduler reads the schedule's row and stalls before it fires (a paused process, a slow
// connection) while another fires the same time, a worker completes its job and the prune
// deletes the completed row: the firing's key is free again, yet the stalled scheduler, once
// it goes on, does not enqueue the firing a second time. The schedule's row remembers it.
backends!(fn a_stalled_scheduler_does_not_fire_again_what_was_completed_and_pruned);
async fn a_stalled_scheduler_does_not_fire_again_what_was_completed_and_pruned<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("periodic_stalled").await else {
        return;
    };
    let (stalled_at, resume) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let stalled = {
        let (stalled_at, resume) = (Arc::clone(&stalled_at), Arc::clone(&resume));
        Scheduler::new(queue.clone(), vec![minutely(Missed::All { limit: 100 })])
            .unwrap()
            .before_fire(move |_, _| {
                let (stalled_at, resume) = (Arc::clone(&stalled_at), Arc::clone(&resume));
                Box::pin(async move {
                    stalled_at.notify_one();
                    resume.notified().await;
                })
            })
    };
    stalled.migrate().await.unwrap();
    stalled.register(at(T - 1)).await.unwrap();
    let stalled_round = tokio::spawn(async move { stalled.tick(at(T + 1)).await });
    stalled_at.notified().await;

    let other = Scheduler::new(queue.clone(), vec![minutely(Missed::All { limit: 100 })]).unwrap();
    let round = other.tick(at(T + 1)).await.unwrap();
    assert_eq!(outcomes(&round, FiringOutcome::Enqueued), [T]);
    let worker = Worker::with_config(queue.clone(), draining())
        .unwrap()
        .register::<Credit>();
    assert_eq!(worker.run(std::future::pending()).await.unwrap().applied, 1);
    let guard = queue.guard(Default::default()).unwrap();
    let config = draining();
    let retention = RetentionConfig {
        keep_completed: Duration::ZERO,
        ..RetentionConfig::default()
    }
    .validate(&config.retry, config.lease)
    .unwrap();
    let pruned = Pruner::new(&guard, retention)
        .jobs(&queue)
        .run()
        .await
        .unwrap();
    assert_eq!(pruned.map(|report| report.completed_jobs), Some(1));
    assert_eq!(
        jobs(&pool).await,
        0,
        "the firing's completed job was pruned"
    );

    resume.notify_one();
    let round = stalled_round.await.unwrap().unwrap();
    assert_eq!(outcomes(&round, FiringOutcome::Enqueued), Vec::<i64>::new());
    assert_eq!(outcomes(&round, FiringOutcome::AlreadyEnqueued), [T]);
    assert_eq!(jobs(&pool).await, 0, "the firing was not enqueued again");
    assert_eq!(ledger_rows(&pool).await, 1);
}

// Europe/Paris: 2026-03-29 02:00 CET jumps to 03:00 CEST; 2026-10-25 03:00 CEST falls back to
// 02:00 CET. Each firing croner gives is enqueued once, keyed by its UTC instant.
backends!(fn firings_around_a_daylight_saving_change_are_croners_each_once);
async fn firings_around_a_daylight_saving_change_are_croners_each_once<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("periodic_dst").await else {
        return;
    };
    let paris = |name: &str, cron: &str| {
        Periodic::new(name, cron, "credit", &json!({"order": 1, "amount": 5}))
            .unwrap()
            .zone("Europe/Paris")
            .unwrap()
            .missed(Missed::All { limit: 1000 })
    };
    // 2026-03-28T12:00Z and 2026-10-24T12:00Z, a day around each change.
    let (spring, autumn) = (1_774_699_200, 1_792_843_200);
    let day = 86_400;
    let fixed = paris("fixed", "30 2 * * *");
    // The skipped 02:30 fires at 03:00 CEST (01:00Z); the repeated 02:30 fires once, at the
    // first pass (CEST, 00:30Z).
    assert_eq!(fixed.firings(spring, spring + day), [1_774_746_000]);
    assert_eq!(fixed.firings(autumn, autumn + day), [1_792_888_200]);
    let half_hourly = paris("half-hourly", "0,30 * * * *");
    // Spring: no 02:00 or 02:30 that night; 01:30 CET (00:30Z) is followed by 03:00 CEST
    // (01:00Z). Autumn: 02:00 CEST (00:00Z), 02:30 CEST, then 02:00 CET (01:00Z) and 02:30
    // CET. Either way one firing every 30 minutes of UTC, none twice.
    let spring_firings = half_hourly.firings(spring, spring + day);
    assert!(spring_firings.contains(&1_774_744_200) && spring_firings.contains(&1_774_746_000));
    let autumn_firings = half_hourly.firings(autumn, autumn + day);
    for firings in [&spring_firings, &autumn_firings] {
        assert!(firings.windows(2).all(|w| w[1] - w[0] == 1800));
        assert_eq!(firings.len(), 48);
    }
    assert!((0..4).all(|n| autumn_firings.contains(&(1_792_886_400 + n * 1800))));

    let scheduler = Scheduler::new(queue.clone(), vec![fixed, half_hourly]).unwrap();
    scheduler.migrate().await.unwrap();
    scheduler.register(at(autumn)).await.unwrap();
    // A tick every 10 minutes of the autumn day, twice each: every firing once.
    let mut enqueued = Vec::new();
    for step in 1..=(day / 600) {
        for _ in 0..2 {
            let round = scheduler.tick(at(autumn + step * 600)).await.unwrap();
            enqueued.extend(
                round
                    .iter()
                    .filter(|f| f.outcome == FiringOutcome::Enqueued)
                    .map(|f| (f.schedule.clone(), f.at)),
            );
        }
    }
    let mut expected: Vec<(String, i64)> = autumn_firings
        .iter()
        .map(|&t| ("half-hourly".to_owned(), t))
        .chain([("fixed".to_owned(), 1_792_888_200)])
        .collect();
    expected.sort();
    enqueued.sort();
    assert_eq!(enqueued, expected);
    assert_eq!(jobs(&pool).await, 49);
}

// Bad input is refused naming the schedule, before anything is enqueued.
backends!(fn bad_schedules_are_refused_at_start);
async fn bad_schedules_are_refused_at_start<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("periodic_bad").await else {
        return;
    };
    let invalid = |error: Error, name: &str, says: &str| match &error {
        Error::InvalidSchedule { schedule, reason } => {
            assert_eq!(schedule, name);
            assert!(reason.contains(says), "{error}");
        }
        other => panic!("{other}"),
    };
    let payload = json!({"order": 1, "amount": 5});
    invalid(
        Periodic::new("nightly", "at 3", "credit", &payload).unwrap_err(),
        "nightly",
        "not a cron expression",
    );
    invalid(
        Periodic::new("nightly", "0 3 * * *", "credit", &payload)
            .unwrap()
            .zone("Europe/Atlantis")
            .unwrap_err(),
        "nightly",
        "unknown time zone `Europe/Atlantis`",
    );
    for (schedule, says) in [
        (
            Periodic::new("unknown-kind", "* * * * * *", "email", &payload).unwrap(),
            "unknown job kind `email`",
        ),
        (
            Periodic::new(
                "bad-payload",
                "* * * * * *",
                "credit",
                &json!({"order": "x"}),
            )
            .unwrap(),
            "does not deserialize into a `credit` job",
        ),
    ] {
        let name = schedule.name().to_owned();
        let worker = Worker::with_config(queue.clone(), draining())
            .unwrap()
            .register::<Credit>()
            .schedule(schedule);
        worker.migrate().await.unwrap();
        invalid(
            worker.run(std::future::pending()).await.unwrap_err(),
            &name,
            says,
        );
    }
    assert_eq!(jobs(&pool).await, 0);
}
