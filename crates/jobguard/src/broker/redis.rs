//! Redis Streams: a [`Source`] reading through a consumer group, with `XACK` after the commit,
//! `XAUTOCLAIM` of entries left idle by consumers that died, and a dead-letter stream, and
//! [`RedisSink`], the outbox's sink, appending with `XADD`.
//!
//! # Entries
//!
//! A job is an entry whose `body` field holds its [`Envelope`] as JSON (and whose `id` field
//! its key, for people reading the stream); [`RedisSink::publish`] writes them so. Outbox
//! messages are entries with the fields `id`, `topic` and `body` (the payload).
//!
//! # How entries are settled
//!
//! Every consumer process reads the stream through one consumer group
//! ([`RedisConfig::group`]), each under its own consumer name. An entry read is pending for
//! that consumer until it is acknowledged.
//!
//! | the job | the entry |
//! |---|---|
//! | running | its idle time is reset (`XCLAIM ... JUSTID`) every third of the claim threshold |
//! | committed, or its key was already applied | `XACK` after the commit; one `XACK` with every id of a committed batch |
//! | failed, retryable, deliveries left | left pending, with its idle time set so that it can be claimed again after the retry delay |
//! | failed on the last delivery, fatal, or the entry cannot run | `XADD` to the dead-letter stream and `XACK`, in one `MULTI` |
//!
//! Each consumer also runs `XAUTOCLAIM` for entries pending longer than
//! [`claim_idle`](RedisConfig::claim_idle): those of consumers that died, and those given back
//! after a failure. Redis counts the deliveries of each entry; one claimed after more than
//! [`max_deliveries`](RedisConfig::max_deliveries) deliveries is dead-lettered without running.
//!
//! `XAUTOCLAIM` needs Redis 6.2 or later.
//!
//! Acknowledged entries stay in the stream (another group may still need them): trim it with
//! `XADD ... MAXLEN` or `XTRIM`, keeping entries at least as long as a consumer may take.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ::redis::aio::MultiplexedConnection;
use ::redis::streams::{StreamAutoClaimReply, StreamId, StreamPendingCountReply, StreamReadReply};
use ::redis::{AsyncConnectionConfig, Client, Value};

use super::consumer::{Delivery, Source};
use super::envelope::Envelope;
use crate::error::{Error, Result};
use crate::outbox::{OutboxMessage, Sink, SinkError};
use jobguard_core::url::redact;

const BROKER: &str = "redis";

/// How long [`RedisSource::receive`](Source::receive) blocks waiting for a new entry.
const POLL: Duration = Duration::from_secs(1);

/// How often a source looks for idle entries to claim.
const CLAIM_SCAN: Duration = Duration::from_millis(500);

/// The field an entry's body is in.
pub const BODY_FIELD: &str = "body";

/// Where a [`RedisSource`] consumes from, and how.
#[derive(Clone, Debug)]
pub struct RedisConfig {
    /// The stream.
    pub stream: String,
    /// The consumer group, shared by every consumer process (default `jobguard`).
    pub group: String,
    /// This consumer's name in the group, unique per process (default: the host name, the
    /// process id and a random number).
    pub consumer: String,
    /// Entries read at once, and the jobs run at once (default 10).
    pub prefetch: usize,
    /// Deliveries an entry gets (default 5).
    pub max_deliveries: u32,
    /// How long an entry stays pending without progress before another consumer claims it
    /// (default 30 s). A running job resets it every third of this.
    pub claim_idle: Duration,
    /// Where dead letters are appended (default `<stream>:dead`), with the fields `id` (the
    /// entry's), `stream`, `reason` and `body`.
    pub dead_letter_stream: String,
    /// Create the group (and the stream) when missing (default true).
    pub declare: bool,
}

impl RedisConfig {
    /// Consumes `stream` with the defaults.
    pub fn new(stream: impl Into<String>) -> Self {
        let stream = stream.into();
        RedisConfig {
            dead_letter_stream: format!("{stream}:dead"),
            stream,
            group: "jobguard".to_owned(),
            consumer: default_consumer_name(),
            prefetch: 10,
            max_deliveries: 5,
            claim_idle: Duration::from_secs(30),
            declare: true,
        }
    }
}

/// A consumer name no other process uses.
fn default_consumer_name() -> String {
    use std::hash::{BuildHasher, RandomState};
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "host".to_owned());
    let random = RandomState::new().hash_one(Instant::now()) % 1_000_000;
    format!("{host}-{}-{random:06}", std::process::id())
}

