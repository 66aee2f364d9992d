//! Enqueue: one row per job key, refused reuse and payloads, and the transactional pair.

use super::*;

// 1.
backends!(fn enqueue_twice_returns_the_same_job);
async fn enqueue_twice_returns_the_same_job<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("enqueue_twice_returns_the_same_job", 4).await else {
        return;
    };
    // A payload that goes through jsonb's normalisation on PostgreSQL (floats, big numbers,
    // nesting, key order, unicode) must still compare equal to the producer's.
    let payload = json!({
        "order": "8812", "amount": 500.25, "ratio": 1e-7, "big": 1e20, "neg": -0.0,
        "max": u64::MAX, "tags": ["a", "é", "\u{2028}"], "nested": {"z": 1, "a": null},
    });
    let job = NewJob::new(key("credit", 8812), &payload).unwrap();

    let first = queue.enqueue(&job).await.unwrap();
    let again = queue.enqueue(&job).await.unwrap();

    assert!(first.inserted, "{first:?}");
    assert!(
        !again.inserted,
        "the second enqueue found the first job: {again:?}"
    );
    assert_eq!(first.id, again.id);
    assert_eq!(queue.counts().await.unwrap(), counts(1, 0, 0, 0));
    assert_eq!(job_rows::<DB>(&pool).await, 1);
    let row = row::<DB>(&queue, first.id).await;
    assert_eq!(
        (row.key.as_str(), row.kind.as_str()),
        ("credit:order-8812", "credit")
    );
    assert_eq!(row.payload, payload);

    // Once running the job is still live: a producer retrying now gets it too.
    let leased = fetch_one::<DB>(&queue, LONG).await;
    let running = queue.enqueue(&job).await.unwrap();
    assert_eq!((running.id, running.inserted), (first.id, false));
    assert_eq!(leased.payload, payload);
    assert_eq!(queue.counts().await.unwrap(), counts(0, 1, 0, 0));
}

// 2.
backends!(fn concurrent_enqueues_of_one_job_insert_one_row, worker_threads = 4);
async fn concurrent_enqueues_of_one_job_insert_one_row<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("concurrent_enqueues_of_one_job_insert_one_row", 10).await
    else {
        return;
    };
    let job = job("credit", 1);
    let start = Arc::new(tokio::sync::Barrier::new(20));

    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (queue, job, start) = (queue.clone(), job.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                queue.enqueue(&job).await
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap().expect("every enqueue succeeds"));
    }

    let inserted = results.iter().filter(|e| e.inserted).count();
    assert_eq!(inserted, 1, "exactly one enqueue inserted: {results:?}");
    let ids: BTreeSet<i64> = results.iter().map(|e| e.id).collect();
    assert_eq!(
        ids.len(),
        1,
        "every enqueue returned the same job: {results:?}"
    );
    assert_eq!(job_rows::<DB>(&pool).await, 1);
    assert_eq!(queue.counts().await.unwrap(), counts(1, 0, 0, 0));
}

// 3.
backends!(fn reused_key_is_refused_while_the_job_is_live);
async fn reused_key_is_refused_while_the_job_is_live<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("reused_key_is_refused_while_the_job_is_live", 4).await
    else {
        return;
    };
    let key = key("credit", 3);
    let job = NewJob::new(key.clone(), &json!({"account": 7, "amount": 500})).unwrap();
    let other_payload = NewJob::new(key.clone(), &json!({"account": 7, "amount": 900})).unwrap();
    let other_kind = job.clone().kind("refund").unwrap();
    let first = queue.enqueue(&job).await.unwrap();

    for reused in [&other_payload, &other_kind] {
        let result = queue.enqueue(reused).await;
        assert!(
            matches!(&result, Err(Error::KeyReused { key }) if key == "credit:order-3"),
            "{reused:?}: {result:?}"
        );
        assert!(!result.unwrap_err().is_retryable());
    }
    // Also while the job runs.
    let leased = fetch_one::<DB>(&queue, LONG).await;
    let result = queue.enqueue(&other_payload).await;
    assert!(matches!(result, Err(Error::KeyReused { .. })), "{result:?}");
    assert_eq!(job_rows::<DB>(&pool).await, 1, "nothing was inserted");

    // The queue dedupes live jobs only: once the first is completed the key takes a new job
    // (the guard is what turns that second run into a duplicate).
    complete::<DB>(&pool, &queue, leased.lease).await.unwrap();
    let second = queue.enqueue(&other_payload).await.unwrap();
    assert!(second.inserted, "{second:?}");
    assert_ne!(second.id, first.id);
    assert_eq!(job_rows::<DB>(&pool).await, 2);
    assert_eq!(queue.counts().await.unwrap(), counts(1, 0, 1, 0));
    assert_eq!(
        row::<DB>(&queue, second.id).await.payload,
        json!({"account": 7, "amount": 900})
    );
}

