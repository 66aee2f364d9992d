//! Retries and dead letters: recorded errors, attempts that run out, and the counts by state.

use super::*;

// 8.
backends!(fn retry_records_the_error_and_counts_the_attempt);
async fn retry_records_the_error_and_counts_the_attempt<DB: TestDb>() {
    let Some((_pool, queue)) =
        open::<DB>("retry_records_the_error_and_counts_the_attempt", 4).await
    else {
        return;
    };
    let id = queue.enqueue(&job("credit", 9)).await.unwrap().id;
    let first = fetch_one::<DB>(&queue, LONG).await;

    queue
        .retry(first.lease, Duration::ZERO, "boom")
        .await
        .unwrap();
    let retried = row::<DB>(&queue, id).await;
    assert_eq!(retried.state, JobState::Available);
    assert_eq!(retried.last_error.as_deref(), Some("boom"));
    let second = fetch_one::<DB>(&queue, LONG).await;
    assert_lease(second.lease, id, 2);
    let stale = queue.retry(first.lease, Duration::ZERO, "stale").await;
    assert!(is_fenced(&stale, first.lease), "{stale:?}");

    queue.retry(second.lease, HOUR, "later").await.unwrap();
    assert!(
        queue
            .fetch(DEFAULT_QUEUE, 10, LONG)
            .await
            .unwrap()
            .is_empty(),
        "not due yet"
    );
    let later = row::<DB>(&queue, id).await;
    assert_eq!((later.state, later.attempt), (JobState::Available, 2));
    assert_eq!(later.last_error.as_deref(), Some("later"));
    assert_near(
        later.run_at,
        SystemTime::now() + HOUR,
        "run time after a retry in an hour",
    );
    assert_eq!(queue.counts().await.unwrap(), counts(1, 0, 0, 0));
}