/// Creates the consumer group of `config` (and its stream) when missing. A new group reads the
/// stream from its first entry.
pub async fn declare(conn: &mut MultiplexedConnection, config: &RedisConfig) -> Result<()> {
    let created: std::result::Result<Value, _> = ::redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&config.stream)
        .arg(&config.group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match created {
        Ok(_) => Ok(()),
        Err(error) if error.code() == Some("BUSYGROUP") => Ok(()),
        Err(error) => Err(broker_error(
            format!(
                "create the group `{}` on the stream `{}`",
                config.group, config.stream
            ),
            error,
        )),
    }
}

/// Deletes the stream of `config` and its dead-letter stream, with their entries and groups.
/// For tests and demos that make their own streams.
pub async fn remove(url: &str, config: &RedisConfig) -> Result<()> {
    let mut conn = connection(&client(url)?, url, &commands()).await?;
    let _: Value = ::redis::cmd("DEL")
        .arg(&config.stream)
        .arg(&config.dead_letter_stream)
        .query_async(&mut conn)
        .await
        .map_err(|error| broker_error(format!("delete the stream `{}`", config.stream), error))?;
    Ok(())
}

/// Consumes a Redis stream through a consumer group, for a [`Consumer`](super::Consumer).
pub struct RedisSource {
    /// Blocks in `XREADGROUP`; other commands would wait behind it.
    reader: MultiplexedConnection,
    /// Acks, claims and dead letters.
    conn: MultiplexedConnection,
    config: RedisConfig,
    /// Where the next `XAUTOCLAIM` scan starts.
    claim_cursor: String,
    last_claim: Option<Instant>,
}

impl RedisSource {
    /// Connects to `url` (`redis://host:6379`), creates the group unless told not to, and
    /// consumes under [`RedisConfig::consumer`].
    pub async fn connect(url: &str, config: RedisConfig) -> Result<Self> {
        let client = client(url)?;
        let blocking = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(POLL + Duration::from_secs(5)));
        let reader = connection(&client, url, &blocking).await?;
        let mut conn = connection(&client, url, &commands()).await?;
        if config.declare {
            declare(&mut conn, &config).await?;
        }
        Ok(RedisSource {
            reader,
            conn,
            config,
            claim_cursor: "0-0".to_owned(),
            last_claim: None,
        })
    }

    /// Claims entries idle past the threshold: those of dead consumers and those given back.
    async fn claim(&mut self, max: usize) -> Result<Vec<RedisDelivery>> {
        let config = &self.config;
        let reply: StreamAutoClaimReply = ::redis::cmd("XAUTOCLAIM")
            .arg(&config.stream)
            .arg(&config.group)
            .arg(&config.consumer)
            .arg(millis(config.claim_idle))
            .arg(&self.claim_cursor)
            .arg("COUNT")
            .arg(max)
            .query_async(&mut self.conn)
            .await
            .map_err(|error| {
                broker_error(format!("claim idle entries of `{}`", config.stream), error)
            })?;
        self.claim_cursor = reply.next_stream_id;
        let mut claimed = Vec::with_capacity(reply.claimed.len());
        for entry in reply.claimed {
            let pending: StreamPendingCountReply = ::redis::cmd("XPENDING")
                .arg(&config.stream)
                .arg(&config.group)
                .arg(&entry.id)
                .arg(&entry.id)
                .arg(1)
                .query_async(&mut self.conn)
                .await
                .map_err(|error| broker_error("read an entry's delivery count".into(), error))?;
            let Some(pending) = pending.ids.first() else {
                // Acknowledged in between by the consumer it was claimed from.
                continue;
            };
            let attempt = u32::try_from(pending.times_delivered.max(1)).unwrap_or(u32::MAX);
            claimed.push(self.delivery(entry, attempt));
        }
        Ok(claimed)
    }

    fn delivery(&self, entry: StreamId, attempt: u32) -> RedisDelivery {
        RedisDelivery {
            body: field(&entry.map, BODY_FIELD).unwrap_or_default(),
            id: entry.id,
            attempt,
            conn: self.conn.clone(),
            config: self.config.clone(),
        }
    }
}

impl Source for RedisSource {
    type Delivery = RedisDelivery;

    super::consumer::source_settings!(claim_idle);

    async fn receive(&mut self, max: usize) -> Result<Vec<RedisDelivery>> {
        self.receive_within(max, POLL).await
    }

    async fn receive_within(&mut self, max: usize, wait: Duration) -> Result<Vec<RedisDelivery>> {
        if self.last_claim.is_none_or(|at| at.elapsed() >= CLAIM_SCAN) {
            self.last_claim = Some(Instant::now());
            let claimed = self.claim(max).await?;
            if !claimed.is_empty() {
                return Ok(claimed);
            }
        }
        let config = &self.config;
        let mut read = ::redis::cmd("XREADGROUP");
        read.arg("GROUP")
            .arg(&config.group)
            .arg(&config.consumer)
            .arg("COUNT")
            .arg(max);
        // `BLOCK 0` would block for ever: no wait is no `BLOCK`.
        if !wait.is_zero() {
            read.arg("BLOCK").arg(millis(wait).max(1));
        }
        let reply: Option<StreamReadReply> = read
            .arg("STREAMS")
            .arg(&config.stream)
            .arg(">")
            .query_async(&mut self.reader)
            .await
            .map_err(|error| broker_error(format!("read from `{}`", config.stream), error))?;
        let entries = reply
            .into_iter()
            .flat_map(|reply| reply.keys)
            .flat_map(|key| key.ids);
        Ok(entries.map(|entry| self.delivery(entry, 1)).collect())
    }

