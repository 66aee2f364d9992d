//! Checks for users' own tests, after the seed's "verify" steps: deliver every job several times
//! concurrently and count effects; run a job twice in a row and compare the database state.
//!
//! Enable with the `testkit` feature, usually as a dev-dependency:
//!
//! ```toml
//! [dev-dependencies]
//! jobguard = { version = "0.1", features = ["testkit"] }
//! ```

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Barrier;

use crate::error::{Error, Result};
use crate::guard::Outcome;
use crate::key::JobKey;

/// What the deliveries of [`deliver_concurrently`] reported.
#[derive(Debug, Default)]
pub struct DeliveryReport {
    /// Deliveries made: keys × deliveries per key.
    pub deliveries: usize,
    /// Deliveries that applied their job.
    pub applied: usize,
    /// Deliveries that found their key already applied.
    pub duplicates: usize,
    /// Deliveries that returned an error, with the error.
    pub failed: Vec<(JobKey, Error)>,
}

impl DeliveryReport {
    /// True when every key was applied exactly once and every other delivery was a duplicate.
    pub fn is_exactly_once(&self, keys: usize) -> bool {
        self.failed.is_empty()
            && self.applied == keys
            && self.applied + self.duplicates == self.deliveries
    }
}

/// Delivers each key `times` times, all at once, and tallies the outcomes.
///
/// Every delivery is its own tokio task, and all of them wait at a barrier before calling
/// `deliver`, so the copies of one key really race, as redeliveries in production do. The
/// deliveries of one key are spawned next to each other. `deliver` is the handler under test,
/// typically a call to [`Guard::run`](crate::Guard::run); it is called once per delivery.
///
/// ```no_run
/// use jobguard::{JobKey, PgGuard, testkit};
///
/// # async fn f(guard: PgGuard) -> jobguard::Result<()> {
/// let keys: Vec<JobKey> = (0..100)
///     .map(|n| JobKey::new("credit", [format!("order-{n}")]))
///     .collect::<Result<_, _>>()?;
/// let report = testkit::deliver_concurrently(&keys, 3, move |key| {
///     let guard = guard.clone();
///     async move {
///         guard
///             .run(&key, async |conn| {
///                 sqlx::query("insert into ledger (amount) values (500)").execute(&mut *conn).await?;
///                 Ok(())
///             })
///             .await
///     }
/// })
/// .await;
/// assert!(report.is_exactly_once(keys.len()), "{report:?}");
/// assert_eq!(report.duplicates, 200);
/// # Ok(()) }
/// ```
pub async fn deliver_concurrently<T, F, Fut>(
    keys: &[JobKey],
    times: usize,
    deliver: F,
) -> DeliveryReport
where
    F: Fn(JobKey) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Outcome<T>>> + Send + 'static,
    T: Send + 'static,
{
    let deliveries = keys.len() * times;
    let start = Arc::new(Barrier::new(deliveries));
    let mut tasks = Vec::with_capacity(deliveries);
    for key in keys {
        for _ in 0..times {
            let (deliver, start, key) = (deliver.clone(), Arc::clone(&start), key.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                let result = deliver(key.clone()).await;
                (key, result)
            }));
        }
    }
    let mut report = DeliveryReport {
        deliveries,
        ..DeliveryReport::default()
    };
    for task in tasks {
        match task.await {
            Ok((_, Ok(Outcome::Applied(_)))) => report.applied += 1,
            Ok((_, Ok(Outcome::Duplicate(_)))) => report.duplicates += 1,
            Ok((key, Err(error))) => report.failed.push((key, error)),
            // A panicking delivery is a failed test, not a failed delivery.
            Err(join_error) => std::panic::resume_unwind(join_error.into_panic()),
        }
    }
    report
}

/// The state after one run and after two, from [`run_twice`].
#[derive(Debug, Clone, PartialEq)]
pub struct TwiceReport<S> {
    /// The state read after the first run.
    pub after_one: S,
    /// The state read after the second run.
    pub after_two: S,
}

impl<S: PartialEq> TwiceReport<S> {
    /// Whether the second run left the state as the first did.
    pub fn is_idempotent(&self) -> bool {
        self.after_one == self.after_two
    }
}

/// Runs a job, reads the state, runs it again, reads the state again.
///
/// A job is idempotent when the two states are equal. `state` reads whatever the job writes,
/// e.g. `select account, balance from accounts order by account`.
///
/// ```no_run
/// use jobguard::testkit;
///
/// # async fn f(pool: sqlx::PgPool) -> jobguard::Result<()> {
/// let report = testkit::run_twice(
///     async || {
///         sqlx::query("update profiles set avatar_url = 'a.png' where user_id = 7")
///             .execute(&pool)
///             .await?;
///         Ok(())
///     },
///     async || {
///         let urls: Vec<String> =
///             sqlx::query_scalar("select avatar_url from profiles order by user_id")
///                 .fetch_all(&pool)
///                 .await?;
///         Ok(urls)
///     },
/// )
/// .await?;
/// assert!(report.is_idempotent(), "{report:?}");
/// # Ok(()) }
/// ```
pub async fn run_twice<S, R, Q>(mut run: R, mut state: Q) -> Result<TwiceReport<S>>
where
    R: AsyncFnMut() -> Result<()>,
    Q: AsyncFnMut() -> Result<S>,
{
    run().await?;
    let after_one = state().await?;
    run().await?;
    let after_two = state().await?;
    Ok(TwiceReport {
        after_one,
        after_two,
    })
}
