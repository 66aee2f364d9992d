//! The consumer: one loop, shared by every broker, that runs each message's job through the
//! guard and acknowledges the message only after the guard's transaction ended.
//!
//! A broker hands the loop [`Delivery`] values through a [`Source`], its adapter. For each one:
//!
//! 1. the body is read as an [`Envelope`] and its kind looked up among the registered [`Job`]s;
//!    a body that is not an envelope, an unknown kind, a payload that does not deserialize or
//!    an envelope whose key is not the one the job derives from its payload
//!    ([`Error::EnvelopeKeyMismatch`]) can never run, and is dead-lettered at once;
//! 2. [`Guard::run_with_payload`] claims the key and runs the job in one transaction, while the
//!    delivery is kept alive with [`Delivery::progress`] (JetStream progress acks, Redis
//!    `XCLAIM`);
//! 3. `Applied` or `Duplicate`: the message is acknowledged. The ack comes after the commit, so
//!    a consumer that dies between the two leaves a committed effect and an unacknowledged
//!    message; the broker delivers it again, the guard finds the key and reports a duplicate,
//!    and that delivery is acknowledged;
//! 4. a retryable error: the transaction rolled back, and the message is given back to the
//!    broker ([`Delivery::retry`]) for a later delivery, until the broker's maximum number of
//!    deliveries; then, or on a fatal error, it is dead-lettered ([`Delivery::dead_letter`]).
//!
//! With [`ConsumerConfig::batch_size`] above 1, messages of kinds that opted in with
//! [`Job::BATCH`] run in batches instead: up to that many received messages in one
//! transaction, each key claimed in it and each effect run in turn, one commit, then one
//! acknowledgement of them all ([`Delivery::ack_all`]). A batch that fails in any way rolls
//! back, and its messages run again one per transaction as above.
//!
//! Messages that name an order group ([`Delivery::order_group`]: an SQS FIFO queue's message
//! group) never run at once with another of their group, nor batch: they run one at a time in
//! the order received, each after the one before was acknowledged or dead-lettered; one given
//! back for a later delivery gives back the rest of its group behind it, which the broker then
//! delivers again after it.

use std::collections::HashSet;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

mod batch;
mod faults;
mod ordered;
pub(super) mod runnable;
mod stats;

use self::faults::Faults;
use self::runnable::Runnable;
pub use self::stats::ConsumerStats;
pub(super) use self::stats::Counters;
use super::Envelope;
use crate::dispatch::{Registry, catch_panic, log_join};
use crate::error::{Error, Result};
use crate::guard::{Guard, Outcome};
use crate::job::Job;
use crate::key::JobKey;
use crate::retry::doubled;
use crate::spikes::record_outcome;
use crate::store::Backend;

/// A message received from a broker, not yet settled.
///
/// Each broker module implements it; every method that settles the message consumes it, so a
/// message is settled at most once by the consumer. A message dropped unsettled (its task was
/// aborted at shutdown, the process died) is delivered again by the broker.
pub trait Delivery: Send + Sync + 'static {
    /// The message body: an [`Envelope`] as JSON.
    fn body(&self) -> &[u8];

    /// Which delivery of the message this is, from 1, as the broker counts them.
    fn attempt(&self) -> u32;

    /// Acknowledges the message: the broker never delivers it again. Called after the guard's
    /// transaction committed (or found the key applied).
    fn ack(self) -> impl Future<Output = Result<()>> + Send;

    /// Gives the message back for another delivery after about `delay`.
    fn retry(self, delay: Duration) -> impl Future<Output = Result<()>> + Send;

    /// Moves the message to the broker's dead letters, with why.
    fn dead_letter(self, reason: String) -> impl Future<Output = Result<()>> + Send;

    /// Tells the broker the message's job is still running, so it is not delivered to another
    /// consumer meanwhile. Called every [`Source::progress_interval`] while the job runs.
    fn progress(&self) -> impl Future<Output = Result<()>> + Send;

    /// The group whose messages must run one at a time, in the order the broker handed them
    /// over (an SQS FIFO queue's `MessageGroupId`); `None`, the default, for a message that
    /// may run alongside any other. See the [module documentation](self).
    fn order_group(&self) -> Option<&str> {
        None
    }

    /// Acknowledges all of `deliveries`, a batch whose transaction committed, as few round
    /// trips as the broker allows (RabbitMQ one `basic.ack` with `multiple`, Redis one `XACK`).
    /// By default each is acknowledged in turn with [`ack`](Self::ack).
    ///
    /// An error means some of them may not have been acknowledged: the broker delivers those
    /// again, and the guard reports them as duplicates.
    fn ack_all(deliveries: Vec<Self>) -> impl Future<Output = Result<()>> + Send
    where
        Self: Sized,
    {
        async move {
            let mut failed = None;
            for delivery in deliveries {
                if let Err(error) = delivery.ack().await {
                    failed.get_or_insert(error);
                }
            }
            failed.map_or(Ok(()), Err)
        }
    }
}

