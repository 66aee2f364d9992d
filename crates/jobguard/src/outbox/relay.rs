//! The relay: takes the outbox's due messages and hands them to a sink, at least once and in
//! order per topic.

use std::fmt;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt as _;
use serde::Serialize;

use super::{Outbox, Sink};
use crate::error::{Error, Result};
use crate::retry::RetryPolicy;
use crate::store::outbox::{DueMessage, Settle};
use crate::store::{Backend, ClaimToken};

/// Messages dead-lettered: `jobguard_outbox_dead_total{topic}`. Any increase needs a look.
pub use crate::metrics::OUTBOX_DEAD_TOTAL as DEAD_TOTAL;
/// Messages the sink confirmed: `jobguard_outbox_delivered_total{topic}`.
pub use crate::metrics::OUTBOX_DELIVERED_TOTAL as DELIVERED_TOTAL;
/// Deliveries that failed and will be tried again: `jobguard_outbox_retried_total{topic}`.
pub use crate::metrics::OUTBOX_RETRIED_TOTAL as RETRIED_TOTAL;

/// The longest `last_error` kept for a failed delivery, in characters.
const MAX_ERROR_LEN: usize = 2000;

/// How a [`Relay`] runs. Checked by [`Relay::with_config`].
#[derive(Clone, Debug, PartialEq)]
pub struct RelayConfig {
    /// Messages read per batch (1 to 10,000).
    pub batch_size: u32,
    /// Topics delivered at once (1 to 1,024); the messages of one topic go one at a time.
    pub concurrency: usize,
    /// How often an idle relay looks for due messages (at least 10 ms).
    pub poll_interval: Duration,
    /// The backoff between attempts of a failed delivery, and how many attempts a message gets
    /// before it is dead-lettered.
    pub retry: RetryPolicy,
    /// How long the relay lease lasts without renewal (at least 300 ms); it is renewed every
    /// third of it while the relay works.
    pub lease: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            batch_size: 100,
            concurrency: 16,
            poll_interval: Duration::from_secs(1),
            retry: RetryPolicy::default(),
            lease: Duration::from_secs(30),
        }
    }
}

impl RelayConfig {
    /// Checks every setting, with [`Error::InvalidConfig`] naming the first one out of range.
    pub fn validate(&self) -> Result<()> {
        let invalid = |setting, reason: &str| {
            Err(Error::InvalidConfig {
                setting,
                reason: reason.to_owned(),
            })
        };
        if !(1..=10_000).contains(&self.batch_size) {
            return invalid("relay batch size", "use 1 to 10000 messages");
        }
        if !(1..=1024).contains(&self.concurrency) {
            return invalid("relay concurrency", "use 1 to 1024 topics at once");
        }
        if self.poll_interval < Duration::from_millis(10) {
            return invalid("relay poll interval", "use at least 10ms");
        }
        if self.lease < Duration::from_millis(300) {
            return invalid(
                "relay lease",
                "use at least 300ms: it is renewed every third of it",
            );
        }
        let retry = &self.retry;
        if retry.max_attempts == 0 {
            return invalid("relay max attempts", "use at least 1");
        }
        if retry.base.is_zero() || retry.max_delay < retry.base {
            return invalid(
                "relay backoff",
                "the base delay must be above zero and at most the maximum delay",
            );
        }
        if !(0.0..=1.0).contains(&retry.jitter) {
            return invalid("relay backoff jitter", "use a fraction from 0 to 1");
        }
        Ok(())
    }
}

/// What a relay did: messages by how their delivery ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RelayReport {
    /// Confirmed by the sink and marked sent.
    pub delivered: u64,
    /// Failed, and scheduled for another attempt after a backoff.
    pub retried: u64,
    /// Dead-lettered: refused by the sink, or out of attempts.
    pub dead: u64,
}

impl std::ops::AddAssign for RelayReport {
    fn add_assign(&mut self, other: Self) {
        self.delivered += other.delivered;
        self.retried += other.retried;
        self.dead += other.dead;
    }
}

/// The report of a batch while its topics are delivered concurrently.
#[derive(Default)]
struct Tally {
    delivered: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
}

