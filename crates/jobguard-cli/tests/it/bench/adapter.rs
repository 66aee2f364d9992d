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

/// A running adapter, killed if the test fails before it is stopped: a failed test must not
/// leave it running against the test's database.
struct Adapter(Option<Child>);

impl std::ops::Deref for Adapter {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.0.as_ref().expect("running")
    }
}

impl std::ops::DerefMut for Adapter {
    fn deref_mut(&mut self) -> &mut Child {
        self.0.as_mut().expect("running")
    }
}

impl Drop for Adapter {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The adapter on `db`, with the harness's environment and `env` over it.
fn adapter(db: &Db, variant: &str, env: &[(&str, &str)]) -> Adapter {
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
    Adapter(Some(command.spawn().expect("start the adapter")))
}

/// Sends SIGTERM and waits for the adapter to exit, which the contract wants within 5 s (here
/// 15 s, for a loaded machine); its stdout lines, parsed.
fn stop(mut adapter: Adapter) -> Vec<Value> {
    let pid = adapter.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let started = Instant::now();
    while adapter.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the adapter did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let child = adapter.0.take().expect("running");
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
    // Each job's row is deleted as it completes (the adapter keeps no completed job): no row
    // left means no job beyond the 200 it was told to enqueue, all of which applied.
    assert_eq!(db.count("select count(*) from jobguard_adapter_jobs"), 0);
    assert_eq!(db.count(applied), 200);
}

/// Jobs the adapter enqueued: those still in its queue, and those applied, whose rows were
/// deleted as they completed and whose keys the guard table holds.
const PRODUCED: &str = "select (select count(*) from jobguard_adapter_jobs) \
                        + (select count(*) from jobguard_adapter_processed_jobs)";

/// Jobs waiting in the adapter's queue: stored available, no lease on them.
const WAITING: &str = "select count(*) from jobguard_adapter_jobs \
                       where state = 'available' and leased_until is null";

/// Waits until the adapter's tables exist.
fn migrated(db: &Db) {
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
}

/// In depth-target mode the producer keeps the queue near its target while the workers drain
/// it: two slow workers (50 ms a job, about 40 jobs/s) under a target of 400.
#[test]
fn depth_target_keeps_the_queue_near_its_target_while_workers_drain_it() {
    let Some(db) = Db::postgres("bench::adapter_depth_target") else {
        return;
    };
    let child = adapter(
        &db,
        "per-job",
        &[
            ("PRODUCER_MODE", "depth-target"),
            ("TARGET_DEPTH", "400"),
            ("WORKER_COUNT", "2"),
            ("JOB_WORK_MS", "50"),
        ],
    );
    migrated(&db);
    std::thread::sleep(Duration::from_secs(2));
    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(db.count(WAITING));
        std::thread::sleep(Duration::from_millis(500));
    }
    let lines = stop(child);
    assert!(
        seen.iter().all(|&waiting| (300..=460).contains(&waiting)),
        "the waiting jobs strayed from the target of 400: {seen:?}"
    );
    let applied = db.count("select count(*) from jobguard_adapter_processed_jobs");
    assert!(applied > 0, "the workers drained it meanwhile");
    let depths: Vec<f64> = lines
        .iter()
        .filter(|r| r["metric"] == "queue_depth")
        .filter_map(|r| r["value"].as_f64())
        .collect();
    assert!(
        depths.iter().rev().take(2).all(|&d| d >= 300.0),
        "the reported depth: {depths:?}"
    );
}

/// A replica says which one it is in every record, and with `PRODUCER_ONLY_INSTANCE_ZERO=1`
/// only replica 0 produces.
#[test]
fn a_replica_names_itself_and_produces_only_when_asked() {
    let Some(db) = Db::postgres("bench::adapter_replica") else {
        return;
    };
    let child = adapter(
        &db,
        "per-job",
        &[
            ("BENCH_INSTANCE_ID", "3"),
            ("PRODUCER_ONLY_INSTANCE_ZERO", "1"),
        ],
    );
    migrated(&db);
    std::thread::sleep(Duration::from_secs(3));
    let lines = stop(child);
    assert!(lines.len() > METRICS.len(), "{lines:?}");
    for record in &lines {
        assert_eq!(record["instance_id"], 3, "{record}");
    }
    assert_eq!(db.count(PRODUCED), 0, "replica 3 produced");
}

/// In the fixed mode the rate comes from `PRODUCER_RATE_CONTROL_FILE` while it has one: 0
/// pauses the producer, a number resumes it at that rate.
#[test]
fn the_rate_control_file_sets_the_fixed_rate() {
    let Some(db) = Db::postgres("bench::adapter_rate_control") else {
        return;
    };
    let file = std::env::temp_dir().join(format!("jobguard-rate-{}", std::process::id()));
    std::fs::write(&file, "0\n").unwrap();
    let child = adapter(
        &db,
        "per-job",
        &[("PRODUCER_RATE_CONTROL_FILE", file.to_str().unwrap())],
    );
    migrated(&db);
    std::thread::sleep(Duration::from_secs(2));
    let jobs = PRODUCED;
    assert_eq!(db.count(jobs), 0, "a rate of 0 enqueues nothing");
    std::fs::write(&file, "300\n").unwrap();
    let started = Instant::now();
    while db.count(jobs) < 100 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the producer did not resume: {} jobs",
            db.count(jobs)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    stop(child);
    let _ = std::fs::remove_file(&file);
}
