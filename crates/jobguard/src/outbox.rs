//! The transactional outbox: messages a job publishes, written in the job's transaction.

/// The outbox statements each backend implements.
#[doc(hidden)]
pub trait OutboxStore: sqlx::Database {}