/// The [`Source`] methods that only read the source's config, for a broker whose delivery
/// lease is the config field `$lease`: progress is due every third of it.
macro_rules! source_settings {
    ($lease:ident) => {
        fn broker(&self) -> &'static str {
            BROKER
        }

        fn prefetch(&self) -> usize {
            self.config.prefetch.max(1)
        }

        fn max_deliveries(&self) -> u32 {
            self.config.max_deliveries
        }

        fn progress_interval(&self) -> Option<Duration> {
            Some(self.config.$lease / 3)
        }
    };
}
pub(crate) use source_settings;

/// Where a [`Consumer`] receives messages from: a queue, stream or subject on one broker.
pub trait Source: Send + 'static {
    /// The messages it hands out.
    type Delivery: Delivery;

    /// The broker's name for logs: `rabbitmq`, `nats`, `redis`.
    fn broker(&self) -> &'static str;

    /// How many messages this consumer holds unacknowledged at once: the broker's prefetch,
    /// and the number of jobs the consumer runs at once.
    fn prefetch(&self) -> usize;

    /// How many deliveries a message gets; a failure on the last one dead-letters it.
    fn max_deliveries(&self) -> u32;

    /// How often a running job's delivery needs [`Delivery::progress`]; `None` if never.
    fn progress_interval(&self) -> Option<Duration>;

    /// Up to `max` messages (`max` is at least 1). Waits for the first one for about a second,
    /// then returns what has arrived, possibly nothing, so that the consumer can notice it is
    /// idle. The consumer cancels the call at shutdown: a message received and dropped
    /// unsettled is delivered again by the broker.
    fn receive(&mut self, max: usize) -> impl Future<Output = Result<Vec<Self::Delivery>>> + Send;

    /// Like [`receive`](Self::receive), waiting at most about `wait` for the first message;
    /// [`Duration::ZERO`] takes only what is at hand. The consumer calls it to top up a batch
    /// after [`ConsumerConfig::batch_linger`]. By default it is `receive`, which waits as long
    /// as that does.
    fn receive_within(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> impl Future<Output = Result<Vec<Self::Delivery>>> + Send {
        let _ = wait;
        self.receive(max)
    }

    /// Stops receiving and closes the connection. Messages still unacknowledged go back to the
    /// broker.
    fn close(self) -> impl Future<Output = ()> + Send;
}

/// How a [`Consumer`] runs.
#[derive(Clone, Debug)]
pub struct ConsumerConfig {
    /// How long a failed delivery waits before it is given back, doubled with each delivery
    /// of the message, up to a minute.
    pub retry_delay: Duration,
    /// How long running jobs get to finish after shutdown is asked; the rest are rolled back
    /// and their messages left unacknowledged, for the broker to deliver again.
    pub shutdown_timeout: Duration,
    /// Return once no message has arrived for this long and no job is running (for tests,
    /// demos and draining a queue); `None` runs until shutdown.
    pub stop_when_idle_for: Option<Duration>,
    /// Messages of kinds that opted in with [`Job::BATCH`] run up to this many in one
    /// transaction, acknowledged together after its commit (see the
    /// [module documentation](self)). 1, the default,
    /// runs every message in its own transaction. A batch is never larger than the source's
    /// [`prefetch`](Source::prefetch): give the source a prefetch of a few batches.
    pub batch_size: usize,
    /// How long a batch that the received messages did not fill waits once for more before it
    /// runs; short, so that a quiet queue keeps its latency.
    pub batch_linger: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            retry_delay: Duration::from_secs(1),
            shutdown_timeout: Duration::from_secs(30),
            stop_when_idle_for: None,
            batch_size: 1,
            batch_linger: Duration::from_millis(2),
        }
    }
}

