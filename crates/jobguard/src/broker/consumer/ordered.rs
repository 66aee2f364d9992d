//! Messages that must run in order: those of one order group ([`Delivery::order_group`], an
//! SQS FIFO queue's message group) run one at a time, in the order the broker handed them over.
//!
//! The messages of a group received together form a lane, run by one task: each message runs
//! in its own transaction once the one before it was acknowledged or dead-lettered, while the
//! broker is told the ones waiting behind it are still held ([`Delivery::progress`]). A
//! message given back for a later delivery (its job failed, retryably) holds its group: the
//! messages behind it are given back at once without running, and the broker delivers them
//! again after it, as a FIFO queue hands out nothing of a group while a message of it is in
//! flight. A lane of a later receive waits for the group's lane before it to end.
//!
//! These messages never join a batch: a batch that rolls back runs its messages one by one and
//! goes on past a failed one, which would let a later message of the group commit first.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::oneshot::{self, error::TryRecvError};

use super::{Consumer, Counters, Delivery, Limits, Message, with_progress};
use crate::store::Backend;

/// A lane: an order group and its messages, in the order received.
type Lane<D, DB> = (String, Vec<Message<D, DB>>);

/// The lanes of received messages, and the messages of no group.
type Split<D, DB> = (Vec<Lane<D, DB>>, Vec<Message<D, DB>>);

/// Splits received messages into lanes, one per order group in the order the groups first
/// appear, each with its messages in the order received; and the messages of no group.
pub(super) fn lanes<D: Delivery, DB: Backend>(messages: Vec<Message<D, DB>>) -> Split<D, DB> {
    let mut lanes: Vec<Lane<D, DB>> = Vec::new();
    let mut unordered = Vec::new();
    for message in messages {
        let Some(group) = message.delivery.order_group() else {
            unordered.push(message);
            continue;
        };
        match lanes.iter_mut().find(|(name, _)| name == group) {
            Some((_, lane)) => lane.push(message),
            None => {
                let group = group.to_owned();
                lanes.push((group, vec![message]));
            }
        }
    }
    (lanes, unordered)
}

/// The last lane of each group that may still run: the next lane of the group waits for it.
/// Each lane holds the sender of its entry and never sends: the sender dropped at the lane's
/// end is the signal, on an abort or a panic too.
#[derive(Default)]
pub(super) struct Tails(HashMap<String, oneshot::Receiver<()>>);

impl Tails {
    /// For a new lane of `group`: what to wait for first (the group's lane before it, if it
    /// may still run), and what to drop once done.
    pub(super) fn follow(
        &mut self,
        group: String,
    ) -> (Option<oneshot::Receiver<()>>, oneshot::Sender<()>) {
        // Lanes that ended leave nothing behind.
        self.0
            .retain(|_, done| matches!(done.try_recv(), Err(TryRecvError::Empty)));
        let (done, waited_on) = oneshot::channel();
        (self.0.insert(group, waited_on), done)
    }
}

impl<DB: Backend> Consumer<DB> {
    /// Runs a lane: after `after` ends, each message in turn, as long as each is settled for
    /// good; the rest given back when one is not. Each permit is given back as its message is
    /// settled.
    pub(super) async fn process_in_order<D: Delivery>(
        self: Arc<Self>,
        lane: Vec<Message<D, DB>>,
        after: Option<oneshot::Receiver<()>>,
        _done: oneshot::Sender<()>,
        limits: Limits,
        counters: Arc<Counters>,
        permits: Vec<OwnedSemaphorePermit>,
    ) {
        let mut waiting: VecDeque<_> = lane.into_iter().zip(permits).collect();
        if let Some(after) = after {
            let held: Vec<&D> = waiting
                .iter()
                .map(|(message, _)| &message.delivery)
                .collect();
            // Closed (never sent) is the signal.
            let _ = with_progress(&held, limits.progress_interval, after).await;
        }
        while let Some((head, permit)) = waiting.pop_front() {
            let behind: Vec<&D> = waiting
                .iter()
                .map(|(message, _)| &message.delivery)
                .collect();
            let settled = with_progress(
                &behind,
                limits.progress_interval,
                self.process_one(head, &limits, &counters),
            )
            .await;
            drop(permit);
            if !settled {
                break;
            }
        }
        if !waiting.is_empty() {
            tracing::info!(
                broker = limits.broker,
                messages = waiting.len(),
                "a message of an order group was given back; the messages behind it go back too, \
                 to run after it"
            );
        }
        for (message, permit) in waiting {
            if let Err(error) = message.delivery.retry(Duration::ZERO).await {
                tracing::warn!(%error, "giving a message back failed; the broker delivers it again later");
                Counters::add(&counters.unacked);
            }
            drop(permit);
        }
    }
}
