// The job queue's conformance suite, included once per backend by `tests/queue.rs` with `DB` set
// to the backend's type, so every test runs on real PostgreSQL and real SQLite.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jobguard::queue::{
    Counts, DEFAULT_QUEUE, JobRow, JobState, Lease, LeasedJob, MAX_PAYLOAD_BYTES, NewJob, Queue,
    Replay,
};
use jobguard::{Backend, Error, JobKey, KeyError, TableName};
use serde_json::json;
use sqlx::Pool;

use crate::common::{TestDb, ledger_rows};

/// A lease no test outlives.
const LONG: Duration = Duration::from_secs(60);
/// A lease the tests wait out.
const SHORT: Duration = Duration::from_millis(1000);
const HOUR: Duration = Duration::from_secs(3600);
/// How far the database clock and the client clock may disagree, plus round trips.
const SLACK: Duration = Duration::from_secs(5);

/// A migrated queue on the test's own database. Test names get a prefix so that they cannot
/// collide with the guard suite's schemas and files.
async fn open(test: &str, connections: u32) -> Option<(Pool<DB>, Queue<DB>)> {
    let pool = DB::open(&format!("q_{test}"), connections).await?;
    let queue = Queue::new(pool.clone());
    queue.migrate().await.expect("migrate the queue");
    queue.migrate().await.expect("migrate is idempotent");
    Some((pool, queue))
}

fn key(kind: &str, part: impl std::fmt::Display) -> JobKey {
    JobKey::new(kind, [format!("order-{part}")]).expect("valid key")
}

fn job(kind: &str, n: usize) -> NewJob {
    NewJob::new(key(kind, n), &json!({"account": 7, "order": n})).expect("valid job")
}

fn counts(available: i64, running: i64, completed: i64, dead: i64) -> Counts {
    Counts {
        available,
        running,
        completed,
        dead,
    }
}

async fn job_rows(pool: &Pool<DB>) -> i64 {
    DB::count(pool, "select count(*) from jobguard_jobs").await
}

async fn fetch_one(queue: &Queue<DB>, lease: Duration) -> LeasedJob {
    let mut jobs = queue.fetch(DEFAULT_QUEUE, 1, lease).await.unwrap();
    assert_eq!(jobs.len(), 1, "expected one job: {jobs:?}");
    jobs.remove(0)
}

/// Completes a job in a transaction of its own and commits it.
async fn complete(pool: &Pool<DB>, queue: &Queue<DB>, lease: Lease) -> jobguard::Result<()> {
    let mut tx = pool.begin().await?;
    queue.complete_tx(&mut tx, lease).await?;
    tx.commit().await?;
    Ok(())
}

async fn row(queue: &Queue<DB>, id: i64) -> JobRow {
    let rows = queue.list(None, None, 1000).await.unwrap();
    rows.into_iter()
        .find(|row| row.id == id)
        .unwrap_or_else(|| panic!("job {id} is not listed"))
}

/// Sleeps until the client clock is past `leased_until` of a [`SHORT`] lease (the database runs
/// on the same host). Fails at once for a lease much longer than asked for, rather than waiting
/// it out.
async fn sleep_past(leased_until: SystemTime) {
    let wait = leased_until
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    assert!(
        wait <= SHORT + SLACK,
        "a lease of {SHORT:?} runs for another {wait:?}"
    );
    tokio::time::sleep(wait + Duration::from_millis(200)).await;
}

fn assert_near(time: SystemTime, expected: SystemTime, what: &str) {
    let ok = time > expected - SLACK && time < expected + SLACK;
    assert!(
        ok,
        "{what}: {time:?} is not within {SLACK:?} of {expected:?}"
    );
}

fn is_fenced(result: &jobguard::Result<()>, lease: Lease) -> bool {
    matches!(result, Err(Error::Fenced { job_id, attempt })
        if *job_id == lease.job_id && *attempt == lease.attempt)
}

// 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_twice_returns_the_same_job() {
    let Some((pool, queue)) = open("enqueue_twice_returns_the_same_job", 4).await else {
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
    assert_eq!(job_rows(&pool).await, 1);
    let row = row(&queue, first.id).await;
    assert_eq!(
        (row.key.as_str(), row.kind.as_str()),
        ("credit:order-8812", "credit")
    );
    assert_eq!(row.payload, payload);

    // Once running the job is still live: a producer retrying now gets it too.
    let leased = fetch_one(&queue, LONG).await;
    let running = queue.enqueue(&job).await.unwrap();
    assert_eq!((running.id, running.inserted), (first.id, false));
    assert_eq!(leased.payload, payload);
    assert_eq!(queue.counts().await.unwrap(), counts(0, 1, 0, 0));
}

