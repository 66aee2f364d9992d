//! Idempotency keys for external APIs.
