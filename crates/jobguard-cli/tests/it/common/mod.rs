//! The harness every module of the CLI's tests shares: a database of the test's own
//! ([`Db`]), the binary run against it, and [`each_backend!`](crate::each_backend), which runs
//! one test on SQLite and on PostgreSQL. Processes ([`Proc`]), services, schemas and the
//! matrices come from `jobguard_testsupport`.

mod browser;
mod cluster;
mod db;
mod machine;
mod rng;
mod server;

pub use browser::Browser;
pub use cluster::Cluster;
pub use db::{AnyPool, COMMAND_TIMEOUT, Db};
pub use jobguard_testsupport::{Exit, Proc, block_on, free_port, spawn, tail};
pub use machine::alone;
pub use rng::{Rng, seed};
pub use server::{Server, get, request, request_with};

/// The binary under test (`JOBGUARD_TEST_BIN`, else the one cargo built), with no database or
/// log settings inherited from the environment.
pub fn jobguard() -> std::process::Command {
    jobguard_testsupport::jobguard(env!("CARGO_BIN_EXE_jobguard"))
}

/// Stamps out one test per backend over one function taking the test's [`Db`]:
/// `each_backend!(credits_apply_once);` makes `credits_apply_once::sqlite` and
/// `credits_apply_once::postgres`, each on a database of its own; the PostgreSQL one skips
/// (or fails with `CI=true`) when no PostgreSQL answers. Attributes written before a name
/// (`#[ignore = "..."]`) go on both tests.
#[macro_export]
macro_rules! each_backend {
    ($($(#[$meta:meta])* $name:ident),+ $(,)?) => {$(
        jobguard_testsupport::cases!($(#[$meta])* #[test] fn $name {
            sqlite => super::$name(&$crate::common::Db::sqlite(module_path!())),
            postgres => if let Some(db) = $crate::common::Db::postgres(module_path!()) {
                super::$name(&db);
            },
        });
    )+};
}
