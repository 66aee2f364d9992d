//! Unique-job policies: the states that keep a key, the period and queue in the key, and what
//! a repeated enqueue does (return, reject, replace, replace or reject); enforced by the unique
//! indexes, so concurrent and transactional enqueues insert one job per key.

use jobguard::unique::{OnConflict, UniqueError, UniqueOpts, UniqueStates};

use super::*;

fn kept(states: &str) -> UniqueOpts {
    UniqueOpts::new().states(states.parse::<UniqueStates>().unwrap())
}

fn credit(order: usize, opts: UniqueOpts) -> NewJob {
    job("credit", order).unique(opts)
}

/// Fetches the one waiting job and completes it.
async fn run_to_completion<DB: TestDb>(pool: &Pool<DB>, queue: &Queue<DB>) -> i64 {
    let leased = fetch_one::<DB>(queue, LONG).await;
    complete::<DB>(pool, queue, leased.lease).await.unwrap();
    leased.lease.job_id
}

// Temporal's "reject duplicate" and "allow duplicate failed only", by the states kept.
backends!(fn a_completed_job_keeps_its_key_when_its_policy_says_so);
async fn a_completed_job_keeps_its_key_when_its_policy_says_so<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("unique_completed_keeps_key", 4).await else {
        return;
    };
    let opts = kept("available,running,completed");
    let first = queue.enqueue(&credit(1, opts)).await.unwrap();
    assert!(first.inserted);
    assert_eq!(run_to_completion(&pool, &queue).await, first.id);

    let again = queue.enqueue(&credit(1, opts)).await.unwrap();
    assert_eq!(
        (again.id, again.inserted, again.existing_state),
        (first.id, false, Some(JobState::Completed)),
        "the completed job keeps the key"
    );
    let rejected = queue
        .enqueue(&credit(1, opts.on_conflict(OnConflict::Reject)))
        .await
        .unwrap_err();
    assert!(
        matches!(&rejected, Error::EnqueueRejected { existing_id, state, .. }
            if *existing_id == first.id && state == "completed"),
        "{rejected}"
    );
    assert!(rejected.to_string().contains(&format!("job {}", first.id)));
    // Replace leaves a finished job as it is.
    let replace = queue
        .enqueue(&credit(1, opts.on_conflict(OnConflict::Replace)))
        .await
        .unwrap();
    assert_eq!((replace.id, replace.replaced), (first.id, false));
    // An enqueue without a policy ignores finished jobs, as before.
    let plain = queue.enqueue(&job("credit", 1)).await.unwrap();
    assert!(plain.inserted, "{plain:?}");
    assert_eq!(job_rows::<DB>(&pool).await, 2);
    // ... and, while it waits, holds the key against the policy's enqueue too.
    let live = queue.enqueue(&credit(1, opts)).await.unwrap();
    assert_eq!(
        (live.id, live.existing_state),
        (plain.id, Some(JobState::Available))
    );

    // Dead is not kept by this policy: a key whose job died is enqueued again.
    let second = queue.enqueue(&credit(2, opts)).await.unwrap();
    let mut leased = queue.fetch(DEFAULT_QUEUE, 10, LONG).await.unwrap();
    leased.retain(|job| job.lease.job_id == second.id);
    queue
        .dead_letter(leased[0].lease, "failed for good")
        .await
        .unwrap();
    let retried = queue.enqueue(&credit(2, opts)).await.unwrap();
    assert!(retried.inserted, "{retried:?}");
}

backends!(fn a_dead_job_keeps_its_key_when_its_policy_says_so);
async fn a_dead_job_keeps_its_key_when_its_policy_says_so<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("unique_dead_keeps_key", 4).await else {
        return;
    };
    let opts = kept("available,running,completed,dead");
    let first = queue.enqueue(&credit(1, opts)).await.unwrap();
    let leased = fetch_one::<DB>(&queue, LONG).await;
    queue.dead_letter(leased.lease, "boom").await.unwrap();
    let again = queue.enqueue(&credit(1, opts)).await.unwrap();
    assert_eq!(
        (again.id, again.inserted, again.existing_state),
        (first.id, false, Some(JobState::Dead))
    );
    // A replay brings the dead job back: it is the key's holder itself.
    assert_eq!(
        queue.replay(&Replay::Job(first.id)).await.unwrap(),
        vec![first.id]
    );
    assert_eq!(run_to_completion(&pool, &queue).await, first.id);
    let after = queue.enqueue(&credit(1, opts)).await.unwrap();
    assert_eq!(after.existing_state, Some(JobState::Completed));
    assert_eq!(job_rows::<DB>(&pool).await, 1);
}

