//! The step ledger's SQL for Postgres.

use sqlx::postgres::Postgres;

impl crate::steps::StepStore for Postgres {}