// 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_enqueues_of_one_job_insert_one_row() {
    let Some((pool, queue)) = open("concurrent_enqueues_of_one_job_insert_one_row", 10).await
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
    assert_eq!(job_rows(&pool).await, 1);
    assert_eq!(queue.counts().await.unwrap(), counts(1, 0, 0, 0));
}

// 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_key_is_refused_while_the_job_is_live() {
    let Some((pool, queue)) = open("reused_key_is_refused_while_the_job_is_live", 4).await else {
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
    let leased = fetch_one(&queue, LONG).await;
    let result = queue.enqueue(&other_payload).await;
    assert!(matches!(result, Err(Error::KeyReused { .. })), "{result:?}");
    assert_eq!(job_rows(&pool).await, 1, "nothing was inserted");

    // The queue dedupes live jobs only: once the first is completed the key takes a new job
    // (the guard is what turns that second run into a duplicate).
    complete(&pool, &queue, leased.lease).await.unwrap();
    let second = queue.enqueue(&other_payload).await.unwrap();
    assert!(second.inserted, "{second:?}");
    assert_ne!(second.id, first.id);
    assert_eq!(job_rows(&pool).await, 2);
    assert_eq!(queue.counts().await.unwrap(), counts(1, 0, 1, 0));
    assert_eq!(
        row(&queue, second.id).await.payload,
        json!({"account": 7, "amount": 900})
    );
}

// 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_payloads_and_names_are_refused() {
    let Some((pool, queue)) = open("invalid_payloads_and_names_are_refused", 4).await else {
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
    assert_eq!(job_rows(&pool).await, 0);

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
    assert_eq!(fetch_one(&queue, LONG).await.payload, at_limit);
}

// 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_tx_follows_the_callers_commit_and_rollback() {
    let Some((pool, queue)) = open("enqueue_tx_follows_commit_and_rollback", 4).await else {
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
    assert_eq!(job_rows(&pool).await, 0, "rollback: never enqueued");

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

    let leased = fetch_one(&queue, LONG).await;
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
    assert_eq!(job_rows(&pool).await, 1);
}

// 6.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_fetches_take_disjoint_jobs() {
    let Some((_pool, queue)) = open("concurrent_fetches_take_disjoint_jobs", 10).await else {
        return;
    };
    let mut ids = BTreeSet::new();
    for n in 0..50 {
        ids.insert(queue.enqueue(&job("credit", n)).await.unwrap().id);
    }
    let start = Arc::new(tokio::sync::Barrier::new(2));

    let before = SystemTime::now();
    let fetchers: Vec<_> = (0..2)
        .map(|_| {
            let (queue, start) = (queue.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                queue.fetch(DEFAULT_QUEUE, 30, LONG).await
            })
        })
        .collect();
    let mut batches = Vec::new();
    for fetcher in fetchers {
        batches.push(fetcher.await.unwrap().expect("fetch succeeds"));
    }
    let after = SystemTime::now();

    let sets: Vec<BTreeSet<i64>> = batches
        .iter()
        .map(|batch| batch.iter().map(|job| job.lease.job_id).collect())
        .collect();
    assert_eq!(sets[0].len(), batches[0].len(), "no job twice in one batch");
    assert_eq!(sets[1].len(), batches[1].len(), "no job twice in one batch");
    assert!(
        sets[0].is_disjoint(&sets[1]),
        "both fetchers leased {:?}",
        sets[0].intersection(&sets[1])
    );
    assert!(
        batches.iter().all(|batch| batch.len() <= 30),
        "a batch over the limit"
    );
    let union: BTreeSet<i64> = sets[0].union(&sets[1]).copied().collect();
    assert_eq!(union, ids, "together they leased every job");
    for job in batches.iter().flatten() {
        assert_eq!(job.lease.attempt, 1, "{job:?}");
        assert_eq!(job.max_attempts, 10);
        assert_eq!(job.kind, "credit");
        assert!(
            job.leased_until > before + LONG - SLACK,
            "{job:?} leased from {before:?}"
        );
        assert!(
            job.leased_until < after + LONG + SLACK,
            "{job:?} leased until {after:?}"
        );
    }
    assert_eq!(queue.counts().await.unwrap(), counts(0, 50, 0, 0));
    assert!(
        queue
            .fetch(DEFAULT_QUEUE, 30, LONG)
            .await
            .unwrap()
            .is_empty()
    );
}

