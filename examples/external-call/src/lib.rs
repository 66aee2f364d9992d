//! Charging an order at a payment provider once, across a delivery that crashes between the
//! provider's answer and the database commit. `main.rs` runs both ways; see there for how to
//! run it.
//!
//! - [`Payments::charge_with_key`]: the provider's charge endpoint honours an idempotency key,
//!   derived from the job key with [`ApiKey::derive`], so the redelivery gets the first charge
//!   back ([`Guard::run_keyed`](jobguard::Guard::run_keyed)).
//! - [`Payments::charge_without_key`]: the provider's legacy endpoint takes no key, so a
//!   started/done step ([`Steps`]) records the call, and the redelivery of a caller that
//!   vanished asks the provider's lookup whether the charge exists instead of charging again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use jobguard::external::{ApiKey, ApiKeyFormat};
use jobguard::steps::{Reconciled, StepConfig, StepOutcome, Steps};
use jobguard::{JobKey, Outcome, SqliteGuard};
use jobguard_provider::ProviderClient;
use sqlx::{Sqlite, SqliteConnection, SqlitePool};
use tokio::sync::Notify;

/// How long a started step is held before another delivery reconciles it. Longer than the
/// provider's request timeout in a real service; short here, so that the example does not wait.
pub const STEP_LEASE: Duration = Duration::from_millis(500);

/// Charges orders at the provider and records the charges in the `charges` table.
pub struct Payments {
    pool: SqlitePool,
    guard: SqliteGuard,
    steps: Steps<Sqlite>,
    provider: ProviderClient,
    crash_armed: AtomicBool,
    crashed: Notify,
}

impl Payments {
    /// Sets up the guard, the step ledger and the `charges` table on `pool`, for the provider
    /// at `provider_url`.
    pub async fn open(pool: SqlitePool, provider_url: &str) -> jobguard::Result<Self> {
        sqlx::query(
            "create table if not exists charges (order_id text not null, charge_id text not null)",
        )
        .execute(&pool)
        .await?;
        let guard = SqliteGuard::new(pool.clone());
        guard.migrate().await?;
        let steps = Steps::with_config(pool.clone(), StepConfig::default().lease(STEP_LEASE));
        steps.migrate().await?;
        Ok(Payments {
            pool,
            guard,
            steps,
            provider: ProviderClient::new(provider_url),
            crash_armed: AtomicBool::new(false),
            crashed: Notify::new(),
        })
    }

    /// Makes the next delivery crash right after the provider answered it.
    pub fn crash_after_next_call(&self) {
        self.crash_armed.store(true, Ordering::SeqCst);
    }

    /// One delivery of the charge of `order`, with the provider's idempotency key, recorded
    /// with the guard. `None` when the delivery crashed after the call.
    pub async fn charge_with_key(
        &self,
        order: &str,
        amount: i64,
    ) -> jobguard::Result<Option<Outcome<String>>> {
        let key = JobKey::new("charge", [order])?;
        // `charge:order-1:create-charge` on every delivery of the job.
        let api_key = ApiKey::derive(&key, "create-charge", ApiKeyFormat::STRIPE)?;
        let delivery = self.guard.run_keyed(
            &key,
            &api_key,
            async |idempotency_key| {
                let charge = self
                    .provider
                    .create_charge(order, amount, Some(idempotency_key))
                    .await?;
                self.after_call().await;
                Ok(charge.id)
            },
            async |conn, charge_id: &String| Ok(record(conn, order, charge_id).await?),
        );
        self.deliver(delivery).await.transpose()
    }

    /// One delivery of the charge of `order` on the endpoint without keys, behind a
    /// started/done step, then recorded with the guard. `None` when the delivery crashed after
    /// the call.
    pub async fn charge_without_key(
        &self,
        order: &str,
        amount: i64,
    ) -> jobguard::Result<Option<(StepOutcome<String>, Outcome<()>)>> {
        let key = JobKey::new("charge-keyless", [order])?;
        let delivery = async {
            let step = self
                .steps
                .run(
                    &key,
                    "create-charge",
                    async || {
                        let charge = self.provider.create_charge_keyless(order, amount).await?;
                        self.after_call().await;
                        Ok(charge.id)
                    },
                    // Asked only when an earlier caller vanished after `started`.
                    async || match self.provider.find_charges(order).await?.first() {
                        Some(charge) => Ok(Reconciled::Done(charge.id.clone())),
                        None => Ok(Reconciled::NotDone),
                    },
                )
                .await?;
            let charge_id = step.clone().into_value();
            let recorded = self
                .guard
                .run(
                    &key,
                    async |conn| Ok(record(conn, order, &charge_id).await?),
                )
                .await?;
            Ok((step, recorded))
        };
        self.deliver(delivery).await.transpose()
    }

    /// The charges recorded for `order`.
    pub async fn recorded(&self, order: &str) -> jobguard::Result<Vec<String>> {
        Ok(
            sqlx::query_scalar("select charge_id from charges where order_id = $1")
                .bind(order)
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// Where a delivery armed to crash stops: right after the provider answered.
    async fn after_call(&self) {
        if self.crash_armed.swap(false, Ordering::SeqCst) {
            self.crashed.notify_one();
            std::future::pending::<()>().await;
        }
    }

    /// Runs a delivery to its end, or drops it where it crashed, as a killed process stops:
    /// nothing after that point runs.
    async fn deliver<T>(&self, delivery: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            biased;
            value = delivery => Some(value),
            () = self.crashed.notified() => None,
        }
    }
}

async fn record(conn: &mut SqliteConnection, order: &str, charge_id: &str) -> sqlx::Result<()> {
    sqlx::query("insert into charges (order_id, charge_id) values ($1, $2)")
        .bind(order)
        .bind(charge_id)
        .execute(conn)
        .await?;
    Ok(())
}