// 4.
backends!(fn invalid_payloads_and_names_are_refused);
async fn invalid_payloads_and_names_are_refused<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("invalid_payloads_and_names_are_refused", 4).await else {
        return;
    };
    let key = key("credit", 4);
    let invalid = [
        ("NUL in a string", json!({"note": "a\u{0}b"})),
        ("NUL in a key", json!({"a\u{0}": 1})),
        ("NUL deep inside", json!({"items": [1, {"x": ["\u{0}"]}]})),
        ("NUL as the payload", json!("\u{0}")),
        ("over the limit", json!("x".repeat(MAX_PAYLOAD_BYTES))),
        (
            "one byte over",
            json!({"p": "x".repeat(MAX_PAYLOAD_BYTES - 7)}),
        ),
    ];
    for (what, payload) in &invalid {
        let result = NewJob::new(key.clone(), payload);
        let Err(Error::InvalidPayload {
            key: reported,
            reason,
        }) = &result
        else {
            panic!("{what}: {result:?}")
        };
        assert_eq!(reported, "credit:order-4", "{what}");
        assert!(!reason.is_empty(), "{what}");
        assert!(!result.unwrap_err().is_retryable(), "{what}");
    }
    assert_eq!(queue.counts().await.unwrap(), counts(0, 0, 0, 0));
    assert_eq!(job_rows::<DB>(&pool).await, 0);

    let job = NewJob::new(key.clone(), &json!({"amount": 1})).unwrap();
    let names = [
        ("", "empty"),
        ("has space", "space"),
        ("1st", "digit first"),
        ("a:b", "separator"),
        ("nul\u{0}", "NUL"),
    ];
    for (name, what) in names {
        let kind = job.clone().kind(name);
        assert!(matches!(kind, Err(Error::Key(_))), "kind {what}: {kind:?}");
        let queue_name = job.clone().queue(name);
        assert!(
            matches!(queue_name, Err(Error::Key(_))),
            "queue {what}: {queue_name:?}"
        );
    }
    let long = "k".repeat(1000);
    assert!(matches!(
        job.clone().kind(&long),
        Err(Error::Key(KeyError::KindTooLong { .. }))
    ));
    assert!(matches!(
        job.clone().queue(""),
        Err(Error::Key(KeyError::EmptyKind))
    ));

    // Exactly at the limit is accepted, stored and read back whole.
    let at_limit = json!("x".repeat(MAX_PAYLOAD_BYTES - 2));
    assert_eq!(
        serde_json::to_vec(&at_limit).unwrap().len(),
        MAX_PAYLOAD_BYTES
    );
    let big = NewJob::new(key, &at_limit).expect("a payload of exactly the limit");
    assert!(queue.enqueue(&big).await.unwrap().inserted);
    assert_eq!(fetch_one::<DB>(&queue, LONG).await.payload, at_limit);
}

// 5.
backends!(fn enqueue_tx_follows_the_callers_commit_and_rollback);
async fn enqueue_tx_follows_the_callers_commit_and_rollback<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("enqueue_tx_follows_commit_and_rollback", 4).await else {
        return;
    };
    let job = job("credit", 5);

    let mut tx = pool.begin().await.unwrap();
    assert!(queue.enqueue_tx(&mut tx, &job).await.unwrap().inserted);
    tx.rollback().await.unwrap();
    assert_eq!(queue.counts().await.unwrap(), counts(0, 0, 0, 0));
    assert!(
        queue
            .fetch(DEFAULT_QUEUE, 10, LONG)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(job_rows::<DB>(&pool).await, 0, "rollback: never enqueued");

    let mut tx = pool.begin().await.unwrap();
    let enqueued = queue.enqueue_tx(&mut tx, &job).await.unwrap();
    assert!(enqueued.inserted);
    assert_eq!(
        queue.enqueue_tx(&mut tx, &job).await.unwrap(),
        jobguard::queue::Enqueued {
            id: enqueued.id,
            inserted: false,
            replaced: false,
            existing_state: Some(JobState::Available),
        },
        "the same transaction sees its own job"
    );
    // Readers outside the transaction do not see it yet.
    assert_eq!(queue.counts().await.unwrap(), counts(0, 0, 0, 0));
    tx.commit().await.unwrap();

    let leased = fetch_one::<DB>(&queue, LONG).await;
    assert_lease(leased.lease, enqueued.id, 1);
    assert_eq!(leased.key, "credit:order-5");
    assert_eq!(leased.payload, json!({"account": 7, "order": 5}));
    assert_eq!(job_rows::<DB>(&pool).await, 1);
}

