//! The guard's SQL for PostgreSQL, from the core crate: the Python package runs the same text.

pub(crate) use jobguard_core::sql::postgres::{claim, create, record, store_result};
