//! `jobguard bench queue` run as a user runs it, small: every figure reported, and every credit
//! job applied exactly once one per transaction and in batches. No speed is asserted.

use serde_json::Value;

use crate::common::Db;
use crate::each_backend;

mod adapter;
mod soak;

/// Every field of `jobguard bench queue --json`.
const FIELDS: [&str; 25] = [
    "backend",
    "jobs",
    "concurrency",
    "batch_size",
    "noop_jobs_per_s",
    "credit_jobs_per_s",
    "batched_noop_jobs_per_s",
    "batched_credit_jobs_per_s",
    "pgbench_tps",
    "rounds",
    "round_ratios",
    "ratio",
    "batched_ratio",
    "exactly_once",
    "batched_exactly_once",
    "rate",
    "pickup_jobs",
    "latency_p50_ms",
    "latency_p99_ms",
    "batched_latency_p50_ms",
    "batched_latency_p99_ms",
    "poll_interval_ms",
    "batch_linger_ms",
    "periodic",
    "pickup",
];

fn positive(report: &Value, field: &str) -> f64 {
    let value = report[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} is not a number: {report}"));
    assert!(value > 0.0, "{field} is not positive: {report}");
    value
}

/// 200 jobs of each kind, one per transaction and in batches of 10, and two pickup runs.
fn bench_queue_reports_batches_and_latency(db: &Db) {
    let report = db.json(&[
        "bench",
        "queue",
        "--jobs",
        "200",
        "--batch-size",
        "10",
        "--rounds",
        "2",
    ]);
    let object = report.as_object().unwrap();
    let mut missing: Vec<&str> = FIELDS
        .iter()
        .copied()
        .filter(|field| !object.contains_key(*field))
        .collect();
    missing.sort_unstable();
    assert!(missing.is_empty(), "missing {missing:?}: {report}");
    assert_eq!(object.len(), FIELDS.len(), "unexpected fields: {report}");

    assert_eq!(report["backend"], db.backend());
    assert_eq!(report["jobs"], 200);
    assert_eq!(report["batch_size"], 10);
    assert_eq!(
        report["periodic"], 0,
        "no schedules unless --periodic: {report}"
    );
    assert_eq!(report["exactly_once"], true, "{report}");
    assert_eq!(report["batched_exactly_once"], true, "{report}");
    for field in [
        "noop_jobs_per_s",
        "credit_jobs_per_s",
        "batched_noop_jobs_per_s",
        "batched_credit_jobs_per_s",
        "rate",
        "pickup_jobs",
    ] {
        positive(&report, field);
    }
    for field in [
        "latency_p50_ms",
        "latency_p99_ms",
        "batched_latency_p50_ms",
        "batched_latency_p99_ms",
    ] {
        assert!(report[field].as_f64().is_some(), "{field}: {report}");
    }
    assert!(
        report["latency_p50_ms"].as_f64() <= report["latency_p99_ms"].as_f64(),
        "{report}"
    );
    assert!(positive(&report, "pickup_jobs") <= 200.0, "{report}");
    // A run at each of 10%, 50% and 90% of the per-job rate, each shape's percentiles in order.
    let runs = report["pickup"].as_array().expect("pickup runs");
    let loads: Vec<f64> = runs.iter().map(|r| r["load"].as_f64().unwrap()).collect();
    assert_eq!(loads, [0.1, 0.5, 0.9], "{report}");
    for run in runs {
        for shape in ["per_job", "batched"] {
            let l = &run[shape];
            let order: Vec<f64> = ["p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"]
                .iter()
                .map(|p| {
                    l[*p]
                        .as_f64()
                        .unwrap_or_else(|| panic!("{shape}.{p}: {report}"))
                })
                .collect();
            assert!(order.windows(2).all(|w| w[0] <= w[1]), "{shape}: {report}");
        }
    }
    let half = &runs[1];
    assert_eq!(
        half["per_job"]["p50_ms"], report["latency_p50_ms"],
        "{report}"
    );

    // pgbench runs only on PostgreSQL, and only when it is installed; the ratios go with it.
    let pgbench = report["pgbench_tps"].as_f64();
    if db.is_postgres() {
        if let Some(tps) = pgbench {
            assert!(tps > 0.0, "{report}");
        }
    } else {
        assert_eq!(pgbench, None, "{report}");
    }
    for ratio in ["ratio", "batched_ratio"] {
        assert_eq!(report[ratio].is_null(), pgbench.is_none(), "{report}");
    }
    // Two rounds of a credit drain and pgbench: a ratio each, and their median.
    assert_eq!(report["rounds"], 2, "{report}");
    let rounds = report["round_ratios"].as_array().expect("round_ratios");
    assert_eq!(
        rounds.len(),
        if pgbench.is_some() { 2 } else { 0 },
        "{report}"
    );
    if let [first, second] = &rounds[..] {
        let (first, second) = (first.as_f64().unwrap(), second.as_f64().unwrap());
        let median = report["ratio"].as_f64().unwrap();
        assert!((median - (first + second) / 2.0).abs() < 1e-9, "{report}");
    }
}

each_backend!(bench_queue_reports_batches_and_latency);
