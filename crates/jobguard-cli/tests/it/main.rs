//! The `jobguard` binary run as its users run it, against real SQLite, PostgreSQL, brokers and
//! the payment provider: one test binary, a module per area, and the harness they share in
//! `common/`.
//!
//! `cargo test -p jobguard-cli --test it faults` runs one area. A test run on every backend is
//! named after its function and the backend: `faults::sigkill_mid_job::postgres`.

mod common;

mod bench;
mod brokers;
mod chaos;
mod console;
mod contention;
mod demo;
mod faults;
mod operators;
mod ops;
mod periodic;
mod relay;
mod retention;
mod serve;
mod sqlite_leases;
mod unique;
