//! The operator's console over the queue: a paused queue gives out nothing, each job action
//! changes only the states it applies to and says why otherwise, and a key's report holds its
//! guard row, jobs, steps and messages, and nothing of another key.

use jobguard::console::{CANCELLED, Console, JobFilter};
use jobguard::outbox::Outbox;
use jobguard::steps::{Reconciled, Steps};
use jobguard::{Guard, Outcome};

use super::*;

backends!(fn a_paused_queue_gives_out_nothing_until_resumed);
async fn a_paused_queue_gives_out_nothing_until_resumed<DB: TestDb>() {
    let Some((_pool, queue)) = open::<DB>("a_paused_queue_gives_out_nothing", 4).await else {
        return;
    };
    let console = Console::new(queue.clone());
    let id = queue.enqueue(&job("credit", 1)).await.unwrap().id;
    let other = queue
        .enqueue(&job("credit", 2).queue("other").unwrap())
        .await
        .unwrap()
        .id;
    console.pause(DEFAULT_QUEUE).await.unwrap();
    console.pause(DEFAULT_QUEUE).await.unwrap();
    assert!(
        queue
            .fetch(DEFAULT_QUEUE, 10, LONG)
            .await
            .unwrap()
            .is_empty(),
        "a paused queue gave out a job"
    );
    let states = console.queues().await.unwrap();
    let default = states.iter().find(|q| q.name == DEFAULT_QUEUE).unwrap();
    assert!(default.paused && default.ready == 1, "{states:?}");
    // Another queue is not held.
    let fetched = queue.fetch("other", 10, LONG).await.unwrap();
    assert_eq!(fetched.len(), 1);
    assert_eq!(fetched[0].lease.job_id, other);
    console.resume(DEFAULT_QUEUE).await.unwrap();
    assert_eq!(fetch_one::<DB>(&queue, LONG).await.lease.job_id, id);
    let bad = console.pause("not a name").await;
    assert!(matches!(bad, Err(Error::Key(_))), "{bad:?}");
}

backends!(fn job_actions_change_only_the_states_they_apply_to);
async fn job_actions_change_only_the_states_they_apply_to<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("job_actions_change_only_their_states", 4).await else {
        return;
    };
    let console = Console::new(queue.clone());
    let conflict = |result: jobguard::Result<()>, id: i64, needle: &str| match result {
        Err(Error::JobConflict {
            id: refused,
            reason,
            ..
        }) => {
            assert_eq!(refused, id);
            assert!(reason.contains(needle), "{reason}");
        }
        other => panic!("job {id}: expected a conflict ({needle}), got {other:?}"),
    };

    // Running: nothing applies.
    let running = queue.enqueue(&job("credit", 1)).await.unwrap().id;
    let leased = fetch_one::<DB>(&queue, LONG).await;
    conflict(console.cancel(running).await, running, "running");
    conflict(console.delete(running).await, running, "running");
    conflict(console.retry(running).await, running, "running");
    // Failed, waiting an hour for its backoff: retry runs it now.
    queue.retry(leased.lease, HOUR, "boom").await.unwrap();
    assert!(
        queue
            .fetch(DEFAULT_QUEUE, 1, LONG)
            .await
            .unwrap()
            .is_empty()
    );
    console.retry(running).await.unwrap();
    let again = fetch_one::<DB>(&queue, LONG).await;
    assert_eq!((again.lease.job_id, again.lease.attempt), (running, 2));
    complete::<DB>(&pool, &queue, again.lease).await.unwrap();
    conflict(console.retry(running).await, running, "completed");

    // Waiting, never failed: retry has nothing to do; cancel makes it dead, unattempted.
    let waiting = queue.enqueue(&job("credit", 2)).await.unwrap().id;
    conflict(console.retry(waiting).await, waiting, "has not failed");
    console.cancel(waiting).await.unwrap();
    let cancelled = console.job(waiting).await.unwrap().job;
    assert_eq!(cancelled.state, JobState::Dead);
    assert_eq!(cancelled.attempt, 0);
    assert_eq!(cancelled.last_error.as_deref(), Some(CANCELLED));
    conflict(console.cancel(waiting).await, waiting, "it is dead");
    assert!(
        queue
            .fetch(DEFAULT_QUEUE, 1, LONG)
            .await
            .unwrap()
            .is_empty()
    );

    // A dead job whose key another live job holds stays dead.
    let holder = queue.enqueue(&job("credit", 2)).await.unwrap().id;
    assert_ne!(holder, waiting);
    conflict(
        console.retry(waiting).await,
        waiting,
        &format!("job {holder}"),
    );
    console.delete(holder).await.unwrap();
    console.retry(waiting).await.unwrap();
    assert_eq!(fetch_one::<DB>(&queue, LONG).await.lease.job_id, waiting);

    // Deleted: gone; unknown ids are not found by any action.
    console.delete(running).await.unwrap();
    for result in [
        console.job(running).await.map(|_| ()),
        console.retry(running).await,
        console.cancel(running).await,
        console.delete(running).await,
    ] {
        assert!(
            matches!(result, Err(Error::JobNotFound { id }) if id == running),
            "{result:?}"
        );
    }
}

