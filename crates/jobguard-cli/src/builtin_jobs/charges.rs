//! The built-in charge jobs: an order charged at a payment provider over HTTP, then recorded in
//! `jobguard_charges`. Three ways to do it, for `jobguard worker` and the charge demo:
//!
//! - `charge` {order, amount}: the provider's idempotency key, derived from the job key
//!   (`charge:<order>` and step `create-charge`); a redelivery gets the original charge back;
//! - `charge-keyless` {order, amount}: the provider's keyless endpoint, behind a started/done
//!   step that asks the provider's lookup when a caller vanished;
//! - `charge-naive` {order, amount}: the keyless endpoint called bare; the database side is
//!   still guarded, so the ledger looks right while the customer pays twice.
//!
//! Workers find the provider at `JOBGUARD_PROVIDER_URL` (see `jobguard provider`).

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;

use jobguard::external::{ApiKey, ExternalJob};
use jobguard::steps::{Reconciled, StepConfig, Steps};
use jobguard::{JobError, JobKey, KeyError, TableName, Worker};
use jobguard_provider::{Charge, ProviderClient, ProviderError};
use serde::{Deserialize, Serialize};

use super::{Example, ExampleDb};

/// Where workers find the payment provider.
pub const PROVIDER_URL_ENV: &str = "JOBGUARD_PROVIDER_URL";

/// What runs after a charge job's call to the provider and before its database commit, with
/// the order: the charge demo's worker process stops there to be killed.
pub type AfterCall = Arc<dyn Fn(&str) -> BoxFuture<'static, ()> + Send + Sync>;

/// An order to charge. The same payload for the three kinds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChargeOrder {
    /// The order; the job key is `<kind>:<order>`.
    pub order: String,
    /// The amount in cents, positive.
    pub amount: i64,
}

/// Charges with the provider's idempotency key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ChargeKeyed(pub ChargeOrder);

/// Charges through a started/done step with reconciliation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ChargeKeyless(pub ChargeOrder);

/// Charges with no protection at the provider.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ChargeNaive(pub ChargeOrder);

const SHAPE: &str = r#"{"order": "<text>", "amount": <positive integer>}"#;

fn validate(order: &ChargeOrder) -> Result<(), String> {
    if order.amount <= 0 {
        return Err(format!(
            "the charge of order `{}` has amount {}: charge a positive amount",
            order.order, order.amount
        ));
    }
    Ok(())
}

macro_rules! charge_kind {
    ($type:ty, $kind:literal) => {
        impl Example for $type {
            const KIND: &'static str = $kind;
            const SHAPE: &'static str = SHAPE;

            fn job_key(&self) -> Result<JobKey, KeyError> {
                JobKey::new($kind, [&self.0.order])
            }

            fn validate(&self) -> Result<(), String> {
                validate(&self.0)
            }
        }
    };
}
charge_kind!(ChargeKeyed, "charge");
charge_kind!(ChargeKeyless, "charge-keyless");
charge_kind!(ChargeNaive, "charge-naive");

/// The tables the charge jobs write: the charges they record and their step ledger.
#[derive(Clone, Debug)]
pub struct PaymentTables {
    pub charges: TableName,
    pub steps: TableName,
}

impl Default for PaymentTables {
    fn default() -> Self {
        PaymentTables {
            charges: TableName::new(super::CHARGES).expect("a valid table name"),
            steps: TableName::new("jobguard_steps").expect("a valid table name"),
        }
    }
}

/// Creates the charge jobs' tables when missing.
pub async fn migrate<DB: ExampleDb>(
    pool: &sqlx::Pool<DB>,
    tables: &PaymentTables,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    DB::create_charges(pool, &tables.charges)
        .await
        .with_context(|| format!("cannot create the charges table `{}`", tables.charges))?;
    Steps::with_config(
        pool.clone(),
        StepConfig::default().table(tables.steps.clone()),
    )
    .migrate()
    .await
    .with_context(|| format!("cannot create the step ledger `{}`", tables.steps))
}

/// What the charge jobs share: the provider's client, the step ledger, the hook after a call.
pub struct Payments<DB: ExampleDb> {
    client: Option<ProviderClient>,
    steps: Steps<DB>,
    charges: TableName,
    after_call: Option<AfterCall>,
}

impl<DB: ExampleDb> Payments<DB> {
    /// The provider from `JOBGUARD_PROVIDER_URL`.
    pub fn from_env(pool: sqlx::Pool<DB>, tables: PaymentTables, step_lease: Duration) -> Self {
        let client = std::env::var(PROVIDER_URL_ENV)
            .ok()
            .filter(|url| !url.is_empty())
            .map(ProviderClient::new);
        let config = StepConfig::default().table(tables.steps).lease(step_lease);
        Payments {
            client,
            steps: Steps::with_config(pool, config),
            charges: tables.charges,
            after_call: None,
        }
    }

