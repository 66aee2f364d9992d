//! The library's integration tests, in one binary so the crate and its dependencies link once.
//!
//! One module per concept; the tests that hold for every backend are generic
//! `async fn name<DB: TestDb>()` functions, and [`backends!`](jobguard_testsupport::backends)
//! stamps out one `#[tokio::test]` per backend for each (`guard::…::postgres`,
//! `guard::…::sqlite`). Each test has a PostgreSQL schema or a SQLite file of its own
//! (`common`). Services come from the `JOBGUARD_TEST_*` URLs (`jobguard_testsupport::Service`);
//! one that is missing skips its tests with a loud `SKIPPED` line, or fails them with
//! `CI=true`.
//!
//! `tests/spikes.rs` stays a binary of its own: the spike watch it installs is process-wide,
//! and every outcome of every test in one process would feed it.

#[macro_use]
extern crate jobguard_testsupport;

mod common;

mod api_key;
mod batch;
#[cfg(all(
    feature = "rabbitmq",
    feature = "nats",
    feature = "redis",
    feature = "sqs",
    feature = "kafka"
))]
mod brokers;
mod external;
mod guard;
mod harness;
mod key;
mod lost_fetch;
mod metrics;
mod outbox;
mod periodic;
mod postgres_faults;
mod queue;
mod retention;
mod upgrade;
mod worker;
mod worker_kinds;
mod worker_mixes;
mod worker_panics;
