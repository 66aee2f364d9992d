//! `jobguard demo` run as a user runs it: the binary, its exit code and its `--json` output.

use std::process::Command;

use serde_json::Value;

fn jobguard(dir: &std::path::Path, args: &[&str]) -> (bool, Value, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_jobguard"))
        .args(args)
        .current_dir(dir)
        .env_remove("DATABASE_URL")
        .output()
        .expect("run jobguard");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let json = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    (output.status.success(), json, stderr)
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("jobguard-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
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
    let dir = scratch("others");
    let url = format!("sqlite:{}", dir.join("app.db").display());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let pool = jobguard::sqlite::connect(&url, 1).await.unwrap();
        sqlx::query("create table invoices (id integer primary key)")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("insert into invoices values (1), (2)")
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    });
    let (ok, _, stderr) = jobguard(&dir, &["demo", "--json", "--database-url", &url]);
    assert!(ok, "{stderr}");
    rt.block_on(async {
        let pool = jobguard::sqlite::connect(&url, 1).await.unwrap();
        let n: i64 = sqlx::query_scalar("select count(*) from invoices")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(n, 2);
    });
}

#[test]
fn demo_on_postgres() {
    let Some(url) = postgres_schema_url("demo") else {
        return;
    };
    let (ok, report, stderr) =
        jobguard(&scratch("pg"), &["demo", "--json", "--database-url", &url]);
    assert!(ok, "{stderr}");
    assert_seed_result(&report, "postgres");
}

#[test]
fn demo_prints_a_readable_report() {
    let output = Command::new(env!("CARGO_BIN_EXE_jobguard"))
        .args(["demo", "--jobs", "20", "--deliveries", "2"])
        .current_dir(scratch("text2"))
        .env_remove("DATABASE_URL")
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

/// A URL whose connections use a fresh schema of this test's own, so demos running at the same
/// time do not share tables.
fn postgres_schema_url(name: &str) -> Option<String> {
    let url = postgres_url()?;
    let schema = format!("jg_cli_{name}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let pool = sqlx::PgPool::connect(&url)
            .await
            .expect("connect to PostgreSQL");
        let reset = format!("drop schema if exists {schema} cascade; create schema {schema}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(reset))
            .execute(&pool)
            .await
            .unwrap();
    });
    let separator = if url.contains('?') { '&' } else { '?' };
    Some(format!(
        "{url}{separator}options=-c%20search_path%3D{schema}"
    ))
}

/// Runs a scenario and checks the seed's claim: the naive job repeats effects, the guarded job
/// applies each job once and reports the rest as duplicates.
fn assert_scenario(url: Option<&str>, name: &str, naive_effects: i64, duplicates: u64) {
    let dir = scratch(&format!(
        "scenario-{name}-{}",
        if url.is_some() { "pg" } else { "sqlite" }
    ));
    let mut args = vec!["demo", "--json", "--scenario", name];
    if let Some(url) = url {
        args.extend(["--database-url", url]);
    }
    let (ok, report, stderr) = jobguard(&dir, &args);
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

#[test]
fn scenarios_on_embedded_sqlite() {
    for (name, naive, duplicates) in SCENARIOS {
        assert_scenario(None, name, naive, duplicates);
    }
}

#[test]
fn scenarios_on_postgres() {
    for (name, naive, duplicates) in SCENARIOS {
        let Some(url) = postgres_schema_url(&name.replace('-', "_")) else {
            return;
        };
        assert_scenario(Some(&url), name, naive, duplicates);
    }
}

fn postgres_url() -> Option<String> {
    match std::env::var("JOBGUARD_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").is_ok_and(|ci| ci == "true") => {
            panic!(
                "CI=true but JOBGUARD_TEST_DATABASE_URL is unset: run the tests with scripts/test"
            )
        }
        _ => {
            // Straight to the process's stderr: `eprintln!` is captured by the test harness and
            // shown only for failing tests, so a skip would pass unseen.
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!(
                    "SKIPPED {}: JOBGUARD_TEST_DATABASE_URL is unset, so this PostgreSQL test did \
                     not run (set it, e.g. to postgres://postgres@127.0.0.1:5432/test, or run \
                     scripts/test; with CI=true it fails instead)\n",
                    std::thread::current().name().unwrap_or("a test")
                )
                .as_bytes(),
            );
            None
        }
    }
}

/// `demo --scenario charge`: worker processes are killed after the provider charged and before
/// the database commit. Without a key the provider charges again on redelivery; with the key,
/// and keyless behind a reconciled step, every order is charged exactly once.
fn assert_charge_scenario(url: Option<&str>) {
    let dir = scratch(&format!(
        "charge-{}",
        if url.is_some() { "pg" } else { "sqlite" }
    ));
    let mut args = vec!["demo", "--json", "--scenario", "charge"];
    if let Some(url) = url {
        args.extend(["--database-url", url]);
    }
    let (ok, report, stderr) = jobguard(&dir, &args);
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

#[test]
fn charge_scenario_on_embedded_sqlite() {
    assert_charge_scenario(None);
}

#[test]
fn charge_scenario_on_postgres() {
    let Some(url) = postgres_schema_url("charge") else {
        return;
    };
    assert_charge_scenario(Some(&url));
}
