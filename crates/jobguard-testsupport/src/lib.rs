//! What the workspace's tests share, written once: the library's, the CLI's and the examples'
//! tests all use it, as a dev-dependency.
//!
//! - [`Service`]: where a test finds PostgreSQL and each broker (a `JOBGUARD_TEST_*` URL, else
//!   the service's default port on 127.0.0.1), and the one rule for a service that is not there
//!   ([`skip`]): the test skips with a loud `SKIPPED` line, or fails with `CI=true`.
//! - A database of the test's own: a PostgreSQL [`Schema`], a SQLite file ([`sqlite`]), a
//!   directory for what the test writes ([`scratch`]).
//! - The matrices: [`cases!`] stamps out one test per case; [`backends!`] runs a generic test
//!   on every database backend, [`each_broker!`] runs one on every [`Broker`].
//! - Processes: [`jobguard`] (the binary with a clean environment), [`spawn`] and [`Proc`]:
//!   output in files, a line waited for, signals, killed when dropped.
//!
//! ```no_run
//! use jobguard_testsupport::Service;
//!
//! // A test against Redis: skipped with a SKIPPED line when none answers, failed on CI.
//! fn talks_to_redis() {
//!     let Some(url) = Service::Redis.url() else {
//!         return;
//!     };
//!     assert!(url.starts_with("redis://"));
//! }
//! # talks_to_redis();
//! ```

mod broker;
mod matrix;
mod postgres;
mod process;
mod scratch;
mod service;
pub mod sqlite;

pub use broker::Broker;
pub use postgres::Schema;
pub use process::{Exit, Proc, jobguard, spawn, tail};
pub use scratch::{scratch, slug};
pub use service::{Service, on_ci, skip};

/// Runs `future` to its end on a runtime of its own.
pub fn block_on<T>(future: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(future)
}

/// Runs `future` on a runtime of its own on another thread, so that it may be called from a
/// `#[tokio::test]` as well as from a plain test.
pub fn off_runtime<T: Send>(future: impl Future<Output = T> + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| block_on(future))
            .join()
            .expect("the thread running the future panicked")
    })
}

/// A port on 127.0.0.1 where nothing listens (it was free a moment ago).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}
