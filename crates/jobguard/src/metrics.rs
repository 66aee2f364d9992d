//! The series jobguard records through the [`metrics`] facade.
//!
//! No exporter is installed by the library: install any `metrics` recorder (Prometheus, StatsD)
//! in the application and these series appear in it.
//!
//! | series | type | labels |
//! |---|---|---|
//! | [`OUTCOMES_TOTAL`] `jobguard_outcomes_total` | counter | `kind`, `outcome` |
//! | [`DUPLICATE_AGE_SECONDS`] `jobguard_duplicate_age_seconds` | histogram | `kind` |
//! | [`GUARD_OLDEST_AGE_SECONDS`] `jobguard_guard_oldest_age_seconds` | gauge | `table` |
//! | [`PRUNED_ROWS_TOTAL`] `jobguard_pruned_rows_total` | counter | `table` |
//! | [`STEPS_ATTENTION_TOTAL`] `jobguard_steps_attention_total` | counter | `kind` |
//! | [`DUPLICATES_TOTAL`] `jobguard_duplicates_total` | counter | `kind`, `source` |
//! | [`JOB_DURATION_SECONDS`] `jobguard_job_duration_seconds` | histogram | `kind`, `outcome` |
//! | [`DUPLICATE_SPIKE`] `jobguard_duplicate_spike` | gauge | `kind` |
//! | [`QUEUE_DEPTH`] `jobguard_queue_depth` | gauge, sampled | `queue` |
//! | [`QUEUE_OLDEST_AGE_SECONDS`] `jobguard_queue_oldest_age_seconds` | gauge, sampled | `queue` |
//! | [`JOBS_RUNNING`] `jobguard_jobs_running` | gauge, sampled | |
//! | [`DEAD_LETTERS`] `jobguard_dead_letters` | gauge, sampled | |
//! | [`STEPS_ATTENTION`] `jobguard_steps_attention` | gauge, sampled | |
//! | [`OUTBOX_DELIVERED_TOTAL`] `jobguard_outbox_delivered_total` | counter | `topic` |
//! | [`OUTBOX_RETRIED_TOTAL`] `jobguard_outbox_retried_total` | counter | `topic` |
//! | [`OUTBOX_DEAD_TOTAL`] `jobguard_outbox_dead_total` | counter | `topic` |
//! | [`KAFKA_OFFSET_OUT_OF_RANGE_TOTAL`] `jobguard_kafka_offset_out_of_range_total` | counter | `topic`, `reason`, `action` |
//! | [`PERIODIC_FIRINGS_TOTAL`] `jobguard_periodic_firings_total` | counter | `schedule`, `outcome` |
//! | [`KAFKA_PARTITIONS_RESTARTED_TOTAL`] `jobguard_kafka_partitions_restarted_total` | counter | `topic` |
//! | [`KAFKA_PARTITIONS_REREAD_TOTAL`] `jobguard_kafka_partitions_reread_total` | counter | `topic` |
//!
//! Counters, histograms and the spike gauge are recorded by the process that runs the jobs (a
//! [`Worker`](crate::Worker), a [`Guard`](crate::Guard)); the gauges marked *sampled* describe
//! the database and are set by whoever reads it, such as `jobguard serve`.

use std::time::{Duration, SystemTime};

/// Outcomes per job kind: `jobguard_outcomes_total{kind, outcome}` where `outcome` is
/// `applied`, `duplicate` or `failed`; the [`Worker`](crate::Worker) also counts `dead`
/// (dead-lettered) and `fenced` (its lease was taken over, so the attempt rolled back).
///
/// A steady trickle of duplicates is normal at-least-once behaviour; a spike means mass
/// redelivery (a worker fleet crash, a visibility timeout shorter than the job, a producer
/// enqueueing in a retry loop) and is worth a look even though nothing was applied twice.
pub const OUTCOMES_TOTAL: &str = "jobguard_outcomes_total";

