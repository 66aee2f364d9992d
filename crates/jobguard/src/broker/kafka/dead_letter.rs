//! A Kafka message that cannot run, failed fatally or ran out of runs: produced to the
//! dead-letter topic with its key, body and the reason and origin headers, then its offset
//! stored past it in a transaction of its own. A consumer that dies in between produces it
//! again.

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;

use super::consumer::Shared;
use super::lane::Received;
use super::{ORIGIN_HEADER, PRODUCE_TIMEOUT, REASON_HEADER};
use crate::broker::consumer::{Consumer, Counters, kind_of};
use crate::broker::offsets::Position;
use crate::error::Result;
use crate::guard::{Failure, UnitOfWork};
use crate::spikes::record_outcome;
use crate::store::Backend;

impl<DB: Backend> Consumer<DB> {
    /// Produces `message` to the dead-letter topic, then stores the offset after it in a
    /// transaction of its own. A consumer that dies in between produces it again.
    pub(super) async fn bury_kafka(
        &self,
        shared: &Shared<DB>,
        partition: i32,
        message: &Received<DB>,
        reason: &str,
    ) -> std::result::Result<(), ()> {
        let config = &shared.config;
        tracing::warn!(
            error = reason,
            offset = message.offset,
            "message dead-lettered"
        );
        let origin = format!("{}/{partition}/{}", config.topic, message.offset);
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: REASON_HEADER,
                value: Some(reason),
            })
            .insert(Header {
                key: ORIGIN_HEADER,
                value: Some(&origin),
            });
        let mut record = FutureRecord::to(&config.dead_letter_topic)
            .payload(&message.body)
            .headers(headers);
        if let Some(key) = &message.key {
            record = record.key(key);
        }
        if let Err((error, _)) = shared.dead_letters.send(record, PRODUCE_TIMEOUT).await {
            tracing::warn!(%error, "producing the dead letter failed; the partition tries again later");
            return Err(());
        }
        let position = Position {
            group: &config.group,
            topic: &config.topic,
            partition,
            next_offset: message.offset + 1,
        };
        let stored: Result<()> = async {
            let guard = &self.guard;
            let _turn = guard.write_turn().await;
            let mut conn = guard.pool().acquire().await?;
            let mut unit = UnitOfWork::begin_on(guard, &mut conn)
                .await
                .map_err(Failure::into_error)?;
            shared.offsets.store_tx(unit.conn(), &position).await?;
            unit.commit().await.map_err(Failure::into_error)
        }
        .await;
        if let Err(error) = stored {
            tracing::warn!(%error, "storing the offset after a dead letter failed; it is dead-lettered again");
            return Err(());
        }
        let kind = kind_of(&message.decoded);
        let label = if self.handlers.contains(&kind) {
            kind.as_str()
        } else {
            "unknown"
        };
        record_outcome(label, "dead");
        Counters::add(&shared.counters.dead);
        Ok(())
    }
}
