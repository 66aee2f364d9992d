//! What the worker does with each job: applied once, a duplicate, retried then dead-lettered,
//! rescued at the attempt limit, refused when its kind or payload is unknown, replayed.

use super::*;

backends!(fn every_job_is_applied_once_and_completed);
async fn every_job_is_applied_once_and_completed<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_every_job_once").await else {
        return;
    };
    for order in 0..100 {
        let credit = Credit { order, amount: 500 };
        assert!(queue.enqueue_job(&credit).await.unwrap().inserted);
        // The producer enqueues the same work again from another code path.
        assert!(!queue.enqueue_job(&credit).await.unwrap().inserted);
    }
    let stats = drain::<DB>(&queue).await;
    assert_eq!(
        (stats.applied, stats.duplicates, stats.failed, stats.dead),
        (100, 0, 0, 0)
    );
    assert_eq!(ledger_rows(&pool).await, 100);
    assert_eq!(ledger_total(&pool).await, 100 * 500);
    assert_eq!(guard_rows(&pool).await, 100);
    let counts = queue.counts().await.unwrap();
    assert_eq!(
        (counts.completed, counts.available, counts.running),
        (100, 0, 0)
    );
}

backends!(fn a_key_already_applied_completes_as_a_duplicate);
async fn a_key_already_applied_completes_as_a_duplicate<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_duplicate").await else {
        return;
    };
    let credit = Credit {
        order: 1,
        amount: 500,
    };
    // Applied once already, say by an earlier job whose completion was lost.
    let guard = queue.guard(Default::default()).unwrap();
    let payload = serde_json::to_value(&credit).unwrap();
    let outcome = guard
        .run_with_payload(
            &<Credit as Job<DB>>::key(&credit).unwrap(),
            &payload,
            async |conn| {
                DB::insert_ledger(conn, 7, 500).await?;
                Ok(())
            },
        )
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Applied(())));

    queue.enqueue_job(&credit).await.unwrap();
    let stats = drain::<DB>(&queue).await;
    assert_eq!((stats.applied, stats.duplicates), (0, 1));
    assert_eq!(
        ledger_rows(&pool).await,
        1,
        "the effect was not applied again"
    );
    assert_eq!(queue.counts().await.unwrap().completed, 1);
}

backends!(fn failures_retry_then_dead_letter_and_roll_back_their_effect);
async fn failures_retry_then_dead_letter_and_roll_back_their_effect<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_failures").await else {
        return;
    };
    let retryable = NewJob::from_job::<DB, _>(&Flaky {
        order: 1,
        fatal: false,
        panic: false,
    })
    .unwrap()
    .max_attempts(3);
    let fatal = NewJob::from_job::<DB, _>(&Flaky {
        order: 2,
        fatal: true,
        panic: false,
    })
    .unwrap();
    let panics = NewJob::from_job::<DB, _>(&Flaky {
        order: 3,
        fatal: false,
        panic: true,
    })
    .unwrap()
    .max_attempts(2);
    for job in [&retryable, &fatal, &panics] {
        queue.enqueue(job).await.unwrap();
    }
    let stats = drain::<DB>(&queue).await;
    // 2 retries + 1 dead for the retryable job, 1 dead for the fatal one, 1 retry + 1 dead for
    // the panicking one.
    assert_eq!(
        (stats.failed, stats.dead, stats.applied),
        (3, 3, 0),
        "{stats:?}"
    );
    assert_eq!(
        ledger_rows(&pool).await,
        0,
        "every failed attempt rolled back its effect"
    );
    assert_eq!(guard_rows(&pool).await, 0, "and its guard row");

    let dead = queue.list(Some(JobState::Dead), None, 10).await.unwrap();
    assert_eq!(dead.len(), 3);
    let error_of = |order: &str| {
        dead.iter()
            .find(|j| j.key.ends_with(order))
            .unwrap()
            .last_error
            .clone()
            .unwrap()
    };
    assert!(error_of("order-1").contains("timed out"), "{dead:?}");
    assert!(
        error_of("order-2").contains("order 2 does not exist"),
        "{dead:?}"
    );
    assert!(error_of("order-3").contains("panicked"), "{dead:?}");
    let attempts: Vec<i32> = dead.iter().map(|j| j.attempt).collect();
    assert!(
        attempts.contains(&3) && attempts.contains(&1) && attempts.contains(&2),
        "{attempts:?}"
    );
}