// 6, PostgreSQL only: a fetch skips jobs another transaction has locked instead of waiting for
// it (`skip locked`). Two fetchers taking disjoint jobs do not show this: without `skip locked`
// the second waits for the first and then skips the rows it took, with the same result. SQLite
// has no row locks; its single writer makes fetchers take turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_skips_jobs_locked_by_another_transaction() {
    if <DB as Backend>::BACKEND != "postgres" {
        return;
    }
    let Some((pool, queue)) = open("fetch_skips_jobs_locked_by_another_transaction", 4).await
    else {
        return;
    };
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(queue.enqueue(&job("credit", n)).await.unwrap().id);
    }
    // Another fetcher, mid-statement: it holds the oldest job's row lock.
    let mut tx = pool.begin().await.unwrap();
    let locked: i64 = sqlx::query_scalar("select id from jobguard_jobs where id = $1 for update")
        .bind(ids[0])
        .fetch_one(&mut *tx)
        .await
        .unwrap();

    let fetch = queue.fetch(DEFAULT_QUEUE, 10, LONG);
    let fetched = tokio::time::timeout(SLACK, fetch).await;
    tx.rollback().await.unwrap();
    let fetched = fetched
        .expect("the fetch waited for the locked row")
        .unwrap();
    let fetched: Vec<i64> = fetched.iter().map(|job| job.lease.job_id).collect();
    assert_eq!(fetched, ids[1..], "every job but the locked one");
    assert_eq!(fetch_one(&queue, LONG).await.lease.job_id, locked);
}

// 6, continued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_respects_queues_delays_and_order() {
    let Some((_pool, queue)) = open("fetch_respects_queues_delays_and_order", 4).await else {
        return;
    };
    let oldest = queue.enqueue(&job("credit", 1)).await.unwrap().id;
    let second = queue.enqueue(&job("credit", 2)).await.unwrap().id;
    let mail = queue
        .enqueue(&job("credit", 3).queue("mail").unwrap())
        .await
        .unwrap()
        .id;
    let delayed = queue
        .enqueue(&job("credit", 4).delay(HOUR))
        .await
        .unwrap()
        .id;
    let third = queue.enqueue(&job("credit", 5)).await.unwrap().id;
    assert_eq!(queue.counts().await.unwrap(), counts(5, 0, 0, 0));
    let delayed_row = row(&queue, delayed).await;
    assert_near(
        delayed_row.run_at,
        SystemTime::now() + HOUR,
        "run time of the delayed job",
    );
    assert_eq!(row(&queue, mail).await.queue, "mail");

    let first_two = queue.fetch(DEFAULT_QUEUE, 2, LONG).await.unwrap();
    let ids: Vec<i64> = first_two.iter().map(|job| job.lease.job_id).collect();
    assert_eq!(ids, [oldest, second], "oldest run time first");
    let rest = queue.fetch(DEFAULT_QUEUE, 10, LONG).await.unwrap();
    let ids: Vec<i64> = rest.iter().map(|job| job.lease.job_id).collect();
    assert_eq!(
        ids,
        [third],
        "neither the other queue's job nor the delayed one"
    );
    assert!(
        queue
            .fetch("nothing-here", 10, LONG)
            .await
            .unwrap()
            .is_empty()
    );

    let on_mail = queue.fetch("mail", 10, LONG).await.unwrap();
    assert_eq!(on_mail.len(), 1);
    assert_eq!(
        on_mail[0].lease,
        Lease {
            job_id: mail,
            attempt: 1,
            token: 1,
        }
    );
    assert_eq!(row(&queue, delayed).await.state, JobState::Available);
    assert_eq!(queue.counts().await.unwrap(), counts(1, 4, 0, 0));
}

