//! The seed's credit job, which the worker and retention suites run.

use jobguard::{Job, JobError, JobKey, KeyError};
use serde::{Deserialize, Serialize};

use super::TestDb;

/// The seed's credit job: one ledger row of `amount` for account 7, keyed by its order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Credit {
    pub order: u32,
    pub amount: i64,
}

impl<DB: TestDb> Job<DB> for Credit {
    const KIND: &'static str = "credit";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("credit", [format!("order-{}", self.order)])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        DB::insert_ledger(conn, 7, self.amount).await?;
        Ok(())
    }
}
