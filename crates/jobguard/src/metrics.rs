//! The counters jobguard records through the [`metrics`] facade.
//!
//! No exporter is installed by the library: install any `metrics` recorder (Prometheus, StatsD)
//! in the application and these series appear in it.

/// Outcomes per job kind: `jobguard_outcomes_total{kind, outcome}` where `outcome` is
/// `applied`, `duplicate` or `failed`.
///
/// A steady trickle of duplicates is normal at-least-once behaviour; a spike means mass
/// redelivery (a worker fleet crash, a visibility timeout shorter than the job, a producer
/// enqueueing in a retry loop) and is worth a look even though nothing was applied twice.
pub const OUTCOMES_TOTAL: &str = "jobguard_outcomes_total";

pub(crate) fn record_outcome(kind: &str, outcome: &'static str) {
    metrics::counter!(OUTCOMES_TOTAL, "kind" => kind.to_owned(), "outcome" => outcome).increment(1);
}