// 7.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_is_fenced_after_rescue() {
    let Some((pool, queue)) = open("expired_lease_is_fenced_after_rescue", 4).await else {
        return;
    };
    let id = queue.enqueue(&job("credit", 7)).await.unwrap().id;
    let first = fetch_one(&queue, SHORT).await;
    assert_eq!(
        first.lease,
        Lease {
            job_id: id,
            attempt: 1,
            token: 1,
        }
    );
    assert_eq!(
        queue.rescue().await.unwrap(),
        0,
        "the lease has not expired yet"
    );

    sleep_past(first.leased_until).await;
    assert_eq!(queue.rescue().await.unwrap(), 1);
    let rescued = row(&queue, id).await;
    assert_eq!((rescued.state, rescued.attempt), (JobState::Available, 1));
    let error = rescued.last_error.unwrap_or_default();
    assert!(error.contains("lease"), "{error}");
    let second = fetch_one(&queue, LONG).await;
    assert_eq!(
        second.lease,
        Lease {
            job_id: id,
            attempt: 2,
            token: 2,
        }
    );

    // The worker of attempt 1 comes back: whatever it did in its transaction rolls back.
    let mut tx = pool.begin().await.unwrap();
    DB::insert_ledger(&mut tx, 7, 500).await.unwrap();
    let stale = queue.complete_tx(&mut tx, first.lease).await;
    assert!(is_fenced(&stale, first.lease), "{stale:?}");
    tx.rollback().await.unwrap();
    let stale = queue.extend(first.lease, LONG).await;
    assert!(is_fenced(&stale, first.lease), "{stale:?}");
    for stale in [
        queue.retry(first.lease, Duration::ZERO, "stale").await,
        queue.dead_letter(first.lease, "stale").await,
        queue.release(first.lease).await,
    ] {
        assert!(is_fenced(&stale, first.lease), "{stale:?}");
    }
    let running = row(&queue, id).await;
    assert_eq!((running.state, running.attempt), (JobState::Running, 2));

    queue
        .extend(second.lease, LONG)
        .await
        .expect("the holder extends its lease");
    let mut tx = pool.begin().await.unwrap();
    DB::insert_ledger(&mut tx, 7, 500).await.unwrap();
    queue
        .complete_tx(&mut tx, second.lease)
        .await
        .expect("the holder completes");
    tx.commit().await.unwrap();
    assert_eq!(row(&queue, id).await.state, JobState::Completed);
    assert_eq!(
        ledger_rows(&pool).await,
        1,
        "only the holder's effect committed"
    );
    assert_eq!(queue.counts().await.unwrap(), counts(0, 0, 1, 0));

    // A completed job's lease is over too.
    let again = complete(&pool, &queue, second.lease).await;
    assert!(is_fenced(&again, second.lease), "{again:?}");
    let again = queue.extend(second.lease, LONG).await;
    assert!(is_fenced(&again, second.lease), "{again:?}");
}

// 7, continued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_keeps_the_lease_and_release_gives_the_job_back() {
    let Some((pool, queue)) = open("extend_keeps_the_lease_and_release_gives_back", 4).await else {
        return;
    };
    let id = queue.enqueue(&job("credit", 8)).await.unwrap().id;
    let leased = fetch_one(&queue, SHORT).await;
    queue.extend(leased.lease, LONG).await.unwrap();
    sleep_past(leased.leased_until).await;
    assert_eq!(
        queue.rescue().await.unwrap(),
        0,
        "the extended lease still holds"
    );
    assert_eq!(row(&queue, id).await.state, JobState::Running);

    queue
        .release(leased.lease)
        .await
        .expect("the holder releases");
    let released = row(&queue, id).await;
    assert_eq!(
        (released.state, released.attempt),
        (JobState::Available, 0),
        "{released:?}"
    );
    assert_eq!(queue.counts().await.unwrap(), counts(1, 0, 0, 0));
    let again = fetch_one(&queue, LONG).await;
    assert_eq!(
        again.lease,
        Lease {
            job_id: id,
            attempt: 1,
            token: 2,
        },
        "the release did not count, the fetch did"
    );
    // The released lease is over, although the new one has the same attempt number.
    let released = complete(&pool, &queue, leased.lease).await;
    assert!(is_fenced(&released, leased.lease), "{released:?}");
    let released = queue.extend(leased.lease, LONG).await;
    assert!(is_fenced(&released, leased.lease), "{released:?}");

    // Extending a lease that expired and was taken over is fenced.
    queue.release(again.lease).await.unwrap();
    let short = fetch_one(&queue, SHORT).await;
    sleep_past(short.leased_until).await;
    assert_eq!(queue.rescue().await.unwrap(), 1);
    let taken_over = fetch_one(&queue, LONG).await;
    assert_eq!(taken_over.lease.attempt, 2);
    let stale = queue.extend(short.lease, LONG).await;
    assert!(is_fenced(&stale, short.lease), "{stale:?}");
    queue.extend(taken_over.lease, LONG).await.unwrap();
}