// A configured table holds the jobs; SQLite has no schemas.
backends!(fn configured_table_holds_the_jobs);
async fn configured_table_holds_the_jobs<DB: TestDb>() {
    let Some(pool) = DB::open("q_configured_table_holds_the_jobs", 4).await else {
        return;
    };
    let queue = Queue::with_table(pool.clone(), TableName::new("billing_jobs").unwrap()).unwrap();
    queue.migrate().await.unwrap();
    queue.migrate().await.expect("migrate is idempotent");

    let id = queue.enqueue(&job("credit", 1)).await.unwrap().id;
    assert_eq!(
        DB::count(&pool, "select count(*) from billing_jobs").await,
        1
    );
    assert_eq!(fetch_one::<DB>(&queue, LONG).await.lease.job_id, id);

    // On PostgreSQL, a table in a schema: the test's own, which is recreated for each run.
    let schema = crate::common::schema_name("pg_q_configured_table_holds_the_jobs");
    let in_schema = TableName::new("jobs").unwrap().in_schema(&schema).unwrap();
    let result = Queue::with_table(pool.clone(), in_schema);
    if DB::BACKEND == "sqlite" {
        assert!(
            matches!(result, Err(Error::InvalidName { .. })),
            "{result:?}"
        );
    } else {
        let queue = result.unwrap();
        queue.migrate().await.unwrap();
        assert!(
            queue.enqueue(&job("credit", 1)).await.unwrap().inserted,
            "another table"
        );
        let sql = "select count(*) from jg_pg_q_configured_table_holds_the_jobs.jobs";
        assert_eq!(DB::count(&pool, sql).await, 1);
    }
}

/// A job for `enqueue_job_tx`: it only needs a kind, a key and a payload.
#[derive(serde::Serialize, serde::Deserialize)]
struct Note {
    order: u32,
}

impl<D: Backend> jobguard::Job<D> for Note {
    const KIND: &'static str = "note";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("note", [format!("order-{}", self.order)])
    }

    async fn run(&self, _conn: &mut D::Connection) -> Result<(), jobguard::JobError> {
        Ok(())
    }
}

// `enqueue_job_tx` enqueues in the caller's transaction: a rollback leaves no job, and the job
// is invisible to other connections until the commit, then fetched with its kind and key.
backends!(fn enqueue_job_tx_shows_on_commit_and_never_after_rollback);
async fn enqueue_job_tx_shows_on_commit_and_never_after_rollback<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("enqueue_job_tx_commit_rollback", 4).await else {
        return;
    };

    let mut tx = pool.begin().await.unwrap();
    let enqueued = queue
        .enqueue_job_tx(&mut *tx, &Note { order: 1 })
        .await
        .unwrap();
    assert!(enqueued.inserted);
    tx.rollback().await.unwrap();
    assert_eq!(
        job_rows::<DB>(&pool).await,
        0,
        "rolled back: never enqueued"
    );

    let mut tx = pool.begin().await.unwrap();
    let enqueued = queue
        .enqueue_job_tx(&mut *tx, &Note { order: 2 })
        .await
        .unwrap();
    assert!(enqueued.inserted);
    assert_eq!(
        queue.counts().await.unwrap(),
        counts(0, 0, 0, 0),
        "not visible before the commit"
    );
    tx.commit().await.unwrap();
    assert_eq!(queue.counts().await.unwrap(), counts(1, 0, 0, 0));

    let leased = fetch_one::<DB>(&queue, LONG).await;
    assert_eq!(leased.lease.job_id, enqueued.id);
    assert_eq!(leased.kind, "note");
    assert_eq!(leased.key, "note:order-2");
}

/// The job ids a batch reported, in its order.
fn ids(results: &[jobguard::queue::Enqueued]) -> Vec<i64> {
    results.iter().map(|e| e.id).collect()
}