// 9.
backends!(fn rescue_kills_a_job_whose_last_lease_expired);
async fn rescue_kills_a_job_whose_last_lease_expired<DB: TestDb>() {
    let Some((_pool, queue)) = open::<DB>("rescue_kills_a_job_whose_last_lease_expired", 4).await
    else {
        return;
    };
    let id = queue
        .enqueue(&job("credit", 10).max_attempts(1))
        .await
        .unwrap()
        .id;
    let other = queue.enqueue(&job("credit", 11)).await.unwrap().id;
    let leased = queue.fetch(DEFAULT_QUEUE, 10, SHORT).await.unwrap();
    assert_eq!(leased.len(), 2);
    assert_eq!(leased[0].max_attempts, 1);

    sleep_past(leased[0].leased_until.max(leased[1].leased_until)).await;
    assert_eq!(queue.rescue().await.unwrap(), 2);
    assert_eq!(queue.rescue().await.unwrap(), 0, "nothing left to rescue");

    let dead = queue.list(Some(JobState::Dead), None, 10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!((dead[0].id, dead[0].attempt), (id, 1));
    let error = dead[0].last_error.as_deref().unwrap_or_default();
    assert!(error.contains("lease"), "{error}");
    assert_eq!(
        row::<DB>(&queue, other).await.state,
        JobState::Available,
        "attempts left"
    );
    assert_eq!(queue.counts().await.unwrap(), counts(1, 0, 0, 1));
    let next = fetch_one::<DB>(&queue, LONG).await;
    assert_lease(next.lease, other, 2);
}

// 12.
backends!(fn counts_and_list_reflect_states_and_kinds);
async fn counts_and_list_reflect_states_and_kinds<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("counts_and_list_reflect_states_and_kinds", 4).await
    else {
        return;
    };
    assert_eq!(queue.counts().await.unwrap(), Counts::default());
    assert!(queue.list(None, None, 10).await.unwrap().is_empty());
    let enqueued_at = SystemTime::now();
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(queue.enqueue(&job("credit", n)).await.unwrap().id);
    }
    let leased = queue.fetch(DEFAULT_QUEUE, 3, LONG).await.unwrap();
    complete::<DB>(&pool, &queue, leased[0].lease)
        .await
        .unwrap();
    queue
        .dead_letter(leased[1].lease, "fatal: bad order")
        .await
        .unwrap();
    // leased[2] stays running, ids[3] available; two more of another kind, one on a queue.
    let refund = queue.enqueue(&job("refund", 4)).await.unwrap().id;
    let mailed = queue
        .enqueue(&job("refund", 5).queue("mail").unwrap())
        .await
        .unwrap()
        .id;

    assert_eq!(queue.counts().await.unwrap(), counts(3, 1, 1, 1));
    let all = queue.list(None, None, 10).await.unwrap();
    let listed: Vec<i64> = all.iter().map(|row| row.id).collect();
    let mut newest_first = ids.clone();
    newest_first.extend([refund, mailed]);
    newest_first.reverse();
    assert_eq!(listed, newest_first, "newest first");
    let states: Vec<JobState> = all.iter().rev().map(|row| row.state).collect();
    use JobState::{Available, Completed, Dead, Running};
    assert_eq!(
        states,
        [Completed, Dead, Running, Available, Available, Available]
    );

    let limited: Vec<i64> = queue
        .list(None, None, 2)
        .await
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(limited, [mailed, refund]);
    for (state, expected) in [
        (Available, vec![mailed, refund, ids[3]]),
        (Running, vec![ids[2]]),
        (Completed, vec![ids[0]]),
        (Dead, vec![ids[1]]),
    ] {
        let rows = queue.list(Some(state), None, 10).await.unwrap();
        assert!(rows.iter().all(|row| row.state == state), "{rows:?}");
        let listed: Vec<i64> = rows.iter().map(|row| row.id).collect();
        assert_eq!(listed, expected, "{state}");
    }
    let refunds = queue.list(None, Some("refund"), 10).await.unwrap();
    assert_eq!(
        refunds.iter().map(|r| r.id).collect::<Vec<_>>(),
        [mailed, refund]
    );
    assert!(refunds.iter().all(|row| row.kind == "refund"));
    let running_credits = queue.list(Some(Running), Some("credit"), 10).await.unwrap();
    assert_eq!(
        running_credits.iter().map(|r| r.id).collect::<Vec<_>>(),
        [ids[2]]
    );
    assert!(
        queue
            .list(Some(Running), Some("refund"), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        queue
            .list(None, Some("nothing"), 10)
            .await
            .unwrap()
            .is_empty()
    );

    let dead = row::<DB>(&queue, ids[1]).await;
    assert_eq!(
        (dead.kind.as_str(), dead.key.as_str(), dead.queue.as_str()),
        ("credit", "credit:order-1", DEFAULT_QUEUE)
    );
    assert_eq!((dead.attempt, dead.max_attempts), (1, 10));
    assert_eq!(dead.payload, json!({"account": 7, "order": 1}));
    assert_near(dead.created_at, enqueued_at, "created_at");
    assert_eq!(row::<DB>(&queue, mailed).await.queue, "mail");

    // JSON, as an admin tool shows it: lowercase states, times in milliseconds.
    let value = serde_json::to_value(&dead).unwrap();
    assert_eq!(value["state"], "dead");
    assert_eq!(value["id"], ids[1]);
    assert_eq!(value["last_error"], "fatal: bad order");
    assert_eq!(value["payload"], json!({"account": 7, "order": 1}));
    let created_ms = value["created_at"]
        .as_u64()
        .expect("created_at is a number");
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        created_ms.abs_diff(now_ms) < SLACK.as_millis() as u64,
        "{created_ms} vs {now_ms}"
    );
    assert!(value["run_at"].is_u64(), "{value}");
    for (state, name) in [
        (Available, "available"),
        (Running, "running"),
        (Completed, "completed"),
        (Dead, "dead"),
    ] {
        assert_eq!(serde_json::to_value(state).unwrap(), name);
        assert_eq!(state.to_string(), name);
        assert_eq!(name.parse::<JobState>().unwrap(), state);
    }
    let counts = serde_json::to_value(queue.counts().await.unwrap()).unwrap();
    assert_eq!(
        counts,
        json!({"available": 3, "running": 1, "completed": 1, "dead": 1})
    );
}