    async fn close(self) {
        // Entries read and not acknowledged stay pending, and are claimed by another consumer
        // after the claim threshold.
    }
}

/// An entry from a [`RedisSource`].
pub struct RedisDelivery {
    id: String,
    body: Vec<u8>,
    attempt: u32,
    conn: MultiplexedConnection,
    config: RedisConfig,
}

impl RedisDelivery {
    /// `XCLAIM` of this entry to this consumer, without counting a delivery, leaving it idle
    /// for `idle`.
    async fn reclaim(&self, idle: Duration) -> std::result::Result<(), ::redis::RedisError> {
        let config = &self.config;
        let _: Value = ::redis::cmd("XCLAIM")
            .arg(&config.stream)
            .arg(&config.group)
            .arg(&config.consumer)
            .arg(0)
            .arg(&self.id)
            .arg("IDLE")
            .arg(millis(idle))
            .arg("JUSTID")
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }
}

impl Delivery for RedisDelivery {
    fn body(&self) -> &[u8] {
        &self.body
    }

    fn attempt(&self) -> u32 {
        self.attempt
    }

    async fn ack(mut self) -> Result<()> {
        let _: Value = ::redis::cmd("XACK")
            .arg(&self.config.stream)
            .arg(&self.config.group)
            .arg(&self.id)
            .query_async(&mut self.conn)
            .await
            .map_err(|error| broker_error("acknowledge an entry".into(), error))?;
        Ok(())
    }

    async fn ack_all(deliveries: Vec<Self>) -> Result<()> {
        let Some(first) = deliveries.first() else {
            return Ok(());
        };
        let config = &first.config;
        if deliveries.iter().any(|delivery| {
            delivery.config.stream != config.stream || delivery.config.group != config.group
        }) {
            // Put together by hand from several streams or groups: one `XACK` each.
            let mut acked = Ok(());
            for delivery in deliveries {
                if let (Err(error), Ok(())) = (delivery.ack().await, &acked) {
                    acked = Err(error);
                }
            }
            return acked;
        }
        let mut xack = ::redis::cmd("XACK");
        xack.arg(&config.stream).arg(&config.group);
        for delivery in &deliveries {
            xack.arg(&delivery.id);
        }
        let _: Value = xack
            .query_async(&mut first.conn.clone())
            .await
            .map_err(|error| broker_error("acknowledge a batch of entries".into(), error))?;
        Ok(())
    }

    async fn retry(self, delay: Duration) -> Result<()> {
        // Idle for `claim_idle - delay` now: any consumer's next XAUTOCLAIM after `delay` takes it.
        let idle = self.config.claim_idle.saturating_sub(delay);
        self.reclaim(idle)
            .await
            .map_err(|error| broker_error("give an entry back".into(), error))
    }

    async fn dead_letter(mut self, reason: String) -> Result<()> {
        let config = &self.config;
        let _: Value = ::redis::pipe()
            .atomic()
            .cmd("XADD")
            .arg(&config.dead_letter_stream)
            .arg("*")
            .arg("id")
            .arg(&self.id)
            .arg("stream")
            .arg(&config.stream)
            .arg("reason")
            .arg(reason)
            .arg(BODY_FIELD)
            .arg(&self.body)
            .ignore()
            .cmd("XACK")
            .arg(&config.stream)
            .arg(&config.group)
            .arg(&self.id)
            .ignore()
            .query_async(&mut self.conn)
            .await
            .map_err(|error| {
                broker_error(
                    format!("dead-letter an entry to `{}`", config.dead_letter_stream),
                    error,
                )
            })?;
        Ok(())
    }

    async fn progress(&self) -> Result<()> {
        self.reclaim(Duration::ZERO)
            .await
            .map_err(|error| broker_error("reset an entry's idle time".into(), error))
    }
}

/// Appends `body` with `id` unless an entry with `id` was appended to the stream within the
/// window: the check, the append and the marker in one script.
const APPEND_ONCE: &str = r"
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
if tonumber(ARGV[1]) > 0 then redis.call('SET', KEYS[2], '1', 'PX', ARGV[1]) end
return 1
";

