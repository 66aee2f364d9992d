//! The PostgreSQL backend.
//!
//! Guarded jobs run in `read committed`, PostgreSQL's default: the guard row's primary key
//! makes concurrent deliveries of one key wait for each other, so no stronger isolation is
//! needed for the guard. Serialization failures (`40001`) and deadlocks (`40P01`) that the
//! job's own effect runs into are retried a bounded number of times.
//!
//! ```no_run
//! # async fn demo() -> jobguard::Result<()> {
//! let pool = sqlx::PgPool::connect("postgres://localhost/app").await?;
//! let guard = jobguard::postgres::PgGuard::new(pool);
//! guard.migrate().await?;
//! # Ok(()) }
//! ```

/// A [`Guard`](crate::Guard) on PostgreSQL.
pub type PgGuard = crate::Guard<sqlx::Postgres>;
