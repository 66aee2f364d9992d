//! The transactional outbox: messages a job publishes, written in the job's own transaction and
//! delivered afterwards by a [`Relay`].
//!
//! A job that must tell another system about its effect ("order 8812 invoiced") cannot call that
//! system from inside its transaction: the call cannot be rolled back, and a call after the
//! commit is lost when the process dies in between. Instead the job writes the message to the
//! outbox table with [`Outbox::publish_tx`], on the connection of its transaction:
//!
//! - **on commit**, the message is in the outbox together with the job's effect, and the relay
//!   delivers it at least once;
//! - **on rollback**, the message was never written, and nothing is ever delivered for it.
//!
//! Each message gets a [`MessageId`] derived from the job key and the topic, so a job that runs
//! again (a redelivery whose guard row was rolled back, a retry) publishes the *same* id, and a
//! receiver deduplicates on it: the webhook sink sends it as the `Idempotency-Key` header.
//!
//! ```no_run
//! use jobguard::outbox::{Outbox, Relay, WebhookSink};
//! use jobguard::{JobKey, PgGuard};
//! use serde_json::json;
//!
//! # async fn invoice(pool: sqlx::PgPool) -> jobguard::Result<()> {
//! let guard = PgGuard::new(pool.clone());
//! let outbox = Outbox::new(pool);
//! guard.migrate().await?;
//! outbox.migrate().await?;
//!
//! let key = JobKey::new("invoice", ["order-8812"])?;
//! let outcome = guard
//!     .run(&key, async |conn| {
//!         sqlx::query("update orders set invoiced = true where id = 8812")
//!             .execute(&mut *conn)
//!             .await?;
//!         outbox
//!             .publish_tx(conn, &key, "invoices", &json!({"order": 8812}))
//!             .await?;
//!         Ok(())
//!     })
//!     .await?;
//! assert!(outcome.is_applied() || outcome.is_duplicate());
//!
//! // Elsewhere, or beside the worker: deliver what the jobs published.
//! let relay = Relay::new(outbox, WebhookSink::new("https://hooks.example.com/v1")?);
//! let report = relay.drain().await?;
//! println!("{} delivered, {} dead-lettered", report.delivered, report.dead);
//! # Ok(()) }
//! ```
//!
//! # Several messages from one job
//!
//! A message id is `<job key>/<topic>`: one message per job and topic. A job that publishes
//! several messages to one topic derives a key for each from its own, for example one per
//! invoice line with `JobKey::new("invoice-line", [order, line])`. Publishing an id again with
//! the same payload returns the id and writes nothing; with another payload it fails with
//! [`Error::MessageReused`].
//!
//! # Delivery
//!
//! The [`Relay`] takes due messages in the order they were written and hands them to a [`Sink`]:
//! at least once, in order per topic, with retries and dead letters. See its documentation for
//! the guarantees and [`WebhookSink`] for delivery over HTTP.
//!
//! # Operations
//!
//! [`Outbox::counts`] tells how many messages wait, were sent or are dead; [`Outbox::list`]
//! shows them with their last error; [`Outbox::replay_dead`] sends dead messages again, and
//! [`Outbox::prune_sent`] deletes old sent ones. The relay counts deliveries, retries and dead
//! letters per topic in [`DELIVERED_TOTAL`], [`RETRIED_TOTAL`] and [`DEAD_TOTAL`].

mod relay;
mod sink;
#[cfg(feature = "webhook")]
mod webhook;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sqlx::Pool;

use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::key::JobKey;
use crate::payload::payload_problem;
use crate::store::{Backend, StateCount};
use crate::table::TableName;

pub use crate::store::outbox::{
    MAX_TOPIC_LEN, MessageId, MessageRow, MessageState, OutboxCounts, OutboxMessage,
};
use crate::store::outbox::{NewMessage, OutboxSql};
pub use relay::{DEAD_TOTAL, DELIVERED_TOTAL, RETRIED_TOTAL, Relay, RelayConfig, RelayReport};
pub use sink::{Sink, SinkError};
#[cfg(feature = "webhook")]
#[cfg_attr(docsrs, doc(cfg(feature = "webhook")))]
pub use webhook::WebhookSink;

/// The transactional outbox on one table. Cheap to clone.
///
/// See the [module documentation](self).
pub struct Outbox<DB: Backend> {
    inner: Arc<OutboxInner<DB>>,
}