/// Appends to Redis streams: the outbox's [`Sink`], and a producer of job [`Envelope`]s.
///
/// As a sink, each outbox message is appended to the stream `<prefix><topic>` as an entry with
/// the fields `id` (the [message id](crate::outbox::MessageId)), `topic` and `body` (the payload
/// as JSON). Redis has no deduplication of its own, so the sink keeps a marker per id for a
/// window (2 minutes unless [`dedupe_window`](Self::dedupe_window) says otherwise): a message
/// delivered again within it (a relay that died before recording the success) is not appended
/// twice. Outside the window receivers deduplicate by `id`.
///
/// | Redis | what the relay does |
/// |---|---|
/// | appended, or already appended within the window | delivered: marks the message sent |
/// | no answer, an error | retries after a backoff |
///
/// ```no_run
/// use jobguard::broker::redis::RedisSink;
/// use jobguard::outbox::{Outbox, Relay};
///
/// # async fn f(pool: sqlx::PgPool) -> jobguard::Result<()> {
/// // Messages on topic `invoices` go to the stream `events:invoices`.
/// let sink = RedisSink::connect("redis://127.0.0.1:6379").await?.stream_prefix("events:");
/// let report = Relay::new(Outbox::new(pool), sink).drain().await?;
/// assert_eq!(report.dead, 0);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisSink {
    conn: MultiplexedConnection,
    prefix: String,
    window: Duration,
}

impl RedisSink {
    /// The default deduplication window.
    pub const DEFAULT_DEDUPE_WINDOW: Duration = Duration::from_secs(120);

    /// Connects to `url`; topics are appended to streams of the same name.
    pub async fn connect(url: &str) -> Result<Self> {
        let conn = connection(&client(url)?, url, &commands()).await?;
        Ok(RedisSink {
            conn,
            prefix: String::new(),
            window: Self::DEFAULT_DEDUPE_WINDOW,
        })
    }

    /// Appends topic `t` to the stream `<prefix>t`.
    pub fn stream_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long an appended id is remembered; zero appends every delivery.
    pub fn dedupe_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Appends a job's envelope to `stream` with the job key as `id`, once within the window.
    pub async fn publish(&self, stream: &str, envelope: &Envelope) -> Result<()> {
        let body = envelope.to_bytes();
        let fields = [
            ("id", envelope.key.as_str().as_bytes()),
            (BODY_FIELD, &body),
        ];
        self.append(stream, envelope.key.as_str(), &fields)
            .await
            .map_err(|error| {
                broker_error(
                    format!("append job `{}` to `{stream}`", envelope.key),
                    error,
                )
            })
    }

    async fn append(
        &self,
        stream: &str,
        id: &str,
        fields: &[(&str, &[u8])],
    ) -> std::result::Result<(), ::redis::RedisError> {
        let mut script = ::redis::cmd("EVAL");
        script
            .arg(APPEND_ONCE)
            .arg(2)
            .arg(stream)
            .arg(format!("jobguard:appended:{stream}:{id}"))
            .arg(millis(self.window));
        for (name, value) in fields {
            script.arg(*name).arg(*value);
        }
        let _: i64 = script.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }
}

impl Sink for RedisSink {
    async fn deliver(&self, message: &OutboxMessage) -> std::result::Result<(), SinkError> {
        let body = serde_json::to_vec(&message.payload)
            .map_err(|error| SinkError::permanent("the payload is not JSON").with_source(error))?;
        let stream = format!("{}{}", self.prefix, message.topic);
        let fields = [
            ("id", message.id.as_str().as_bytes()),
            ("topic", message.topic.as_bytes()),
            (BODY_FIELD, &body),
        ];
        self.append(&stream, message.id.as_str(), &fields)
            .await
            .map_err(|error| {
                SinkError::retryable(format!("appending to the stream `{stream}` failed"))
                    .with_source(error)
            })
    }
}

/// The bytes of an entry's field, if it has it.
fn field(map: &HashMap<String, Value>, name: &str) -> Option<Vec<u8>> {
    ::redis::from_redis_value_ref(map.get(name)?).ok()
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The configuration of connections that send short commands.
fn commands() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(5)))
}

fn client(url: &str) -> Result<Client> {
    Client::open(url)
        .map_err(|error| broker_error(format!("use the Redis URL {}", redact(url)), error))
}

async fn connection(
    client: &Client,
    url: &str,
    config: &AsyncConnectionConfig,
) -> Result<MultiplexedConnection> {
    client
        .get_multiplexed_async_connection_with_config(config)
        .await
        .map_err(|error| {
            broker_error(
                format!("connect to {} (is Redis running there?)", redact(url)),
                error,
            )
        })
}

fn broker_error(action: String, error: ::redis::RedisError) -> Error {
    Error::Broker {
        broker: BROKER,
        action,
        source: Box::new(error),
    }
}
