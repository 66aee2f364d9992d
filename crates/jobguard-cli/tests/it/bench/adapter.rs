//! `jobguard bench adapter` against the public cross-system benchmark's adapter contract: a
//! descriptor line, then every `SAMPLE_EVERY_S` one record per required metric, JSON each;
//! a clean exit on SIGTERM; and, paced by the harness, exactly the jobs its `ENQUEUE <n>`
//! lines ask for. No speed is asserted.

use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Db, jobguard};

/// The metrics every sample carries.
const METRICS: [&str; 6] = [
    "claim_p50_ms",
    "claim_p95_ms",
    "claim_p99_ms",
    "enqueue_rate",
    "completion_rate",
    "queue_depth",
];

/// The adapter on `db`, with the harness's environment and `env` over it.
fn adapter(db: &Db, variant: &str, env: &[(&str, &str)]) -> Child {
    let mut command: Command = jobguard();
    command
        .args(["bench", "adapter", "--variant", variant])
        .env("DATABASE_URL", &db.url)
        .env("SCENARIO", "long_horizon")
        .env("PRODUCER_MODE", "fixed")
        .env("PRODUCER_RATE", "200")
        .env("WORKER_COUNT", "4")
        .env("JOB_WORK_MS", "1")
        .env("SAMPLE_EVERY_S", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command.spawn().expect("start the adapter")
}

/// Sends SIGTERM and waits for the adapter to exit, which the contract wants within 5 s (here
/// 15 s, for a loaded machine); its stdout lines, parsed.
fn stop(mut child: Child) -> Vec<Value> {
    let pid = child.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the adapter did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}: {stderr}", output.status);
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}")))
        .collect()
}

/// A timestamp as the contract writes them: `2026-04-17T09:00:10.000Z`.
fn is_timestamp(value: &Value) -> bool {
    let text = value.as_str().unwrap_or_default();
    text.len() == 24 && text.ends_with('Z') && text.as_bytes()[10] == b'T'
}

fn speaks_the_contract(variant: &str, system: &str) {
    let Some(db) = Db::postgres(&format!("bench::adapter_{system}")) else {
        return;
    };
    let child = adapter(&db, variant, &[]);
    std::thread::sleep(Duration::from_secs(5));
    let lines = stop(child);
    let (descriptor, samples) = lines.split_first().expect("a descriptor");
    assert_eq!(descriptor["kind"], "descriptor", "{descriptor}");
    assert_eq!(descriptor["system"], system, "{descriptor}");
    assert!(is_timestamp(&descriptor["started_at"]), "{descriptor}");
    let tables = descriptor["event_tables"].as_array().expect("event_tables");
    assert!(
        tables
            .iter()
            .any(|t| t.as_str().unwrap().ends_with(".jobguard_adapter_jobs")),
        "{descriptor}"
    );
    assert!(descriptor["extensions"].is_array(), "{descriptor}");

    // Ticks of six records each, one per metric, every field of the contract's sample.
    assert!(samples.len() >= 2 * METRICS.len(), "{samples:?}");
    assert_eq!(samples.len() % METRICS.len(), 0, "{samples:?}");
    let mut completed = 0.0;
    for tick in samples.chunks(METRICS.len()) {
        let by_metric = |metric: &str| -> f64 {
            let record = tick
                .iter()
                .find(|r| r["metric"] == metric)
                .unwrap_or_else(|| panic!("no {metric} in {tick:?}"));
            assert_eq!(record["kind"], "adapter", "{record}");
            assert_eq!(record["subject_kind"], "adapter", "{record}");
            assert_eq!(record["subject"], "", "{record}");
            assert_eq!(record["system"], system, "{record}");
            assert!(is_timestamp(&record["t"]), "{record}");
            assert!(record["window_s"].is_u64(), "{record}");
            let value = record["value"].as_f64().expect("a number");
            assert!(value >= 0.0, "{record}");
            value
        };
        let [p50, p95, p99] = [
            by_metric("claim_p50_ms"),
            by_metric("claim_p95_ms"),
            by_metric("claim_p99_ms"),
        ];
        assert!(p50 <= p95 && p95 <= p99, "{tick:?}");
        by_metric("enqueue_rate");
        by_metric("queue_depth");
        completed += by_metric("completion_rate");
    }
    assert!(completed > 0.0, "jobs completed: {samples:?}");
    let done = db.count("select count(*) from jobguard_adapter_processed_jobs");
    assert!(done > 0, "every completed job claimed its key");
}

#[test]
fn the_per_job_variant_speaks_the_contract() {
    speaks_the_contract("per-job", "jobguard");
}

#[test]
fn the_batched_variant_speaks_the_contract() {
    speaks_the_contract("batched", "jobguard-batched");
}

/// With `PRODUCER_PACING=harness` the adapter enqueues what each `ENQUEUE <n>` line says, and
/// nothing of its own.
#[test]
fn paced_by_the_harness_it_enqueues_what_it_is_told() {
    let Some(db) = Db::postgres("bench::adapter_paced") else {
        return;
    };
    let mut child = adapter(&db, "per-job", &[("PRODUCER_PACING", "harness")]);
    {
        let stdin = child.stdin.as_mut().unwrap();
        for _ in 0..5 {
            writeln!(stdin, "ENQUEUE 40").unwrap();
        }
        stdin.flush().unwrap();
    }
    let started = Instant::now();
    let migrated = "select count(*) from pg_tables where schemaname = current_schema() \
                    and tablename = 'jobguard_adapter_processed_jobs'";
    while db.count(migrated) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no guard table"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let applied = "select count(*) from jobguard_adapter_processed_jobs";
    while db.count(applied) < 200 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{} of 200 jobs ran",
            db.count(applied)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Longer than a producer tick of its own would take to add more.
    std::thread::sleep(Duration::from_millis(500));
    let lines = stop(child);
    assert!(!lines.is_empty());
    assert_eq!(db.count("select count(*) from jobguard_adapter_jobs"), 200);
    assert_eq!(db.count(applied), 200);
}