/// Called with each message's key and outcome after its transaction committed.
type OnOutcome = Arc<dyn Fn(&JobKey, &Outcome<()>) + Send + Sync>;

/// Runs registered [`Job`] kinds from a broker through a [`Guard`]. See the
/// [module documentation](self) for the order of claim, commit and ack.
///
/// ```no_run
/// use jobguard::broker::{Consumer, ConsumerConfig};
/// use jobguard::broker::rabbitmq::{RabbitConfig, RabbitSource};
/// use jobguard::{Job, JobError, JobKey, KeyError, PgGuard};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Credit { order: String, account: i64, amount: i64 }
///
/// impl Job<sqlx::Postgres> for Credit {
///     const KIND: &'static str = "credit";
///     fn key(&self) -> Result<JobKey, KeyError> { JobKey::new("credit", [&self.order]) }
///     async fn run(&self, conn: &mut sqlx::PgConnection) -> Result<(), JobError> {
///         sqlx::query("insert into ledger (account, amount) values ($1, $2)")
///             .bind(self.account).bind(self.amount).execute(conn).await?;
///         Ok(())
///     }
/// }
///
/// # async fn f(pool: sqlx::PgPool) -> jobguard::Result<()> {
/// let consumer = Consumer::new(PgGuard::new(pool)).register::<Credit>();
/// consumer.migrate().await?;
/// let source =
///     RabbitSource::connect("amqp://127.0.0.1:5672", RabbitConfig::new("credits")).await?;
/// let stats = consumer.run(source, jobguard::worker::shutdown_signal()).await?;
/// println!("{} applied, {} duplicates", stats.applied, stats.duplicates);
/// # Ok(()) }
/// ```
pub struct Consumer<DB: Backend> {
    pub(super) guard: Guard<DB>,
    pub(super) handlers: Registry<dyn Runnable<DB>>,
    /// The registered kinds whose [`Job::BATCH`] is true.
    pub(super) batched: HashSet<String>,
    pub(super) config: ConsumerConfig,
    pub(super) on_outcome: Option<OnOutcome>,
    pub(super) faults: Faults,
}

impl<DB: Backend> Consumer<DB> {
    /// A consumer claiming keys with `guard`, with the default configuration and no job kinds
    /// yet.
    pub fn new(guard: Guard<DB>) -> Self {
        Self::with_config(guard, ConsumerConfig::default())
    }

    /// A consumer with its own configuration.
    pub fn with_config(guard: Guard<DB>, config: ConsumerConfig) -> Self {
        Consumer {
            guard,
            handlers: Registry::default(),
            batched: HashSet::new(),
            config,
            on_outcome: None,
            faults: Faults::default(),
        }
    }

    /// Runs messages of kind `J::KIND` as `J`, in batches when [`Job::BATCH`] is true and
    /// [`ConsumerConfig::batch_size`] is above 1.
    pub fn register<J: Job<DB>>(mut self) -> Self {
        self.handlers.insert(J::KIND, |payload| {
            Ok(Box::new(J::deserialize(payload)?) as Box<dyn Runnable<DB>>)
        });
        if J::BATCH {
            self.batched.insert(J::KIND.to_owned());
        } else {
            self.batched.remove(J::KIND);
        }
        self
    }

