//! Running a batch: up to [`ConsumerConfig::batch_size`](super::ConsumerConfig::batch_size)
//! received messages of kinds that opted in ([`Job::BATCH`](crate::Job::BATCH)), in one
//! transaction, acknowledged together after its commit.
//!
//! Each message's key is claimed in the batch's transaction and its effect runs right after,
//! in the order the broker handed the messages over; one commit makes all of them true at once
//! or none. A key held before the batch, or claimed by an earlier message of the same batch, is
//! a duplicate: the key applies once. Only after the commit are the messages acknowledged, with
//! [`Delivery::ack_all`]; a consumer that dies in between leaves committed effects and messages
//! that come back as duplicates.
//!
//! Anything else that stops the batch (an effect's error or panic, a key reused with another
//! payload, a serialization failure, a deadlock, a lost connection or commit) rolls the whole
//! batch back, and its messages run again one per transaction on the per-message path: a
//! failing message is retried or dead-lettered alone and the others apply, and a commit whose
//! outcome was lost is settled message by message by the guard. Messages that can never run
//! (undecodable, an unknown kind, a key the job does not derive) never join a batch.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use super::{Consumer, Counters, Delivery, Limits, Message, Runnable, kind_of, with_progress};
use crate::dispatch::catch_panic;
use crate::guard::{Claim, Failure, Outcome, UnitOfWork, duplicate_of, fingerprint_of};
use crate::key::JobKey;
use crate::spikes::record_outcome;
use crate::store::Backend;

/// One message of a batch, decoded.
struct Member<'a, DB: Backend> {
    key: &'a JobKey,
    payload: &'a serde_json::Value,
    runnable: &'a dyn Runnable<DB>,
}

impl<DB: Backend> Consumer<DB> {
    /// Messages per transaction for kinds that opted in: 1 when none did.
    pub(in crate::broker) fn batch_size(&self) -> usize {
        if self.batched.is_empty() {
            1
        } else {
            self.config.batch_size.max(1)
        }
    }

    /// Whether `message` may join a batch: it decoded, its kind opted in, and it has
    /// deliveries left.
    fn batchable<D: Delivery>(&self, message: &Message<D, DB>, limits: &Limits) -> bool {
        match &message.decoded {
            Ok((envelope, _)) => {
                self.batched.contains(&envelope.kind)
                    && message.delivery.attempt() <= limits.max_deliveries
            }
            Err(_) => false,
        }
    }

    /// How many more messages would fill the last batch of `messages`, at most `room`; `None`
    /// when batches are off, there is no batch, it is full, there is no room, or no linger.
    pub(super) fn short_by<D: Delivery>(
        &self,
        messages: &[Message<D, DB>],
        limits: &Limits,
        room: usize,
    ) -> Option<usize> {
        let size = self.batch_size();
        if size == 1 || room == 0 || self.config.batch_linger.is_zero() {
            return None;
        }
        let batchable = messages
            .iter()
            .filter(|message| self.batchable(message, limits))
            .count();
        let short = (size - batchable % size).min(room);
        (batchable > 0 && batchable % size != 0).then_some(short)
    }

    /// The tasks for received messages: batchable ones in groups of up to the batch size, in
    /// the order received; every other message alone.
    pub(super) fn group<D: Delivery>(
        &self,
        messages: Vec<Message<D, DB>>,
        limits: &Limits,
    ) -> Vec<Vec<Message<D, DB>>> {
        let size = self.batch_size();
        let mut groups = Vec::new();
        let mut batch = Vec::new();
        for message in messages {
            if size > 1 && self.batchable(&message, limits) {
                batch.push(message);
                if batch.len() == size {
                    groups.push(std::mem::take(&mut batch));
                }
            } else {
                groups.push(vec![message]);
            }
        }
        if !batch.is_empty() {
            groups.push(batch);
        }
        groups
    }

