//! [`Consumer::run_kafka`]: each partition's messages in order, each transaction writing the
//! guard rows, the effects and the partition's next offset together.
//!
//! The loop owns the Kafka client. It polls it all along (rebalances and heartbeats need it,
//! however long jobs run), keeps the messages it receives in a lane per partition, and runs one
//! unit per lane at a time: one message, or with batches a run of consecutive batchable
//! messages of the lane. A unit's result says how far the lane got; only then does the lane
//! run its next unit. A lane whose unit failed waits out a backoff, its partition paused in
//! the client; so does a lane holding [`KafkaConfig::buffer`] messages.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use rdkafka::ClientConfig;
use rdkafka::consumer::Consumer as _;
use rdkafka::message::Message as _;
use rdkafka::producer::FutureProducer;
use rdkafka::topic_partition_list::TopicPartitionList;
use tracing::Instrument;

use super::expected::{self, Admit};
use super::lane::{Lane, Received};
use super::out_of_range::{self, Gone, OutOfRange};
use super::source::{Event, KafkaSource};
use super::stall::{self, Checked, partition_list};
use super::{KafkaConfig, kafka_error};
use crate::broker::consumer::{
    Consumer, ConsumerStats, Counters, MAX_RECEIVE_FAILURES, kind_of, retry_delay,
};
use crate::broker::offsets::{Offsets, Position};
use crate::dispatch::log_join;
use crate::error::{Error, Result, effect_error};
use crate::guard::{Claim, Failure, Outcome, UnitOfWork, duplicate_of, fingerprint_of};
use crate::spikes::record_outcome;
use crate::store::Backend;

/// Consecutive messages of one partition, to run as one transaction (or one by one).
struct Unit<DB: Backend> {
    partition: i32,
    generation: u64,
    messages: Vec<Received<DB>>,
}

/// How a unit ended.
struct Ran<DB: Backend> {
    partition: i32,
    generation: u64,
    /// The messages it did not settle, in order, for the lane to keep.
    unsettled: Vec<Received<DB>>,
    /// The offset after the last message it settled.
    next_offset: Option<i64>,
    /// The attempt on which the first unsettled message failed, when one did.
    failed_attempt: Option<u32>,
    /// The unit's task panicked outside the job: how far it got is unknown, and its messages
    /// are gone with it. The lane fetches the partition again from its last settled offset.
    lost: bool,
}

/// What every unit of a run shares.
pub(super) struct Shared<DB: Backend> {
    pub(super) offsets: Offsets<DB>,
    pub(super) dead_letters: FutureProducer,
    pub(super) config: KafkaConfig,
    /// The settings of the clients that look at what a partition's offsets hold
    /// (`kafka/gap.rs`).
    pub(super) looks: ClientConfig,
    pub(super) counters: Counters,
    retry_delay: Duration,
}

impl<DB: Backend> Consumer<DB> {
    /// Joins the consumer group of `config` on the Kafka broker at `url`
    /// (`kafka://host:9092`), with its offsets stored in this consumer's database: creates the
    /// topics unless told not to, and the offsets table when missing. Run it with
    /// [`run_kafka`](Self::run_kafka).
    ///
    /// ```no_run
    /// # #[cfg(feature = "kafka")]
    /// # async fn f(consumer: jobguard::broker::Consumer<sqlx::Postgres>) -> jobguard::Result<()> {
    /// use jobguard::broker::kafka::KafkaConfig;
    ///
    /// let source = consumer.kafka_source("kafka://127.0.0.1:9092", KafkaConfig::new("credits")).await?;
    /// let stats = consumer.run_kafka(source, jobguard::worker::shutdown_signal()).await?;
    /// println!("{} applied, {} duplicates", stats.applied, stats.duplicates);
    /// # Ok(()) }
    /// ```
    pub async fn kafka_source(&self, url: &str, config: KafkaConfig) -> Result<KafkaSource<DB>> {
        KafkaSource::connect(url, config, self.guard.pool().clone()).await
    }

