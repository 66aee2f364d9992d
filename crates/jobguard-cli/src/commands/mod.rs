//! One file per command: its arguments, and what it runs.
//!
//! The operator commands (`worker`, `enqueue`, `jobs`, `key`, `queue`, `dead`, `relay`, `outbox`, `steps`,
//! `prune`, `retention`, `schedules`, `consume`, `provider`, `serve`, `stats`) use the library, the built-in
//! jobs and the helpers shared by every command; they import nothing of the demo or the
//! benchmarks. `demo` and `bench` parse and dispatch to [`crate::demo`] and [`crate::bench`];
//! `demo_process` holds the processes the demo starts and kills.

pub mod bench;
pub mod consume;
pub mod dead;
pub mod demo;
pub mod demo_process;
pub mod enqueue;
pub mod jobs;
pub mod key;
pub mod outbox;
pub mod provider;
pub mod prune;
pub mod queue;
pub mod relay;
pub mod retention;
pub mod schedules;
pub mod serve;
pub mod stats;
pub mod steps;
pub mod worker;
