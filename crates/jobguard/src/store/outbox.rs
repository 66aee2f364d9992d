//! The outbox's rows and its interface to the backends: what a message is in its table, the
//! statements each backend builds from the table name, and their binding and decoding, written
//! once in [`outbox_statements`] and expanded in each backend's `outbox.rs`.
//! `jobguard::outbox` re-exports the types users name.

use std::fmt;
use std::fmt::Write as _;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::Value;
use sqlx::Pool;

use crate::error::{Error, Result};
use crate::key::JobKey;
use crate::store::database::StateCount;
use crate::table::TableName;

/// The longest topic accepted, in bytes.
pub const MAX_TOPIC_LEN: usize = 200;

/// The identity of an outbox message: `<job key>/<topic>`, the same every time the job runs.
///
/// The key's bytes outside printable ASCII (spaces, control characters, non-ASCII letters) are
/// written as `%XX`, so an id is always a valid HTTP header value; job keys never contain a `%`
/// other than their own `%25` and `%3A` escapes, and topics never contain `/`, so two different
/// keys or topics never give the same id. An id is at most `3 * 512 + 1 + 200` bytes.
///
/// ```
/// use jobguard::JobKey;
/// use jobguard::outbox::MessageId;
///
/// let key = JobKey::new("invoice", ["order-8812"])?;
/// let id = MessageId::new(&key, "invoices")?;
/// assert_eq!(id.as_str(), "invoice:order-8812/invoices");
/// assert_eq!(id.topic(), "invoices");
///
/// let key = JobKey::new("invoice", ["café 7"])?;
/// assert_eq!(MessageId::new(&key, "invoices")?.as_str(), "invoice:caf%C3%A9%207/invoices");
/// # Ok::<(), jobguard::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct MessageId(String);

impl MessageId {
    /// The id of the message the job of `key` publishes to `topic`.
    ///
    /// Fails with [`Error::InvalidTopic`] unless `topic` is 1 to [`MAX_TOPIC_LEN`] ASCII
    /// letters, digits, `.`, `_` and `-`, starting with a letter or digit.
    pub fn new(key: &JobKey, topic: &str) -> Result<Self> {
        check_topic(topic)?;
        let mut id = encode_key(key.as_str());
        id.push('/');
        id.push_str(topic);
        Ok(MessageId(id))
    }

    /// The id as stored and sent.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The topic the message was published to.
    pub fn topic(&self) -> &str {
        self.0.rsplit_once('/').map_or("", |(_, topic)| topic)
    }

    pub(crate) fn from_stored(id: String) -> Self {
        MessageId(id)
    }
}

/// A key as the ids of its messages begin: its bytes outside printable ASCII as `%XX`.
pub(crate) fn encode_key(key: &str) -> String {
    let mut encoded = String::with_capacity(key.len());
    for &byte in key.as_bytes() {
        if byte.is_ascii_graphic() {
            encoded.push(char::from(byte));
        } else {
            write!(encoded, "%{byte:02X}").expect("writing to a string cannot fail");
        }
    }
    encoded
}

/// Reads an id as [`MessageId::as_str`] writes it, as an operator copies it from a listing.
///
/// ```
/// use jobguard::outbox::MessageId;
///
/// let id: MessageId = "invoice:order-8812/invoices".parse()?;
/// assert_eq!(id.topic(), "invoices");
/// assert!("no-topic".parse::<MessageId>().is_err());
/// # Ok::<(), jobguard::Error>(())
/// ```
impl FromStr for MessageId {
    type Err = Error;

    fn from_str(id: &str) -> Result<Self> {
        let malformed = || Error::InvalidMessage {
            id: id.to_owned(),
            reason: "a message id is `<job key>/<topic>` in visible ASCII, as listed by \
                     `jobguard outbox list`"
                .to_owned(),
        };
        let (key, topic) = id.rsplit_once('/').ok_or_else(malformed)?;
        check_topic(topic)?;
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(malformed());
        }
        Ok(MessageId(id.to_owned()))
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for MessageId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Checks a topic: it becomes the last segment of a webhook URL, so a topic of dots (`..`),
/// which URL parsers resolve away, is refused along with anything that would need escaping.
pub(crate) fn check_topic(topic: &str) -> Result<()> {
    let starts_well = topic
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric());
    let plain = topic
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if starts_well && plain && topic.len() <= MAX_TOPIC_LEN {
        Ok(())
    } else {
        Err(Error::InvalidTopic {
            topic: topic.chars().take(MAX_TOPIC_LEN + 10).collect(),
        })
    }
}