    /// Runs `hook` after each call to the provider, before the job's database commit.
    pub fn after_call(mut self, hook: AfterCall) -> Self {
        self.after_call = Some(hook);
        self
    }

    fn client(&self) -> Result<&ProviderClient, JobError> {
        self.client.as_ref().ok_or_else(|| {
            JobError::msg(format!(
                "no payment provider: set {PROVIDER_URL_ENV} for the worker (start one with \
                 `jobguard provider`)"
            ))
        })
    }

    /// What runs between the provider's answer and the database commit.
    fn called(&self, order: &str) -> BoxFuture<'static, ()> {
        match &self.after_call {
            Some(hook) => hook(order),
            None => std::future::ready(()).boxed(),
        }
    }
}

fn provider_error(error: ProviderError) -> JobError {
    if error.is_retryable() {
        error.into()
    } else {
        JobError::from(error).into_fatal()
    }
}

fn checked(order: &ChargeOrder) -> Result<(), JobError> {
    validate(order).map_err(JobError::fatal)
}

/// What the three charge jobs share: their kind, key, context and how they record a charge, on
/// the transaction that claims the key and completes the job. Only the call differs.
macro_rules! charge_job {
    () => {
        const KIND: &'static str = <Self as Example>::KIND;
        type Context = Payments<DB>;
        type Output = Charge;

        fn key(&self) -> Result<JobKey, KeyError> {
            self.job_key()
        }

        async fn record(
            &self,
            payments: &Payments<DB>,
            conn: &mut DB::Connection,
            charge: &Charge,
        ) -> Result<(), JobError> {
            let kind = <Self as Example>::KIND;
            Ok(DB::record_charge(conn, &payments.charges, kind, charge).await?)
        }
    };
}

impl<DB: ExampleDb> ExternalJob<DB> for ChargeKeyed {
    const STEP: &'static str = "create-charge";
    charge_job!();

    async fn call(&self, payments: &Payments<DB>, api_key: &ApiKey) -> Result<Charge, JobError> {
        checked(&self.0)?;
        let charge = payments
            .client()?
            .create_charge(&self.0.order, self.0.amount, Some(api_key.as_str()))
            .await
            .map_err(provider_error)?;
        payments.called(&self.0.order).await;
        Ok(charge)
    }
}

impl<DB: ExampleDb> ExternalJob<DB> for ChargeNaive {
    charge_job!();

    async fn call(&self, payments: &Payments<DB>, _api_key: &ApiKey) -> Result<Charge, JobError> {
        checked(&self.0)?;
        let charge = payments
            .client()?
            .create_charge_keyless(&self.0.order, self.0.amount)
            .await
            .map_err(provider_error)?;
        payments.called(&self.0.order).await;
        Ok(charge)
    }
}

impl<DB: ExampleDb> ExternalJob<DB> for ChargeKeyless {
    charge_job!();

    async fn call(&self, payments: &Payments<DB>, _api_key: &ApiKey) -> Result<Charge, JobError> {
        checked(&self.0)?;
        let client = payments.client()?;
        let key = self.job_key().map_err(JobError::fatal)?;
        let order = &self.0.order;
        let outcome = payments
            .steps
            .run(
                &key,
                "charge",
                async || {
                    let charge = client
                        .create_charge_keyless(order, self.0.amount)
                        .await
                        .map_err(provider_error)?;
                    payments.called(order).await;
                    Ok(charge)
                },
                async || match client.find_charges(order).await {
                    Ok(found) => Ok(match found.into_iter().next() {
                        Some(charge) => Reconciled::Done(charge),
                        None => Reconciled::NotDone,
                    }),
                    Err(ProviderError::Unavailable { status }) => Ok(Reconciled::Unknown(format!(
                        "the provider's charge lookup answered {status}"
                    ))),
                    Err(error) => Err(provider_error(error)),
                },
            )
            .await;
        match outcome {
            Ok(outcome) => Ok(outcome.into_value()),
            // In flight is retryable and needs-attention fatal, as the worker should treat them.
            Err(error) => {
                let fatal = !error.is_retryable();
                let error = JobError::from(error);
                Err(if fatal { error.into_fatal() } else { error })
            }
        }
    }
}

/// Registers the three charge kinds with `worker`.
pub fn register<DB: ExampleDb>(worker: Worker<DB>, payments: Payments<DB>) -> Worker<DB> {
    // One context per kind; they share the provider's connection pool.
    let clone = |payments: &Payments<DB>| Payments {
        client: payments.client.clone(),
        steps: payments.steps.clone(),
        charges: payments.charges.clone(),
        after_call: payments.after_call.clone(),
    };
    worker
        .register_external::<ChargeNaive>(clone(&payments))
        .register_external::<ChargeKeyless>(clone(&payments))
        .register_external::<ChargeKeyed>(payments)
}