/// Counts one outcome. Callers go through `spikes::record_outcome`, which also feeds the
/// duplicate-spike watch.
pub(crate) fn count_outcome(kind: &str, outcome: &'static str) {
    metrics::counter!(OUTCOMES_TOTAL, "kind" => kind.to_owned(), "outcome" => outcome).increment(1);
}

/// How old a key's guard row was when a duplicate delivery of it arrived, in seconds, per job
/// kind: `jobguard_duplicate_age_seconds{kind}`.
///
/// Most duplicates arrive within seconds (a retry, a lease that expired). Duplicates whose age
/// comes close to the guard's retention are the warning sign: a little later and the key would
/// have been pruned, and the duplicate applied again. Compare the high quantiles with the
/// retention and with the horizon `jobguard retention` prints.
pub const DUPLICATE_AGE_SECONDS: &str = "jobguard_duplicate_age_seconds";

/// The age of the oldest row in a guard table, in seconds: how far back the guard remembers,
/// `jobguard_guard_oldest_age_seconds{table}`. Set by every prune, scheduled or not, and when a
/// worker's prune schedule starts; 0 for an empty table.
///
/// It should hover around the retention. Far above it, pruning is not running; below the
/// horizon, keys are forgotten while duplicates can still arrive.
pub const GUARD_OLDEST_AGE_SECONDS: &str = "jobguard_guard_oldest_age_seconds";

/// Rows deleted by pruning, per table (guard tables and step ledgers):
/// `jobguard_pruned_rows_total{table}`.
pub const PRUNED_ROWS_TOTAL: &str = "jobguard_pruned_rows_total";

/// Records the age of the guard row a duplicate delivery found.
pub(crate) fn record_duplicate_age(kind: &str, first_applied_at: SystemTime) {
    let age = SystemTime::now()
        .duration_since(first_applied_at)
        .unwrap_or_default();
    metrics::histogram!(DUPLICATE_AGE_SECONDS, "kind" => kind.to_owned()).record(age.as_secs_f64());
}

pub(crate) fn record_oldest_age(table: &str, age: Option<Duration>) {
    let age = age.unwrap_or_default().as_secs_f64();
    metrics::gauge!(GUARD_OLDEST_AGE_SECONDS, "table" => table.to_owned()).set(age);
}

pub(crate) fn record_pruned(table: &str, rows: u64) {
    metrics::counter!(PRUNED_ROWS_TOTAL, "table" => table.to_owned()).increment(rows);
}

/// Periodic firings per schedule by outcome: `jobguard_periodic_firings_total{schedule,
/// outcome}`, `outcome` one of `enqueued` (this scheduler enqueued the firing's job),
/// `already_enqueued` (another scheduler had: normal with several workers) and `missed` (no
/// scheduler reached it in time, and the schedule's policy left it out). Counted by the
/// worker that runs the schedule.
pub const PERIODIC_FIRINGS_TOTAL: &str = "jobguard_periodic_firings_total";