// A batch of fresh keys and keys a live job holds (waiting, or running): the fresh ones are
// inserted, the live ones report their job, in the order given.
backends!(fn enqueue_many_inserts_fresh_keys_and_finds_live_ones);
async fn enqueue_many_inserts_fresh_keys_and_finds_live_ones<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("enqueue_many_fresh_and_live", 4).await else {
        return;
    };
    let running = queue.enqueue(&job("credit", 1)).await.unwrap();
    let leased = fetch_one::<DB>(&queue, LONG);
    let leased = leased.await;
    assert_eq!(leased.lease.job_id, running.id);
    let waiting = queue.enqueue(&job("credit", 2)).await.unwrap();

    let batch = [
        job("credit", 3),
        job("credit", 1),
        job("credit", 4),
        job("credit", 2),
    ];
    let results = queue.enqueue_many(&batch).await.unwrap();

    let inserted: Vec<bool> = results.iter().map(|e| e.inserted).collect();
    assert_eq!(inserted, [true, false, true, false], "{results:?}");
    assert_eq!(results[1].id, running.id);
    assert_eq!(results[3].id, waiting.id);
    let all: BTreeSet<i64> = ids(&results).into_iter().collect();
    assert_eq!(all.len(), 4, "four different jobs: {results:?}");
    assert_eq!(job_rows::<DB>(&pool).await, 4);
    assert_eq!(queue.counts().await.unwrap(), counts(3, 1, 0, 0));
    for (job, result) in batch.iter().zip(&results) {
        let row = row::<DB>(&queue, result.id).await;
        assert_eq!(row.key, job.key().as_str());
        assert_eq!(row.kind, "credit");
        assert_eq!(row.payload["order"], row.key[13..].parse::<i64>().unwrap());
    }

    // Once a key's job completed, a batch enqueues it anew, as `enqueue` does.
    complete::<DB>(&pool, &queue, leased.lease).await.unwrap();
    let again = queue.enqueue_many(&[job("credit", 1)]).await.unwrap();
    assert!(again[0].inserted && again[0].id != running.id, "{again:?}");
    assert!(queue.enqueue_many(&[]).await.unwrap().is_empty());
    assert_eq!(job_rows::<DB>(&pool).await, 5);
}

// The same key twice in one batch is one job, reported as if enqueued one by one; the same key
// with another payload in one batch refuses the batch.
backends!(fn enqueue_many_makes_one_job_of_a_key_given_twice);
async fn enqueue_many_makes_one_job_of_a_key_given_twice<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("enqueue_many_key_twice", 4).await else {
        return;
    };
    let batch = [job("credit", 5), job("credit", 6), job("credit", 5)];
    let results = queue.enqueue_many(&batch).await.unwrap();
    assert_eq!(results[0].id, results[2].id, "{results:?}");
    assert_ne!(results[0].id, results[1].id, "{results:?}");
    let inserted: Vec<bool> = results.iter().map(|e| e.inserted).collect();
    assert_eq!(inserted, [true, true, false], "{results:?}");
    assert_eq!(job_rows::<DB>(&pool).await, 2);

    let other = NewJob::new(key("credit", 7), &json!({"amount": 900})).unwrap();
    let batch = [job("credit", 7), job("credit", 8), other];
    let result = queue.enqueue_many(&batch).await;
    assert!(
        matches!(&result, Err(Error::KeyReused { key }) if key == "credit:order-7"),
        "{result:?}"
    );
    assert_eq!(job_rows::<DB>(&pool).await, 2, "nothing of the batch");
}

