//! Started/done steps for external calls that take no idempotency key.

/// The step ledger's statements each backend implements.
#[doc(hidden)]
pub trait StepStore: sqlx::Database {}