pub(crate) fn count_periodic_firing(schedule: &str, outcome: &'static str) {
    metrics::counter!(PERIODIC_FIRINGS_TOTAL, "schedule" => schedule.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// Duplicates per job kind by where they came from, where that is known:
/// Counter: worker batches by how they ended (`committed`, `rolled_back`), per queue.
pub const BATCHES_TOTAL: &str = "jobguard_batches_total";

pub(crate) fn count_batch(queue: &str, ended: &'static str) {
    metrics::counter!(BATCHES_TOTAL, "queue" => queue.to_owned(), "outcome" => ended).increment(1);
}

/// `jobguard_duplicates_total{kind, source}`, `source` one of [`DuplicateSource`]'s names.
///
/// The [`Worker`](crate::Worker) infers the source of every duplicate it completes (see
/// [`DuplicateSource`]); code that knows better, such as a broker consumer that sees the
/// broker's redelivered flag, records it with [`record_duplicate_source`]. A
/// [`Guard`](crate::Guard) alone cannot know, so `jobguard_outcomes_total{outcome="duplicate"}`
/// is the total and this series the part whose source is known.
pub const DUPLICATES_TOTAL: &str = "jobguard_duplicates_total";

/// How long the worker spent on a job, from fetch to commit, in seconds, per kind and outcome:
/// `jobguard_job_duration_seconds{kind, outcome}`.
pub const JOB_DURATION_SECONDS: &str = "jobguard_job_duration_seconds";

/// 1 while a kind's duplicates spike against its own recent baseline, else 0:
/// `jobguard_duplicate_spike{kind}`. Set by a [`SpikeWatch`](crate::spikes::SpikeWatch) at the
/// end of each window; alert on it.
pub const DUPLICATE_SPIKE: &str = "jobguard_duplicate_spike";

/// Steps marked `attention` per job kind: `jobguard_steps_attention_total{kind}`.
pub const STEPS_ATTENTION_TOTAL: &str = "jobguard_steps_attention_total";

/// Messages the sink confirmed: `jobguard_outbox_delivered_total{topic}`.
pub const OUTBOX_DELIVERED_TOTAL: &str = "jobguard_outbox_delivered_total";
/// Deliveries that failed and will be tried again: `jobguard_outbox_retried_total{topic}`.
pub const OUTBOX_RETRIED_TOTAL: &str = "jobguard_outbox_retried_total";
/// Messages dead-lettered: `jobguard_outbox_dead_total{topic}`. Any increase needs a look.
pub const OUTBOX_DEAD_TOTAL: &str = "jobguard_outbox_dead_total";

/// Kafka partitions assigned at a stored offset their log no longer holds:
/// `jobguard_kafka_offset_out_of_range_total{topic, reason, action}`, `reason` one of
/// `below_log_start` (retention removed messages the group had not applied: they are lost) and
/// `past_log_end` (the topic was made again, or its log truncated), `action` one of `resumed`,
/// `reset` and `refused` (see `broker::kafka::BelowLogStart` and `PastLogEnd`). Any increase
/// needs a look.
pub const KAFKA_OFFSET_OUT_OF_RANGE_TOTAL: &str = "jobguard_kafka_offset_out_of_range_total";

#[cfg(feature = "kafka")]
pub(crate) fn count_kafka_offset_out_of_range(
    topic: &str,
    reason: &'static str,
    action: &'static str,
) {
    metrics::counter!(
        KAFKA_OFFSET_OUT_OF_RANGE_TOTAL,
        "topic" => topic.to_owned(),
        "reason" => reason,
        "action" => action
    )
    .increment(1);
}

/// Kafka partitions this consumer owned whose messages stopped coming, found by their log
/// holding messages the consumer had not received, and fetched again:
/// `jobguard_kafka_partitions_restarted_total{topic}` (see `broker::kafka::KafkaConfig::stalled_after`).
/// Any increase is a client that left a partition unfetched, and needs a look at the logs.
pub const KAFKA_PARTITIONS_RESTARTED_TOTAL: &str = "jobguard_kafka_partitions_restarted_total";

/// Counts a partition fetched again after it stopped.
pub(crate) fn count_kafka_partition_restarted(topic: &str) {
    metrics::counter!(KAFKA_PARTITIONS_RESTARTED_TOTAL, "topic" => topic.to_owned()).increment(1);
}

/// Kafka partitions read again from an earlier offset because the broker served a fetch from
/// past messages after the offset the consumer expected (the rest of a record batch, as tansu
/// serves a fetch from inside one): `jobguard_kafka_partitions_reread_total{topic}`. Offsets
/// that carry no message (transaction markers, aborted or compacted messages) are not counted.
pub const KAFKA_PARTITIONS_REREAD_TOTAL: &str = "jobguard_kafka_partitions_reread_total";

/// Counts a partition read again after the broker skipped past the expected offset.
#[cfg(feature = "kafka")]
pub(crate) fn count_kafka_partition_reread(topic: &str) {
    metrics::counter!(KAFKA_PARTITIONS_REREAD_TOTAL, "topic" => topic.to_owned()).increment(1);
}

/// Jobs ready to run now and waiting for a worker, per queue: `jobguard_queue_depth{queue}`.
pub const QUEUE_DEPTH: &str = "jobguard_queue_depth";

/// How long the oldest job ready to run has been waiting, per queue, in seconds:
/// `jobguard_queue_oldest_age_seconds{queue}`; 0 when none waits. Growing means the workers
/// do not keep up.
pub const QUEUE_OLDEST_AGE_SECONDS: &str = "jobguard_queue_oldest_age_seconds";

/// Jobs leased to a worker right now: `jobguard_jobs_running`.
pub const JOBS_RUNNING: &str = "jobguard_jobs_running";

/// Dead-lettered jobs waiting for an operator: `jobguard_dead_letters`.
pub const DEAD_LETTERS: &str = "jobguard_dead_letters";

/// External steps marked `attention`, waiting for an operator: `jobguard_steps_attention`.
pub const STEPS_ATTENTION: &str = "jobguard_steps_attention";

/// Where a duplicate delivery came from.
///
/// The [`Worker`](crate::Worker) infers it from the job's attempt and lease token, and says so
/// honestly: it knows how this job reached it, not who applied the key first.
///
/// - [`Replay`](Self::Replay): the job's attempts were reset after an earlier fetch, which is
///   what replaying a dead letter does (a job given back at shutdown and fetched again looks
///   the same, and is counted here too).
/// - [`Retry`](Self::Retry): a second or later attempt, after a failure or an expired lease;
///   meanwhile something else applied the key.
/// - [`DoubleEnqueue`](Self::DoubleEnqueue): the job's first attempt found its key applied: the
///   same work was enqueued again after an earlier job with the key completed (a producer
///   retrying, two code paths), or the key was applied outside the queue.
///
/// In jobguard's own queue a lease that expires mid-job never becomes a duplicate: the worker
/// that lost it is fenced off before its effect runs, and counted as outcome `fenced`.
/// [`Redelivery`](Self::Redelivery) and [`LeaseExpiry`](Self::LeaseExpiry) are for consumers of
/// other systems that can tell, through [`record_duplicate_source`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DuplicateSource {
    /// The job system delivered the message again (a broker's redelivered flag).
    Redelivery,
    /// A retry of an attempt that had in fact been applied, or that lost to another delivery.
    Retry,
    /// A visibility timeout or lease expired while the first delivery still ran.
    LeaseExpiry,
    /// A dead letter replayed after its key was applied.
    Replay,
    /// The same work enqueued twice.
    DoubleEnqueue,
}

impl DuplicateSource {
    /// The label value: `redelivery`, `retry`, `lease_expiry`, `replay` or `double_enqueue`.
    pub fn as_str(self) -> &'static str {
        match self {
            DuplicateSource::Redelivery => "redelivery",
            DuplicateSource::Retry => "retry",
            DuplicateSource::LeaseExpiry => "lease_expiry",
            DuplicateSource::Replay => "replay",
            DuplicateSource::DoubleEnqueue => "double_enqueue",
        }
    }

    /// The worker's inference from the delivery that found its key applied: its attempt, and
    /// whether the job was replayed since it last ran.
    pub(crate) fn infer(attempt: i32, replayed: bool) -> Self {
        if replayed {
            DuplicateSource::Replay
        } else if attempt > 1 {
            DuplicateSource::Retry
        } else {
            DuplicateSource::DoubleEnqueue
        }
    }
}

