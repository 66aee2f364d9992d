//! Guard, job and step retention's conformance suite, on every backend (`backends!`).

use std::ops::ControlFlow;
use std::time::Duration;

use jobguard::retention::{PruneConfig, PruneSchedule, Pruner, Retention, RetentionConfig};
use jobguard::steps::{Reconciled, Steps};
use jobguard::{Error, Guard, JobError, JobKey, Queue, Worker, WorkerConfig};

use super::{Aging, DAY};
use crate::common::{Credit, draining, guard_rows, ledger_rows, setup};

pub(super) async fn drain<DB: Aging>(queue: &Queue<DB>) -> jobguard::WorkerStats {
    let worker = Worker::with_config(queue.clone(), draining())
        .unwrap()
        .register::<Credit>();
    tokio::time::timeout(Duration::from_secs(60), worker.run(std::future::pending()))
        .await
        .expect("the worker drained the queue in time")
        .unwrap()
}

/// The worker's retention: `config` checked against the draining worker's horizon.
pub(super) fn retention(config: RetentionConfig) -> Retention {
    let worker = draining();
    config.validate(&worker.retry, worker.lease).unwrap()
}

backends!(fn a_retention_shorter_than_the_horizon_is_refused_unless_overridden);
async fn a_retention_shorter_than_the_horizon_is_refused_unless_overridden<DB: Aging>() {
    let Some((pool, queue)) = setup::<DB>("retention_refused").await else {
        return;
    };
    queue
        .enqueue_job(&Credit {
            order: 1,
            amount: 500,
        })
        .await
        .unwrap();
    let short = RetentionConfig {
        keep: Duration::from_secs(3600),
        ..RetentionConfig::default()
    };
    let config = WorkerConfig {
        retention: short.clone(),
        ..draining()
    };
    let expected = short.horizon(&config.retry, config.lease);
    // No retries to speak of (a zero backoff), ten 30-second leases, the 7-day replay window,
    // and the replayed job's ten leases again.
    assert_eq!(expected.total(), 7 * DAY + Duration::from_secs(600));

    let worker = Worker::with_config(queue.clone(), config.clone())
        .unwrap()
        .register::<Credit>();
    let error = worker.run(std::future::pending()).await.unwrap_err();
    let Error::RetentionTooShort {
        retention,
        horizon,
        breakdown,
    } = &error
    else {
        panic!("{error:?}");
    };
    assert_eq!(
        (*retention, *horizon),
        (Duration::from_secs(3600), expected.total())
    );
    assert_eq!(breakdown, &expected.to_string());
    let message = error.to_string();
    for needle in [
        "guard retention 1h is shorter",
        "replay window 7d",
        "at least 7d 10m",
        "override",
    ] {
        assert!(
            message.contains(needle),
            "{needle:?} missing from: {message}"
        );
    }
    assert_eq!(
        queue.counts().await.unwrap().available,
        1,
        "the worker did not start"
    );
    assert_eq!(ledger_rows(&pool).await, 0);
    // Nor can a pruner be built with it.
    assert!(matches!(
        short.validate(&config.retry, config.lease),
        Err(Error::RetentionTooShort { .. })
    ));

    let overridden = WorkerConfig {
        retention: RetentionConfig {
            override_horizon: true,
            ..short
        },
        ..config
    };
    let worker = Worker::with_config(queue.clone(), overridden)
        .unwrap()
        .register::<Credit>();
    assert!(worker.retention().unwrap().is_overridden());
    let stats = worker.run(std::future::pending()).await.unwrap();
    assert_eq!(stats.applied, 1);
}

