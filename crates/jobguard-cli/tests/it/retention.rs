//! `jobguard retention`, `jobguard prune` and the worker's retention flags, as an operator runs
//! them: the real binary on a fresh SQLite file per test, and on a fresh PostgreSQL schema per
//! test when PostgreSQL answers.

use serde_json::{Value, json};

use crate::common::{Db, Exit, jobguard};
use crate::each_backend;

/// The horizon of `jobguard worker` with its defaults: retries 10m 13.2s (1 + 2 + ... + 256 s,
/// each up to 20% longer), ten 30-second leases, a 12-hour replay window, and the replayed
/// job's retries and leases again; it stays below the default 24-hour provider key lifetime.
const DEFAULT_HORIZON_SECONDS: f64 = 2.0 * (613.2 + 300.0) + 12.0 * 3600.0;

fn enqueue_credit(db: &Db, n: i64) {
    let payload = json!({"order": format!("order-{n}"), "account": n, "amount": 100});
    db.json(&["enqueue", "credit", "--payload", &payload.to_string()]);
}

/// Makes the guard rows of these orders `days` days older.
fn age_credits(db: &Db, orders: &[i64], days: i64) {
    let keys: Vec<String> = orders
        .iter()
        .map(|n| format!("'credit:order-{n}'"))
        .collect();
    let by = if db.is_postgres() {
        format!("interval '{days} days'")
    } else {
        format!("{}", days * 86_400_000_000)
    };
    db.execute(&format!(
        "update processed_jobs set applied_at = applied_at - {by} where job_key in ({})",
        keys.join(", ")
    ));
}

fn guard_rows(db: &Db) -> i64 {
    db.count("select count(*) from processed_jobs")
}

fn ledger_rows(db: &Db) -> i64 {
    db.count("select count(*) from jobguard_ledger")
}

/// `jobguard retention`, which needs no database.
fn retention(args: &[&str]) -> Exit {
    let output = jobguard()
        .arg("retention")
        .args(args)
        .output()
        .expect("run jobguard");
    Exit::from(output)
}

#[test]
fn retention_prints_the_horizon_and_checks_keep() {
    let run = retention(&["--json"]);
    assert!(run.ok, "{}", run.stderr);
    let horizon = run.json["horizon_seconds"].as_f64().unwrap();
    assert!(
        (horizon - DEFAULT_HORIZON_SECONDS).abs() < 1e-6,
        "{horizon}"
    );
    assert_eq!(run.json["horizon"], "12h 30m 26s");
    assert_eq!(run.json["provider_key_lifetime_seconds"], 86_400.0);
    assert_eq!(run.json["provider_key_lifetime_covers"], true);
    let names: Vec<&str> = run.json["terms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|term| term["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["retries", "leases", "replay window", "replayed attempts"]
    );
    assert_eq!(run.json["covered"], Value::Null, "no --keep, no verdict");

    let covered = retention(&["--keep", "14d", "--json"]);
    assert!(covered.ok);
    assert_eq!(covered.json["covered"], true);

    let short = retention(&["--keep", "6h"]);
    assert!(!short.ok, "a retention below the horizon exits non-zero");
    for needle in [
        "refused",
        "guard retention 6h",
        "12h 30m 26s",
        "replay window 12h",
    ] {
        assert!(
            short.stdout.contains(needle),
            "{needle:?}: {}",
            short.stdout
        );
    }

    // Declaring shorter windows and worker settings shrinks the horizon below three days.
    let declared = retention(&[
        "--keep",
        "3d",
        "--replay-window",
        "2d",
        "--provider-key-lifetime",
        "0s",
        "--lease",
        "1m",
        "--backoff",
        "10s",
        "--json",
    ]);
    assert!(declared.ok, "{}", declared.stdout);
    assert_eq!(declared.json["covered"], true);
    // (10 + 20 + ... + 2560 s) x 1.2 and ten leases of a minute, before and after the replay;
    // two days.
    let expected = 2.0 * (5110.0 * 1.2 + 600.0) + 2.0 * 86_400.0;
    let horizon = declared.json["horizon_seconds"].as_f64().unwrap();
    assert!((horizon - expected).abs() < 1e-6, "{horizon}");
}