backends!(fn rescue_stops_at_the_retry_policys_attempt_limit_as_failure_does);
/// A job whose lease expired is out of attempts at the same limit as a job that failed: the
/// lesser of its own `max_attempts` and the worker's retry policy. A worker whose policy
/// allows one attempt dead-letters the rescued job instead of running it a second time.
async fn rescue_stops_at_the_retry_policys_attempt_limit_as_failure_does<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_rescue_policy_limit").await else {
        return;
    };
    // The job allows 10 attempts; the worker's policy allows 1.
    let job = NewJob::from_job::<DB, _>(&Credit {
        order: 1,
        amount: 500,
    })
    .unwrap()
    .max_attempts(10);
    queue.enqueue(&job).await.unwrap();
    // A worker that takes the job and dies: attempt 1 is spent, its lease runs out.
    let taken = queue
        .fetch("default", 1, Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    let expired = taken[0].leased_until + Duration::from_millis(50);
    while std::time::SystemTime::now() < expired {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let config = WorkerConfig {
        retry: jobguard::RetryPolicy {
            max_attempts: 1,
            base: Duration::ZERO,
            ..Default::default()
        },
        ..draining()
    };
    let worker = Worker::with_config(queue.clone(), config)
        .unwrap()
        .register::<Credit>();
    let stats = tokio::time::timeout(Duration::from_secs(60), worker.run(std::future::pending()))
        .await
        .expect("the worker stopped when idle")
        .unwrap();

    assert_eq!(stats.applied, 0, "the job got no second attempt: {stats:?}");
    assert_eq!(ledger_rows(&pool).await, 0);
    let dead = queue.list(Some(JobState::Dead), None, 10).await.unwrap();
    assert_eq!(
        dead.len(),
        1,
        "{:?}",
        queue.list(None, None, 10).await.unwrap()
    );
    assert_eq!(dead[0].attempt, 1);
    let error = dead[0].last_error.as_deref().unwrap();
    assert!(error.contains("the lease of attempt 1 expired"), "{error}");
}

backends!(fn unknown_kinds_when_asked_and_bad_payloads_are_dead_lettered_not_retried);
async fn unknown_kinds_when_asked_and_bad_payloads_are_dead_lettered_not_retried<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_bad_input").await else {
        return;
    };
    let unknown = NewJob::new(
        JobKey::new("refund", ["order-1"]).unwrap(),
        &json!({"x": 1}),
    )
    .unwrap();
    let malformed = NewJob::new(
        JobKey::new("credit", ["order-2"]).unwrap(),
        &json!({"order": "two"}),
    )
    .unwrap();
    queue.enqueue(&unknown).await.unwrap();
    queue.enqueue(&malformed).await.unwrap();
    // Only a worker told to dead-letter kinds it does not run fetches `refund` at all.
    let config = WorkerConfig {
        unknown_kinds: UnknownKinds::DeadLetter,
        ..draining()
    };
    let worker = Worker::with_config(queue.clone(), config)
        .unwrap()
        .register::<Credit>();
    let stats = tokio::time::timeout(Duration::from_secs(60), worker.run(std::future::pending()))
        .await
        .expect("the worker drained the queue in time")
        .unwrap();
    assert_eq!(
        (stats.dead, stats.failed, stats.applied),
        (2, 0, 0),
        "{stats:?}"
    );
    let dead = queue.list(Some(JobState::Dead), None, 10).await.unwrap();
    let errors: Vec<String> = dead.iter().filter_map(|j| j.last_error.clone()).collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("unknown job kind `refund`")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("does not deserialize into a `credit` job")),
        "{errors:?}"
    );
    assert_eq!(ledger_rows(&pool).await, 0);
}