    /// Runs `messages` as one batch and acknowledges them, or runs them one per transaction
    /// when the batch rolled back. Each permit is given back as its message is settled.
    pub(super) async fn process_batch<D: Delivery>(
        self: Arc<Self>,
        messages: Vec<Message<D, DB>>,
        limits: Limits,
        counters: Arc<Counters>,
        permits: Vec<OwnedSemaphorePermit>,
    ) {
        let span = tracing::info_span!("batch", broker = limits.broker, messages = messages.len());
        async {
            let members: Vec<Member<'_, DB>> = messages
                .iter()
                .filter_map(|message| {
                    let (envelope, runnable) = message.decoded.as_ref().ok()?;
                    Some(Member {
                        key: &envelope.key,
                        payload: &envelope.payload,
                        runnable: &**runnable,
                    })
                })
                .collect();
            let started = Instant::now();
            let deliveries: Vec<&D> = messages.iter().map(|message| &message.delivery).collect();
            let ran = with_progress(
                &deliveries,
                limits.progress_interval,
                catch_panic(self.execute_batch(&members)),
            )
            .await;
            let reason = match ran {
                Ok(Ok(outcomes)) if outcomes.len() == messages.len() => {
                    drop(members);
                    tracing::debug!(seconds = started.elapsed().as_secs_f64(), "batch committed");
                    return self.settle_batch(messages, outcomes, &counters).await;
                }
                Ok(Ok(_)) => "a message of the batch did not decode".to_owned(),
                Ok(Err(reason)) | Err(reason) => reason,
            };
            drop(members);
            tracing::info!(
                reason,
                "the batch rolled back; running its messages one per transaction"
            );
            let (this, limits, counters) = (&*self, &limits, &*counters);
            let singles = messages
                .into_iter()
                .zip(permits)
                .map(|(message, permit)| async move {
                    this.process_one(message, limits, counters).await;
                    drop(permit);
                });
            futures::future::join_all(singles).await;
        }
        .instrument(span)
        .await;
    }

    /// One unit of work for all of `members`: each key claimed and its effect run when fresh,
    /// in order, then one commit; how each ended when it committed, or why not.
    async fn execute_batch(&self, members: &[Member<'_, DB>]) -> Result<Vec<Outcome<()>>, String> {
        let guard = &self.guard;
        let fingerprints = members
            .iter()
            .map(|member| fingerprint_of(member.key, member.payload))
            .collect::<crate::Result<Vec<_>>>()
            .map_err(|error| error.to_string())?;
        // On SQLite, this process's turn to write before the connection, as every writer.
        let _turn = guard.write_turn().await;
        let mut conn = guard
            .pool()
            .acquire()
            .await
            .map_err(|error| format!("no connection for the batch: {error}"))?;
        let mut unit = UnitOfWork::begin_on(guard, &mut conn)
            .await
            .map_err(|failure| failure.to_string())?;
        let mut outcomes = Vec::with_capacity(members.len());
        let mut ran = Ok(());
        for (member, fingerprint) in members.iter().zip(&fingerprints) {
            let claim = match unit.claim(member.key, Some(fingerprint)).await {
                Ok(claim) => claim,
                Err(failure) => {
                    ran = Err(format!("`{}`: {failure}", member.key));
                    break;
                }
            };
            match claim {
                Claim::Claimed => match member.runnable.run_in(unit.conn()).await {
                    Ok(()) => outcomes.push(Outcome::Applied(())),
                    Err(error) => {
                        let failure = Failure::effect::<DB>(member.key, error);
                        ran = Err(format!("`{}`: {failure}", member.key));
                        break;
                    }
                },
                // Held by a committed transaction, or by an earlier message of this batch.
                Claim::Duplicate(record) => match duplicate_of(member.key, record) {
                    Ok(duplicate) => outcomes.push(Outcome::Duplicate(duplicate)),
                    Err(error) => {
                        ran = Err(error.to_string());
                        break;
                    }
                },
            }
        }
        if let Err(reason) = ran {
            // Now, not when the pool next hands the connection out: the per-message runs
            // that follow need the rows the batch locked.
            unit.rollback().await;
            return Err(reason);
        }
        self.faults.before_commit(unit.claimed()).await;
        unit.commit()
            .await
            .map(|()| outcomes)
            .map_err(|failure| format!("the batch's commit failed: {failure}"))
    }

    /// Counts a committed batch's messages, then acknowledges them all.
    async fn settle_batch<D: Delivery>(
        &self,
        messages: Vec<Message<D, DB>>,
        outcomes: Vec<Outcome<()>>,
        counters: &Counters,
    ) {
        let mut deliveries = Vec::with_capacity(messages.len());
        for (message, outcome) in messages.into_iter().zip(outcomes) {
            let kind = kind_of(&message.decoded);
            let attempt = message.delivery.attempt();
            record_outcome(&kind, outcome.label());
            counters.count(&outcome, &kind, attempt);
            if let Ok((envelope, _)) = &message.decoded {
                self.settled(&envelope.key, &outcome).await;
            }
            deliveries.push(message.delivery);
        }
        let count = deliveries.len() as u64;
        if let Err(error) = D::ack_all(deliveries).await {
            tracing::warn!(%error, "acknowledging the batch failed; its messages come again as duplicates");
            counters
                .unacked
                .fetch_add(count, std::sync::atomic::Ordering::Relaxed);
        }
    }
}
