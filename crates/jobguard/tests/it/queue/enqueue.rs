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
            inserted: false
        },
        "the same transaction sees its own job"
    );
    // Readers outside the transaction do not see it yet.
    assert_eq!(queue.counts().await.unwrap(), counts(0, 0, 0, 0));
    tx.commit().await.unwrap();

    let leased = fetch_one::<DB>(&queue, LONG).await;
    assert_eq!(
        leased.lease,
        Lease {
            job_id: enqueued.id,
            attempt: 1,
            token: 1,
        }
    );
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
