//! `jobguard bench contention` on every backend: each of its four runs (rows of their own and
//! hot rows, one job per transaction and in batches) applies every deposit once, and the batched
//! runs count their batches. Speed is reported, never asserted.

use crate::common::Db;
use crate::each_backend;

fn every_deposit_applies_once_each_way(db: &Db) {
    let report = db.json(&[
        "bench",
        "contention",
        "--jobs",
        "120",
        "--hot-accounts",
        "2",
        "--batch-size",
        "10",
        "--concurrency",
        "4",
    ]);
    assert_eq!(report["exactly_once"], true, "{report}");
    let runs = report["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 4, "{report}");
    for run in runs {
        assert_eq!(run["exactly_once"], true, "{run}");
        assert!(run["jobs_per_s"].as_f64().unwrap() > 0.0, "{run}");
        let batches =
            run["batches"].as_u64().unwrap() + run["batches_rolled_back"].as_u64().unwrap();
        if run["batch_size"] == 1 {
            assert_eq!(batches, 0, "{run}");
        } else {
            assert!(batches > 0, "the batched run ran no batch: {run}");
        }
    }
    for field in ["own_rows_speedup", "hot_rows_speedup"] {
        assert!(report[field].as_f64().unwrap() > 0.0, "{report}");
    }
}

each_backend!(every_deposit_applies_once_each_way);
