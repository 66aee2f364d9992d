//! The outcome counter, `jobguard_outcomes_total{kind, outcome}`, on every backend.
//!
//! The recorder is thread-local (`metrics::with_local_recorder`), so each test runs everything
//! on a current-thread runtime inside `block_on`.

use std::collections::BTreeMap;

use jobguard::metrics::OUTCOMES_TOTAL;
use jobguard::{Guard, JobError, JobKey, Outcome};
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, Snapshot};

use crate::common::{self, TestDb, ledger_rows};

type Series = BTreeMap<(String, String), u64>;

/// 10 `credit` keys delivered three times each (concurrently), 2 `fee` keys once each and one
/// `credit` job whose effect fails. Returns `None` when the backend is not available.
async fn deliver<DB: TestDb>(test: &str) -> Option<()> {
    let pool = DB::open(test, 4).await?;
    let guard = Guard::<DB>::new(pool.clone());
    guard.migrate().await.unwrap();

    for n in 0..10 {
        let key = JobKey::new("credit", [format!("order-{n}")]).unwrap();
        let deliveries = (0..3).map(|_| {
            guard.run(&key, async |conn| {
                DB::insert_ledger(conn, 7, 500).await?;
                Ok(())
            })
        });
        let outcomes = futures::future::join_all(deliveries).await;
        let applied = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, Ok(Outcome::Applied(()))))
            .count();
        assert_eq!(applied, 1, "{outcomes:?}");
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    }
    for n in 0..2 {
        let key = JobKey::new("fee", [format!("account-{n}")]).unwrap();
        let outcome = guard
            .run(&key, async |conn| {
                DB::insert_ledger(conn, 7, -90).await?;
                Ok(())
            })
            .await
            .unwrap();
        assert!(outcome.is_applied(), "{outcome:?}");
    }
    let declined = JobKey::new("credit", ["order-declined"]).unwrap();
    let failed = guard
        .run(&declined, async |conn| -> Result<(), JobError> {
            DB::insert_ledger(conn, 7, 500).await?;
            Err(JobError::msg("the card was declined"))
        })
        .await;
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(ledger_rows(&pool).await, 12);
    Some(())
}

/// Runs [`deliver`] with a fresh recorder; the outcome series with nonzero values.
fn recorded<DB: TestDb>(test: &str) -> Option<Series> {
    let (ran, snapshot) = common::recorded(deliver::<DB>(test));
    ran?;
    Some(outcome_series(snapshot))
}

fn outcome_series(snapshot: Snapshot) -> Series {
    let mut series = Series::new();
    for (key, _unit, _description, value) in snapshot.into_vec() {
        if key.key().name() != OUTCOMES_TOTAL {
            continue;
        }
        assert_eq!(key.kind(), MetricKind::Counter, "{key:?}");
        let DebugValue::Counter(count) = value else {
            panic!("{key:?}: {value:?}")
        };
        let labels: BTreeMap<&str, &str> = key
            .key()
            .labels()
            .map(|label| (label.key(), label.value()))
            .collect();
        let names: Vec<&str> = labels.keys().copied().collect();
        assert_eq!(names, ["kind", "outcome"], "{key:?}");
        if count > 0 {
            let previous = series.insert(
                (labels["kind"].to_owned(), labels["outcome"].to_owned()),
                count,
            );
            assert!(previous.is_none(), "{key:?} reported twice");
        }
    }
    series
}

fn expected() -> Series {
    [
        (("credit", "applied"), 10),
        (("credit", "duplicate"), 20),
        (("credit", "failed"), 1),
        (("fee", "applied"), 2),
    ]
    .into_iter()
    .map(|((kind, outcome), count)| ((kind.to_owned(), outcome.to_owned()), count))
    .collect()
}

backends!(fn outcomes_are_counted_per_kind, blocking);
fn outcomes_are_counted_per_kind<DB: TestDb>() {
    let Some(series) = recorded::<DB>("metrics_outcomes") else {
        assert_ne!(DB::BACKEND, "sqlite", "SQLite is always there");
        return;
    };
    assert_eq!(series, expected());
}