struct OutboxInner<DB: Backend> {
    pool: Pool<DB>,
    sql: OutboxSql,
}

impl<DB: Backend> Clone for Outbox<DB> {
    fn clone(&self) -> Self {
        Outbox {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<DB: Backend> fmt::Debug for Outbox<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("backend", &DB::BACKEND)
            .field("table", &self.inner.sql.table.to_string())
            .finish()
    }
}

impl<DB: Backend> Outbox<DB> {
    /// The outbox table unless configured: `jobguard_outbox`. The relay's lease lives in a
    /// second table named after it, `jobguard_outbox_relay`.
    pub const DEFAULT_TABLE: &'static str = "jobguard_outbox";

    /// An outbox on the `jobguard_outbox` table.
    pub fn new(pool: Pool<DB>) -> Self {
        let table = TableName::new(Self::DEFAULT_TABLE).expect("the default name is valid");
        Self::with_table(pool, table).expect("the default table suits every backend")
    }

    /// An outbox on another table. Fails for a schema on SQLite.
    pub fn with_table(pool: Pool<DB>, table: TableName) -> Result<Self> {
        let sql = DB::outbox_sql(&table)?;
        Ok(Outbox {
            inner: Arc::new(OutboxInner { pool, sql }),
        })
    }

    /// The pool the outbox uses.
    pub fn pool(&self) -> &Pool<DB> {
        &self.inner.pool
    }

    /// The outbox table.
    pub fn table(&self) -> &TableName {
        &self.inner.sql.table
    }

    pub(crate) fn sql(&self) -> &OutboxSql {
        &self.inner.sql
    }

    /// Creates the outbox table, its indexes and the relay's lease table when missing. Safe to
    /// call from many processes at once and on every start.
    pub async fn migrate(&self) -> Result<()> {
        let sql = &self.inner.sql;
        Ok(DB::migrate_statements(&self.inner.pool, &sql.table, &sql.create).await?)
    }