    /// Runs the messages of `source` until `shutdown` resolves, or until idle with
    /// [`ConsumerConfig::stop_when_idle_for`](crate::broker::ConsumerConfig::stop_when_idle_for):
    /// each partition's in order, each transaction claiming the keys, applying the effects and
    /// storing the partition's next offset (see the [`kafka`](crate::broker::kafka) module).
    ///
    /// The consumer's [`on_outcome`](Self::on_outcome) observer runs after each commit, before
    /// the offset is handed to Kafka.
    pub async fn run_kafka(
        self,
        source: KafkaSource<DB>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<ConsumerStats> {
        let poller = source.start();
        let KafkaSource {
            consumer: client,
            mut events,
            stopping,
            dead_letters,
            offsets,
            config,
            looks,
            ..
        } = source;
        let this = Arc::new(self);
        let shared = Arc::new(Shared {
            offsets,
            dead_letters,
            retry_delay: this.config.retry_delay,
            config,
            looks,
            counters: Counters::default(),
        });
        let topic = shared.config.topic.clone();
        let concurrency = shared.config.concurrency.max(1);
        let buffer = shared.config.buffer.max(1);
        let batch_size = this.batch_size();
        let linger = this.config.batch_linger;
        let stalled_after = shared.config.stalled_after;
        let mut stall_checks = tokio::time::interval(
            stalled_after.clamp(Duration::from_millis(100), Duration::from_secs(1)),
        );
        stall_checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut lanes: BTreeMap<i32, Lane<DB>> = BTreeMap::new();
        let mut revoking: Vec<(Vec<i32>, std::sync::mpsc::Sender<()>)> = Vec::new();
        let mut units = tokio::task::JoinSet::new();
        let mut shutdown = pin!(shutdown);
        let mut last_message = Instant::now();
        let mut receive_failures = 0_u32;
        let mut joined = false;
        let mut last_started = -1;
        let mut failure = None;
        let pause = |lane: &mut Lane<DB>, partition: i32, paused: bool| {
            if lane.paused == paused {
                return;
            }
            let list = partition_list(&topic, partition);
            let done = if paused {
                client.pause(&list)
            } else {
                client.resume(&list)
            };
            match done {
                Ok(()) => lane.paused = paused,
                Err(error) => tracing::debug!(%error, partition, paused, "cannot pause or resume"),
            }
        };

        loop {
            // A revocation waits for the transactions running on its partitions.
            revoking.retain(|(partitions, done)| {
                let running = partitions
                    .iter()
                    .any(|partition| lanes.get(partition).is_some_and(|lane| lane.running));
                if !running {
                    let _ = done.send(());
                }
                running
            });
            // Start what may run: one unit per lane, up to the concurrency, from the partition
            // after the one started last, so that with fewer slots than partitions each gets
            // its turn.
            let now = Instant::now();
            let (after, upto): (Vec<_>, Vec<_>) = lanes
                .iter_mut()
                .partition(|(partition, _)| **partition > last_started);
            for (&partition, lane) in after.into_iter().chain(upto) {
                if units.len() >= concurrency {
                    break;
                }
                if !lane.owned || lane.running || lane.queue.is_empty() {
                    continue;
                }
                if lane.retry_at.is_some_and(|at| at > now) {
                    continue;
                }
                if lane.queue.len() < batch_size && lane.ready_at.is_some_and(|at| at > now) {
                    continue;
                }
                lane.retry_at = None;
                lane.ready_at = None;
                let unit = this.take_unit(partition, lane);
                if lane.queue.len() < buffer {
                    pause(lane, partition, false);
                }
                let (consumer, shared) = (Arc::clone(&this), Arc::clone(&shared));
                units.spawn(consumer.run_unit(shared, unit));
                last_started = partition;
            }
            let next_retry = lanes
                .values()
                .filter(|lane| lane.owned && !lane.running && !lane.queue.is_empty())
                .filter_map(|lane| lane.retry_at.max(lane.ready_at))
                .min();
            let idle_check = this.config.stop_when_idle_for;
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(joined) = units.join_next() => {
                    let Some(ran) = joined_unit(joined) else { continue };
                    let lane = lanes.entry(ran.partition).or_insert_with(|| Lane::new(stalled_after));
                    lane.running = false;
                    if let Some(next) = ran.next_offset {
                        lane.settled_next = lane.settled_next.max(next);
                        if let Err(error) = client.store_offset(&topic, ran.partition, next) {
                            tracing::debug!(%error, "Kafka did not take the offset; the stored one stands");
                        }
                        if this.faults.pause_unseen(next) {
                            let _ = client.pause(&partition_list(&topic, ran.partition));
                        }
                    }
                    if ran.lost && ran.generation == lane.generation && lane.owned {
                        lane.queue.clear();
                        let next = lane.settled_next;
                        // Expected even when the seek was refused: a later message above it is
                        // then met as a broker's skip is (`kafka/expected.rs`).
                        stall::refetch(&client, &topic, ran.partition, next);
                        lane.expect_from(next, false);
                    } else if ran.generation == lane.generation && lane.owned {
                        for message in ran.unsettled.into_iter().rev() {
                            lane.queue.push_front(message);
                        }
                        match ran.failed_attempt {
                            Some(attempt) => {
                                lane.failures = attempt;
                                lane.retry_at =
                                    Some(Instant::now() + retry_delay(shared.retry_delay, attempt));
                                pause(lane, ran.partition, true);
                            }
                            None => lane.failures = 0,
                        }
                    }
                    let settled_next = lane.settled_next;
                    lane.queue.retain(|message| message.offset >= settled_next);
                }
                event = events.recv() => {
                    let Some(event) = event else {
                        failure = Some(Error::Broker {
                            broker: super::BROKER,
                            action: format!("receive from `{topic}`"),
                            source: "the client's thread stopped".into(),
                        });
                        break;
                    };
                    match event {
                        Event::Message(message) => {
                            receive_failures = 0;
                            last_message = Instant::now();
                            let partition = message.partition();
                            let Some(lane) = lanes.get_mut(&partition).filter(|lane| lane.owned) else {
                                continue;
                            };
                            lane.quiet.heard();
                            // Assigned with no stored offset: the client's first message says
                            // where it started the partition.
                            lane.assigned_at.get_or_insert(message.offset());
                            match expected::admit(lane, (&client, partition), message.offset(), &shared).await {
                                Admit::Take => {}
                                Admit::Drop => continue,
                                Admit::Stop(error) => {
                                    failure = Some(error);
                                    break;
                                }
                            }
                            if message.offset() < lane.settled_next {
                                continue;
                            }
                            let body = message.payload().unwrap_or_default().to_vec();
                            let decoded = this.decode_body(&body);
                            if batch_size > 1 && lane.queue.is_empty() && !lane.running {
                                // A batch waits a moment for the messages fetched with this one.
                                lane.ready_at = Some(Instant::now() + linger);
                            }
                            lane.queue.push_back(Received {
                                offset: message.offset(),
                                key: message.key().map(<[u8]>::to_vec),
                                body,
                                decoded,
                            });
                            if lane.queue.len() >= buffer {
                                pause(lane, partition, true);
                            }
                        }
                        Event::Assigned(partitions) => {
                            joined = true;
                            last_message = Instant::now();
                            for (partition, start, gone) in partitions {
                                let lane = lanes.entry(partition).or_insert_with(|| Lane::new(stalled_after));
                                lane.reset(true);
                                if let Some(gone) = gone {
                                    // Counted and logged; a reset stored (before any message of
                                    // the partition runs), or the consumer stops.
                                    let OutOfRange { gone: why, stored, low, high } = gone;
                                    if let Err(error) = out_of_range::out_of_range((&shared.config, &shared.offsets), partition, stored, low, high, why).await {
                                        failure = Some(error);
                                        break;
                                    }
                                    lane.settled_next = low;
                                }
                                if let Some(start) = start {
                                    lane.settled_next = lane.settled_next.max(start);
                                    lane.expected = Some(start);
                                    lane.assigned_at = Some(start);
                                }
                            }
                            if failure.is_some() {
                                break;
                            }
                            // The callback resumed them as it assigned them, but a pause this
                            // loop asked for on the old assignment may have reached the client
                            // after that resume (a rebalance that failed gives partitions up
                            // without waiting for this loop): resumed again from here, after
                            // any such pause, as the lanes say.
                            let mut resumed = TopicPartitionList::new();
                            for (&partition, lane) in lanes.iter().filter(|(_, lane)| lane.owned) {
                                if !lane.paused {
                                    resumed.add_partition(&topic, partition);
                                }
                            }
                            if let Err(error) = client.resume(&resumed) {
                                tracing::debug!(%error, "cannot resume the assigned partitions");
                            }
                        }
                        Event::Revoked { partitions, done } => {
                            for partition in &partitions {
                                if let Some(lane) = lanes.get_mut(partition) {
                                    lane.reset(false);
                                }
                            }
                            revoking.push((partitions, done));
                        }
                        Event::Failed(error) => {
                            receive_failures += 1;
                            if receive_failures >= MAX_RECEIVE_FAILURES {
                                failure = Some(kafka_error(format!("receive from `{topic}`"), error));
                                break;
                            }
                            tracing::warn!(%error, broker = super::BROKER, "receiving failed; trying again");
                        }
                    }
                }
                () = sleep_until(next_retry) => {}
                _ = stall_checks.tick() => {
                    // One partition a tick, the one quiet longest: the broker's answer is awaited
                    // here (up to `stall::ASK_TIMEOUT`), and the loop must stay responsive.
                    // A lane that does not know its next offset (assigned with none stored, no
                    // message since) is not checked: any offset picked for it would be a guess.
                    let quiet = lanes
                        .iter_mut()
                        .filter(|(_, lane)| lane.owned && !lane.running && lane.queue.is_empty() && lane.quiet.due())
                        .filter_map(|(&partition, lane)| Some((partition, lane.next_offset()?, lane)))
                        .max_by_key(|(_, _, lane)| lane.quiet.overdue());
                    if let Some((partition, next, lane)) = quiet {
                        match stall::restart_if_stopped((&client, &shared.looks), &topic, partition, next, &mut lane.quiet).await {
                            Checked::Caught => {}
                            Checked::Refetched => lane.expect_from(next, true),
                            Checked::BelowLogStart { low, high } => {
                                // Logged and counted; the lane goes on from the log start, so the
                                // next check finds it there, or the consumer stops.
                                if let Err(error) = out_of_range::out_of_range((&shared.config, &shared.offsets), partition, next, low, high, Gone::BelowLogStart).await {
                                    failure = Some(error);
                                    break;
                                }
                                stall::refetch(&client, &topic, partition, low);
                                lane.settled_next = lane.settled_next.max(low);
                                lane.expect_from(low, true);
                            }
                        }
                    }
                }
                () = tokio::time::sleep(Duration::from_millis(100)), if idle_check.is_some() => {
                    let idle = idle_check.expect("checked");
                    // Idle once in the group: joining may take longer than the idle time.
                    if joined
                        && units.is_empty()
                        && lanes.values().all(|lane| lane.queue.is_empty())
                        && last_message.elapsed() >= idle
                    {
                        break;
                    }
                }
            }
        }

        let drained = tokio::time::timeout(this.config.shutdown_timeout, async {
            while let Some(joined) = units.join_next().await {
                if let Some(ran) = joined_unit(joined)
                    && let Some(next) = ran.next_offset
                {
                    let _ = client.store_offset(&topic, ran.partition, next);
                }
            }
        })
        .await;
        if drained.is_err() {
            let unsettled = units.len() as u64;
            tracing::warn!(
                partitions = unsettled,
                "running jobs did not finish in time; rolling them back, their messages stay in the log"
            );
            shared
                .counters
                .released
                .fetch_add(unsettled, std::sync::atomic::Ordering::Relaxed);
            units.abort_all();
            while units.join_next().await.is_some() {}
        }
        // The client's thread commits what was stored in it (the database's offsets stand
        // either way) and leaves the group.
        stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        for (_, done) in revoking {
            let _ = done.send(());
        }
        drop(events);
        drop(client);
        let _ = tokio::task::spawn_blocking(move || poller.join()).await;
        match failure {
            Some(error) => Err(error),
            None => Ok(shared.counters.snapshot()),
        }
    }

