//! The outbox's SQL for Sqlite.

use sqlx::sqlite::Sqlite;

impl crate::outbox::OutboxStore for Sqlite {}