    /// Publishes a message in a transaction of its own: delivered at least once from when
    /// this returns. Prefer [`publish_tx`](Self::publish_tx) inside the job's transaction: a
    /// message published on its own is not tied to the job's effect.
    pub async fn publish<P: Serialize + ?Sized>(
        &self,
        key: &JobKey,
        topic: &str,
        message: &P,
    ) -> Result<MessageId> {
        let mut tx = DB::begin(&self.inner.pool).await?;
        let id = self.publish_tx(&mut tx, key, topic, message).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Publishes a message inside the caller's transaction, with the id
    /// [`MessageId::new(key, topic)`](MessageId::new). The relay sees it when the transaction
    /// **commits**, and delivers it at least once; on **rollback** it was never published.
    ///
    /// Publishing an id that is already in the outbox (a job that runs again) writes nothing
    /// and returns the id, when the payload is the same; with another payload it fails with
    /// [`Error::MessageReused`]. A bad topic fails with [`Error::InvalidTopic`], a payload that
    /// is not JSON with [`Error::Payload`], and one over [`MAX_PAYLOAD_BYTES`](crate::queue::MAX_PAYLOAD_BYTES) or with a NUL
    /// character with [`Error::InvalidMessage`]; in every error case nothing was written, and
    /// the transaction can go on.
    ///
    /// On PostgreSQL, a concurrent transaction publishing the same id makes this call wait for
    /// it to end, as the guard does for keys; under `repeatable read` or `serializable` it then
    /// fails with a serialization failure: roll back and run the job again. On SQLite, open
    /// the transaction with `begin immediate`, as [`Guard`](crate::Guard) does.
    pub async fn publish_tx<P: Serialize + ?Sized>(
        &self,
        conn: &mut DB::Connection,
        key: &JobKey,
        topic: &str,
        message: &P,
    ) -> Result<MessageId> {
        let id = MessageId::new(key, topic)?;
        let payload = serde_json::to_value(message).map_err(|source| Error::Payload {
            key: key.to_string(),
            source,
        })?;
        if let Some(reason) = payload_problem(&payload, "its payload", "publish") {
            return Err(Error::InvalidMessage {
                id: id.to_string(),
                reason,
            });
        }
        let fingerprint = Fingerprint::of(&payload).map_err(|source| Error::Payload {
            key: key.to_string(),
            source,
        })?;
        let new = NewMessage {
            id: id.as_str(),
            topic,
            payload: &payload,
            fingerprint: fingerprint.as_bytes(),
        };
        let sql = &self.inner.sql;
        // The message can be pruned between a conflict and the read; then it goes in again.
        for _ in 0..3 {
            if DB::publish(conn, sql, &new).await? {
                return Ok(id);
            }
            match DB::published_fingerprint(conn, sql, id.as_str()).await? {
                Some(stored) if stored.as_slice() == fingerprint.as_bytes() => return Ok(id),
                Some(_) => return Err(Error::MessageReused { id: id.to_string() }),
                None => continue,
            }
        }
        Err(Error::Database(sqlx::Error::Protocol(format!(
            "outbox message `{id}` kept appearing and disappearing while publishing"
        ))))
    }

    /// Message counts by state.
    pub async fn counts(&self) -> Result<OutboxCounts> {
        let mut counts = OutboxCounts::default();
        for StateCount { state, count: n } in
            DB::outbox_counts(&self.inner.pool, &self.inner.sql).await?
        {
            match state.parse()? {
                MessageState::Pending => counts.pending = n,
                MessageState::Sent => counts.sent = n,
                MessageState::Dead => counts.dead = n,
            }
        }
        Ok(counts)
    }

    /// The newest messages, optionally of one state.
    pub async fn list(&self, state: Option<MessageState>, limit: u32) -> Result<Vec<MessageRow>> {
        DB::outbox_list(
            &self.inner.pool,
            &self.inner.sql,
            state.map(|s| s.as_str()),
            limit,
        )
        .await
    }

    /// Makes dead messages pending again with fresh attempts: one by id, or all of them.
    /// Returns the ids replayed.
    ///
    /// A replayed message keeps its place in its topic: it is delivered before the topic's
    /// messages that are still pending, though after those delivered while it was dead.
    pub async fn replay_dead(&self, id: Option<&MessageId>) -> Result<Vec<MessageId>> {
        let ids =
            DB::outbox_replay(&self.inner.pool, &self.inner.sql, id.map(MessageId::as_str)).await?;
        Ok(ids.into_iter().map(MessageId::from_stored).collect())
    }

    /// Deletes messages delivered longer than `older_than` ago. Returns how many.
    ///
    /// A job that runs again after its message was pruned publishes it again, and it is
    /// delivered again with the same id: keep sent messages at least as long as the job's
    /// guard rows, or as long as receivers deduplicate.
    pub async fn prune_sent(&self, older_than: Duration) -> Result<u64> {
        Ok(DB::outbox_prune(&self.inner.pool, &self.inner.sql, older_than).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::outbox::check_topic;

    fn key(parts: &[&str]) -> JobKey {
        JobKey::new("k", parts).unwrap()
    }

    #[test]
    fn ids_are_printable_ascii_and_name_key_and_topic() {
        let id = MessageId::new(&key(&["a b", "é\t", "x/y"]), "t.1").unwrap();
        assert_eq!(id.as_str(), "k:a%20b:%C3%A9%09:x/y/t.1");
        assert!(id.as_str().bytes().all(|b| b.is_ascii_graphic()));
        assert_eq!(id.topic(), "t.1");
    }

    #[test]
    fn different_keys_give_different_ids() {
        // A part that looks like an escape is escaped by the key itself.
        let literal = MessageId::new(&key(&["%20"]), "t").unwrap();
        let space = MessageId::new(&key(&[" "]), "t").unwrap();
        assert_ne!(literal, space);
        let slash = MessageId::new(&key(&["a/t"]), "u").unwrap();
        let other = MessageId::new(&key(&["a"]), "t").unwrap();
        assert_ne!(slash, other);
    }

    #[test]
    fn topics_are_plain_names() {
        for topic in [
            "invoices",
            "a",
            "Orders.v2",
            "x_y-z",
            &"t".repeat(MAX_TOPIC_LEN),
        ] {
            assert!(check_topic(topic).is_ok(), "{topic:?} was refused");
        }
        for topic in [
            "",
            ".",
            "..",
            "-x",
            "a/b",
            "a b",
            "é",
            "a?b",
            &"t".repeat(MAX_TOPIC_LEN + 1),
        ] {
            assert!(
                matches!(check_topic(topic), Err(Error::InvalidTopic { .. })),
                "{topic:?} was accepted"
            );
        }
    }
}