// A key a live job holds with another payload or kind refuses the whole batch: none of its
// jobs is inserted, also inside the caller's transaction, which goes on.
backends!(fn enqueue_many_refuses_the_whole_batch_for_a_reused_key);
async fn enqueue_many_refuses_the_whole_batch_for_a_reused_key<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("enqueue_many_reused_key", 4).await else {
        return;
    };
    assert!(queue.enqueue(&job("credit", 9)).await.unwrap().inserted);
    let other_payload = NewJob::new(key("credit", 9), &json!({"amount": 900})).unwrap();
    let other_kind = job("credit", 9).kind("refund").unwrap();

    for reused in [other_payload, other_kind] {
        // Fresh keys on both sides of the reused one, sorting before and after it.
        let batch = [job("credit", 10), reused.clone(), job("credit", 1)];
        let result = queue.enqueue_many(&batch).await;
        assert!(
            matches!(&result, Err(Error::KeyReused { key }) if key == "credit:order-9"),
            "{reused:?}: {result:?}"
        );
        assert!(!result.unwrap_err().is_retryable());
        assert_eq!(job_rows::<DB>(&pool).await, 1, "nothing of the batch");

        // In the caller's transaction: the batch is undone, what came before it stays.
        let mut tx = pool.begin().await.unwrap();
        let before = queue.enqueue_tx(&mut tx, &job("credit", 11)).await.unwrap();
        let result = queue.enqueue_many_tx(&mut tx, &batch).await;
        assert!(matches!(result, Err(Error::KeyReused { .. })), "{result:?}");
        let after = queue.enqueue_tx(&mut tx, &job("credit", 12)).await.unwrap();
        tx.commit().await.unwrap();
        let rows: BTreeSet<String> = queue
            .list(None, None, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|row| row.key)
            .collect();
        let expected: BTreeSet<String> = ["credit:order-9", "credit:order-11", "credit:order-12"]
            .map(String::from)
            .into();
        assert_eq!(rows, expected, "the batch left nothing, the rest committed");
        assert!(before.inserted && after.inserted);
        let mut conn = pool.acquire().await.unwrap();
        let sql = "delete from jobguard_jobs where job_key <> 'credit:order-9'";
        DB::execute(&mut conn, sql).await.unwrap();
    }
}

/// A job whose payload is free text, so that a batch can hold one that cannot be enqueued.
#[derive(serde::Serialize, serde::Deserialize)]
struct Memo {
    order: u32,
    text: String,
}

impl<D: Backend> jobguard::Job<D> for Memo {
    const KIND: &'static str = "memo";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("memo", [format!("order-{}", self.order)])
    }

    async fn run(&self, _conn: &mut D::Connection) -> Result<(), jobguard::JobError> {
        Ok(())
    }
}

// A job of the batch that cannot be enqueued fails the batch with its index before anything
// is written.
backends!(fn enqueue_jobs_refuses_a_batch_with_a_bad_job);
async fn enqueue_jobs_refuses_a_batch_with_a_bad_job<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("enqueue_jobs_bad_job", 4).await else {
        return;
    };
    let memo = |order, text: &str| Memo {
        order,
        text: text.into(),
    };
    let bad = [
        ("NUL", "a\u{0}b".to_owned()),
        ("over the limit", "x".repeat(MAX_PAYLOAD_BYTES)),
    ];
    for (what, text) in bad {
        let batch = [memo(1, "ok"), memo(2, "ok"), memo(3, &text), memo(4, "ok")];
        let result = queue.enqueue_jobs(&batch).await;
        let Err(Error::InvalidBatchJob { index, source }) = &result else {
            panic!("{what}: {result:?}")
        };
        assert_eq!(*index, 2, "{what}");
        assert!(
            matches!(&**source, Error::InvalidPayload { key, .. } if key == "memo:order-3"),
            "{what}: {source:?}"
        );
        let mut tx = pool.begin().await.unwrap();
        let result = queue.enqueue_jobs_tx(&mut tx, &batch).await;
        assert!(
            matches!(result, Err(Error::InvalidBatchJob { index: 2, .. })),
            "{what}: {result:?}"
        );
        tx.commit().await.unwrap();
        assert_eq!(job_rows::<DB>(&pool).await, 0, "{what}: nothing enqueued");
    }
    let good = [memo(1, "ok"), memo(2, "ok")];
    let results = queue.enqueue_jobs(&good).await.unwrap();
    assert!(results.iter().all(|e| e.inserted), "{results:?}");
    let row = row::<DB>(&queue, results[1].id).await;
    assert_eq!(
        (row.kind.as_str(), row.key.as_str()),
        ("memo", "memo:order-2")
    );
    assert_eq!(row.payload, json!({"order": 2, "text": "ok"}));
}