// 8.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_records_the_error_and_counts_the_attempt() {
    let Some((_pool, queue)) = open("retry_records_the_error_and_counts_the_attempt", 4).await
    else {
        return;
    };
    let id = queue.enqueue(&job("credit", 9)).await.unwrap().id;
    let first = fetch_one(&queue, LONG).await;

    queue
        .retry(first.lease, Duration::ZERO, "boom")
        .await
        .unwrap();
    let retried = row(&queue, id).await;
    assert_eq!(retried.state, JobState::Available);
    assert_eq!(retried.last_error.as_deref(), Some("boom"));
    let second = fetch_one(&queue, LONG).await;
    assert_eq!(
        second.lease,
        Lease {
            job_id: id,
            attempt: 2,
            token: 2,
        }
    );
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
    let later = row(&queue, id).await;
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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rescue_kills_a_job_whose_last_lease_expired() {
    let Some((_pool, queue)) = open("rescue_kills_a_job_whose_last_lease_expired", 4).await else {
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
        row(&queue, other).await.state,
        JobState::Available,
        "attempts left"
    );
    assert_eq!(queue.counts().await.unwrap(), counts(1, 0, 0, 1));
    let next = fetch_one(&queue, LONG).await;
    assert_eq!(
        next.lease,
        Lease {
            job_id: other,
            attempt: 2,
            token: 2,
        }
    );
}

// 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_and_replayed() {
    let Some((pool, queue)) = open("dead_letters_are_listed_and_replayed", 4).await else {
        return;
    };
    let id = queue.enqueue(&job("credit", 1)).await.unwrap().id;
    let first = fetch_one(&queue, LONG).await;
    queue
        .retry(first.lease, Duration::ZERO, "timeout")
        .await
        .unwrap();
    let leased = fetch_one(&queue, LONG).await;
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
    let replayed = row(&queue, id).await;
    assert_eq!((replayed.state, replayed.attempt), (JobState::Available, 0));
    let again = fetch_one(&queue, LONG).await;
    assert_eq!(
        again.lease,
        Lease {
            job_id: id,
            attempt: 1,
            token: 3,
        }
    );
    complete(&pool, &queue, again.lease).await.unwrap();
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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_job_whose_key_is_live_again_is_not_replayed() {
    let Some((_pool, queue)) = open("dead_job_whose_key_is_live_again_stays_dead", 4).await else {
        return;
    };
    let job = job("credit", 1);
    let dead = queue.enqueue(&job).await.unwrap().id;
    let leased = fetch_one(&queue, LONG).await;
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
    assert_eq!(row(&queue, dead).await.state, JobState::Dead);
    assert_eq!(queue.counts().await.unwrap(), counts(1, 0, 0, 1));

    // Also while the new job runs; once it is done, the dead one can come back.
    let running = fetch_one(&queue, LONG).await;
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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_from_before_a_replay_stays_fenced() {
    let Some((pool, queue)) = open("lease_from_before_a_replay_stays_fenced", 4).await else {
        return;
    };
    let id = queue
        .enqueue(&job("credit", 1).max_attempts(1))
        .await
        .unwrap()
        .id;
    let stalled = fetch_one(&queue, SHORT).await;
    sleep_past(stalled.leased_until).await;
    assert_eq!(queue.rescue().await.unwrap(), 1);
    assert_eq!(row(&queue, id).await.state, JobState::Dead);
    assert_eq!(queue.replay(&Replay::Job(id)).await.unwrap(), [id]);
    let fresh = fetch_one(&queue, LONG).await;
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
    complete(&pool, &queue, fresh.lease)
        .await
        .expect("the current holder completes");
    assert_eq!(ledger_rows(&pool).await, 0);
}

// 11.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_tx_follows_the_callers_commit_and_rollback() {
    let Some((pool, queue)) = open("complete_tx_follows_commit_and_rollback", 4).await else {
        return;
    };
    let id = queue.enqueue(&job("credit", 1)).await.unwrap().id;
    let leased = fetch_one(&queue, SHORT).await;

    let mut tx = pool.begin().await.unwrap();
    DB::insert_ledger(&mut tx, 7, 500).await.unwrap();
    queue.complete_tx(&mut tx, leased.lease).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(
        row(&queue, id).await.state,
        JobState::Running,
        "rolled back with the effect"
    );
    assert_eq!(ledger_rows(&pool).await, 0);

    sleep_past(leased.leased_until).await;
    assert_eq!(queue.rescue().await.unwrap(), 1);
    assert_eq!(row(&queue, id).await.state, JobState::Available);
    let again = fetch_one(&queue, LONG).await;
    assert_eq!(
        again.lease,
        Lease {
            job_id: id,
            attempt: 2,
            token: 2,
        }
    );

    let mut tx = pool.begin().await.unwrap();
    DB::insert_ledger(&mut tx, 7, 500).await.unwrap();
    queue.complete_tx(&mut tx, again.lease).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(row(&queue, id).await.state, JobState::Completed);
    assert_eq!(
        ledger_rows(&pool).await,
        1,
        "the job is done together with its effect"
    );
}

