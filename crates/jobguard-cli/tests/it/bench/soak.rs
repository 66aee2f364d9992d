//! `jobguard bench soak` run short: a cycle reported per prune, every size read, the old rows
//! pruned as the load goes on. No size or speed is asserted.

use crate::common::Db;

#[test]
fn bench_soak_reports_every_cycle() {
    let Some(db) = Db::postgres("bench::soak") else {
        return;
    };
    let report = db.json(&[
        "bench",
        "soak",
        "--duration",
        "4s",
        "--rate",
        "200",
        "--keep",
        "1s",
        "--prune-every",
        "1s",
        "--concurrency",
        "4",
    ]);
    let cycles = report["cycles"].as_array().expect("cycles");
    assert!(cycles.len() >= 3, "{report}");
    for cycle in cycles {
        for table in ["jobs", "guard"] {
            for field in [
                "rows",
                "live_tuples",
                "dead_tuples",
                "heap_bytes",
                "index_bytes",
            ] {
                assert!(
                    cycle[table][field].as_i64().is_some(),
                    "{field} of {table}: {report}"
                );
            }
            assert!(cycle[table]["heap_bytes"].as_i64().unwrap() > 0, "{report}");
        }
    }
    let last = cycles.last().unwrap();
    assert!(last["applied"].as_u64().unwrap() > 0, "{report}");
    let pruned: u64 = cycles
        .iter()
        .map(|c| c["pruned_guard_rows"].as_u64().unwrap())
        .sum();
    assert!(
        pruned > 0,
        "rows older than the retention were pruned: {report}"
    );
    assert!(report["growth"].as_f64().is_some(), "{report}");
    assert!(report["levels_off"].is_boolean(), "{report}");
    // Where the server does not vacuum, the soak does after each prune, and says so.
    assert!(report["autovacuum"].is_boolean(), "{report}");
}