// `enqueue_many_tx` follows the caller's transaction: rolled back it leaves no job, committed
// it makes the whole batch visible at once, and not before.
backends!(fn enqueue_many_tx_follows_the_callers_commit_and_rollback);
async fn enqueue_many_tx_follows_the_callers_commit_and_rollback<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("enqueue_many_tx_commit_rollback", 4).await else {
        return;
    };
    let batch: Vec<NewJob> = (1..=50).map(|n| job("credit", n)).collect();

    let mut tx = pool.begin().await.unwrap();
    let results = queue.enqueue_many_tx(&mut tx, &batch).await.unwrap();
    assert!(results.iter().all(|e| e.inserted), "{results:?}");
    tx.rollback().await.unwrap();
    assert_eq!(
        job_rows::<DB>(&pool).await,
        0,
        "rolled back: never enqueued"
    );
    assert!(
        queue
            .fetch(DEFAULT_QUEUE, 100, LONG)
            .await
            .unwrap()
            .is_empty()
    );

    let mut tx = pool.begin().await.unwrap();
    let results = queue.enqueue_many_tx(&mut tx, &batch).await.unwrap();
    assert!(results.iter().all(|e| e.inserted), "{results:?}");
    let again = queue.enqueue_many_tx(&mut tx, &batch).await.unwrap();
    assert_eq!(
        ids(&again),
        ids(&results),
        "the transaction sees its own jobs"
    );
    assert!(again.iter().all(|e| !e.inserted), "{again:?}");
    assert_eq!(
        queue.counts().await.unwrap(),
        counts(0, 0, 0, 0),
        "not visible before the commit"
    );
    tx.commit().await.unwrap();
    assert_eq!(queue.counts().await.unwrap(), counts(50, 0, 0, 0));
    let fetched: BTreeSet<i64> = queue
        .fetch(DEFAULT_QUEUE, 100, LONG)
        .await
        .unwrap()
        .into_iter()
        .map(|job| job.lease.job_id)
        .collect();
    assert_eq!(fetched, ids(&results).into_iter().collect());
}

// Ten thousand jobs in one call, then a worker runs every one of them once.
backends!(fn enqueue_many_of_ten_thousand_jobs_is_drained_by_the_worker);
async fn enqueue_many_of_ten_thousand_jobs_is_drained_by_the_worker<DB: TestDb>() {
    let Some((pool, queue)) = crate::common::setup::<DB>("q_enqueue_many_ten_thousand").await
    else {
        return;
    };
    let notes: Vec<Note> = (0..10_000).map(|order| Note { order }).collect();
    let results = queue.enqueue_jobs(&notes).await.unwrap();
    assert_eq!(results.len(), 10_000);
    assert!(results.iter().all(|e| e.inserted));
    let distinct: BTreeSet<i64> = ids(&results).into_iter().collect();
    assert_eq!(distinct.len(), 10_000);
    assert_eq!(queue.counts().await.unwrap(), counts(10_000, 0, 0, 0));

    let worker = jobguard::Worker::with_config(queue.clone(), crate::common::draining())
        .unwrap()
        .register::<Note>();
    let stats = tokio::time::timeout(Duration::from_secs(600), worker.run(std::future::pending()))
        .await
        .expect("the worker drained the queue")
        .unwrap();
    assert_eq!(
        (stats.applied, stats.duplicates, stats.failed, stats.dead),
        (10_000, 0, 0, 0),
        "{stats:?}"
    );
    assert_eq!(queue.counts().await.unwrap(), counts(0, 0, 10_000, 0));
    assert_eq!(job_rows::<DB>(&pool).await, 10_000);
}

// Batches sharing keys, given in opposite orders, enqueued at once: every batch succeeds and
// each key is one job, which every batch reports. On PostgreSQL, batches inserting their keys
// in the order given wait for each other's uncommitted keys and deadlock (40P01); enough keys
// that the batches overlap in time.
backends!(fn concurrent_batches_sharing_keys_insert_each_key_once, worker_threads = 4);
async fn concurrent_batches_sharing_keys_insert_each_key_once<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("enqueue_many_concurrent_batches", 10).await else {
        return;
    };
    let forward: Vec<NewJob> = (0..5000).map(|n| job("credit", n)).collect();
    let backward: Vec<NewJob> = forward.iter().rev().cloned().collect();
    let start = Arc::new(tokio::sync::Barrier::new(8));
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let batch = if i % 2 == 0 { &forward } else { &backward }.clone();
            let (queue, start) = (queue.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                queue.enqueue_many(&batch).await.map(|results| (i, results))
            })
        })
        .collect();
    let mut by_key: std::collections::BTreeMap<usize, BTreeSet<i64>> = Default::default();
    let mut inserted = 0;
    for task in tasks {
        let (i, results) = task.await.unwrap().expect("every batch succeeds");
        for (n, result) in results.iter().enumerate() {
            let n = if i % 2 == 0 { n } else { 4999 - n };
            by_key.entry(n).or_default().insert(result.id);
            inserted += usize::from(result.inserted);
        }
    }
    assert_eq!(inserted, 5000, "each key inserted by one batch");
    assert!(
        by_key.values().all(|ids| ids.len() == 1),
        "every batch reported the same job for a key"
    );
    assert_eq!(job_rows::<DB>(&pool).await, 5000);
}