impl std::fmt::Display for DuplicateSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Counts a duplicate of `kind` whose source is known, in [`DUPLICATES_TOTAL`].
///
/// The duplicate itself is counted in [`OUTCOMES_TOTAL`] by whoever found the key applied;
/// this adds where it came from.
///
/// ```
/// use jobguard::metrics::{DuplicateSource, record_duplicate_source};
///
/// // A consumer that saw the broker's redelivered flag on a message the guard found applied.
/// record_duplicate_source("credit", DuplicateSource::Redelivery);
/// ```
pub fn record_duplicate_source(kind: &str, source: DuplicateSource) {
    metrics::counter!(DUPLICATES_TOTAL, "kind" => kind.to_owned(), "source" => source.as_str())
        .increment(1);
}

pub(crate) fn record_job_duration(kind: &str, outcome: &'static str, took: Duration) {
    metrics::histogram!(JOB_DURATION_SECONDS, "kind" => kind.to_owned(), "outcome" => outcome)
        .record(took.as_secs_f64());
}

/// Registers the help text of every jobguard series with the installed recorder, so an
/// exporter can show it (Prometheus's `# HELP` lines). Call it once after installing one.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        OUTCOMES_TOTAL,
        "Deliveries per job kind by outcome: applied, duplicate, failed, dead, fenced."
    );
    describe_counter!(
        DUPLICATES_TOTAL,
        "Duplicate deliveries per job kind by source, where it is known: redelivery, retry, \
         lease_expiry, replay, double_enqueue."
    );
    describe_histogram!(
        JOB_DURATION_SECONDS,
        Unit::Seconds,
        "Time the worker spent on a job, from fetch to commit, per kind and outcome."
    );
    describe_histogram!(
        DUPLICATE_AGE_SECONDS,
        Unit::Seconds,
        "Age of the guard row a duplicate delivery found, per job kind."
    );
    describe_gauge!(
        DUPLICATE_SPIKE,
        "1 while a job kind's duplicates spike against its own recent baseline: mass \
         redelivery (a crashed worker fleet, a lease or visibility timeout shorter than the job, \
         a producer enqueueing in a retry loop)."
    );
    describe_gauge!(
        GUARD_OLDEST_AGE_SECONDS,
        Unit::Seconds,
        "Age of the oldest guard row: how far back the guard remembers keys."
    );
    describe_counter!(PRUNED_ROWS_TOTAL, "Rows deleted by pruning, per table.");
    describe_counter!(
        BATCHES_TOTAL,
        "Worker batches, committed or rolled back (their jobs then ran one per transaction)."
    );
    describe_counter!(
        PERIODIC_FIRINGS_TOTAL,
        "Periodic firings per schedule: enqueued, already_enqueued (by another scheduler), \
         missed (left out by the schedule's policy)."
    );
    describe_counter!(
        STEPS_ATTENTION_TOTAL,
        "External steps marked attention, per job kind."
    );
    describe_gauge!(
        QUEUE_DEPTH,
        "Jobs ready to run and waiting for a worker, per queue."
    );
    describe_gauge!(
        QUEUE_OLDEST_AGE_SECONDS,
        Unit::Seconds,
        "How long the oldest job ready to run has waited, per queue."
    );
    describe_gauge!(JOBS_RUNNING, "Jobs leased to a worker.");
    describe_gauge!(DEAD_LETTERS, "Dead-lettered jobs waiting for an operator.");
    describe_gauge!(
        STEPS_ATTENTION,
        "External steps marked attention, waiting for an operator."
    );
}

#[cfg(test)]
mod tests {
    use super::DuplicateSource;

    #[test]
    fn duplicate_sources_are_inferred_from_attempt_and_replay() {
        assert_eq!(
            DuplicateSource::infer(1, false),
            DuplicateSource::DoubleEnqueue
        );
        assert_eq!(DuplicateSource::infer(3, false), DuplicateSource::Retry);
        // Dead, replayed, fetched again.
        assert_eq!(DuplicateSource::infer(1, true), DuplicateSource::Replay);
    }
}