/// A keyed charge dead-lettered and replayed after the provider forgot its idempotency key is
/// charged twice: a replay window of a week behind a provider that keeps keys a day is refused,
/// with both terms and both numbers; a window that fits, or no provider, is accepted.
#[test]
fn retention_refuses_a_horizon_past_the_provider_key_lifetime() {
    let refused = retention(&["--replay-window", "7d", "--provider-key-lifetime", "1d"]);
    assert!(!refused.ok, "exit 1: {}", refused.stdout);
    for needle in [
        "refused",
        "provider key lifetime 1d",
        "replay window 7d",
        "7d 30m 26s",
        "to at most 23h 29m 32s",
    ] {
        assert!(
            refused.stdout.contains(needle),
            "{needle:?}: {}",
            refused.stdout
        );
    }
    let json = retention(&[
        "--replay-window",
        "7d",
        "--provider-key-lifetime",
        "1d",
        "--json",
    ]);
    assert!(!json.ok);
    assert_eq!(json.json["provider_key_lifetime_covers"], false);
    assert!(
        json.json["provider_error"]
            .as_str()
            .is_some_and(|error| error.contains("provider key lifetime 1d")),
        "{}",
        json.json
    );
    // Even a guard retention that covers the horizon does not help: the provider forgets.
    assert!(
        !retention(&[
            "--keep",
            "14d",
            "--replay-window",
            "7d",
            "--provider-key-lifetime",
            "1d"
        ])
        .ok
    );

    // The defaults are consistent; so is a week of replay with no keyed external API.
    assert!(retention(&[]).ok);
    let no_provider = retention(&["--replay-window", "7d", "--provider-key-lifetime", "0s"]);
    assert!(no_provider.ok, "{}", no_provider.stdout);
    assert!(
        no_provider
            .stdout
            .contains("no provider key lifetime declared")
    );
}

/// Three credits applied; two of them 20 days ago. A dry run counts two and deletes nothing;
/// the prune deletes them in batches; a replay of one of them would now apply again, which is
/// why the retention is checked against the horizon.
fn prune_deletes_what_is_past_the_retention(db: &Db) {
    for n in 1..=3 {
        enqueue_credit(db, n);
    }
    let report = db.json(&["worker", "--until-idle"]);
    assert_eq!(report["applied"], 3, "{report}");
    assert_eq!(report["pruned"], 0);
    age_credits(db, &[1, 2], 20);

    let dry = db.json(&["prune", "--dry-run"]);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(
        (dry["guard_rows"].as_u64(), dry["batches"].as_u64()),
        (Some(2), Some(0))
    );
    assert_eq!(dry["steps_table"], "jobguard_steps", "{dry}");
    assert!(dry["oldest_age_seconds"].as_f64().unwrap() > 19.0 * 86_400.0);
    assert_eq!(guard_rows(db), 3, "a dry run deletes nothing");
    let text = db.run(&["prune", "--dry-run"]);
    assert!(
        text.ok && text.stdout.contains("would delete 2 guard rows"),
        "{}",
        text.stdout
    );

    let pruned = db.json(&["prune", "--keep", "14d", "--batch", "1", "--pause", "0s"]);
    assert_eq!(pruned["guard_rows"], 2, "{pruned}");
    // Two batches of one, one that found nothing; one for the step ledger; one each for
    // completed and dead jobs, none of them a day old.
    assert_eq!(pruned["batches"], 6, "{pruned}");
    assert_eq!(
        (
            pruned["completed_jobs"].as_u64(),
            pruned["dead_jobs"].as_u64()
        ),
        (Some(0), Some(0)),
        "{pruned}"
    );
    assert_eq!(pruned["overridden"], false);
    assert!(pruned["oldest_age_seconds"].as_f64().unwrap() < 86_400.0);
    assert_eq!(guard_rows(db), 1);

    // Nothing left to prune.
    assert_eq!(db.json(&["prune"])["guard_rows"], 0);
    assert_eq!(ledger_rows(db), 3);

    // Completed jobs can go at once: the guard row is the durable record.
    assert_eq!(db.json(&["jobs"])["counts"]["completed"], 3);
    let dry = db.json(&["prune", "--keep-completed", "0s", "--dry-run"]);
    assert_eq!(dry["completed_jobs"], 3, "{dry}");
    assert_eq!(
        db.json(&["jobs"])["counts"]["completed"],
        3,
        "a dry run deletes nothing"
    );
    let jobs = db.json(&["prune", "--keep-completed", "0s"]);
    assert_eq!(
        (jobs["completed_jobs"].as_u64(), jobs["guard_rows"].as_u64()),
        (Some(3), Some(0))
    );
    let listed = db.json(&["jobs"]);
    assert_eq!(listed["counts"]["completed"], 0, "{listed}");
    assert_eq!(listed["jobs"], json!([]), "{listed}");
    let text = db.run(&["prune", "--keep-completed", "0s"]);
    assert!(
        text.stdout
            .contains("deleted 0 completed jobs older than 0s and 0 dead jobs older than 7d"),
        "{}",
        text.stdout
    );
    // The third credit again: its job row is gone, its guard row stops it.
    enqueue_credit(db, 3);
    let report = db.json(&["worker", "--until-idle"]);
    assert_eq!(
        (report["applied"].as_u64(), report["duplicates"].as_u64()),
        (Some(0), Some(1)),
        "{report}"
    );
    assert_eq!(ledger_rows(db), 3);

    // Dead jobs are kept at least through the replay window.
    let error = db.fails(&["prune", "--keep-dead", "1h"]);
    assert!(
        error.contains("dead-job retention 1h is shorter than the replay window 12h"),
        "{error}"
    );
    let error = db.fails(&["worker", "--until-idle", "--keep-dead", "1h"]);
    assert!(error.contains("dead-job retention 1h"), "{error}");
}