backends!(fn replaying_a_dead_job_whose_key_the_guard_holds_is_a_duplicate);
async fn replaying_a_dead_job_whose_key_the_guard_holds_is_a_duplicate<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_replay").await else {
        return;
    };
    let credit = Credit {
        order: 5,
        amount: 500,
    };
    queue.enqueue_job(&credit).await.unwrap();
    assert_eq!(drain::<DB>(&queue).await.applied, 1);

    // The same work enqueued again and dead-lettered, e.g. by an operator or a broken worker.
    let second = queue.enqueue_job(&credit).await.unwrap();
    assert!(
        second.inserted,
        "the first job is completed, so this is a new job"
    );
    let leased = queue
        .fetch("default", 1, Duration::from_secs(30))
        .await
        .unwrap();
    queue
        .dead_letter(leased[0].lease, "dead-lettered by hand")
        .await
        .unwrap();

    assert_eq!(
        queue.replay(&Replay::Job(second.id)).await.unwrap(),
        vec![second.id]
    );
    let stats = drain::<DB>(&queue).await;
    assert_eq!((stats.applied, stats.duplicates), (0, 1), "{stats:?}");
    assert_eq!(ledger_rows(&pool).await, 1);
}

// A queue that keeps no completed job: on PostgreSQL the statement that completes a job
// deletes its row (the guard row is the record), except a job whose unique policy keeps its
// key while completed, whose row holds the key. Either way each key applies once, and a key
// enqueued again is a duplicate.
backends!(fn a_queue_keeping_no_completed_job_deletes_it_as_it_completes);
async fn a_queue_keeping_no_completed_job_deletes_it_as_it_completes<DB: TestDb>() {
    use jobguard::RetentionConfig;
    use jobguard::unique::{UniqueOpts, UniqueStates};

    let Some((pool, queue)) = setup::<DB>("worker_keeps_no_completed").await else {
        return;
    };
    let kept = UniqueOpts::new().states(
        "available,running,completed"
            .parse::<UniqueStates>()
            .unwrap(),
    );
    for order in 0..20 {
        let credit = Credit { order, amount: 5 };
        let job = NewJob::from_job::<DB, _>(&credit).unwrap();
        let job = if order < 5 { job.unique(kept) } else { job };
        assert!(queue.enqueue(&job).await.unwrap().inserted);
    }
    let config = WorkerConfig {
        retention: RetentionConfig {
            keep_completed: Duration::ZERO,
            ..RetentionConfig::default()
        },
        ..draining()
    };
    let stats = drain_with::<DB>(&queue, config.clone()).await;
    assert_eq!((stats.applied, stats.duplicates), (20, 0), "{stats:?}");
    assert_eq!(ledger_rows(&pool).await, 20);
    assert_eq!(guard_rows(&pool).await, 20);
    let counts = queue.counts().await.unwrap();
    let deleted = DB::BACKEND == "postgres";
    // SQLite keeps every completed row for the prune.
    assert_eq!(counts.completed, if deleted { 5 } else { 20 }, "{counts:?}");
    assert_eq!((counts.available, counts.running), (0, 0));
    // The unique jobs' rows still hold their keys; the others' keys enqueue again and are
    // duplicates by their guard rows.
    for order in 0..20 {
        let credit = Credit { order, amount: 5 };
        let job = NewJob::from_job::<DB, _>(&credit).unwrap();
        let job = if order < 5 { job.unique(kept) } else { job };
        let again = queue.enqueue(&job).await.unwrap();
        assert_eq!(again.inserted, order >= 5, "order {order}: {again:?}");
        if order < 5 {
            assert_eq!(again.existing_state, Some(JobState::Completed));
        }
    }
    let stats = drain_with::<DB>(&queue, config.clone()).await;
    assert_eq!((stats.applied, stats.duplicates), (0, 15), "{stats:?}");
    assert_eq!(ledger_rows(&pool).await, 20, "no effect applied twice");
    let counts = queue.counts().await.unwrap();
    assert_eq!(counts.completed, if deleted { 5 } else { 35 }, "{counts:?}");
}