    /// Calls `observer` with each message's key and outcome once its transaction committed or
    /// the guard found the key already applied, before the message is acknowledged (on Kafka,
    /// before its offset is handed to the client): for progress reports and counts of your own.
    ///
    /// Only messages that settled with an [`Outcome`] are observed: a failure given back for
    /// another delivery or a dead letter is not one (see [`ConsumerStats`] and the logs). An
    /// acknowledgement can still fail after the call, and the message then comes again, as a
    /// duplicate. `observer` runs on the message's task: keep it short, and hand anything slow
    /// to a task of its own. A panic in it is logged as an error and the message is
    /// acknowledged all the same.
    ///
    /// ```no_run
    /// # async fn f(consumer: jobguard::broker::Consumer<sqlx::Postgres>) {
    /// let consumer = consumer.on_outcome(|key, outcome| {
    ///     println!("{key}: {}", outcome.label());
    /// });
    /// # }
    /// ```
    pub fn on_outcome<F>(mut self, observer: F) -> Self
    where
        F: Fn(&JobKey, &Outcome<()>) + Send + Sync + 'static,
    {
        self.on_outcome = Some(Arc::new(observer));
        self
    }

    /// The guard the consumer claims keys with.
    pub fn guard(&self) -> &Guard<DB> {
        &self.guard
    }

    /// Creates the guard's table when missing.
    pub async fn migrate(&self) -> Result<()> {
        self.guard.migrate().await
    }