// 11, PostgreSQL only: a job whose completion is in flight (its worker's transaction holds the
// row) is not rescued when its lease runs out meanwhile, and rescue does not wait for it. SQLite
// has no row locks: the open transaction holds the one write lock, which rescue would wait for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rescue_skips_a_job_whose_completion_is_in_flight() {
    if <DB as Backend>::BACKEND != "postgres" {
        return;
    }
    let Some((pool, queue)) = open("rescue_skips_a_job_whose_completion_is_in_flight", 4).await
    else {
        return;
    };
    let id = queue.enqueue(&job("credit", 1)).await.unwrap().id;
    let leased = fetch_one(&queue, SHORT).await;
    let mut tx = pool.begin().await.unwrap();
    queue.complete_tx(&mut tx, leased.lease).await.unwrap();
    sleep_past(leased.leased_until).await;

    let rescued = tokio::time::timeout(SLACK, queue.rescue()).await;
    let committed = tx.commit().await;
    let rescued = rescued
        .expect("rescue waited for the completing transaction")
        .unwrap();
    assert_eq!(rescued, 0, "the job being completed was rescued");
    committed.unwrap();
    assert_eq!(row(&queue, id).await.state, JobState::Completed);
    assert_eq!(queue.rescue().await.unwrap(), 0);
}

// 12.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_and_list_reflect_states_and_kinds() {
    let Some((pool, queue)) = open("counts_and_list_reflect_states_and_kinds", 4).await else {
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
    complete(&pool, &queue, leased[0].lease).await.unwrap();
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

    let dead = row(&queue, ids[1]).await;
    assert_eq!(
        (dead.kind.as_str(), dead.key.as_str(), dead.queue.as_str()),
        ("credit", "credit:order-1", DEFAULT_QUEUE)
    );
    assert_eq!((dead.attempt, dead.max_attempts), (1, 10));
    assert_eq!(dead.payload, json!({"account": 7, "order": 1}));
    assert_near(dead.created_at, enqueued_at, "created_at");
    assert_eq!(row(&queue, mailed).await.queue, "mail");

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

// A configured table holds the jobs; SQLite has no schemas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_table_holds_the_jobs() {
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
    assert_eq!(fetch_one(&queue, LONG).await.lease.job_id, id);

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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_job_tx_shows_on_commit_and_never_after_rollback() {
    let Some((pool, queue)) = open("enqueue_job_tx_commit_rollback", 4).await else {
        return;
    };

    let mut tx = pool.begin().await.unwrap();
    let enqueued = queue
        .enqueue_job_tx(&mut *tx, &Note { order: 1 })
        .await
        .unwrap();
    assert!(enqueued.inserted);
    tx.rollback().await.unwrap();
    assert_eq!(job_rows(&pool).await, 0, "rolled back: never enqueued");

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

    let leased = fetch_one(&queue, LONG).await;
    assert_eq!(leased.lease.job_id, enqueued.id);
    assert_eq!(leased.kind, "note");
    assert_eq!(leased.key, "note:order-2");
}