backends!(fn a_key_report_holds_its_own_rows_only);
async fn a_key_report_holds_its_own_rows_only<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("a_key_report_holds_its_own_rows", 6).await else {
        return;
    };
    let console = Console::new(queue.clone());
    let nothing = console.key("credit:x").await.unwrap();
    assert!(nothing.guard.is_none() && nothing.jobs.is_empty() && nothing.messages.is_empty());

    let guard = Guard::new(pool.clone());
    guard.migrate().await.unwrap();
    let outbox = Outbox::new(pool.clone());
    outbox.migrate().await.unwrap();
    let steps = Steps::new(pool.clone());
    steps.migrate().await.unwrap();
    let key = JobKey::new("credit", ["x"]).unwrap();
    // A key whose messages' ids start with this key's, `credit:x/`.
    let longer = JobKey::new("credit", ["x/y"]).unwrap();
    let first = queue
        .enqueue(&NewJob::new(key.clone(), &json!({"n": 1})).unwrap())
        .await
        .unwrap()
        .id;
    queue
        .enqueue(&NewJob::new(longer.clone(), &json!({"n": 2})).unwrap())
        .await
        .unwrap();
    let outcome = guard
        .run_with_payload(&key, &json!({"n": 1}), async |_conn| {
            Ok::<_, jobguard::JobError>(json!({"charge": "ch_1"}))
        })
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Applied(_)));
    outbox
        .publish(&key, "invoices", &json!({"n": 1}))
        .await
        .unwrap();
    outbox
        .publish(&longer, "invoices", &json!({"n": 2}))
        .await
        .unwrap();
    outbox
        .publish(&longer, "t", &json!({"n": 2}))
        .await
        .unwrap();
    steps
        .run(
            &key,
            "charge",
            async || Ok::<_, jobguard::JobError>(7),
            async || Ok(Reconciled::NotDone),
        )
        .await
        .unwrap();

    let report = console.key("credit:x").await.unwrap();
    let record = report.guard.expect("applied");
    assert_eq!(record.kind, "credit");
    assert_eq!(record.result, Some(json!({"charge": "ch_1"})));
    assert!(record.fingerprint.is_some_and(|f| f.len() == 64));
    let ids: Vec<i64> = report.jobs.iter().map(|job| job.job.id).collect();
    assert_eq!(ids, [first]);
    let messages: Vec<&str> = report.messages.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(messages, ["credit:x/invoices"]);
    assert_eq!(report.steps.len(), 1);
    assert_eq!(
        (
            report.steps[0].step.as_str(),
            report.steps[0].state.as_str()
        ),
        ("charge", "done")
    );
    let longer_report = console.key("credit:x/y").await.unwrap();
    assert!(longer_report.guard.is_none());
    assert_eq!(longer_report.messages.len(), 2, "{longer_report:?}");

    // Listing by key, newest first, a page at a time.
    let second = queue
        .enqueue(&NewJob::new(key.clone(), &json!({"n": 1})).unwrap())
        .await
        .unwrap();
    assert!(!second.inserted, "the first job still waits");
    let page = |before| JobFilter {
        kind: Some("credit".into()),
        before,
        limit: 1,
        ..JobFilter::default()
    };
    let newest = console.jobs(&page(None)).await.unwrap();
    let older = console.jobs(&page(Some(newest[0].id))).await.unwrap();
    assert_eq!(older.len(), 1);
    assert!(older[0].id < newest[0].id);
    assert!(
        console
            .jobs(&page(Some(older[0].id)))
            .await
            .unwrap()
            .is_empty()
    );
}

// The console lists waiting jobs newest first and running jobs oldest first (the jobs held are
// the oldest stored `available`, and no index holds a lease), each paging on from the last id
// of the page before.
backends!(fn the_console_tells_running_jobs_from_waiting_ones);
async fn the_console_tells_running_jobs_from_waiting_ones<DB: TestDb>() {
    let Some((_pool, queue)) = open::<DB>("the_console_tells_running_from_waiting", 4).await else {
        return;
    };
    let console = Console::new(queue.clone());
    let mut ids = Vec::new();
    for n in 0..7 {
        ids.push(queue.enqueue(&job("credit", n)).await.unwrap().id);
    }
    let held = queue.fetch(DEFAULT_QUEUE, 4, LONG).await.unwrap();
    assert_eq!(held.len(), 4);
    let listed = |state, before| {
        let console = console.clone();
        async move {
            let filter = JobFilter {
                state: Some(state),
                before,
                limit: 3,
                ..JobFilter::default()
            };
            let jobs = console.jobs(&filter).await.unwrap();
            assert!(jobs.iter().all(|job| job.state == state), "{jobs:?}");
            jobs.iter().map(|job| job.id).collect::<Vec<_>>()
        }
    };
    let first = listed(JobState::Running, None).await;
    assert_eq!(first, ids[..3], "oldest first");
    assert_eq!(listed(JobState::Running, Some(ids[2])).await, ids[3..4]);
    let waiting = listed(JobState::Available, None).await;
    assert_eq!(waiting, [ids[6], ids[5], ids[4]], "newest first");
    assert!(listed(JobState::Available, Some(ids[4])).await.is_empty());
    assert_eq!(queue.counts().await.unwrap(), counts(3, 4, 0, 0));
}