backends!(fn replace_rewrites_a_waiting_job_and_returns_a_running_one_as_it_is);
async fn replace_rewrites_a_waiting_job_and_returns_a_running_one_as_it_is<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("unique_replace", 4).await else {
        return;
    };
    let key = key("credit", 1);
    let replace = UniqueOpts::new().on_conflict(OnConflict::Replace);
    let first = queue
        .enqueue(
            &NewJob::new(key.clone(), &json!({"amount": 1}))
                .unwrap()
                .delay(HOUR),
        )
        .await
        .unwrap();
    let replaced = queue
        .enqueue(
            &NewJob::new(key.clone(), &json!({"amount": 2}))
                .unwrap()
                .unique(replace),
        )
        .await
        .unwrap();
    assert_eq!(
        (replaced.id, replaced.inserted, replaced.replaced),
        (first.id, false, true)
    );
    let listed = row::<DB>(&queue, first.id).await;
    assert_eq!(listed.payload, json!({"amount": 2}));
    assert_eq!(listed.replaced, 1);
    // The run time was replaced too: the job runs now, not in an hour.
    let mut conn = pool.acquire().await.unwrap();
    let token = "select lease_token from jobguard_jobs where id = $1";
    let token = DB::fetch_i64(&mut conn, token, first.id).await.unwrap();
    assert_eq!(token, 0, "a replace bumps no lease token");
    drop(conn);
    let leased = fetch_one::<DB>(&queue, LONG).await;
    assert_eq!(leased.payload, json!({"amount": 2}));
    assert_eq!(leased.lease.attempt, 1, "a replace counts no attempt");

    // A worker holds it now: returned as it is.
    let late = queue
        .enqueue(
            &NewJob::new(key.clone(), &json!({"amount": 3}))
                .unwrap()
                .unique(replace),
        )
        .await
        .unwrap();
    assert_eq!(
        (late.id, late.replaced, late.existing_state),
        (first.id, false, Some(JobState::Running))
    );
    assert_eq!(
        row::<DB>(&queue, first.id).await.payload,
        json!({"amount": 2})
    );
    complete::<DB>(&pool, &queue, leased.lease).await.unwrap();

    // Another kind under the key is still a reused key.
    let other = NewJob::new(key.clone(), &json!({"amount": 4}))
        .unwrap()
        .kind("debit")
        .unwrap()
        .unique(replace);
    queue.enqueue(&other.clone().delay(HOUR)).await.unwrap();
    let reused = queue
        .enqueue(&NewJob::new(key, &json!({})).unwrap().unique(replace))
        .await
        .unwrap_err();
    assert!(matches!(reused, Error::KeyReused { .. }), "{reused}");
}

