//! The guard's SQL for SQLite, from the core crate: the Python package runs the same text.

pub(crate) use jobguard_core::sql::sqlite::{NOW_MICROS, claim, create, record, store_result};