/// A --keep shorter than the horizon is refused by prune and worker alike, with the numbers;
/// --override-horizon goes ahead; shorter declared windows make the same --keep acceptable.
fn short_retentions_are_refused_unless_overridden(db: &Db) {
    enqueue_credit(db, 1);
    db.json(&["worker", "--until-idle"]);
    age_credits(db, &[1], 2);

    let error = db.fails(&["prune", "--keep", "6h"]);
    for needle in [
        "guard retention 6h is shorter than the horizon",
        "12h 30m 26s",
        "replay window 12h + replayed attempts 15m 13s",
        "at least 12h 30m 26s",
    ] {
        assert!(error.contains(needle), "{needle:?} missing from: {error}");
    }
    assert_eq!(guard_rows(db), 1, "nothing was pruned");

    enqueue_credit(db, 2);
    let error = db.fails(&["worker", "--until-idle", "--keep", "6h"]);
    assert!(error.contains("guard retention 6h is shorter"), "{error}");
    assert_eq!(ledger_rows(db), 1, "the worker did not start");

    // A replay window past the provider's key lifetime is refused by prune and worker alike,
    // whatever the guard keeps and even with --override-horizon.
    let stripe = ["--replay-window", "7d", "--provider-key-lifetime", "1d"];
    let error = db.fails(&[&["prune", "--keep", "14d"][..], &stripe].concat());
    for needle in ["provider key lifetime 1d", "replay window 7d"] {
        assert!(error.contains(needle), "{needle:?} missing from: {error}");
    }
    assert_eq!(guard_rows(db), 1, "nothing was pruned");
    let error = db.fails(
        &[
            &["worker", "--until-idle", "--override-horizon"][..],
            &stripe,
        ]
        .concat(),
    );
    assert!(error.contains("provider key lifetime 1d"), "{error}");
    assert_eq!(ledger_rows(db), 1, "the worker did not start");

    let overridden = db.json(&["prune", "--keep", "6h", "--override-horizon"]);
    assert_eq!(overridden["overridden"], true);
    assert_eq!(overridden["guard_rows"], 1, "{overridden}");

    // With a 2-hour replay window and no external API, six hours cover the horizon.
    let report = db.json(&[
        "worker",
        "--until-idle",
        "--keep",
        "6h",
        "--replay-window",
        "2h",
        "--provider-key-lifetime",
        "0s",
    ]);
    assert_eq!(report["applied"], 1, "{report}");
    assert_eq!(ledger_rows(db), 2);

    let schedule = db.fails(&["worker", "--until-idle", "--prune-schedule", "every night"]);
    assert!(schedule.contains("not a cron expression"), "{schedule}");
    let off = db.json(&["worker", "--until-idle", "--prune-schedule", "off"]);
    assert_eq!(off["applied"], 0);
}

fn prune_without_a_guard_table_says_so(db: &Db) {
    let error = db.fails(&["prune"]);
    assert!(error.contains("no guard table `processed_jobs`"), "{error}");
}

each_backend!(
    prune_deletes_what_is_past_the_retention,
    short_retentions_are_refused_unless_overridden,
    prune_without_a_guard_table_says_so,
);
