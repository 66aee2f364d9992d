//! `jobguard enqueue` under unique policies: the flags, their errors, the JSON report, and
//! several enqueue processes at once inserting one job.

use std::time::Duration;

use jobguard::{Backend, Queue};
use serde_json::{Value, json};
use sqlx::Pool;

use crate::common::Db;
use crate::{each_backend, on_pool};

const FEE: [&str; 5] = ["enqueue", "fee", "--key", "fee:acct-7", "--payload"];

fn enqueue(db: &Db, payload: &str, more: &[&str]) -> jobguard_testsupport::Exit {
    let mut args = FEE.to_vec();
    args.push(payload);
    args.extend_from_slice(more);
    args.push("--json");
    db.run(&args)
}

each_backend!(enqueue_takes_a_policy_and_reports_what_it_did);
fn enqueue_takes_a_policy_and_reports_what_it_did(db: &Db) {
    let policy = [
        "--unique-states",
        "available,running,completed",
        "--delay",
        "1h",
    ];
    let first = enqueue(
        db,
        r#"{"a": 1}"#,
        &[&policy[..], &["--on-conflict", "reject"]].concat(),
    );
    assert!(first.ok, "{}", first.stderr);
    assert_eq!(first.json["inserted"], true);
    assert_eq!(first.json["existing_id"], Value::Null);
    let id = first.json["id"].clone();

    // Reject: exit 1, naming the job that holds the key.
    let rejected = enqueue(
        db,
        r#"{"a": 1}"#,
        &[&policy[..], &["--on-conflict", "reject"]].concat(),
    );
    assert!(!rejected.ok);
    assert_eq!(rejected.status.code(), Some(1));
    assert_eq!(
        (
            &rejected.json["rejected"],
            &rejected.json["existing_id"],
            &rejected.json["inserted"]
        ),
        (&json!(true), &id, &json!(false))
    );
    let text = db.run(&[&FEE[..], &[r#"{"a": 1}"#, "--on-conflict", "reject"]].concat());
    assert!(!text.ok);
    assert!(
        text.stdout.contains(&format!("taken by job {id}")),
        "{}",
        text.stdout
    );

    // Replace while it waits: the new payload, same job.
    let replaced = enqueue(
        db,
        r#"{"a": 2}"#,
        &[&policy[..], &["--on-conflict", "replace"]].concat(),
    );
    assert!(replaced.ok, "{}", replaced.stderr);
    assert_eq!(
        (
            &replaced.json["replaced"],
            &replaced.json["existing_id"],
            &replaced.json["existing_state"]
        ),
        (&json!(true), &id, &json!("available"))
    );
    // The default returns it, now with the replaced payload.
    let returned = enqueue(db, r#"{"a": 2}"#, &[]);
    assert!(returned.ok, "{}", returned.stderr);
    assert_eq!(
        (&returned.json["inserted"], &returned.json["id"]),
        (&json!(false), &id)
    );

    let key = db.json(&["key", "fee:acct-7"]);
    assert_eq!(key["jobs"][0]["replaced"], 1);
    assert_eq!(
        key["jobs"][0]["unique_states"],
        "available,running,completed"
    );
    assert_eq!(key["holder"]["id"], id);
    assert_eq!(key["holder"]["live"], true);

    // Bad input: clear errors, nothing enqueued.
    for (flags, says) in [
        (
            &["--unique-states", "available,completed"][..],
            "missing: running",
        ),
        (
            &["--unique-states", "available,running,finished"][..],
            "unknown job state `finished`",
        ),
        (&["--unique-period", "0s"][..], "invalid unique period"),
        (
            &["--unique-period", "1500ms"][..],
            "whole number of seconds",
        ),
        (
            &["--on-conflict", "ignore"][..],
            "use return, reject, replace or replace-or-reject",
        ),
    ] {
        let refused = enqueue(db, r#"{"a": 3}"#, flags);
        assert!(!refused.ok, "{flags:?} was accepted");
        assert!(
            refused.stderr.contains(says),
            "{flags:?}: {}",
            refused.stderr
        );
    }

    // A period in the key: the day the job runs.
    let daily = enqueue(db, r#"{"a": 1}"#, &["--unique-period", "1d"]);
    assert!(daily.ok, "{}", daily.stderr);
    let stored = daily.json["key"].as_str().unwrap().to_owned();
    assert!(
        stored.starts_with("fee:acct-7:") && stored.len() == "fee:acct-7:2026-10-02".len(),
        "{stored}"
    );
    assert_eq!(daily.json["inserted"], true);
}

/// Leases the one waiting job, as a worker does, and returns its id.
async fn hold<DB: Backend>(pool: Pool<DB>) -> i64 {
    let leased = Queue::new(pool)
        .fetch("default", 1, Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(leased.len(), 1, "one job waits");
    leased[0].lease.job_id
}

each_backend!(replace_says_on_stderr_when_a_worker_holds_the_job);
fn replace_says_on_stderr_when_a_worker_holds_the_job(db: &Db) {
    let replace = ["--on-conflict", "replace"];
    let first = enqueue(db, r#"{"a": 1}"#, &replace);
    assert!(first.ok, "{}", first.stderr);
    let id = on_pool!(db, |pool| hold(pool.clone()));
    assert_eq!(first.json["id"], id);

    // Exit 0, as before, but the dropped payload is said on stderr.
    let kept = enqueue(db, r#"{"a": 2}"#, &replace);
    assert!(kept.ok, "{}", kept.stderr);
    assert_eq!(
        (&kept.json["replaced"], &kept.json["existing_state"]),
        (&json!(false), &json!("running"))
    );
    let warnings: Vec<&str> = kept
        .stderr
        .lines()
        .filter(|line| line.starts_with("warning:"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", kept.stderr);
    assert!(
        warnings[0].contains(&format!("job {id} (fee:acct-7) kept its payload"))
            && warnings[0].contains("a worker holds it"),
        "{}",
        warnings[0]
    );

    // replace-or-reject: exit 1, naming the job; its payload is still the first one.
    let refused = enqueue(db, r#"{"a": 2}"#, &["--on-conflict", "replace-or-reject"]);
    assert_eq!(refused.status.code(), Some(1), "{}", refused.stderr);
    assert_eq!(
        (&refused.json["rejected"], &refused.json["existing_id"]),
        (&json!(true), &json!(id))
    );
    assert!(!refused.stderr.contains("warning:"), "{}", refused.stderr);
    let key = db.json(&["key", "fee:acct-7"]);
    assert_eq!(key["jobs"][0]["replaced"], 0, "{key}");
}

each_backend!(concurrent_enqueue_processes_insert_one_job);
fn concurrent_enqueue_processes_insert_one_job(db: &Db) {
    // The table first, so that the processes race on the key, not on the migration.
    assert!(
        db.run(&["enqueue", "fee", "--key", "fee:warm-up", "--payload", "{}"])
            .ok
    );
    let runs: Vec<_> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..6)
            .map(|_| {
                scope.spawn(|| {
                    enqueue(
                        db,
                        r#"{"a": 1}"#,
                        &[
                            "--unique-states",
                            "available,running,completed,dead",
                            "--on-conflict",
                            "reject",
                        ],
                    )
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let inserted: Vec<&Value> = runs
        .iter()
        .filter(|run| run.ok)
        .map(|run| &run.json["id"])
        .collect();
    assert_eq!(
        inserted.len(),
        1,
        "one process inserted: {:?}",
        runs.iter()
            .map(|r| (&r.json, &r.stderr))
            .collect::<Vec<_>>()
    );
    for run in runs.iter().filter(|run| !run.ok) {
        assert_eq!(run.json["rejected"], true, "{}", run.stderr);
        assert_eq!(&run.json["existing_id"], inserted[0]);
    }
}
