//! Fault injection, for tests only (feature `fault-injection`): two points of a consumer's
//! transaction where a test stops it, as a process killed there would be.
//!
//! - [`Consumer::before_commit`]: after a transaction's effects ran and before it commits. A
//!   consumer stopped there applies nothing, and every message of the transaction is delivered
//!   again.
//! - [`Consumer::before_ack`]: after a message's transaction committed (or found its key
//!   applied) and before the message is acknowledged, or on Kafka before its offset is handed to
//!   the client. A consumer stopped there leaves a committed effect and a message the broker
//!   delivers again, which the guard reports as a duplicate.
//!
//! - [`Consumer::kafka_pause_unseen_at`]: on Kafka, once a partition settled up to an
//!   offset, the client pauses it without the consumer's loop knowing, as a pause that reached
//!   the client after the resume meant to end it would. The partition's messages stop coming.
//!
//! A hook stops the consumer by returning a future that never resolves. Without the feature the
//! points are still called, and do nothing.

#[cfg(feature = "fault-injection")]
use std::sync::Arc;

#[cfg(feature = "fault-injection")]
use futures::future::BoxFuture;

#[cfg(feature = "fault-injection")]
use super::Consumer;
use crate::guard::Outcome;
use crate::key::JobKey;
#[cfg(feature = "fault-injection")]
use crate::store::Backend;

/// Called after a message's transaction ended and before the message is acknowledged.
#[cfg(feature = "fault-injection")]
type BeforeAck = Arc<dyn Fn(&JobKey, &Outcome<()>) -> BoxFuture<'static, ()> + Send + Sync>;

/// Called with the keys a transaction claimed, after their effects ran and before it commits.
#[cfg(feature = "fault-injection")]
type BeforeCommit = Arc<dyn Fn(Vec<JobKey>) -> BoxFuture<'static, ()> + Send + Sync>;

/// A consumer's fault-injection hooks: none without the feature.
#[derive(Clone, Default)]
pub(in crate::broker) struct Faults {
    #[cfg(feature = "fault-injection")]
    before_ack: Option<BeforeAck>,
    #[cfg(feature = "fault-injection")]
    before_commit: Option<BeforeCommit>,
    /// The offset at which a Kafka partition is paused behind the loop's back, and whether it
    /// was.
    #[cfg(feature = "fault-injection")]
    pause_unseen_at: Option<(i64, Arc<std::sync::atomic::AtomicBool>)>,
}

impl Faults {
    /// The point after a transaction's effects and before its commit, with the keys it
    /// claimed; a transaction that claimed none does not stop there.
    pub(in crate::broker) async fn before_commit<'a>(
        &self,
        claimed: impl Iterator<Item = &'a JobKey>,
    ) {
        #[cfg(feature = "fault-injection")]
        if let Some(hook) = &self.before_commit {
            let claimed: Vec<JobKey> = claimed.cloned().collect();
            if !claimed.is_empty() {
                hook(claimed).await;
            }
        }
        #[cfg(not(feature = "fault-injection"))]
        drop(claimed);
    }

    /// Whether a Kafka partition whose lane settled up to `next` is to be paused in the client
    /// now, behind the loop's back: once, at the first offset at or past the one asked for.
    pub(in crate::broker) fn pause_unseen(&self, next: i64) -> bool {
        #[cfg(feature = "fault-injection")]
        if let Some((at, paused)) = &self.pause_unseen_at
            && next >= *at
        {
            return !paused.swap(true, std::sync::atomic::Ordering::SeqCst);
        }
        let _ = next;
        false
    }

    /// The point after a message's transaction ended with `outcome` and before its
    /// acknowledgement.
    pub(in crate::broker) async fn before_ack(&self, key: &JobKey, outcome: &Outcome<()>) {
        #[cfg(feature = "fault-injection")]
        if let Some(hook) = &self.before_ack {
            hook(key, outcome).await;
        }
        #[cfg(not(feature = "fault-injection"))]
        let _ = (key, outcome);
    }
}

#[cfg(feature = "fault-injection")]
#[cfg_attr(docsrs, doc(cfg(feature = "fault-injection")))]
impl<DB: Backend> Consumer<DB> {
    /// For fault-injection tests: awaits `hook` after each message's transaction ended with an
    /// outcome and before the message is acknowledged (on Kafka, before its offset is handed to
    /// the client). A hook that never resolves plays a consumer killed between its commit and
    /// its ack. To watch outcomes, use [`on_outcome`](Self::on_outcome) instead.
    pub fn before_ack<F>(mut self, hook: F) -> Self
    where
        F: Fn(&JobKey, &Outcome<()>) -> BoxFuture<'static, ()> + Send + Sync + 'static,
    {
        self.faults.before_ack = Some(Arc::new(hook));
        self
    }

    /// For fault-injection tests: awaits `hook` with the keys a transaction claimed, after
    /// their effects ran and before it commits: one key for a message run alone, the claimed
    /// keys of a batch in order. A hook that never resolves plays a consumer killed before its
    /// commit: nothing applies, and every message is delivered again.
    pub fn before_commit<F>(mut self, hook: F) -> Self
    where
        F: Fn(Vec<JobKey>) -> BoxFuture<'static, ()> + Send + Sync + 'static,
    {
        self.faults.before_commit = Some(Arc::new(hook));
        self
    }

    /// For fault-injection tests, on Kafka: once a partition's messages are settled up to
    /// `offset`, the client pauses the partition without the consumer's loop knowing (once).
    /// Its messages stop coming until the consumer finds the partition stopped
    /// ([`KafkaConfig::stalled_after`](crate::broker::kafka::KafkaConfig::stalled_after)).
    pub fn kafka_pause_unseen_at(mut self, offset: i64) -> Self {
        self.faults.pause_unseen_at = Some((offset, Arc::default()));
        self
    }
}