    /// Receives and runs messages from `source` until `shutdown` resolves (see
    /// [`shutdown_signal`](crate::worker::shutdown_signal)), or until idle with
    /// [`ConsumerConfig::stop_when_idle_for`]. Runs up to [`Source::prefetch`] jobs at once.
    ///
    /// Fails when the source keeps failing to receive (the broker went away); messages not
    /// acknowledged by then are delivered again by the broker.
    pub async fn run<S: Source>(
        self,
        mut source: S,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<ConsumerStats> {
        let consumer = Arc::new(self);
        let counters = Arc::new(Counters::default());
        let capacity = source.prefetch().max(1);
        let permits = Arc::new(Semaphore::new(capacity));
        let limits = Limits {
            broker: source.broker(),
            max_deliveries: source.max_deliveries().max(1),
            progress_interval: source.progress_interval(),
        };
        let mut tasks = JoinSet::new();
        let mut shutdown = pin!(shutdown);
        let mut last_message = Instant::now();
        let mut receive_failures = 0_u32;
        let mut failure = None;
        let mut tails = ordered::Tails::default();

        loop {
            while let Some(joined) = tasks.try_join_next() {
                log_join(joined, "a message task panicked outside the job");
            }
            let first = tokio::select! {
                biased;
                () = &mut shutdown => break,
                permit = Arc::clone(&permits).acquire_owned() => permit.expect("never closed"),
            };
            let free = 1 + permits.available_permits();
            let received = tokio::select! {
                biased;
                () = &mut shutdown => break,
                received = source.receive(free) => received,
            };
            let deliveries = match received {
                Ok(deliveries) => {
                    receive_failures = 0;
                    deliveries
                }
                Err(error) => {
                    receive_failures += 1;
                    if receive_failures >= MAX_RECEIVE_FAILURES {
                        failure = Some(error);
                        break;
                    }
                    tracing::warn!(%error, broker = limits.broker, "receiving failed; trying again");
                    drop(first);
                    let pause = Duration::from_millis(100 << receive_failures.min(5));
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(pause) => continue,
                    }
                }
            };
            if deliveries.is_empty() {
                drop(first);
                if let Some(idle) = consumer.config.stop_when_idle_for
                    && tasks.is_empty()
                    && last_message.elapsed() >= idle
                {
                    break;
                }
                continue;
            }
            last_message = Instant::now();
            let mut messages: Vec<Message<S::Delivery, DB>> = deliveries
                .into_iter()
                .map(|delivery| consumer.decode(delivery))
                .collect();
            let room = free.saturating_sub(messages.len());
            let mut stopping = false;
            if let Some(wanted) = consumer.short_by(&messages, &limits, room) {
                // The batch is short: give the broker a moment to hand over more.
                let topped_up = tokio::select! {
                    biased;
                    () = &mut shutdown => None,
                    received = async {
                        tokio::time::sleep(consumer.config.batch_linger).await;
                        source.receive_within(wanted, Duration::ZERO).await
                    } => Some(received),
                };
                match topped_up {
                    Some(Ok(more)) => {
                        messages.extend(more.into_iter().map(|delivery| consumer.decode(delivery)));
                    }
                    Some(Err(error)) => {
                        tracing::warn!(%error, broker = limits.broker, "receiving more for a batch failed");
                    }
                    // Shutdown: the messages at hand still run, then the loop stops.
                    None => stopping = true,
                }
            }
            let mut first = Some(first);
            let (lanes, messages) = ordered::lanes(messages);
            for (group, lane) in lanes {
                let lane_permits = take_permits(&mut first, &permits, lane.len()).await;
                let (after, done) = tails.follow(group);
                let (consumer, limits, counters) =
                    (Arc::clone(&consumer), limits.clone(), Arc::clone(&counters));
                tasks.spawn(consumer.process_in_order(
                    lane,
                    after,
                    done,
                    limits,
                    counters,
                    lane_permits,
                ));
            }
            for group in consumer.group(messages, &limits) {
                let mut group_permits = take_permits(&mut first, &permits, group.len()).await;
                let (consumer, limits, counters) =
                    (Arc::clone(&consumer), limits.clone(), Arc::clone(&counters));
                match <[_; 1]>::try_from(group) {
                    Ok([message]) => {
                        let permit = group_permits.pop().expect("one per message");
                        tasks.spawn(consumer.process(message, limits, counters, permit));
                    }
                    Err(group) => {
                        tasks.spawn(consumer.process_batch(group, limits, counters, group_permits));
                    }
                }
            }
            if stopping {
                break;
            }
        }

        let drained = tokio::time::timeout(consumer.config.shutdown_timeout, async {
            while let Some(joined) = tasks.join_next().await {
                log_join(joined, "a message task panicked outside the job");
            }
        })
        .await;
        if drained.is_err() {
            // Every message not settled yet holds a permit, alone or in a batch.
            let unsettled = capacity.saturating_sub(permits.available_permits());
            tracing::warn!(
                messages = unsettled,
                "running jobs did not finish in time; rolling them back, their messages go back to the broker"
            );
            counters
                .released
                .fetch_add(unsettled as u64, Ordering::Relaxed);
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
        source.close().await;
        match failure {
            Some(error) => Err(error),
            None => Ok(counters.snapshot()),
        }
    }

    /// Runs one message in its own transaction and settles it, holding `_permit`.
    async fn process<D: Delivery>(
        self: Arc<Self>,
        message: Message<D, DB>,
        limits: Limits,
        counters: Arc<Counters>,
        _permit: OwnedSemaphorePermit,
    ) {
        self.process_one(message, &limits, &counters).await;
    }

    /// Runs one message in its own transaction and settles it. True when it is settled for
    /// good, acknowledged or dead-lettered; false when it was given back to the broker (or the
    /// broker did not take its dead letter), to be delivered again.
    async fn process_one<D: Delivery>(
        &self,
        message: Message<D, DB>,
        limits: &Limits,
        counters: &Counters,
    ) -> bool {
        let Message { delivery, decoded } = message;
        let attempt = delivery.attempt();
        let kind = kind_of(&decoded);
        let span = message_span(&decoded, limits, attempt);
        async {
            let (envelope, runnable) = match decoded {
                Ok(decoded) => decoded,
                Err((_, reason)) => {
                    return self.bury(delivery, &kind, &reason, counters).await;
                }
            };
            if attempt > limits.max_deliveries {
                // The broker delivered it again after deliveries that never settled (consumers
                // that died running it): stop here rather than die with it once more.
                let reason = format!(
                    "delivered {attempt} times, more than the {} allowed, without settling",
                    limits.max_deliveries
                );
                return self.bury(delivery, &kind, &reason, counters).await;
            }
            let run = Arc::clone(&runnable).guarded(
                self.guard.clone(),
                envelope.key.clone(),
                envelope.payload.clone(),
                self.faults.clone(),
            );
            let ran = with_progress(
                &[&delivery],
                limits.progress_interval,
                catch_panic(run),
            )
            .await;
            let error = match ran {
                Ok(Ok(outcome)) => {
                    counters.count(&outcome, &kind, attempt);
                    self.settled(&envelope.key, &outcome).await;
                    if let Err(error) = delivery.ack().await {
                        tracing::warn!(%error, "the ack failed; the message comes again as a duplicate");
                        Counters::add(&counters.unacked);
                    }
                    // Committed: what comes after it may run, even if the ack was lost.
                    return true;
                }
                Ok(Err(error)) => error,
                Err(panicked) => Error::Effect {
                    key: envelope.key.to_string(),
                    fatal: false,
                    source: panicked.into(),
                },
            };
            if !error.is_retryable() || attempt >= limits.max_deliveries {
                let reason = if error.is_retryable() {
                    format!("failed on delivery {attempt}, the last allowed: {error}")
                } else {
                    error.to_string()
                };
                return self.bury(delivery, &kind, &reason, counters).await;
            }
            tracing::warn!(%error, "the job failed; the message is given back for another delivery");
            Counters::add(&counters.failed);
            let delay = retry_delay(self.config.retry_delay, attempt);
            if let Err(error) = delivery.retry(delay).await {
                tracing::warn!(%error, "giving the message back failed; the broker delivers it again later");
                Counters::add(&counters.unacked);
            }
            false
        }
        .instrument(span)
        .await
    }

    /// What runs once a message's transaction committed with `outcome`, before its
    /// acknowledgement: the observer, then the fault-injection point.
    pub(super) async fn settled(&self, key: &JobKey, outcome: &Outcome<()>) {
        // An observer that panics loses its own call, never the message's acknowledgement (on
        // Kafka, its partition's next unit).
        if let Some(observer) = &self.on_outcome
            && let Err(panic) =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| observer(key, outcome)))
        {
            tracing::error!(
                %key,
                outcome = outcome.label(),
                panic = crate::dispatch::panic_message(&*panic),
                "the on_outcome observer panicked; the message is settled all the same"
            );
        }
        self.faults.before_ack(key, outcome).await;
    }

    /// Dead-letters a delivery and counts it; false when the broker did not take it.
    async fn bury<D: Delivery>(
        &self,
        delivery: D,
        kind: &str,
        reason: &str,
        counters: &Counters,
    ) -> bool {
        tracing::warn!(error = reason, "message dead-lettered");
        // Kinds nobody registered are whatever a message said: one label for them all keeps
        // the series bounded.
        let label = if self.handlers.contains(kind) {
            kind
        } else {
            "unknown"
        };
        record_outcome(label, "dead");
        Counters::add(&counters.dead);
        if let Err(error) = delivery.dead_letter(reason.to_owned()).await {
            tracing::warn!(%error, "dead-lettering failed; the broker delivers the message again");
            Counters::add(&counters.unacked);
            return false;
        }
        true
    }

    /// A received delivery with what its body decodes to.
    fn decode<D: Delivery>(&self, delivery: D) -> Message<D, DB> {
        let decoded = self.decode_body(delivery.body());
        Message { delivery, decoded }
    }

    /// The envelope and its runnable job, or the kind (when known) and why it can never run.
    pub(super) fn decode_body(&self, body: &[u8]) -> Decoded<DB> {
        let envelope = Envelope::from_bytes(body).map_err(|error| {
            let kind = serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|value| value.get("kind")?.as_str().map(str::to_owned));
            let shown: String = String::from_utf8_lossy(body).chars().take(200).collect();
            (
                kind,
                format!(
                    "the message is not a jobguard envelope \
                     ({{\"kind\": ..., \"key\": ..., \"payload\": ...}}): {error}; body: {shown}"
                ),
            )
        })?;
        let runnable = match self
            .handlers
            .decode(&envelope.kind, &envelope.payload, "consumer")
        {
            Ok(runnable) => runnable,
            Err(reason) => return Err((Some(envelope.kind), reason)),
        };
        // The guard claims the envelope's key, so it must be the one the job derives: a key
        // made afresh for each publish of the same work would let every copy apply.
        match runnable.key() {
            Ok(derived) if derived == envelope.key => Ok((envelope, Arc::from(runnable))),
            Ok(derived) => {
                let reason = Error::EnvelopeKeyMismatch {
                    kind: envelope.kind.clone(),
                    envelope: envelope.key.to_string(),
                    derived: derived.to_string(),
                }
                .to_string();
                Err((Some(envelope.kind), reason))
            }
            Err(error) => {
                let reason = format!(
                    "the `{}` job derives no valid key from its payload: {error}",
                    envelope.kind
                );
                Err((Some(envelope.kind), reason))
            }
        }
    }
}