/// Where a message is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageState {
    /// Waiting for the relay: due now, or backing off after a failed delivery.
    Pending,
    /// Delivered: the sink confirmed it.
    Sent,
    /// Dead-lettered: the sink refused it, or every attempt failed. Can be replayed.
    Dead,
}

impl MessageState {
    /// The state's name as stored.
    pub fn as_str(&self) -> &'static str {
        match self {
            MessageState::Pending => "pending",
            MessageState::Sent => "sent",
            MessageState::Dead => "dead",
        }
    }
}

impl fmt::Display for MessageState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for MessageState {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "pending" => Ok(MessageState::Pending),
            "sent" => Ok(MessageState::Sent),
            "dead" => Ok(MessageState::Dead),
            other => Err(Error::Database(sqlx::Error::Decode(
                format!("unknown outbox message state `{other}`").into(),
            ))),
        }
    }
}

/// Message counts by state, from [`Outbox::counts`](crate::Outbox::counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OutboxCounts {
    /// Waiting for the relay.
    pub pending: i64,
    /// Delivered.
    pub sent: i64,
    /// Dead-lettered.
    pub dead: i64,
}

/// A message as listed by [`Outbox::list`](crate::Outbox::list).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MessageRow {
    /// The message id.
    pub id: MessageId,
    /// The topic.
    pub topic: String,
    /// Where it is in its life.
    pub state: MessageState,
    /// Deliveries attempted so far.
    pub attempts: i32,
    /// When the relay tries it next, if it is pending.
    #[serde(serialize_with = "serialize_time")]
    pub next_attempt_at: SystemTime,
    /// Why the last failed delivery failed.
    pub last_error: Option<String>,
    /// When it was published (the publishing transaction's time on PostgreSQL).
    #[serde(serialize_with = "serialize_time")]
    pub created_at: SystemTime,
    /// When the sink confirmed it.
    #[serde(serialize_with = "serialize_optional_time")]
    pub sent_at: Option<SystemTime>,
    /// The payload.
    pub payload: Value,
}

fn millis(time: &SystemTime) -> u64 {
    let since = time.duration_since(SystemTime::UNIX_EPOCH);
    u64::try_from(since.unwrap_or_default().as_millis()).unwrap_or(u64::MAX)
}

fn serialize_time<S: serde::Serializer>(time: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(millis(time))
}

fn serialize_optional_time<S: serde::Serializer>(
    time: &Option<SystemTime>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match time {
        Some(time) => s.serialize_some(&millis(time)),
        None => s.serialize_none(),
    }
}

/// A message handed to a [`Sink`](crate::outbox::Sink) by the relay.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct OutboxMessage {
    /// The message id, the same on every delivery of the message: receivers deduplicate on it.
    pub id: MessageId,
    /// The topic it was published to.
    pub topic: String,
    /// The payload, as published.
    pub payload: Value,
    /// Which delivery attempt this is, from 1. A relay that died during an attempt did not
    /// count it, so a receiver may see the same attempt number twice.
    pub attempt: u32,
    /// When the message was published.
    pub created_at: SystemTime,
}

/// The outbox's statements, built once from its validated table name.
#[derive(Debug)]
pub struct OutboxSql {
    pub(crate) table: TableName,
    pub(crate) create: Vec<Arc<str>>,
    pub(crate) publish: Arc<str>,
    pub(crate) fingerprint: Arc<str>,
    pub(crate) due: Arc<str>,
    pub(crate) sent: Arc<str>,
    pub(crate) retry: Arc<str>,
    pub(crate) dead: Arc<str>,
    pub(crate) take_lease: Arc<str>,
    pub(crate) release_lease: Arc<str>,
    pub(crate) counts: Arc<str>,
    pub(crate) list: Arc<str>,
    pub(crate) replay: Arc<str>,
    pub(crate) prune: Arc<str>,
}

/// The values of a message about to be written.
#[derive(Debug)]
pub struct NewMessage<'a> {
    pub(crate) id: &'a str,
    pub(crate) topic: &'a str,
    pub(crate) payload: &'a Value,
    pub(crate) fingerprint: &'a [u8; 32],
}

/// A due message read by the relay, with its place in the outbox.
#[derive(Debug)]
pub struct DueMessage {
    pub(crate) seq: i64,
    pub(crate) message: OutboxMessage,
}

