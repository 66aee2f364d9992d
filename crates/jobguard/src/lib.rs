//! jobguard makes background jobs take effect exactly once on top of job systems that deliver
//! at least once.
//!
//! Every job system (RabbitMQ, NATS JetStream, Redis Streams, SQS, a Postgres-backed queue)
//! will sometimes run a job twice: a worker crashes after the work and before the
//! acknowledgement, a retry repeats an attempt that had succeeded, a lease expires while the
//! job still runs. jobguard gives each job a stable [`JobKey`] derived from the business
//! operation and a [`Guard`] that inserts a row for that key in the same transaction as the
//! job's effect, so the effect commits once and every other delivery reports a duplicate.
//!
//! ```no_run
//! use jobguard::{JobKey, Outcome, PgGuard};
//!
//! # async fn run() -> jobguard::Result<()> {
//! let pool = sqlx::PgPool::connect("postgres://localhost/app").await?;
//! let guard = PgGuard::new(pool);
//! guard.migrate().await?;
//!
//! let key = JobKey::new("credit", ["order-8812"])?;
//! let outcome = guard
//!     .run(&key, async |conn| {
//!         sqlx::query("update accounts set balance = balance + 500 where id = 7")
//!             .execute(&mut *conn)
//!             .await?;
//!         Ok(())
//!     })
//!     .await?;
//! assert!(matches!(outcome, Outcome::Applied(()) | Outcome::Duplicate(_)));
//! # Ok(()) }
//! ```
//!
//! # Where the effect lands
//!
//! | the effect                      | use                                   | what holds it once      |
//! |---------------------------------|---------------------------------------|-------------------------|
//! | a write to this database        | [`Guard::run`], [`Worker`]             | guard row, same commit  |
//! | an API with idempotency keys    | [`Guard::run_keyed`], [`external::ExternalJob`] | the API, keyed by [`external::ApiKey`] |
//! | an API without keys             | [`steps::Steps`]                      | started/done + reconcile |
//! | a message this job publishes    | [`outbox::Outbox::publish_tx`]        | outbox row, same commit; id for the receiver |
//!
//! # Features
//!
//! | feature    | default | what it adds                                                    |
//! |------------|---------|-----------------------------------------------------------------|
//! | `postgres` | yes     | the PostgreSQL backend, [`PgGuard`]                             |
//! | `sqlite`   | yes     | the SQLite backend, [`SqliteGuard`] and [`sqlite::connect`]     |
//! | `webhook`  | yes     | [`outbox::WebhookSink`]: outbox delivery to HTTP webhooks       |
//! | `rabbitmq` | no      | [`broker::rabbitmq`]: a [`broker::Consumer`] source and an outbox sink for RabbitMQ |
//! | `nats`     | no      | [`broker::nats`]: the same for NATS JetStream                   |
//! | `redis`    | no      | [`broker::redis`]: the same for Redis Streams                   |
//! | `sqs`      | no      | [`broker::sqs`]: the same for Amazon SQS                        |
//! | `kafka`    | no      | [`broker::kafka`]: offsets stored with the effects, and an outbox sink, for Kafka |
//! | `testkit`  | no      | [`testkit`]: concurrent-delivery and run-twice checks for tests |
//! | `fault-injection` | no | jobguard's own fault tests: [`broker::Consumer`] hooks where a test stops a consumer before its commit or its ack |

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
// Built with some features only (CI checks each alone; an application enables the one broker
// it uses), the crate leaves unused what only the other backend or the other brokers use: the
// other dialect's statements, the dispatch's lookups, the offsets store Kafka's consumer keeps.
// Dead code is the full build's to find, with every feature, whose lints CI denies.
#![cfg_attr(
    not(all(
        feature = "postgres",
        feature = "sqlite",
        feature = "rabbitmq",
        feature = "nats",
        feature = "redis",
        feature = "sqs",
        feature = "kafka"
    )),
    allow(dead_code, unused_imports, unused_macros)
)]

#[cfg(any(
    feature = "rabbitmq",
    feature = "nats",
    feature = "redis",
    feature = "sqs",
    feature = "kafka"
))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(
        feature = "rabbitmq",
        feature = "nats",
        feature = "redis",
        feature = "sqs",
        feature = "kafka"
    )))
)]
pub mod broker;
/// Each broker feature brings its module: a gate above that leaves one out fails to build here,
/// which CI's check of each feature alone then shows.
#[allow(unused_imports)]
mod broker_features {
    #[cfg(feature = "kafka")]
    use super::broker::kafka as _;
    #[cfg(feature = "nats")]
    use super::broker::nats as _;
    #[cfg(feature = "rabbitmq")]
    use super::broker::rabbitmq as _;
    #[cfg(feature = "redis")]
    use super::broker::redis as _;
    #[cfg(feature = "sqs")]
    use super::broker::sqs as _;
}
pub mod console;
mod dispatch;
mod duration;
mod error;
pub mod external;
mod fingerprint;
pub mod guard;
mod job;
pub mod key;
pub mod metrics;
pub mod outbox;
mod payload;
pub mod periodic;
pub mod queue;
pub mod retention;
mod retry;
pub mod spikes;
pub mod steps;
mod store;
mod table;
mod time;
pub mod unique;
pub mod worker;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
#[cfg(feature = "testkit")]
#[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
pub mod testkit;

pub use error::{Error, JobError, Result};
pub use fingerprint::Fingerprint;
pub use guard::{Claim, Duplicate, Guard, GuardConfig, Outcome};
pub use job::Job;
pub use key::{JobKey, KeyError};
pub use outbox::{MessageId, Outbox, Relay};
#[cfg(feature = "postgres")]
pub use postgres::PgGuard;
pub use queue::Queue;
pub use retention::{Horizon, PruneConfig, PruneSchedule, Pruner, Retention, RetentionConfig};
pub use retry::RetryPolicy;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteGuard;
pub use store::{Backend, GuardRecord};
pub use table::TableName;
pub use unique::{OnConflict, UniqueOpts, UniqueStates};
pub use worker::{UnknownKinds, Worker, WorkerConfig, WorkerStats};
