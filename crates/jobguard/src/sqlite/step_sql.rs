//! The step ledger's SQL for Sqlite.

use sqlx::sqlite::Sqlite;

impl crate::steps::StepStore for Sqlite {}