    /// The next unit of `lane`: its head, and with batches the consecutive batchable
    /// messages after it, up to the batch size. A head that failed before runs alone.
    fn take_unit(&self, partition: i32, lane: &mut Lane<DB>) -> Unit<DB> {
        lane.running = true;
        let first = lane.queue.pop_front().expect("the lane holds a message");
        let mut messages = vec![first];
        let size = self.batch_size();
        if size > 1 && lane.failures == 0 && self.kafka_batchable(&messages[0]) {
            while messages.len() < size
                && lane
                    .queue
                    .front()
                    .is_some_and(|next| self.kafka_batchable(next))
            {
                messages.push(lane.queue.pop_front().expect("checked"));
            }
        }
        Unit {
            partition,
            generation: lane.generation,
            messages,
        }
    }

    /// Whether a message may join a batch: it decoded and its kind opted in.
    fn kafka_batchable(&self, message: &Received<DB>) -> bool {
        match &message.decoded {
            Ok((envelope, _)) => self.batched.contains(&envelope.kind),
            Err(_) => false,
        }
    }

    /// Runs a unit: as one transaction when it holds several messages, and one per
    /// transaction when that rolled back, in order, up to the first failure. Before each run,
    /// the run is counted in the database ([`count_attempt`](Self::count_attempt)); a message
    /// whose runs are past [`KafkaConfig::max_deliveries`] is dead-lettered without running
    /// again: its earlier runs ended with no result, their consumer killed or stopped.
    async fn run_unit(self: Arc<Self>, shared: Arc<Shared<DB>>, unit: Unit<DB>) -> Ran<DB> {
        let Unit {
            partition,
            generation,
            messages,
        } = unit;
        let span = tracing::info_span!(
            "partition",
            broker = super::BROKER,
            topic = %shared.config.topic,
            partition,
            messages = messages.len(),
        );
        let max = shared.config.max_deliveries.max(1);
        let work = async move {
            let mut messages = VecDeque::from(messages);
            let mut next_offset = None;
            let unsettled = |messages: VecDeque<Received<DB>>, next_offset, attempt| Ran {
                partition,
                generation,
                unsettled: messages.into(),
                next_offset,
                failed_attempt: Some(attempt),
                lost: false,
            };
            // The first message's run, counted already: by a batch that rolled back (its
            // messages then run alone at once, the same attempt), or one that did not run.
            let mut counted = None;
            if messages.len() > 1 {
                let first = messages[0].offset;
                let runs = match self.count_attempt(&shared, partition, first).await {
                    Ok(runs) => runs,
                    Err(error) => {
                        tracing::warn!(%error, "counting the attempt failed; the partition waits, then tries again");
                        return unsettled(messages, None, 1);
                    }
                };
                if runs > 1 {
                    // A batch from here ran before and ended with no result: each message alone.
                    tracing::info!(runs, "a batch from this offset ran before with no result; running its messages one per transaction");
                    counted = Some(runs);
                } else {
                    let batch: Vec<&Received<DB>> = messages.iter().collect();
                    match self.transaction(&shared, partition, &batch, 1).await {
                        Ok(()) => {
                            let last = messages.back().expect("a batch").offset;
                            return Ran {
                                partition,
                                generation,
                                unsettled: Vec::new(),
                                next_offset: Some(last + 1),
                                failed_attempt: None,
                                lost: false,
                            };
                        }
                        Err(error) => {
                            tracing::info!(
                                %error,
                                "the batch rolled back; running its messages one per transaction"
                            );
                            counted = Some(1);
                        }
                    }
                }
            }
            while let Some(message) = messages.pop_front() {
                let mut attempt = 1;
                let settled = match &message.decoded {
                    Err((_, reason)) => self.bury_kafka(&shared, partition, &message, reason).await,
                    Ok(_) => {
                        attempt = match counted.take() {
                            Some(runs) => runs,
                            None => match self.count_attempt(&shared, partition, message.offset).await {
                                Ok(runs) => runs,
                                Err(error) => {
                                    tracing::warn!(%error, "counting the attempt failed; the partition waits, then tries again");
                                    messages.push_front(message);
                                    return unsettled(messages, next_offset, 1);
                                }
                            },
                        };
                        if attempt > max {
                            let reason = format!(
                                "its {} runs allowed ended with no result: its consumer was killed \
                                 or stopped while running it each time",
                                attempt - 1
                            );
                            self.bury_kafka(&shared, partition, &message, &reason).await
                        } else {
                            match self.transaction(&shared, partition, &[&message], attempt).await {
                                Ok(()) => Ok(()),
                                Err(error) if error.is_retryable() && attempt < max => {
                                    tracing::warn!(%error, attempt, "the job failed; the partition waits, then tries it again");
                                    Counters::add(&shared.counters.failed);
                                    Err(())
                                }
                                Err(error) => {
                                    let reason = if error.is_retryable() {
                                        format!("failed on attempt {attempt}, the last allowed: {error}")
                                    } else {
                                        error.to_string()
                                    };
                                    self.bury_kafka(&shared, partition, &message, &reason).await
                                }
                            }
                        }
                    }
                };
                if settled.is_err() {
                    messages.push_front(message);
                    return unsettled(messages, next_offset, attempt);
                }
                next_offset = Some(message.offset + 1);
            }
            Ran {
                partition,
                generation,
                unsettled: Vec::new(),
                next_offset,
                failed_attempt: None,
                lost: false,
            }
        }
        .instrument(span);
        // A panic outside the job (the job's own is caught as its failure) must not leave the
        // lane running for ever: the loop is told the unit was lost.
        match std::panic::AssertUnwindSafe(work).catch_unwind().await {
            Ok(ran) => ran,
            Err(panic) => {
                tracing::error!(
                    partition,
                    panic = crate::dispatch::panic_message(&*panic),
                    "a partition's unit panicked outside the job; the partition is fetched again \
                     from its last settled offset"
                );
                Ran {
                    partition,
                    generation,
                    unsettled: Vec::new(),
                    next_offset: None,
                    failed_attempt: None,
                    lost: true,
                }
            }
        }
    }