backends!(fn replace_or_reject_refuses_when_the_holder_no_longer_waits);
async fn replace_or_reject_refuses_when_the_holder_no_longer_waits<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("unique_replace_or_reject", 4).await else {
        return;
    };
    let opts = kept("available,running,completed");
    let latest = |amount: i64| {
        NewJob::new(key("credit", 1), &json!({"amount": amount}))
            .unwrap()
            .unique(opts.on_conflict(OnConflict::ReplaceOrReject))
    };
    let first = queue
        .enqueue(&latest(1).unique(opts).delay(HOUR))
        .await
        .unwrap();
    // While it waits: replaced, as Replace does.
    let replaced = queue.enqueue(&latest(2)).await.unwrap();
    assert_eq!((replaced.id, replaced.replaced), (first.id, true));
    let leased = fetch_one::<DB>(&queue, LONG).await;
    assert_eq!(leased.payload, json!({"amount": 2}));

    // A worker holds it: refused, naming the job, and the payload is the one it fetched.
    let refused = queue.enqueue(&latest(3)).await.unwrap_err();
    assert!(
        matches!(&refused, Error::ReplaceRejected { existing_id, state, .. }
            if *existing_id == first.id && state == "running"),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("it keeps its payload"),
        "{refused}"
    );
    assert_eq!(
        row::<DB>(&queue, first.id).await.payload,
        json!({"amount": 2})
    );
    // Inside a batch, the refusal fails the batch: nothing of it is written.
    let refused = queue
        .enqueue_many(&[credit(2, opts), latest(3)])
        .await
        .unwrap_err();
    assert!(
        matches!(refused, Error::ReplaceRejected { .. }),
        "{refused}"
    );
    assert_eq!(job_rows::<DB>(&pool).await, 1);
    complete::<DB>(&pool, &queue, leased.lease).await.unwrap();

    // Finished, and kept by its policy: refused too.
    let mut tx = pool.begin().await.unwrap();
    let refused = queue.enqueue_tx(&mut tx, &latest(4)).await.unwrap_err();
    tx.rollback().await.unwrap();
    assert!(
        matches!(&refused, Error::ReplaceRejected { existing_id, state, .. }
            if *existing_id == first.id && state == "completed"),
        "{refused}"
    );
    assert_eq!(
        "replace-or-reject".parse::<OnConflict>().unwrap(),
        OnConflict::ReplaceOrReject
    );
}

backends!(fn a_period_puts_the_run_times_period_in_the_key);
async fn a_period_puts_the_run_times_period_in_the_key<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("unique_period", 4).await else {
        return;
    };
    let daily = UniqueOpts::new()
        .by_queue()
        .period(Duration::from_secs(86_400))
        .unwrap();
    let today = credit(1, daily);
    let first = queue.enqueue(&today).await.unwrap();
    let again = queue.enqueue(&today).await.unwrap();
    assert!(first.inserted && !again.inserted);
    // Two days on, the period is another one: another key, another job.
    let later = queue
        .enqueue(&today.clone().delay(Duration::from_secs(2 * 86_400)))
        .await
        .unwrap();
    assert!(later.inserted);
    let stored = today.clone().resolve_key().unwrap();
    let parts = stored.key().parts();
    assert_eq!(parts.len(), 3, "order, queue, day: {parts:?}");
    assert_eq!(parts[1], DEFAULT_QUEUE);
    assert_eq!(parts[2].len(), "2026-10-02".len(), "{parts:?}");
    assert_eq!(row::<DB>(&queue, first.id).await.key, stored.key().as_str());
    assert_eq!(job_rows::<DB>(&pool).await, 2);
    // Bad input is a typed error, never a panic.
    assert!(matches!(
        UniqueOpts::new().period(Duration::ZERO),
        Err(Error::InvalidUnique {
            setting: "period",
            ..
        })
    ));
    assert!(matches!(
        "available,completed".parse::<UniqueStates>(),
        Err(UniqueError {
            setting: "states",
            ..
        })
    ));
    assert!(matches!(
        "available,running,done".parse::<UniqueStates>(),
        Err(UniqueError {
            setting: "states",
            ..
        })
    ));
}

backends!(fn concurrent_enqueues_under_a_policy_insert_one_job, worker_threads = 4);
async fn concurrent_enqueues_under_a_policy_insert_one_job<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("unique_concurrent", 10).await else {
        return;
    };
    let opts = kept("available,running,completed,dead").on_conflict(OnConflict::Reject);
    let race = |order: usize| {
        let start = Arc::new(tokio::sync::Barrier::new(20));
        let tasks: Vec<_> = (0..20)
            .map(|_| {
                let (queue, start) = (queue.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    queue.enqueue(&credit(order, opts)).await
                })
            })
            .collect();
        async move {
            let mut results = Vec::new();
            for task in tasks {
                results.push(task.await.unwrap());
            }
            results
        }
    };
    let results = race(1).await;
    let inserted: Vec<i64> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().map(|e| e.id))
        .collect();
    assert_eq!(inserted.len(), 1, "one enqueue inserted: {results:?}");
    for result in &results {
        if let Err(error) = result {
            assert!(
                matches!(error, Error::EnqueueRejected { existing_id, .. } if *existing_id == inserted[0]),
                "{error}"
            );
        }
    }
    // Once it completed, the race finds it as well.
    run_to_completion(&pool, &queue).await;
    let results = race(1).await;
    assert!(results.iter().all(|r| matches!(r,
        Err(Error::EnqueueRejected { existing_id, state, .. })
            if *existing_id == inserted[0] && state == "completed")));
    assert_eq!(job_rows::<DB>(&pool).await, 1);
}