impl Tally {
    fn report(&self) -> RelayReport {
        RelayReport {
            delivered: self.delivered.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead: self.dead.load(Ordering::Relaxed),
        }
    }
}

/// Delivers an [`Outbox`]'s messages to a [`Sink`].
///
/// - **At least once.** A message is marked sent only after the sink confirmed it, by a
///   statement that changes only a pending row. A relay that dies or is stopped at any point
///   leaves every unconfirmed message pending, and it is delivered again, with the same id.
/// - **In order per topic.** Messages are taken in the order they were written, and a topic's
///   message is never handed to the sink while an earlier message of the topic is pending: a
///   failed delivery holds back the rest of its topic until it succeeds or is dead-lettered
///   (head-of-line blocking; other topics go on). The order is that of the outbox: the order
///   of publishing within a transaction, and the order of commits for messages published after
///   another committed; messages of transactions that overlap go in the order they became
///   visible. Because the next message goes only after the previous one was confirmed, the
///   *first* receipt of each message is in order even when a message is delivered twice.
/// - **Retries and dead letters.** A retryable failure is tried again after the
///   [`RetryPolicy`]'s backoff; a permanent one, or the last attempt failing, dead-letters the
///   message ([`Outbox::list`], [`Outbox::replay_dead`]) and its topic moves on.
/// - **One relay at a time.** A relay delivers only while it holds the outbox's lease, a row
///   with its token and an expiry by the database clock, renewed while it works; a second relay
///   (a worker's and `jobguard relay`) waits. A relay paused past its lease (a long GC pause,
///   SIGSTOP) may deliver a batch alongside the one that took over, which at-least-once allows.
///
/// ```no_run
/// use jobguard::outbox::{Outbox, Relay, RelayConfig, WebhookSink};
///
/// # async fn f(pool: sqlx::SqlitePool) -> jobguard::Result<()> {
/// let outbox = Outbox::new(pool);
/// outbox.migrate().await?;
/// let sink = WebhookSink::new("https://hooks.example.com/v1")?;
/// let config = RelayConfig { batch_size: 500, ..RelayConfig::default() };
/// let relay = Relay::with_config(outbox, sink, config)?;
/// let total = relay.run(jobguard::worker::shutdown_signal()).await?;
/// println!("{} delivered, {} dead-lettered", total.delivered, total.dead);
/// # Ok(()) }
/// ```
pub struct Relay<DB: Backend, S: Sink> {
    outbox: Outbox<DB>,
    sink: S,
    config: RelayConfig,
    /// This relay's token in the lease table: the process id, for operators, and a random part.
    holder: String,
}

impl<DB: Backend, S: Sink> fmt::Debug for Relay<DB, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("outbox", &self.outbox)
            .field("config", &self.config)
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

impl<DB: Backend, S: Sink> Relay<DB, S> {
    /// A relay with the default [`RelayConfig`].
    pub fn new(outbox: Outbox<DB>, sink: S) -> Self {
        Self::with_config(outbox, sink, RelayConfig::default())
            .expect("the default configuration is valid")
    }

    /// A relay with its own configuration; fails with [`Error::InvalidConfig`] for a setting
    /// out of range.
    pub fn with_config(outbox: Outbox<DB>, sink: S, config: RelayConfig) -> Result<Self> {
        config.validate()?;
        let token: String = ClaimToken::new()
            .0
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        Ok(Relay {
            outbox,
            sink,
            config,
            holder: format!("pid {} {token}", std::process::id()),
        })
    }

    /// The outbox it delivers.
    pub fn outbox(&self) -> &Outbox<DB> {
        &self.outbox
    }

    /// The sink it delivers to.
    pub fn sink(&self) -> &S {
        &self.sink
    }

    /// How it runs.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// Takes or renews the lease, then delivers one batch of due messages.
    ///
    /// Fails with [`Error::RelayLeaseHeld`] when another relay holds the lease. The lease stays
    /// with this relay until it runs out or the next call renews it; [`drain`](Self::drain) and
    /// [`run`](Self::run) let go of it when they end.
    pub async fn run_once(&self) -> Result<RelayReport> {
        let stop = AtomicBool::new(false);
        Ok(self.batch(&stop).await?.0)
    }

