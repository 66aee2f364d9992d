//! The harness every module of the CLI's tests shares: a database of the test's own
//! ([`Db`]), processes of the binary ([`Proc`]), the services found from the environment, and
//! [`each_backend!`](crate::each_backend), which runs one test on SQLite and on PostgreSQL.

mod browser;
mod cluster;
mod db;
mod machine;
mod process;
mod rng;
mod server;
mod services;

pub use browser::Browser;
pub use cluster::Cluster;
pub use db::{AnyPool, COMMAND_TIMEOUT, Db};
pub use machine::alone;
pub use process::{Exit, Proc, jobguard, spawn, tail};
pub use rng::{Rng, seed};
pub use server::{Server, get, request, request_with};
pub use services::service_url;

/// A port on 127.0.0.1 where nothing listens (it was free a moment ago).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `future` to its end on a runtime of its own.
pub fn block_on<T>(future: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

/// Stamps out one test per backend over one function taking the test's [`Db`]:
/// `each_backend!(credits_apply_once);` makes `credits_apply_once::sqlite` and
/// `credits_apply_once::postgres`, each on a database of its own; the PostgreSQL one skips
/// (or fails with `CI=true`) when `JOBGUARD_TEST_DATABASE_URL` is unset. Attributes written
/// before a name (`#[ignore = "..."]`) go on both tests.
#[macro_export]
macro_rules! each_backend {
    ($($(#[$meta:meta])* $name:ident),+ $(,)?) => {$(
        mod $name {
            $(#[$meta])*
            #[test]
            fn sqlite() {
                super::$name(&$crate::common::Db::sqlite(module_path!()));
            }

            $(#[$meta])*
            #[test]
            fn postgres() {
                let Some(db) = $crate::common::Db::postgres(module_path!()) else {
                    return;
                };
                super::$name(&db);
            }
        }
    )+};
}
