//! An external call made once across a crash: an order charged at a payment provider (the
//! fake provider of `jobguard-provider`, an HTTP server started in this process) by a delivery
//! that dies between the provider's answer and the database commit, then delivered again.
//!
//! - With an idempotency key, derived from the job key, the redelivery sends the same key and
//!   the provider answers with the first charge instead of making a second.
//! - On the provider's endpoint without keys, a started/done step records that the call began;
//!   the redelivery finds the step started by a caller that vanished and asks the provider's
//!   lookup, which finds the charge, instead of charging again.
//!
//! The guard rows, the step ledger and the recorded charges are in an embedded SQLite file in
//! a temporary directory:
//!
//! ```sh
//! cargo run -p example-external-call
//! ```

use example_external_call::{Payments, STEP_LEASE};
use jobguard::Outcome;
use jobguard::steps::StepOutcome;
use jobguard_provider::{Provider, ProviderConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join("jobguard-example-external-call");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let url = format!("sqlite:{}", dir.join("payments.db").display());
    let pool = jobguard::sqlite::connect(&url, 4).await?;
    let provider = Provider::start(ProviderConfig::default()).await?;
    let payments = Payments::open(pool.clone(), &provider.url()).await?;

    println!("order-1, with an idempotency key:");
    payments.crash_after_next_call();
    for delivery in 1..=3 {
        let shown = match payments.charge_with_key("order-1", 4200).await? {
            None => "crashed after the provider answered".to_owned(),
            Some(Outcome::Applied(charge)) => format!("recorded {charge}"),
            Some(Outcome::Duplicate(dup)) => {
                format!(
                    "duplicate: {} was recorded already",
                    dup.result.unwrap_or_default()
                )
            }
        };
        println!("  delivery {delivery}: {shown}");
    }

    println!("order-2, without a key, behind a started/done step:");
    payments.crash_after_next_call();
    for delivery in 1..=3 {
        let shown = match payments.charge_without_key("order-2", 1800).await? {
            None => {
                // The step stays started until its lease runs out, as a dead caller's does.
                tokio::time::sleep(STEP_LEASE * 2).await;
                "crashed after the provider answered".to_owned()
            }
            Some((step, recorded)) => {
                let step = match step {
                    StepOutcome::Called(charge) => format!("charged {charge}"),
                    StepOutcome::Reconciled(charge) => {
                        format!("the lookup found {charge}, made before the crash")
                    }
                    StepOutcome::Recorded(charge) => format!("{charge} was done already"),
                };
                let recorded = if recorded.is_applied() {
                    "recorded"
                } else {
                    "recorded already"
                };
                format!("{step}; {recorded}")
            }
        };
        println!("  delivery {delivery}: {shown}");
    }

    for order in ["order-1", "order-2"] {
        let charged: Vec<String> = provider
            .provider()
            .charges()
            .into_iter()
            .filter(|charge| charge.order == order)
            .map(|charge| charge.id)
            .collect();
        let recorded = payments.recorded(order).await?;
        println!("{order}: charged {charged:?} by the provider, recorded {recorded:?}");
    }
    provider.stop().await;
    pool.close().await;
    Ok(())
}