    /// Delivers batches until no message is due, then lets go of the lease. Messages backing
    /// off after a failure are left for later. Fails with [`Error::RelayLeaseHeld`] when
    /// another relay holds the lease.
    pub async fn drain(&self) -> Result<RelayReport> {
        let stop = AtomicBool::new(false);
        let mut total = RelayReport::default();
        let result = loop {
            match self.batch(&stop).await {
                Ok((report, found)) => {
                    total += report;
                    if found == 0 {
                        break Ok(total);
                    }
                }
                Err(error) => break Err(error),
            }
        };
        self.release().await;
        result
    }

    /// Delivers until `shutdown` resolves (see
    /// [`shutdown_signal`](crate::worker::shutdown_signal)), then lets go of the lease and
    /// returns what it did.
    ///
    /// After shutdown is asked it hands no new message to the sink and waits for the deliveries
    /// under way. Database errors and waiting for another relay's lease do not end it: they
    /// are logged, and it tries again after the poll interval.
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) -> Result<RelayReport> {
        let mut shutdown = pin!(shutdown);
        let stop = AtomicBool::new(false);
        let mut total = RelayReport::default();
        let mut waiting = false;
        loop {
            let mut batch = pin!(self.batch(&stop));
            let mut stopping = false;
            let result = tokio::select! {
                result = &mut batch => result,
                () = &mut shutdown => {
                    stopping = true;
                    stop.store(true, Ordering::Relaxed);
                    batch.await
                }
            };
            let idle = match result {
                Ok((report, found)) => {
                    waiting = false;
                    total += report;
                    found == 0
                }
                Err(Error::RelayLeaseHeld { .. }) => {
                    if !waiting {
                        tracing::info!(
                            outbox = %self.outbox.table(),
                            "another relay holds the outbox lease; waiting for it"
                        );
                    }
                    waiting = true;
                    true
                }
                Err(error) => {
                    tracing::warn!(%error, "an outbox batch failed; trying again");
                    true
                }
            };
            if stopping {
                break;
            }
            if idle {
                tokio::select! {
                    () = tokio::time::sleep(self.config.poll_interval) => {}
                    () = &mut shutdown => break,
                }
            }
        }
        self.release().await;
        Ok(total)
    }

    async fn release(&self) {
        let outbox = &self.outbox;
        if let Err(error) = DB::release_lease(outbox.pool(), outbox.sql(), &self.holder).await {
            tracing::warn!(%error, "letting go of the outbox lease failed; it runs out by itself");
        }
    }

    /// One batch under the lease: the report and how many due messages were found.
    async fn batch(&self, stop: &AtomicBool) -> Result<(RelayReport, usize)> {
        let (pool, sql) = (self.outbox.pool(), self.outbox.sql());
        if !DB::take_lease(pool, sql, &self.holder, self.config.lease).await? {
            return Err(Error::RelayLeaseHeld {
                table: self.outbox.table().to_string(),
            });
        }
        let due = DB::due(pool, sql, self.config.batch_size).await?;
        let found = due.len();
        if found == 0 {
            return Ok((RelayReport::default(), 0));
        }
        let tally = Tally::default();
        let deliveries = futures::stream::iter(by_topic(due))
            .map(|messages| self.deliver_topic(messages, &tally, stop))
            .buffer_unordered(self.config.concurrency)
            .collect::<Vec<Result<()>>>();
        tokio::select! {
            results = deliveries => {
                results.into_iter().collect::<Result<()>>()?;
            }
            () = self.keep_lease() => {
                // The deliveries under way are dropped: their messages stay pending.
                tracing::warn!(
                    outbox = %self.outbox.table(),
                    "another relay took the outbox lease during a batch; stopping the batch"
                );
            }
        }
        Ok((tally.report(), found))
    }

    /// Renews the lease every third of it; returns only when another relay has taken it.
    async fn keep_lease(&self) {
        let (pool, sql) = (self.outbox.pool(), self.outbox.sql());
        loop {
            tokio::time::sleep(self.config.lease / 3).await;
            match DB::take_lease(pool, sql, &self.holder, self.config.lease).await {
                Ok(true) => {}
                Ok(false) => return,
                // Delivering on is safe: at worst another relay overlaps this one.
                Err(error) => tracing::warn!(%error, "renewing the outbox lease failed"),
            }
        }
    }

    /// Delivers a topic's due messages in order, stopping at the first that must wait.
    async fn deliver_topic(
        &self,
        messages: Vec<DueMessage>,
        tally: &Tally,
        stop: &AtomicBool,
    ) -> Result<()> {
        for due in messages {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let message = &due.message;
            let topic = message.topic.clone();
            let failure = match self.sink.deliver(message).await {
                Ok(()) => {
                    self.settle(&due, Settle::Sent).await?;
                    tally.delivered.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!(DELIVERED_TOTAL, "topic" => topic).increment(1);
                    continue;
                }
                Err(failure) => failure,
            };
            let error = shorten(failure.describe());
            if failure.is_permanent() || self.config.retry.is_exhausted(message.attempt) {
                tracing::warn!(
                    message.id = %message.id, message.attempt, %error,
                    "an outbox message was dead-lettered"
                );
                self.settle(&due, Settle::Dead { error: &error }).await?;
                tally.dead.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(DEAD_TOTAL, "topic" => topic).increment(1);
                continue;
            }
            let delay = self.config.retry.next_delay(message.attempt);
            tracing::debug!(
                message.id = %message.id, message.attempt, %error, ?delay,
                "an outbox delivery failed; its topic waits for the retry"
            );
            self.settle(
                &due,
                Settle::Retry {
                    delay,
                    error: &error,
                },
            )
            .await?;
            tally.retried.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(RETRIED_TOTAL, "topic" => topic).increment(1);
            break;
        }
        Ok(())
    }

    async fn settle(&self, due: &DueMessage, how: Settle<'_>) -> Result<()> {
        let (pool, sql) = (self.outbox.pool(), self.outbox.sql());
        if !DB::settle_message(pool, sql, due.seq, how).await? {
            // Another relay that overlapped this one settled it first, or an operator did.
            tracing::debug!(message.id = %due.message.id, "the message was no longer pending");
        }
        Ok(())
    }
}

