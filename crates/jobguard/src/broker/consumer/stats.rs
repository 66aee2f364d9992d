//! What a consumer did: [`ConsumerStats`], and the counters its tasks add to.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::guard::Outcome;
use crate::metrics::{DuplicateSource, record_duplicate_source};

/// What a consumer did, by how each delivery ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ConsumerStats {
    /// Deliveries whose effect this consumer committed.
    pub applied: u64,
    /// Deliveries whose key the guard already held: acknowledged, effect skipped.
    pub duplicates: u64,
    /// Deliveries that failed and were given back for another delivery.
    pub failed: u64,
    /// Messages dead-lettered: undecodable, an unknown kind, a fatal error, or out of
    /// deliveries.
    pub dead: u64,
    /// Acknowledgements or settlements the broker did not take: the message comes again, and
    /// the guard reports it as a duplicate.
    pub unacked: u64,
    /// Messages whose jobs were still running (alone or in a batch) at the end of the
    /// shutdown timeout: rolled back, messages left to the broker.
    pub released: u64,
}

/// The counts behind [`ConsumerStats`], shared by a consumer's tasks.
#[derive(Default)]
pub(in crate::broker) struct Counters {
    pub(in crate::broker) applied: AtomicU64,
    pub(in crate::broker) duplicates: AtomicU64,
    pub(in crate::broker) failed: AtomicU64,
    pub(in crate::broker) dead: AtomicU64,
    pub(in crate::broker) unacked: AtomicU64,
    pub(in crate::broker) released: AtomicU64,
}

impl Counters {
    pub(in crate::broker) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a message whose transaction ended with `outcome`.
    pub(in crate::broker) fn count(&self, outcome: &Outcome<()>, kind: &str, attempt: u32) {
        let counter = match outcome {
            Outcome::Applied(()) => &self.applied,
            Outcome::Duplicate(_) => {
                // The broker says how this copy came: delivered again, or published again by
                // the producer.
                let source = if attempt > 1 {
                    DuplicateSource::Redelivery
                } else {
                    DuplicateSource::DoubleEnqueue
                };
                record_duplicate_source(kind, source);
                &self.duplicates
            }
        };
        Counters::add(counter);
    }

    pub(in crate::broker) fn snapshot(&self) -> ConsumerStats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ConsumerStats {
            applied: get(&self.applied),
            duplicates: get(&self.duplicates),
            failed: get(&self.failed),
            dead: get(&self.dead),
            unacked: get(&self.unacked),
            released: get(&self.released),
        }
    }
}
