//! Consumers for the brokers users already run (RabbitMQ, NATS JetStream, Redis Streams,
//! Amazon SQS, Kafka), and outbox sinks for them.
//!
//! Every broker delivers at least once: a consumer that dies after doing the work and before
//! acknowledging the message gets it delivered again. A [`Consumer`] closes that gap the way
//! jobguard's own worker does for its queue: it runs each message's [`Job`](crate::Job)
//! through the [`Guard`](crate::Guard), in one transaction that claims the job key and applies
//! the effect, and acknowledges the message only **after** that transaction commits.
//!
//! - **Committed, then acknowledged**: the effect happened once, the broker forgets the message.
//! - **Committed, and the consumer died before the ack**: the broker delivers the message
//!   again; the guard finds its key, the delivery is reported as a duplicate (counted in
//!   `jobguard_outcomes_total{outcome="duplicate"}`) and acknowledged. Nothing is applied twice.
//! - **Rolled back** (the job failed, the consumer died before the commit): nothing happened;
//!   the message is given back to the broker and a later delivery applies it. After the
//!   broker's maximum number of deliveries, or on a fatal error, it goes to the broker's dead
//!   letters.
//! - **Delivered to two consumers at once** (a lease or ack deadline that ran out while the
//!   first still worked): the second waits on the guard row and reports a duplicate.
//!
//! Kinds that opt in with [`Job::BATCH`](crate::Job::BATCH) run in batches when
//! [`ConsumerConfig::batch_size`] is above 1: up to that many messages claimed and applied in one
//! transaction, one commit, then one acknowledgement of them all, with the same four cases; a
//! batch that fails rolls back and its messages run one per transaction.
//!
//! One loop ([`consumer`] for the order of these steps) serves every broker through a small
//! adapter, a [`Source`] of [`Delivery`] values:
//!
//! | feature    | module      | consumer                                                        | outbox sink |
//! |------------|-------------|-----------------------------------------------------------------|-------------|
//! | `rabbitmq` | [`rabbitmq`] | manual acks, prefetch, requeue on failure, quorum queue delivery limit and dead-letter exchange | publisher confirms, `message_id` |
//! | `nats`     | [`nats`]    | JetStream pull consumer, explicit acks, AckWait with progress acks, MaxDeliver, a dead-letter subject | `Nats-Msg-Id` for the server's dedupe window |
//! | `redis`    | [`redis`]   | consumer group, `XACK` after commit, `XAUTOCLAIM` of idle entries, a dead-letter stream | `XADD`, deduplicated by id within a window |
//! | `sqs`      | [`sqs`]     | long polling, `DeleteMessage` after commit, the visibility timeout extended while a job runs, `ApproximateReceiveCount`, a redrive policy and a dead-letter queue | `SendMessage`; `MessageDeduplicationId` on FIFO queues |
//! | `kafka`    | [`kafka`]   | consumer group, each partition's next offset stored in the effects' transaction ([`Offsets`]), partitions started at it on assignment, a dead-letter topic; runs through [`Consumer::run_kafka`] | the idempotent producer, keyed by the job key |
//!
//! Messages carry jobs as an [`Envelope`]: `{"kind", "key", "payload"}` as JSON. Producers
//! build it with [`Envelope::for_job`] and publish it with the broker's sink, so that every
//! copy of a message carries the key the job derives. Any number of consumer processes can
//! consume one queue, stream or group at once, on as many machines: the guard serialises them
//! per key.
//!
//! ```no_run
//! # #[cfg(feature = "nats")]
//! # async fn f(pool: sqlx::PgPool) -> jobguard::Result<()> {
//! use jobguard::broker::nats::{NatsConfig, NatsSink, NatsSource};
//! use jobguard::broker::{Consumer, Envelope};
//! use jobguard::{Job, JobError, JobKey, KeyError, PgGuard};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Credit { order: String, account: i64, amount: i64 }
//!
//! impl Job<sqlx::Postgres> for Credit {
//!     const KIND: &'static str = "credit";
//!     fn key(&self) -> Result<JobKey, KeyError> { JobKey::new("credit", [&self.order]) }
//!     async fn run(&self, conn: &mut sqlx::PgConnection) -> Result<(), JobError> {
//!         sqlx::query("insert into ledger (account, amount) values ($1, $2)")
//!             .bind(self.account).bind(self.amount).execute(conn).await?;
//!         Ok(())
//!     }
//! }
//!
//! // The producer.
//! let config = NatsConfig::new("CREDITS", "credits");
//! let sink = NatsSink::connect("nats://127.0.0.1:4222").await?;
//! let credit = Credit { order: "order-8812".into(), account: 7, amount: 500 };
//! sink.publish(&config.subject, &Envelope::for_job::<sqlx::Postgres, _>(&credit)?).await?;
//!
//! // A consumer, in as many processes as needed.
//! let consumer = Consumer::new(PgGuard::new(pool)).register::<Credit>();
//! consumer.migrate().await?;
//! let source = NatsSource::connect("nats://127.0.0.1:4222", config).await?;
//! let stats = consumer.run(source, jobguard::worker::shutdown_signal()).await?;
//! println!("{} applied, {} duplicates", stats.applied, stats.duplicates);
//! # Ok(()) }
//! ```

pub mod consumer;
mod envelope;
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub mod kafka;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
mod offsets;
#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub mod rabbitmq;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(feature = "sqs")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqs")))]
pub mod sqs;

pub use consumer::{Consumer, ConsumerConfig, ConsumerStats, Delivery, Source};
pub use envelope::Envelope;
pub use offsets::{Offsets, Position};
