//! The harness every library test shares: a database of the test's own on each backend
//! (`database`), the services it needs (`services`), and [`backends!`], which runs one test on
//! every backend.
#![allow(dead_code)]

/// Stamps out one `#[tokio::test]` per database backend over a generic
/// `async fn name<DB: TestDb>()` defined next to it: `backends!(fn name);` gives the tests
/// `name::postgres` and `name::sqlite`, on a multi-thread runtime with two workers unless
/// `worker_threads = N` says otherwise. `backends!(fn name, blocking);` stamps out plain
/// `#[test]`s over a synchronous `fn name<DB: TestDb>()`, for tests that build their own
/// runtime (a thread-local metrics recorder).
macro_rules! backends {
    (fn $name:ident) => {
        backends!(fn $name, worker_threads = 2);
    };
    (fn $name:ident, blocking) => {
        mod $name {
            #[test]
            fn postgres() {
                super::$name::<sqlx::Postgres>();
            }

            #[test]
            fn sqlite() {
                super::$name::<sqlx::Sqlite>();
            }
        }
    };
    (fn $name:ident, worker_threads = $threads:literal) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
            async fn postgres() {
                super::$name::<sqlx::Postgres>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
            async fn sqlite() {
                super::$name::<sqlx::Sqlite>().await;
            }
        }
    };
}

mod credit;
mod database;
mod recorder;
mod services;
mod worker;

pub use credit::*;
pub use database::*;
pub use recorder::*;
pub use services::*;
pub use worker::*;