backends!(fn enqueue_tx_under_a_policy_follows_the_callers_commit_and_rollback);
async fn enqueue_tx_under_a_policy_follows_the_callers_commit_and_rollback<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("unique_tx", 4).await else {
        return;
    };
    let opts = kept("available,running,completed").on_conflict(OnConflict::Reject);
    let mut tx = pool.begin().await.unwrap();
    let first = queue.enqueue_tx(&mut tx, &credit(1, opts)).await.unwrap();
    assert!(first.inserted);
    let rejected = queue.enqueue_tx(&mut tx, &credit(1, opts)).await;
    assert!(
        matches!(rejected, Err(Error::EnqueueRejected { existing_id, .. }) if existing_id == first.id),
        "the transaction sees its own job: {rejected:?}"
    );
    tx.rollback().await.unwrap();
    assert_eq!(job_rows::<DB>(&pool).await, 0, "rollback: never enqueued");

    let mut tx = pool.begin().await.unwrap();
    let committed = queue.enqueue_tx(&mut tx, &credit(1, opts)).await.unwrap();
    assert!(committed.inserted);
    tx.commit().await.unwrap();
    run_to_completion(&pool, &queue).await;
    let mut tx = pool.begin().await.unwrap();
    let after = queue.enqueue_tx(&mut tx, &credit(1, opts)).await;
    assert!(
        matches!(after, Err(Error::EnqueueRejected { existing_id, .. }) if existing_id == committed.id)
    );
    tx.rollback().await.unwrap();
}

backends!(fn enqueue_many_applies_each_jobs_policy);
async fn enqueue_many_applies_each_jobs_policy<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("unique_many", 4).await else {
        return;
    };
    let opts = kept("available,running,completed");
    let done = queue.enqueue(&credit(1, opts)).await.unwrap();
    run_to_completion(&pool, &queue).await;
    let waiting = queue
        .enqueue(
            &NewJob::new(key("credit", 2), &json!({"v": 1}))
                .unwrap()
                .delay(HOUR),
        )
        .await
        .unwrap();

    let batch = [
        credit(1, opts),
        NewJob::new(key("credit", 2), &json!({"v": 2}))
            .unwrap()
            .unique(UniqueOpts::new().on_conflict(OnConflict::Replace)),
        credit(3, opts),
    ];
    let results = queue.enqueue_many(&batch).await.unwrap();
    assert_eq!(
        (
            results[0].id,
            results[0].inserted,
            results[0].existing_state
        ),
        (done.id, false, Some(JobState::Completed))
    );
    assert_eq!((results[1].id, results[1].replaced), (waiting.id, true));
    assert!(results[2].inserted);
    assert_eq!(row::<DB>(&queue, waiting.id).await.payload, json!({"v": 2}));

    // A rejected key fails the whole batch: nothing of it is written.
    let rows = job_rows::<DB>(&pool).await;
    let refused = queue
        .enqueue_many(&[
            credit(4, opts),
            credit(1, opts.on_conflict(OnConflict::Reject)),
        ])
        .await
        .unwrap_err();
    assert!(
        matches!(refused, Error::EnqueueRejected { existing_id, .. } if existing_id == done.id)
    );
    assert_eq!(job_rows::<DB>(&pool).await, rows);
}