backends!(fn pruning_deletes_old_rows_in_batches_and_keeps_the_rest);
async fn pruning_deletes_old_rows_in_batches_and_keeps_the_rest<DB: Aging>() {
    let Some(pool) = DB::open("retention_batches", 4).await else {
        return;
    };
    let guard = Guard::<DB>::new(pool.clone());
    guard.migrate().await.unwrap();
    for order in 0..20 {
        let key = JobKey::new("credit", [format!("order-{order}")]).unwrap();
        let outcome = guard
            .run(&key, async |conn| Ok(DB::insert_ledger(conn, 7, 1).await?))
            .await;
        assert!(outcome.unwrap().is_applied());
    }
    DB::insert_guard_rows(&pool, "old", 250, 30 * DAY).await;
    // One day short of the retention: kept.
    DB::insert_guard_rows(&pool, "young", 7, 13 * DAY).await;
    assert_eq!(guard_rows(&pool).await, 277);

    let pruner = Pruner::new(&guard, retention(RetentionConfig::default()))
        .batch(100)
        .pause(Duration::ZERO);
    let plan = pruner.plan().await.unwrap();
    assert_eq!((plan.guard_rows, plan.step_rows), (250, 0));
    assert!(plan.oldest_age.unwrap() > 29 * DAY, "{plan:?}");
    assert_eq!(guard_rows(&pool).await, 277, "planning deletes nothing");

    let mut seen = Vec::new();
    let report = pruner
        .run_with(|progress| {
            seen.push(progress.guard_rows);
            ControlFlow::Continue(())
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!((report.guard_rows, report.batches), (250, 3), "{report:?}");
    assert_eq!(seen, [100, 200, 250]);
    let oldest = report.oldest_age.unwrap();
    assert!(
        oldest > 12 * DAY && oldest < 14 * DAY,
        "the 13-day-old rows are the oldest: {oldest:?}"
    );
    assert_eq!(guard_rows(&pool).await, 27);
    assert_eq!(pruner.plan().await.unwrap().guard_rows, 0);

    // Stopped after its first batch, a run keeps what it deleted.
    DB::insert_guard_rows(&pool, "old", 250, 30 * DAY).await;
    let report = pruner
        .run_with(|_| ControlFlow::Break(()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((report.guard_rows, report.batches), (100, 1));
    assert_eq!(guard_rows(&pool).await, 177);
}

/// Steps by state: done, started, attention.
async fn step_states<DB: Aging>(pool: &sqlx::Pool<DB>) -> (i64, i64, i64) {
    (
        DB::count(
            pool,
            "select count(*) from jobguard_steps where state = 'done'",
        )
        .await,
        DB::count(
            pool,
            "select count(*) from jobguard_steps where state = 'started'",
        )
        .await,
        DB::count(
            pool,
            "select count(*) from jobguard_steps where state = 'attention'",
        )
        .await,
    )
}

backends!(fn done_steps_are_pruned_and_started_or_attention_steps_survive);
async fn done_steps_are_pruned_and_started_or_attention_steps_survive<DB: Aging>() {
    let Some(pool) = DB::open("retention_steps", 4).await else {
        return;
    };
    let guard = Guard::<DB>::new(pool.clone());
    guard.migrate().await.unwrap();
    let steps = Steps::<DB>::new(pool.clone());
    steps.migrate().await.unwrap();
    let key = |n: &str| JobKey::new("payout", [n]).unwrap();

    // done
    let done = steps
        .run(
            &key("p-1"),
            "transfer",
            async || Ok("tr-1".to_owned()),
            async || Ok(Reconciled::NotDone),
        )
        .await
        .unwrap();
    assert!(done.called());
    // started, its caller still in the call (its future is dropped mid-call, as a crash would)
    let p2 = key("p-2");
    let in_call = steps.run(
        &p2,
        "transfer",
        async || {
            std::future::pending::<()>().await;
            Ok("never".to_owned())
        },
        async || Ok(Reconciled::NotDone),
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(200), in_call)
            .await
            .is_err()
    );
    // attention: the call failed, then the reconciler could not tell
    let failed = steps
        .run(
            &key("p-3"),
            "transfer",
            async || Err::<String, _>(JobError::msg("timed out")),
            async || Ok(Reconciled::NotDone),
        )
        .await;
    assert!(failed.is_err());
    let unknown = steps
        .run(
            &key("p-3"),
            "transfer",
            async || Ok("tr-3".to_owned()),
            async || Ok(Reconciled::Unknown("the lookup is down".into())),
        )
        .await;
    assert!(
        matches!(unknown, Err(Error::StepNeedsAttention { .. })),
        "{unknown:?}"
    );

    // All three a month old, and one more done step from today.
    DB::age_steps(&pool, 30 * DAY).await;
    steps
        .run(
            &key("p-4"),
            "transfer",
            async || Ok("tr-4".to_owned()),
            async || Ok(Reconciled::NotDone),
        )
        .await
        .unwrap();
    assert_eq!(step_states::<DB>(&pool).await, (2, 1, 1));

    let pruner = Pruner::new(&guard, retention(RetentionConfig::default())).steps(steps.clone());
    assert_eq!(pruner.plan().await.unwrap().step_rows, 1);
    let report = pruner.run().await.unwrap().unwrap();
    assert_eq!(report.step_rows, 1, "{report:?}");
    assert_eq!(
        step_states::<DB>(&pool).await,
        (1, 1, 1),
        "only the month-old done step went"
    );
    let attention = steps.attention(10).await.unwrap();
    assert_eq!(attention.len(), 1);
    assert_eq!(attention[0].key, "payout:p-3");
}

backends!(fn a_second_pruner_skips_while_the_first_runs);
/// Only one pruner runs on a table at a time: a second pruner on its own pool (on PostgreSQL,
/// another session, as another process would be) asked while the first is between batches
/// finds the table taken and deletes nothing; once the first is done, it runs.
async fn a_second_pruner_skips_while_the_first_runs<DB: Aging>() {
    let Some(pool) = DB::open("retention_one_pruner", 4).await else {
        return;
    };
    let guard = Guard::<DB>::new(pool.clone());
    guard.migrate().await.unwrap();
    DB::insert_guard_rows(&pool, "old", 30, 30 * DAY).await;
    let other_pool = sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(2)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let other_guard = Guard::<DB>::new(other_pool);
    let first = Pruner::new(&guard, retention(RetentionConfig::default()))
        .batch(10)
        .pause(Duration::ZERO);
    let second = Pruner::new(&other_guard, retention(RetentionConfig::default()));

    let mut meanwhile = None;
    let report = first
        .run_with(|_| {
            if meanwhile.is_none() {
                let handle = tokio::runtime::Handle::current();
                meanwhile = Some(tokio::task::block_in_place(|| {
                    handle.block_on(second.run())
                }));
            }
            ControlFlow::Continue(())
        })
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(meanwhile, Some(Ok(None))), "{meanwhile:?}");
    assert_eq!(report.guard_rows, 30);
    let after = second.run().await.unwrap();
    assert_eq!(
        after.map(|report| report.guard_rows),
        Some(0),
        "the table is free again"
    );
}

backends!(fn two_workers_prune_on_schedule_one_at_a_time);
/// Two workers prune on a schedule that fires every second; each prune of the 300 old rows
/// takes at least three seconds (30 batches, 100 ms apart). Whichever worker starts first holds
/// the table, and the other's rounds meanwhile are skipped instead of pruning alongside.
async fn two_workers_prune_on_schedule_one_at_a_time<DB: Aging>() {
    let Some((pool, queue)) = setup::<DB>("retention_two_workers").await else {
        return;
    };
    DB::insert_guard_rows(&pool, "old", 300, 30 * DAY).await;
    let other_pool = sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(8)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let config = WorkerConfig {
        concurrency: 2,
        poll_interval: Duration::from_millis(50),
        prune: PruneConfig {
            schedule: Some(PruneSchedule::new("* * * * * *").unwrap()),
            batch: 10,
            pause: Duration::from_millis(100),
            steps: None,
        },
        ..WorkerConfig::default()
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut running = Vec::new();
    for queue in [queue.clone(), Queue::new(other_pool)] {
        let worker = Worker::with_config(queue, config.clone())
            .unwrap()
            .register::<Credit>();
        let mut stopped = stopped.clone();
        running.push(tokio::spawn(worker.run(async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        })));
    }
    // The workers run jobs meanwhile.
    queue
        .enqueue_job(&Credit {
            order: 1,
            amount: 500,
        })
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while DB::count(
        &pool,
        "select count(*) from processed_jobs where kind = 'old'",
    )
    .await
        > 0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the old rows were never pruned"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.send(true).unwrap();
    let mut stats = Vec::new();
    for worker in running {
        stats.push(worker.await.unwrap().unwrap());
    }
    let pruned: u64 = stats.iter().map(|s| s.pruned).sum();
    let skipped: u64 = stats.iter().map(|s| s.prunes_skipped).sum();
    let applied: u64 = stats.iter().map(|s| s.applied).sum();
    assert_eq!(pruned, 300, "{stats:?}");
    assert!(
        skipped >= 1,
        "no round found the table taken: both pruned at once? {stats:?}"
    );
    assert_eq!(applied, 1, "{stats:?}");
    assert_eq!(ledger_rows(&pool).await, 1);
}

backends!(fn finished_jobs_are_pruned_after_their_retention_and_live_ones_stay);
/// Completed jobs go after `keep_completed` and dead ones after `keep_dead`, by when they
/// finished, in batches; jobs that wait or run stay whatever their age, and so do finished
/// jobs younger than their retention.
async fn finished_jobs_are_pruned_after_their_retention_and_live_ones_stay<DB: Aging>() {
    let Some((pool, queue)) = setup::<DB>("retention_jobs").await else {
        return;
    };
    for order in 1..=4 {
        queue
            .enqueue_job(&Credit { order, amount: 100 })
            .await
            .unwrap();
    }
    assert_eq!(drain::<DB>(&queue).await.applied, 4);
    // A dead job, and a job that waits (scheduled for tomorrow).
    let dead = queue
        .enqueue_job(&Credit {
            order: 5,
            amount: 100,
        })
        .await
        .unwrap();
    let leased = queue
        .fetch("default", 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(leased[0].lease.job_id, dead.id);
    queue
        .dead_letter(leased[0].lease, "dead-lettered by hand")
        .await
        .unwrap();
    let waiting = jobguard::queue::NewJob::new(
        JobKey::new("credit", ["order-6"]).unwrap(),
        &Credit {
            order: 6,
            amount: 100,
        },
    )
    .unwrap()
    .kind("credit")
    .unwrap()
    .delay(DAY);
    queue.enqueue(&waiting).await.unwrap();
    // Every job two days older: finished two days ago, or created two days ago.
    DB::age_jobs(&pool, 2 * DAY).await;
    // One fresh completed job.
    queue
        .enqueue_job(&Credit {
            order: 7,
            amount: 100,
        })
        .await
        .unwrap();
    assert_eq!(drain::<DB>(&queue).await.applied, 1);

    let config = RetentionConfig {
        keep_completed: DAY,
        keep_dead: 3 * DAY,
        ..RetentionConfig::default()
    };
    // A dead-job retention shorter than the replay window is refused.
    let short = RetentionConfig {
        keep_dead: DAY,
        ..config.clone()
    };
    let worker = draining();
    let error = short.validate(&worker.retry, worker.lease).unwrap_err();
    assert!(
        matches!(error, Error::DeadRetentionTooShort { .. }),
        "{error:?}"
    );
    let config = RetentionConfig {
        replay_window: DAY,
        ..config
    };

    let guard = queue.guard(Default::default()).unwrap();
    let pruner = Pruner::new(&guard, retention(config.clone()))
        .jobs(&queue)
        .batch(3)
        .pause(Duration::ZERO);
    let plan = pruner.plan().await.unwrap();
    assert_eq!((plan.completed_jobs, plan.dead_jobs), (4, 0), "{plan:?}");
    let report = pruner.run().await.unwrap().unwrap();
    assert_eq!(
        (report.completed_jobs, report.dead_jobs),
        (4, 0),
        "{report:?}"
    );
    // Batches of three: guard 1, then completed 3 + 1, then dead 1.
    assert_eq!(report.batches, 4, "{report:?}");
    let counts = queue.counts().await.unwrap();
    assert_eq!(
        (counts.available, counts.completed, counts.dead),
        (1, 1, 1),
        "{counts:?}"
    );

    // Two days more: the dead job is past three days; the fresh completed job is past one.
    DB::age_jobs(&pool, 2 * DAY).await;
    let report = pruner.run().await.unwrap().unwrap();
    assert_eq!(
        (report.completed_jobs, report.dead_jobs),
        (1, 1),
        "{report:?}"
    );
    let counts = queue.counts().await.unwrap();
    assert_eq!(
        (counts.available, counts.completed, counts.dead),
        (1, 0, 0),
        "{counts:?}"
    );
    assert_eq!(
        ledger_rows(&pool).await,
        5,
        "pruning jobs touches no effect"
    );

    // Zero keeps no completed job at all; the guard still remembers every key.
    queue
        .enqueue_job(&Credit {
            order: 8,
            amount: 100,
        })
        .await
        .unwrap();
    assert_eq!(drain::<DB>(&queue).await.applied, 1);
    let now = RetentionConfig {
        keep_completed: Duration::ZERO,
        ..config
    };
    let report = Pruner::new(&guard, retention(now))
        .jobs(&queue)
        .run()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(report.completed_jobs, 1, "{report:?}");
    assert_eq!(queue.counts().await.unwrap().completed, 0);
    assert_eq!(guard_rows(&pool).await, 6);
    queue
        .enqueue_job(&Credit {
            order: 8,
            amount: 100,
        })
        .await
        .unwrap();
    let stats = drain::<DB>(&queue).await;
    assert_eq!(
        (stats.applied, stats.duplicates),
        (0, 1),
        "the guard row stops it: {stats:?}"
    );
}

backends!(fn the_scheduled_prune_deletes_finished_jobs);
/// The worker's scheduled prune deletes finished jobs too.
async fn the_scheduled_prune_deletes_finished_jobs<DB: Aging>() {
    let Some((pool, queue)) = setup::<DB>("retention_scheduled_jobs").await else {
        return;
    };
    for order in 1..=3 {
        queue
            .enqueue_job(&Credit { order, amount: 100 })
            .await
            .unwrap();
    }
    let config = WorkerConfig {
        concurrency: 2,
        poll_interval: Duration::from_millis(50),
        retention: RetentionConfig {
            // Not zero: with zero the worker deletes completed rows itself as it completes
            // them (on PostgreSQL), and the prune would have nothing to do.
            keep_completed: Duration::from_millis(1),
            ..RetentionConfig::default()
        },
        prune: PruneConfig {
            schedule: Some(PruneSchedule::new("* * * * * *").unwrap()),
            ..PruneConfig::default()
        },
        ..WorkerConfig::default()
    };
    let worker = Worker::with_config(queue.clone(), config)
        .unwrap()
        .register::<Credit>();
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(worker.run(async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    }));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let counts = queue.counts().await.unwrap();
        let applied = ledger_rows(&pool).await;
        if applied == 3 && counts.completed == 0 && counts.available == 0 && counts.running == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never pruned: {counts:?}, {applied} applied"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.send(true).unwrap();
    let stats = running.await.unwrap().unwrap();
    assert_eq!(stats.applied, 3, "{stats:?}");
    assert_eq!(
        DB::count(&pool, "select count(*) from jobguard_jobs").await,
        0
    );
}

backends!(fn counts_stay_bounded_on_a_large_table);
/// Finished jobs above the cap are estimated, live ones counted exactly, and the finished
/// states are read from their own index (the plan never reads the whole table).
async fn counts_stay_bounded_on_a_large_table<DB: Aging>() {
    let Some((pool, queue)) = setup::<DB>("retention_counts").await else {
        return;
    };
    let cap = jobguard::queue::TERMINAL_COUNT_CAP;
    DB::insert_finished_jobs(&pool, "completed", cap + 5_000).await;
    DB::insert_finished_jobs(&pool, "dead", 3).await;
    queue
        .enqueue_job(&Credit {
            order: 1,
            amount: 100,
        })
        .await
        .unwrap();
    DB::analyze(&pool).await;
    let counts = queue.counts().await.unwrap();
    assert_eq!(
        (counts.available, counts.running, counts.dead),
        (1, 0, 3),
        "{counts:?}"
    );
    assert!(counts.is_estimated(), "{counts:?}");
    assert!(counts.completed >= cap, "{counts:?}");
    assert!(counts.completed < 2 * cap, "{counts:?}");

    let plan = DB::explain(&pool, queue.counts_statement()).await;
    assert!(
        !DB::full_scan(&plan),
        "a state is counted by scanning the table:\n{plan}"
    );
}