    /// Counts a run of the message at `offset` of `partition` in a transaction of its own,
    /// committed before it runs: the runs started of it, this one included.
    async fn count_attempt(&self, shared: &Shared<DB>, partition: i32, offset: i64) -> Result<u32> {
        let position = Position {
            group: &shared.config.group,
            topic: &shared.config.topic,
            partition,
            next_offset: offset,
        };
        let guard = &self.guard;
        let _turn = guard.write_turn().await;
        let mut conn = guard.pool().acquire().await?;
        let mut unit = UnitOfWork::begin_on(guard, &mut conn)
            .await
            .map_err(Failure::into_error)?;
        let runs = shared
            .offsets
            .count_attempt_tx(unit.conn(), &position)
            .await?;
        unit.commit().await.map_err(Failure::into_error)?;
        Ok(runs)
    }

    /// One transaction for `messages`, consecutive in `partition`: each key claimed and its
    /// effect run when fresh, then the offset after the last one stored, then the commit.
    /// After the commit, each outcome is counted and observed.
    async fn transaction(
        &self,
        shared: &Shared<DB>,
        partition: i32,
        messages: &[&Received<DB>],
        attempt: u32,
    ) -> Result<()> {
        let guard = &self.guard;
        let last = messages.last().expect("at least one message").offset;
        let position = Position {
            group: &shared.config.group,
            topic: &shared.config.topic,
            partition,
            next_offset: last + 1,
        };
        // One unit of work: each key claimed and its effect run when fresh, then the offset
        // after the last message, then one commit. On SQLite, this process's turn to write
        // before the connection, as every writer; both given back at the commit, before the
        // outcomes are observed.
        let outcomes = {
            let _turn = guard.write_turn().await;
            let mut conn = guard.pool().acquire().await?;
            let mut unit = UnitOfWork::begin_on(guard, &mut conn)
                .await
                .map_err(Failure::into_error)?;
            let ran: std::result::Result<Vec<Outcome<()>>, Failure> = async {
                let mut outcomes = Vec::with_capacity(messages.len());
                for message in messages {
                    let Ok((envelope, runnable)) = &message.decoded else {
                        unreachable!("only decoded messages run in a transaction");
                    };
                    let key = &envelope.key;
                    let fingerprint =
                        fingerprint_of(key, &envelope.payload).map_err(Failure::of)?;
                    match unit.claim(key, Some(&fingerprint)).await? {
                        Claim::Claimed => {
                            let run = crate::dispatch::catch_panic(runnable.run_in(unit.conn()));
                            match run.await {
                                Ok(Ok(())) => {}
                                Ok(Err(error)) => {
                                    return Err(Failure::Failed(effect_error(key, error)));
                                }
                                Err(panicked) => {
                                    return Err(Failure::Failed(Error::Effect {
                                        key: key.to_string(),
                                        fatal: false,
                                        source: panicked.into(),
                                    }));
                                }
                            }
                            outcomes.push(Outcome::Applied(()));
                        }
                        // Held by a committed transaction, or by an earlier message of this one.
                        Claim::Duplicate(record) => outcomes.push(Outcome::Duplicate(
                            duplicate_of(key, record).map_err(Failure::Failed)?,
                        )),
                    }
                }
                shared
                    .offsets
                    .store_tx(unit.conn(), &position)
                    .await
                    .map_err(Failure::of)?;
                Ok(outcomes)
            }
            .await;
            let outcomes = match ran {
                Ok(outcomes) => outcomes,
                Err(failure) => {
                    unit.rollback().await;
                    return Err(failure.into_error());
                }
            };
            self.faults.before_commit(unit.claimed()).await;
            unit.commit().await.map_err(Failure::into_error)?;
            outcomes
        };
        for (message, outcome) in messages.iter().zip(outcomes) {
            let kind = kind_of(&message.decoded);
            let attempt = if message.offset == messages[0].offset {
                attempt
            } else {
                1
            };
            record_outcome(&kind, outcome.label());
            shared.counters.count(&outcome, &kind, attempt);
            if let Ok((envelope, _)) = &message.decoded {
                self.settled(&envelope.key, &outcome).await;
            }
        }
        Ok(())
    }
}

/// A unit's result, unless its task was aborted (at shutdown; logged). A unit catches a panic of
/// its own task and returns it as a `lost` result, so a join error here is never a panic of the
/// job's.
fn joined_unit<DB: Backend>(
    joined: std::result::Result<Ran<DB>, tokio::task::JoinError>,
) -> Option<Ran<DB>> {
    match joined {
        Ok(ran) => Some(ran),
        Err(error) => {
            log_join(Err(error), "a partition's task panicked outside the job");
            None
        }
    }
}

/// Sleeps until `at`, or for ever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
