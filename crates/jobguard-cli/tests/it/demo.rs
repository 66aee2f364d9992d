//! `jobguard demo` run as a user runs it: the binary, its exit code and its `--json` output.

use serde_json::Value;

use crate::common::{self, Db, Exit};
use crate::each_backend;

fn jobguard(dir: &std::path::Path, args: &[&str]) -> (bool, Value, String) {
    let run = Exit::from(
        common::jobguard()
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run jobguard"),
    );
    (run.ok, run.json, run.stderr)
}

fn scratch(name: &str) -> std::path::PathBuf {
    Db::scratch(&format!("demo::{name}"))
}

fn assert_seed_result(report: &Value, backend: &str) {
    assert_eq!(report["backend"], backend);
    assert_eq!(
        (report["jobs"].as_u64(), report["deliveries"].as_u64()),
        (Some(100), Some(3))
    );
    assert_eq!(report["concurrency"], 20);
    let (naive, guarded) = (&report["naive"], &report["guarded"]);
    assert_eq!(naive["effects"], 300, "{report}");
    assert_eq!(naive["applied"], 300);
    assert_eq!(guarded["effects"], 100, "{report}");
    assert_eq!(guarded["applied"], 100);
    assert_eq!(guarded["duplicates"], 200);
    assert_eq!(guarded["balance_total"], report["expected_balance_total"]);
    assert_eq!(
        naive["balance_total"].as_i64().unwrap(),
        3 * guarded["balance_total"].as_i64().unwrap()
    );
    assert!(guarded["seconds"].as_f64().unwrap() > 0.0);
    assert_eq!(report["exactly_once"], true);
}

#[test]
fn demo_on_embedded_sqlite_with_no_server() {
    let dir = scratch("sqlite");
    let (ok, report, stderr) = jobguard(&dir, &["demo", "--json"]);
    assert!(ok, "{stderr}");
    assert_seed_result(&report, "sqlite");
    assert!(
        dir.join("jobguard-demo.db").exists(),
        "the default database is a file in the working directory"
    );

    // Run again on the same file: the demo resets its own tables and gets the same result.
    let (ok, report, stderr) = jobguard(&dir, &["demo", "--json"]);
    assert!(ok, "{stderr}");
    assert_seed_result(&report, "sqlite");
}

#[test]
fn demo_leaves_other_tables_alone() {
    let db = Db::sqlite("demo::others");
    db.execute("create table invoices (id integer primary key)");
    db.execute("insert into invoices values (1), (2)");
    let (ok, _, stderr) = jobguard(&db.dir, &["demo", "--json", "--database-url", &db.url]);
    assert!(ok, "{stderr}");
    assert_eq!(db.count("select count(*) from invoices"), 2);
}

#[test]
fn demo_on_postgres() {
    let Some(db) = Db::postgres("demo::demo") else {
        return;
    };
    let (ok, report, stderr) = jobguard(&db.dir, &["demo", "--json", "--database-url", &db.url]);
    assert!(ok, "{stderr}");
    assert_seed_result(&report, "postgres");
}

#[test]
fn demo_prints_a_readable_report() {
    let output = common::jobguard()
        .args(["demo", "--jobs", "20", "--deliveries", "2"])
        .current_dir(scratch("text2"))
        .output()
        .unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.contains("verdict: exactly once"), "{text}");
    assert!(text.contains("balances x2"), "{text}");
    assert!(text.contains('█'), "{text}");
}

#[test]
fn bad_input_gets_a_clear_error() {
    let dir = scratch("bad");
    let (ok, _, stderr) = jobguard(
        &dir,
        &["demo", "--database-url", "mysql://root@127.0.0.1/test"],
    );
    assert!(!ok);
    assert!(stderr.contains("unsupported database URL"), "{stderr}");
    let (ok, _, stderr) = jobguard(
        &dir,
        &["demo", "--database-url", "postgres://nobody@127.0.0.1:1/x"],
    );
    assert!(!ok);
    assert!(stderr.contains("cannot connect to PostgreSQL"), "{stderr}");
    let (ok, _, stderr) = jobguard(&dir, &["demo", "--jobs", "0"]);
    assert!(!ok);
    assert!(stderr.contains("--jobs"), "{stderr}");
}

