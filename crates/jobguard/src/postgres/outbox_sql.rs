//! The outbox's SQL for Postgres.

use sqlx::postgres::Postgres;

impl crate::outbox::OutboxStore for Postgres {}