pub(super) type Decoded<DB> =
    std::result::Result<(Envelope, Arc<dyn Runnable<DB>>), (Option<String>, String)>;

/// A received delivery and what its body decoded to.
struct Message<D, DB: Backend> {
    delivery: D,
    decoded: Decoded<DB>,
}

/// The kind a message names, `unknown` when it names none.
pub(super) fn kind_of<DB: Backend>(decoded: &Decoded<DB>) -> String {
    match decoded {
        Ok((envelope, _)) => envelope.kind.clone(),
        Err((kind, _)) => kind.clone().unwrap_or_else(|| "unknown".to_owned()),
    }
}

/// The span a message's logs go in.
fn message_span<DB: Backend>(
    decoded: &Decoded<DB>,
    limits: &Limits,
    attempt: u32,
) -> tracing::Span {
    let key = decoded
        .as_ref()
        .map(|(envelope, _)| envelope.key.to_string());
    tracing::info_span!(
        "message",
        broker = limits.broker,
        job.kind = %kind_of(decoded),
        job.key = key.as_deref().unwrap_or("-"),
        attempt,
    )
}

/// `n` permits for messages about to run: `first`, the one taken before the receive, then as
/// many more as needed (free: the receive asked for no more messages than there were).
async fn take_permits(
    first: &mut Option<OwnedSemaphorePermit>,
    permits: &Arc<Semaphore>,
    n: usize,
) -> Vec<OwnedSemaphorePermit> {
    let mut taken = Vec::with_capacity(n);
    for _ in 0..n {
        taken.push(match first.take() {
            Some(permit) => permit,
            None => Arc::clone(permits)
                .acquire_owned()
                .await
                .expect("never closed"),
        });
    }
    taken
}