/// Runs a scenario and checks the seed's claim: the naive job repeats effects, the guarded job
/// applies each job once and reports the rest as duplicates.
fn assert_scenario(db: &Db, name: &str, naive_effects: i64, duplicates: u64) {
    let (ok, report, stderr) = jobguard(&db.dir, &demo_args(db, name));
    assert!(ok, "{name}: {stderr}");
    assert_eq!(report["scenario"], name);
    assert_eq!(report["jobs"], 20);
    assert_eq!(
        report["naive"]["effects"], naive_effects,
        "{name}: {report}"
    );
    assert_eq!(report["guarded"]["effects"], 20, "{name}: {report}");
    assert_eq!(report["guarded"]["applied"], 20, "{name}: {report}");
    assert_eq!(
        report["guarded"]["duplicates"], duplicates,
        "{name}: {report}"
    );
    assert_eq!(
        report["guarded"]["balance_total"],
        report["expected_balance_total"]
    );
    assert_eq!(report["exactly_once"], true);
}

const SCENARIOS: [(&str, i64, u64); 4] = [
    // Every 5th job's worker process is killed after its effect and before its ack: 4 kills.
    ("crash-before-ack", 24, 4),
    // Every job's first attempt answers after the caller gave up: every job runs twice.
    ("retry-after-timeout", 40, 20),
    // The slow worker's 5 jobs are run again by the second worker while it still runs them.
    ("lease-expiry", 25, 5),
    // 10 jobs enqueued twice while waiting (the queue returns the live job) and 10 after they
    // completed (the guard reports them): the naive producer's random keys run all 40.
    ("double-enqueue", 40, 10),
];

/// `demo --json --scenario NAME`, on the embedded SQLite file in the test's directory or on
/// the test's PostgreSQL schema.
fn demo_args<'a>(db: &'a Db, name: &'a str) -> Vec<&'a str> {
    let mut args = vec!["demo", "--json", "--scenario", name];
    if db.is_postgres() {
        args.extend(["--database-url", &db.url]);
    }
    args
}

/// Every scenario, each on a database of its own.
fn scenarios(db: &Db) {
    for (name, naive, duplicates) in SCENARIOS {
        let db = db.another(&format!("demo::scenario::{name}"));
        assert_scenario(&db, name, naive, duplicates);
    }
}

each_backend!(scenarios, charge_scenario);

/// `demo --scenario charge`: worker processes are killed after the provider charged and before
/// the database commit. Without a key the provider charges again on redelivery; with the key,
/// and keyless behind a reconciled step, every order is charged exactly once.
fn charge_scenario(db: &Db) {
    let (ok, report, stderr) = jobguard(&db.dir, &demo_args(db, "charge"));
    assert!(ok, "{stderr}\n{report}");
    assert_eq!(report["scenario"], "charge");
    assert_eq!(report["jobs"], 20);
    assert_eq!(report["provider_charges"], 20, "{report}");
    assert_eq!(report["exactly_once"], true);
    let naive = &report["naive"];
    assert_eq!(naive["crashes"], 4, "{report}");
    assert!(
        naive["provider_charges"].as_i64().unwrap() >= 24,
        "each killed delivery was charged again: {report}"
    );
    assert!(naive["orders_charged_more_than_once"].as_u64().unwrap() >= 4);
    assert_eq!(
        naive["effects"], 20,
        "the database recorded one charge per order"
    );
    for run in [&report["guarded"], &report["keyless"]] {
        assert_eq!(run["crashes"], 4, "{report}");
        assert_eq!(run["provider_charges"], 20, "{report}");
        assert_eq!(run["orders_charged_more_than_once"], 0, "{report}");
        assert_eq!(run["effects"], 20, "{report}");
        assert_eq!(run["balance_total"], report["expected_balance_total"]);
    }
}