backends!(fn migrate_adds_the_policy_columns_to_an_older_table);
async fn migrate_adds_the_policy_columns_to_an_older_table<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("unique_migrate", 4).await else {
        return;
    };
    let old = queue.enqueue(&job("credit", 1)).await.unwrap();
    // The table as an earlier version made it: no policy columns, no kept-key index, and (on
    // PostgreSQL) the marker of that schema.
    let mut conn = pool.acquire().await.unwrap();
    DB::execute(&mut conn, "drop index jobguard_jobs_kept_key")
        .await
        .unwrap();
    DB::execute(
        &mut conn,
        "alter table jobguard_jobs drop column unique_states",
    )
    .await
    .unwrap();
    DB::execute(&mut conn, "alter table jobguard_jobs drop column replaced")
        .await
        .unwrap();
    if DB::BACKEND == "postgres" {
        DB::execute(
            &mut conn,
            "comment on table jobguard_jobs is 'jobguard schema 0'",
        )
        .await
        .unwrap();
    }
    drop(conn);
    let refused = queue
        .enqueue(&credit(2, kept("available,running,dead")))
        .await;
    assert!(refused.is_err(), "no column yet: {refused:?}");

    queue.migrate().await.unwrap();
    queue.migrate().await.unwrap();
    let opts = kept("available,running,completed");
    assert!(queue.enqueue(&credit(2, opts)).await.unwrap().inserted);
    assert_eq!(
        row::<DB>(&queue, old.id).await.unique_states,
        UniqueStates::LIVE
    );
    assert_eq!(
        row::<DB>(&queue, old.id + 1).await.unique_states,
        UniqueStates::LIVE.with_completed()
    );
}

backends!(fn the_key_report_tells_the_job_that_applied_from_its_duplicates);
async fn the_key_report_tells_the_job_that_applied_from_its_duplicates<DB: TestDb>() {
    use crate::common::{Credit, draining, setup};
    use jobguard::console::{Console, JobOutcome};
    use jobguard::{Job, Worker};

    let Some((_pool, queue)) = setup::<DB>("unique_key_report").await else {
        return;
    };
    let drain = || async {
        let worker = Worker::with_config(queue.clone(), draining())
            .unwrap()
            .register::<Credit>();
        tokio::time::timeout(Duration::from_secs(60), worker.run(std::future::pending()))
            .await
            .expect("drained in time")
            .unwrap()
    };
    let credit = Credit {
        order: 1,
        amount: 500,
    };
    let first = queue.enqueue_job(&credit).await.unwrap();
    assert_eq!(drain().await.applied, 1);
    // Without a policy that keeps completed keys, the same work is enqueued again, and the
    // guard makes it a duplicate.
    let second = queue.enqueue_job(&credit).await.unwrap();
    assert!(second.inserted);
    assert_eq!(drain().await.duplicates, 1);

    let key = <Credit as Job<DB>>::key(&credit).unwrap();
    let report = Console::new(queue.clone()).key(key.as_str()).await.unwrap();
    assert_eq!(report.guard.as_ref().unwrap().applied_by, Some(first.id));
    let outcomes: Vec<(i64, Option<JobOutcome>, Option<i64>)> = report
        .jobs
        .iter()
        .map(|job| (job.job.id, job.outcome.outcome, job.outcome.duplicate_of))
        .collect();
    assert_eq!(
        outcomes,
        [
            (second.id, Some(JobOutcome::Duplicate), Some(first.id)),
            (first.id, Some(JobOutcome::Applied), None),
        ]
    );
    assert!(report.holder.is_none(), "{:?}", report.holder);
    let detail = Console::new(queue.clone()).job(second.id).await.unwrap();
    assert_eq!(detail.outcome.duplicate_of, Some(first.id));

    // A third job under a policy that keeps completed keys holds the key once it completed.
    let kept_job = NewJob::from_job::<DB, _>(&credit)
        .unwrap()
        .unique(kept("available,running,completed"));
    let third = queue.enqueue(&kept_job).await.unwrap();
    drain().await;
    let report = Console::new(queue.clone()).key(key.as_str()).await.unwrap();
    let holder = report.holder.expect("the completed job keeps the key");
    assert_eq!(
        (holder.id, holder.state, holder.live),
        (third.id, JobState::Completed, false)
    );
    let json = serde_json::to_value(&report.jobs[0]).unwrap();
    assert_eq!(json["outcome"], "duplicate");
    assert_eq!(json["duplicate_of"], first.id);
    assert_eq!(json["unique_states"], "available,running,completed");
}