/// Consecutive failed receives after which [`Consumer::run`] gives up.
pub(super) const MAX_RECEIVE_FAILURES: u32 = 8;

/// The longest a failed delivery waits before it is given back.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);

/// What the loop knows of its source, for each message.
#[derive(Clone)]
struct Limits {
    broker: &'static str,
    max_deliveries: u32,
    progress_interval: Option<Duration>,
}

/// `base` doubled for each delivery after the first, up to [`MAX_RETRY_DELAY`].
pub(super) fn retry_delay(base: Duration, attempt: u32) -> Duration {
    doubled(base, attempt, MAX_RETRY_DELAY)
}

/// Runs `work`, calling [`Delivery::progress`] of each of `deliveries` every `interval` until
/// it finishes.
async fn with_progress<D: Delivery, T>(
    deliveries: &[&D],
    interval: Option<Duration>,
    work: impl Future<Output = T>,
) -> T {
    let Some(interval) = interval.filter(|i| !i.is_zero()) else {
        return work.await;
    };
    // Polled alongside `work`, never instead of it.
    let beats = async {
        loop {
            tokio::time::sleep(interval).await;
            let beats = deliveries.iter().map(|delivery| delivery.progress());
            for beat in futures::future::join_all(beats).await {
                if let Err(error) = beat {
                    tracing::warn!(%error, "telling the broker the job still runs failed");
                }
            }
        }
    };
    tokio::select! {
        done = work => done,
        () = beats => unreachable!("progress never ends"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_double_up_to_a_minute() {
        let base = Duration::from_millis(500);
        assert_eq!(retry_delay(base, 1), base);
        assert_eq!(retry_delay(base, 2), base * 2);
        assert_eq!(retry_delay(base, 4), base * 8);
        assert_eq!(retry_delay(base, 40), MAX_RETRY_DELAY);
    }
}