/// Splits a batch in seq order into one run of messages per topic, each in seq order, the
/// topics in the order of their first message.
fn by_topic(due: Vec<DueMessage>) -> Vec<Vec<DueMessage>> {
    let mut topics: Vec<Vec<DueMessage>> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for message in due {
        let slot = *index
            .entry(message.message.topic.clone())
            .or_insert_with(|| {
                topics.push(Vec::new());
                topics.len() - 1
            });
        topics[slot].push(message);
    }
    topics
}

fn shorten(mut text: String) -> String {
    if let Some((cut, _)) = text.char_indices().nth(MAX_ERROR_LEN) {
        text.truncate(cut);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_configuration_is_valid_and_bad_settings_are_named() {
        assert!(RelayConfig::default().validate().is_ok());
        let bad = [
            RelayConfig {
                batch_size: 0,
                ..RelayConfig::default()
            },
            RelayConfig {
                concurrency: 0,
                ..RelayConfig::default()
            },
            RelayConfig {
                poll_interval: Duration::ZERO,
                ..RelayConfig::default()
            },
            RelayConfig {
                lease: Duration::from_millis(10),
                ..RelayConfig::default()
            },
            RelayConfig {
                retry: RetryPolicy {
                    base: Duration::ZERO,
                    ..RetryPolicy::default()
                },
                ..RelayConfig::default()
            },
            RelayConfig {
                retry: RetryPolicy {
                    max_attempts: 0,
                    ..RetryPolicy::default()
                },
                ..RelayConfig::default()
            },
        ];
        let settings: Vec<_> = bad
            .iter()
            .map(|config| match config.validate() {
                Err(Error::InvalidConfig { setting, .. }) => setting,
                other => panic!("{config:?} gave {other:?}"),
            })
            .collect();
        assert_eq!(
            settings,
            [
                "relay batch size",
                "relay concurrency",
                "relay poll interval",
                "relay lease",
                "relay backoff",
                "relay max attempts"
            ]
        );
    }

    #[test]
    fn long_errors_are_cut() {
        assert_eq!(shorten("short".into()), "short");
        let long = shorten("é".repeat(MAX_ERROR_LEN + 5));
        assert_eq!(long.chars().count(), MAX_ERROR_LEN + 1);
    }
}
