//! Replay of dead letters: listed, replayed once, never over a live key, and old leases stay fenced.

use super::*;

// 10.
backends!(fn dead_letters_are_listed_and_replayed);
async fn dead_letters_are_listed_and_replayed<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("dead_letters_are_listed_and_replayed", 4).await else {
        return;
    };
    let id = queue.enqueue(&job("credit", 1)).await.unwrap().id;
    let first = fetch_one::<DB>(&queue, LONG).await;
    queue
        .retry(first.lease, Duration::ZERO, "timeout")
        .await
        .unwrap();
    let leased = fetch_one::<DB>(&queue, LONG).await;
    queue
        .dead_letter(leased.lease, "fatal: bad order")
        .await
        .unwrap();
    let stale = queue.dead_letter(leased.lease, "again").await;
    assert!(is_fenced(&stale, leased.lease), "{stale:?}");

    let dead = queue.list(Some(JobState::Dead), None, 10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].id, id);
    assert_eq!(dead[0].last_error.as_deref(), Some("fatal: bad order"));
    assert_eq!(queue.counts().await.unwrap(), counts(0, 0, 0, 1));
    assert!(
        queue
            .fetch(DEFAULT_QUEUE, 10, LONG)
            .await
            .unwrap()
            .is_empty(),
        "dead is dead"
    );

    assert_eq!(queue.replay(&Replay::Job(id)).await.unwrap(), [id]);
    assert!(
        queue.replay(&Replay::Job(id)).await.unwrap().is_empty(),
        "no longer dead"
    );
    let replayed = row::<DB>(&queue, id).await;
    assert_eq!((replayed.state, replayed.attempt), (JobState::Available, 0));
    let again = fetch_one::<DB>(&queue, LONG).await;
    assert_lease(again.lease, id, 1);
    assert!(again.replayed, "a replayed job's first attempt says so");
    complete::<DB>(&pool, &queue, again.lease).await.unwrap();
    assert!(
        queue.replay(&Replay::Job(id)).await.unwrap().is_empty(),
        "completed"
    );

    // By kind, then all.
    let mut credits = Vec::new();
    let mut refunds = Vec::new();
    for n in 2..5 {
        credits.push(queue.enqueue(&job("credit", n)).await.unwrap().id);
    }
    refunds.push(queue.enqueue(&job("refund", 5)).await.unwrap().id);
    // A kind set with `NewJob::kind` is the kind replay filters on.
    let relabelled = job("credit", 6).kind("refund").unwrap();
    refunds.push(queue.enqueue(&relabelled).await.unwrap().id);
    for leased in queue.fetch(DEFAULT_QUEUE, 10, LONG).await.unwrap() {
        queue.dead_letter(leased.lease, "fatal").await.unwrap();
    }
    assert_eq!(queue.counts().await.unwrap(), counts(0, 0, 1, 5));

    let mut replayed = queue.replay(&Replay::Kind("refund".into())).await.unwrap();
    replayed.sort_unstable();
    assert_eq!(replayed, refunds);
    let still_dead = queue.list(Some(JobState::Dead), None, 10).await.unwrap();
    let mut still_dead: Vec<i64> = still_dead.iter().map(|row| row.id).collect();
    still_dead.sort_unstable();
    assert_eq!(still_dead, credits, "other kinds stay dead");
    assert!(
        queue
            .replay(&Replay::Kind("nothing".into()))
            .await
            .unwrap()
            .is_empty()
    );

    let mut replayed = queue.replay(&Replay::All).await.unwrap();
    replayed.sort_unstable();
    assert_eq!(replayed, credits);
    assert_eq!(queue.counts().await.unwrap(), counts(5, 0, 1, 0));
    assert!(queue.replay(&Replay::All).await.unwrap().is_empty());
}

// 10, continued.
backends!(fn dead_job_whose_key_is_live_again_is_not_replayed);
async fn dead_job_whose_key_is_live_again_is_not_replayed<DB: TestDb>() {
    let Some((_pool, queue)) = open::<DB>("dead_job_whose_key_is_live_again_stays_dead", 4).await
    else {
        return;
    };
    let job = job("credit", 1);
    let dead = queue.enqueue(&job).await.unwrap().id;
    let leased = fetch_one::<DB>(&queue, LONG).await;
    queue
        .dead_letter(leased.lease, "fatal: bad order")
        .await
        .unwrap();

    // Dead is not live: the same key can be enqueued again.
    let live = queue.enqueue(&job).await.unwrap();
    assert!(live.inserted, "{live:?}");
    assert_ne!(live.id, dead);

    assert!(queue.replay(&Replay::Job(dead)).await.unwrap().is_empty());
    assert!(
        queue
            .replay(&Replay::Kind("credit".into()))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(queue.replay(&Replay::All).await.unwrap().is_empty());
    assert_eq!(row::<DB>(&queue, dead).await.state, JobState::Dead);
    assert_eq!(queue.counts().await.unwrap(), counts(1, 0, 0, 1));

    // Also while the new job runs; once it is done, the dead one can come back.
    let running = fetch_one::<DB>(&queue, LONG).await;
    assert_eq!(running.lease.job_id, live.id);
    assert!(queue.replay(&Replay::All).await.unwrap().is_empty());
    queue
        .dead_letter(running.lease, "fatal again")
        .await
        .unwrap();
    // Two dead jobs of one key: only the newest comes back.
    assert!(queue.replay(&Replay::Job(dead)).await.unwrap().is_empty());
    assert_eq!(queue.replay(&Replay::All).await.unwrap(), [live.id]);
    assert_eq!(queue.counts().await.unwrap(), counts(1, 0, 0, 1));
}

// 10, fencing across a replay.
//
// A job dies when the lease of its last attempt expires, typically because the worker holding
// it stalled (a pause, a partition) and is still running. When the dead job is replayed and
// handed out again, that stalled worker's lease must stay fenced: it was taken over.
backends!(fn lease_from_before_a_replay_stays_fenced);
async fn lease_from_before_a_replay_stays_fenced<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("lease_from_before_a_replay_stays_fenced", 4).await else {
        return;
    };
    let id = queue
        .enqueue(&job("credit", 1).max_attempts(1))
        .await
        .unwrap()
        .id;
    let stalled = fetch_one::<DB>(&queue, SHORT).await;
    sleep_past(stalled.leased_until).await;
    assert_eq!(queue.rescue().await.unwrap(), 1);
    assert_eq!(row::<DB>(&queue, id).await.state, JobState::Dead);
    assert_eq!(queue.replay(&Replay::Job(id)).await.unwrap(), [id]);
    let fresh = fetch_one::<DB>(&queue, LONG).await;
    assert_eq!(fresh.lease.job_id, id);

    // The stalled worker wakes up and completes with its old lease.
    let mut tx = pool.begin().await.unwrap();
    DB::insert_ledger(&mut tx, 7, 500).await.unwrap();
    let stale = queue.complete_tx(&mut tx, stalled.lease).await;
    if stale.is_ok() {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    assert!(
        is_fenced(&stale, stalled.lease),
        "the lease {:?} of the worker whose lease expired before the replay completed the \
         replayed job, whose current lease is {:?}: {stale:?}",
        stalled.lease,
        fresh.lease
    );
    complete::<DB>(&pool, &queue, fresh.lease)
        .await
        .expect("the current holder completes");
    assert_eq!(ledger_rows(&pool).await, 0);
}