/// How a delivery attempt ends for its row.
#[derive(Clone, Copy, Debug)]
pub enum Settle<'a> {
    Sent,
    Retry { delay: Duration, error: &'a str },
    Dead { error: &'a str },
}

/// The outbox statements each backend implements. Their SQL is in the backend's
/// `outbox_sql.rs`; their binding, the same for every backend, in [`outbox_statements`].
pub trait OutboxStore: sqlx::Database {
    fn outbox_sql(table: &TableName) -> Result<OutboxSql>;

    /// Inserts a message; false when its id is already in the outbox.
    fn publish(
        conn: &mut Self::Connection,
        sql: &OutboxSql,
        message: &NewMessage<'_>,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    fn published_fingerprint(
        conn: &mut Self::Connection,
        sql: &OutboxSql,
        id: &str,
    ) -> impl Future<Output = sqlx::Result<Option<Vec<u8>>>> + Send;

    fn due(
        pool: &Pool<Self>,
        sql: &OutboxSql,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<Vec<DueMessage>>> + Send;

    /// Records how a delivery ended; false when the message was no longer pending.
    fn settle_message(
        pool: &Pool<Self>,
        sql: &OutboxSql,
        seq: i64,
        how: Settle<'_>,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// Takes or renews the relay lease; false when another holder has it.
    fn take_lease(
        pool: &Pool<Self>,
        sql: &OutboxSql,
        holder: &str,
        lease: Duration,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    fn release_lease(
        pool: &Pool<Self>,
        sql: &OutboxSql,
        holder: &str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    fn outbox_counts(
        pool: &Pool<Self>,
        sql: &OutboxSql,
    ) -> impl Future<Output = sqlx::Result<Vec<StateCount>>> + Send;

    fn outbox_list(
        pool: &Pool<Self>,
        sql: &OutboxSql,
        state: Option<&str>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<MessageRow>>> + Send;

    fn outbox_replay(
        pool: &Pool<Self>,
        sql: &OutboxSql,
        id: Option<&str>,
    ) -> impl Future<Output = sqlx::Result<Vec<String>>> + Send;

    fn outbox_prune(
        pool: &Pool<Self>,
        sql: &OutboxSql,
        older_than: Duration,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
}

// The outbox's statements that every dialect writes alike, on the outbox table `t` or its
// relay's lease table (quoted); each backend's `outbox_sql` takes them from here.

pub(crate) fn fingerprint(t: &str) -> String {
    format!("select fingerprint from {t} where id = $1")
}

pub(crate) fn release_lease(lease: &str) -> String {
    format!("delete from {lease} where name = 'relay' and holder = $1")
}

pub(crate) fn counts(t: &str) -> String {
    format!("select state, count(*) from {t} group by state")
}

/// Dead-letters a pending message, the same in both dialects: `$1` its seq, `$2` the error.
pub(crate) fn dead_sql(t: &str) -> String {
    format!(
        "update {t} set state = 'dead', attempts = attempts + 1, last_error = $2
         where seq = $1 and state = 'pending'"
    )
}

/// The outbox table's indexes, the same in both dialects.
pub(crate) fn outbox_indexes(table: &TableName) -> [String; 3] {
    let t = table.quoted();
    [
        // The relay's scan: pending messages in seq order.
        format!(
            "create index if not exists {} on {t} (seq) where state = 'pending'",
            table.derived("pending")
        ),
        // Whether a topic has a pending message backing off, which holds back the rest.
        format!(
            "create index if not exists {} on {t} (topic, next_attempt_at) \
             where state = 'pending'",
            table.derived("blocked")
        ),
        format!(
            "create index if not exists {} on {t} (sent_at) where state = 'sent'",
            table.derived("sent_at")
        ),
    ]
}

/// The outbox statements whose binding and decoding are the same on every backend: only their
/// SQL differs, and that comes from the backend's [`OutboxSql`]. Expanded inside each
/// `impl OutboxStore`, where the backend's `Row` and `Connection` types are concrete. Times
/// come back as microseconds since the Unix epoch; durations go in as microseconds.
macro_rules! outbox_statements {
    () => {
        async fn publish(
            conn: &mut Self::Connection,
            sql: &$crate::store::outbox::OutboxSql,
            message: &$crate::store::outbox::NewMessage<'_>,
        ) -> sqlx::Result<bool> {
            let seq: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.publish.clone()))
                .bind(message.id)
                .bind(message.topic)
                .bind(sqlx::types::Json(message.payload))
                .bind(message.fingerprint.as_slice())
                .fetch_optional(conn)
                .await?;
            Ok(seq.is_some())
        }

        async fn published_fingerprint(
            conn: &mut Self::Connection,
            sql: &$crate::store::outbox::OutboxSql,
            id: &str,
        ) -> sqlx::Result<Option<Vec<u8>>> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql.fingerprint.clone()))
                .bind(id)
                .fetch_optional(conn)
                .await
        }

        async fn due(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::outbox::OutboxSql,
            limit: u32,
        ) -> sqlx::Result<Vec<$crate::store::outbox::DueMessage>> {
            use sqlx::Row as _;
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.due.clone()))
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await?;
            rows.into_iter()
                .map(|row| {
                    let payload: sqlx::types::Json<serde_json::Value> = row.try_get(3)?;
                    let attempts: i32 = row.try_get(4)?;
                    Ok($crate::store::outbox::DueMessage {
                        seq: row.try_get(0)?,
                        message: $crate::store::outbox::OutboxMessage {
                            id: $crate::store::outbox::MessageId::from_stored(row.try_get(1)?),
                            topic: row.try_get(2)?,
                            payload: payload.0,
                            attempt: u32::try_from(attempts).unwrap_or(0).saturating_add(1),
                            created_at: $crate::time::micros_to_time(row.try_get(5)?),
                        },
                    })
                })
                .collect()
        }

        async fn settle_message(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::outbox::OutboxSql,
            seq: i64,
            how: $crate::store::outbox::Settle<'_>,
        ) -> sqlx::Result<bool> {
            use $crate::store::outbox::Settle;
            let statement = match how {
                Settle::Sent => &sql.sent,
                Settle::Retry { .. } => &sql.retry,
                Settle::Dead { .. } => &sql.dead,
            };
            let query = sqlx::query(sqlx::AssertSqlSafe(statement.clone())).bind(seq);
            let query = match how {
                Settle::Sent => query,
                Settle::Retry { delay, error } => {
                    query.bind($crate::time::duration_micros(delay)).bind(error)
                }
                Settle::Dead { error } => query.bind(error),
            };
            Ok(query.execute(pool).await?.rows_affected() == 1)
        }

        async fn take_lease(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::outbox::OutboxSql,
            holder: &str,
            lease: std::time::Duration,
        ) -> sqlx::Result<bool> {
            let held: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.take_lease.clone()))
                .bind(holder)
                .bind($crate::time::duration_micros(lease))
                .fetch_optional(pool)
                .await?;
            Ok(held.is_some())
        }

        async fn release_lease(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::outbox::OutboxSql,
            holder: &str,
        ) -> sqlx::Result<()> {
            sqlx::query(sqlx::AssertSqlSafe(sql.release_lease.clone()))
                .bind(holder)
                .execute(pool)
                .await?;
            Ok(())
        }

        async fn outbox_counts(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::outbox::OutboxSql,
        ) -> sqlx::Result<Vec<$crate::store::database::StateCount>> {
            let rows: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql.counts.clone()))
                .fetch_all(pool)
                .await?;
            Ok(rows
                .into_iter()
                .map($crate::store::database::StateCount::from)
                .collect())
        }

        async fn outbox_list(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::outbox::OutboxSql,
            state: Option<&str>,
            limit: u32,
        ) -> $crate::Result<Vec<$crate::store::outbox::MessageRow>> {
            use sqlx::Row as _;
            use $crate::time::micros_to_time;
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.list.clone()))
                .bind(state)
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await?;
            rows.into_iter()
                .map(|row| {
                    let state: String = row.try_get(2)?;
                    let sent_at: Option<i64> = row.try_get(7)?;
                    let payload: sqlx::types::Json<serde_json::Value> = row.try_get(8)?;
                    Ok($crate::store::outbox::MessageRow {
                        id: $crate::store::outbox::MessageId::from_stored(row.try_get(0)?),
                        topic: row.try_get(1)?,
                        state: state.parse()?,
                        attempts: row.try_get(3)?,
                        next_attempt_at: micros_to_time(row.try_get(4)?),
                        last_error: row.try_get(5)?,
                        created_at: micros_to_time(row.try_get(6)?),
                        sent_at: sent_at.map(micros_to_time),
                        payload: payload.0,
                    })
                })
                .collect()
        }

        async fn outbox_replay(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::outbox::OutboxSql,
            id: Option<&str>,
        ) -> sqlx::Result<Vec<String>> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql.replay.clone()))
                .bind(id)
                .fetch_all(pool)
                .await
        }

        async fn outbox_prune(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::outbox::OutboxSql,
            older_than: std::time::Duration,
        ) -> sqlx::Result<u64> {
            let done = sqlx::query(sqlx::AssertSqlSafe(sql.prune.clone()))
                .bind($crate::time::duration_micros(older_than))
                .execute(pool)
                .await?;
            Ok(done.rows_affected())
        }
    };
}
pub(crate) use outbox_statements;
