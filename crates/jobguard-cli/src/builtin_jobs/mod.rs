//! The built-in example job kinds that `jobguard worker` runs and `jobguard enqueue` checks:
//!
//! - `credit` {order, account, amount}, key `credit:<order>`: appends a row to
//!   `jobguard_ledger`, the effect that must not repeat;
//! - `noop` {id}, key `noop:<id>`: does nothing, for benchmarks;
//! - `fail` {id, fatal}, key `fail:<id>`: always fails, retryably or fatally, to show retries
//!   and dead letters;
//! - the charge jobs `charge`, `charge-keyless` and `charge-naive`, in [`charges`].
//!
//! The demo and the benchmarks run the same [`Credit`] on tables of their own.

pub mod charges;

use std::future::Future;

use anyhow::{Context, anyhow};
use std::time::Duration;

use jobguard::{Backend, Job, JobError, JobKey, KeyError, TableName, Worker};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::postgres::Postgres;
use sqlx::sqlite::Sqlite;
use sqlx::{Executor, Pool};

use charges::{ChargeKeyed, ChargeKeyless, ChargeNaive, PaymentTables, Payments};

/// The table the `credit` job appends to. Nothing else in the database is touched.
pub const LEDGER: &str = "jobguard_ledger";

/// The kinds `jobguard worker` runs.
pub const KINDS: [&str; 6] = [
    <Credit as Example>::KIND,
    <Noop as Example>::KIND,
    <Fail as Example>::KIND,
    <ChargeKeyed as Example>::KIND,
    <ChargeKeyless as Example>::KIND,
    <ChargeNaive as Example>::KIND,
];

/// Credits `amount` to `account` for `order`, once per order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credit {
    /// The order the credit is for; the job key is `credit:<order>`.
    pub order: String,
    /// The account credited.
    pub account: i64,
    /// The amount, non-zero (negative for a debit).
    pub amount: i64,
    /// Milliseconds to wait inside the job's transaction after appending to the ledger: a slow
    /// job, for fault tests. Left out of the payload when 0, so keys and payloads stay as they
    /// were.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hold_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Does nothing: measures the queue and the guard alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Noop {
    /// Makes the key, `noop:<id>`.
    pub id: String,
}

/// Always fails: retryably (the job runs again until its attempts run out) or fatally (it goes
/// to the dead letters at once).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fail {
    /// Makes the key, `fail:<id>`.
    pub id: String,
    /// Whether the failure is fatal; retryable when absent.
    #[serde(default)]
    pub fatal: bool,
}

/// What the built-in kinds share, whatever the backend.
pub trait Example: Serialize + DeserializeOwned {
    /// The kind the job is enqueued and registered under.
    const KIND: &'static str;
    /// The payload's shape, for error messages.
    const SHAPE: &'static str;

    /// The key, derived from the payload.
    fn job_key(&self) -> Result<JobKey, KeyError>;

    /// Checks what the types cannot, with a message saying what is wrong.
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }
}

impl Example for Credit {
    const KIND: &'static str = "credit";
    const SHAPE: &'static str =
        r#"{"order": "<text>", "account": <integer>, "amount": <non-zero integer>}"#;

    fn job_key(&self) -> Result<JobKey, KeyError> {
        JobKey::new(<Self as Example>::KIND, [&self.order])
    }

    fn validate(&self) -> Result<(), String> {
        if self.amount == 0 {
            return Err(format!(
                "the credit of order `{}` has amount 0: credit a non-zero amount",
                self.order
            ));
        }
        Ok(())
    }
}

impl Example for Noop {
    const KIND: &'static str = "noop";
    const SHAPE: &'static str = r#"{"id": "<text>"}"#;

    fn job_key(&self) -> Result<JobKey, KeyError> {
        JobKey::new(<Self as Example>::KIND, [&self.id])
    }
}

impl Example for Fail {
    const KIND: &'static str = "fail";
    const SHAPE: &'static str = r#"{"id": "<text>", "fatal": <true|false, default false>}"#;

    fn job_key(&self) -> Result<JobKey, KeyError> {
        JobKey::new(<Self as Example>::KIND, [&self.id])
    }
}

/// A built-in job checked for enqueueing: its key and its payload in canonical form (fields
/// in order, defaults filled in), so that equal jobs have equal payloads.
#[derive(Debug)]
pub struct Checked {
    pub key: JobKey,
    pub payload: Value,
}

/// Checks a payload for the built-in `kind`: `Ok(None)` when `kind` is not built in.
pub fn check(kind: &str, payload: &Value) -> anyhow::Result<Option<Checked>> {
    match kind {
        <Credit as Example>::KIND => check_as::<Credit>(payload).map(Some),
        <Noop as Example>::KIND => check_as::<Noop>(payload).map(Some),
        <Fail as Example>::KIND => check_as::<Fail>(payload).map(Some),
        <ChargeKeyed as Example>::KIND => check_as::<ChargeKeyed>(payload).map(Some),
        <ChargeKeyless as Example>::KIND => check_as::<ChargeKeyless>(payload).map(Some),
        <ChargeNaive as Example>::KIND => check_as::<ChargeNaive>(payload).map(Some),
        _ => Ok(None),
    }
}

fn check_as<J: Example>(payload: &Value) -> anyhow::Result<Checked> {
    let job = J::deserialize(payload).map_err(|error| {
        anyhow!(
            "the payload does not fit a `{}` job: {error}; expected {}",
            J::KIND,
            J::SHAPE
        )
    })?;
    job.validate()
        .map_err(|reason| anyhow!("invalid `{}` job: {reason}", J::KIND))?;
    let key = job
        .job_key()
        .with_context(|| format!("cannot derive the key of the `{}` job", J::KIND))?;
    let payload = serde_json::to_value(&job)?;
    Ok(Checked { key, payload })
}

/// The databases the built-in jobs run on: the ledger's SQL per backend.
pub trait ExampleDb: Backend {
    /// Creates `jobguard_ledger` when missing.
    fn create_ledger(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Appends the credit to the ledger, on the worker's transaction.
    fn append_credit(
        conn: &mut Self::Connection,
        credit: &Credit,
        key: &str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Creates the charges table `table` when missing.
    fn create_charges(
        pool: &Pool<Self>,
        table: &TableName,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Records a provider's charge for its order in `table`, on the worker's transaction.
    fn record_charge(
        conn: &mut Self::Connection,
        table: &TableName,
        kind: &str,
        charge: &jobguard_provider::Charge,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// The charges recorded in `table`.
    fn recorded_charges(
        pool: &Pool<Self>,
        table: &TableName,
    ) -> impl Future<Output = sqlx::Result<i64>> + Send;

    /// Deletes every row of `table`.
    fn clear(pool: &Pool<Self>, table: &TableName)
    -> impl Future<Output = sqlx::Result<()>> + Send;
}

/// The table the charge jobs record in.
pub const CHARGES: &str = "jobguard_charges";

/// The statements whose text and binding are the same on both backends, expanded in each
/// `impl ExampleDb`, where the backend's types are concrete.
macro_rules! same_statements {
    () => {
        async fn append_credit(
            conn: &mut Self::Connection,
            credit: &Credit,
            key: &str,
        ) -> sqlx::Result<()> {
            sqlx::query(APPEND)
                .bind(credit.account)
                .bind(credit.amount)
                .bind(key)
                .execute(conn)
                .await?;
            Ok(())
        }

        async fn record_charge(
            conn: &mut Self::Connection,
            table: &TableName,
            kind: &str,
            charge: &jobguard_provider::Charge,
        ) -> sqlx::Result<()> {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "insert into {} (kind, order_id, charge_id, amount) values ($1, $2, $3, $4)",
                table.quoted()
            )))
            .bind(kind)
            .bind(&charge.order)
            .bind(&charge.id)
            .bind(charge.amount)
            .execute(conn)
            .await?;
            Ok(())
        }

        async fn recorded_charges(pool: &Pool<Self>, table: &TableName) -> sqlx::Result<i64> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "select count(*) from {}",
                table.quoted()
            )))
            .fetch_one(pool)
            .await
        }

        async fn clear(pool: &Pool<Self>, table: &TableName) -> sqlx::Result<()> {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "delete from {}",
                table.quoted()
            )))
            .execute(pool)
            .await?;
            Ok(())
        }
    };
}

/// The same statement on both backends: sqlx accepts `$1` placeholders for SQLite too.
const APPEND: &str = "insert into jobguard_ledger (account, amount, job_key) values ($1, $2, $3)";

impl ExampleDb for Postgres {
    async fn create_ledger(pool: &Pool<Self>) -> sqlx::Result<()> {
        let mut tx = pool.begin().await?;
        // Workers starting together would race on `create table if not exists`, which is not
        // atomic in PostgreSQL's catalog.
        sqlx::query("select pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind("jobguard:migrate:jobguard_ledger")
            .execute(&mut *tx)
            .await?;
        tx.execute(
            "create table if not exists jobguard_ledger (
                 id      bigserial primary key,
                 account bigint not null,
                 amount  bigint not null,
                 job_key text not null
             )",
        )
        .await?;
        tx.commit().await
    }

    same_statements!();

    async fn create_charges(pool: &Pool<Self>, table: &TableName) -> sqlx::Result<()> {
        let mut tx = pool.begin().await?;
        sqlx::query("select pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!("jobguard:migrate:{}", table.quoted()))
            .execute(&mut *tx)
            .await?;
        tx.execute(sqlx::AssertSqlSafe(format!(
            "create table if not exists {} (
                 id        bigserial primary key,
                 kind      text not null,
                 order_id  text not null,
                 charge_id text not null,
                 amount    bigint not null
             )",
            table.quoted()
        )))
        .await?;
        tx.commit().await
    }
}

impl ExampleDb for Sqlite {
    async fn create_ledger(pool: &Pool<Self>) -> sqlx::Result<()> {
        let mut tx = pool.begin_with("begin immediate").await?;
        tx.execute(
            "create table if not exists jobguard_ledger (
                 id      integer primary key,
                 account bigint not null,
                 amount  bigint not null,
                 job_key text not null
             )",
        )
        .await?;
        tx.commit().await
    }

    same_statements!();

    async fn create_charges(pool: &Pool<Self>, table: &TableName) -> sqlx::Result<()> {
        let mut tx = pool.begin_with("begin immediate").await?;
        tx.execute(sqlx::AssertSqlSafe(format!(
            "create table if not exists {} (
                 id        integer primary key,
                 kind      text not null,
                 order_id  text not null,
                 charge_id text not null,
                 amount    bigint not null
             )",
            table.quoted()
        )))
        .await?;
        tx.commit().await
    }
}

impl<DB: ExampleDb> Job<DB> for Credit {
    const KIND: &'static str = <Self as Example>::KIND;
    // Each credit appends its own ledger row: batches lock no row that another batch writes.
    const BATCH: bool = true;

    fn key(&self) -> Result<JobKey, KeyError> {
        self.job_key()
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        // A producer other than `jobguard enqueue` may have skipped the checks.
        self.validate().map_err(JobError::fatal)?;
        let key = self.job_key().map_err(JobError::fatal)?;
        DB::append_credit(conn, self, key.as_str()).await?;
        if self.hold_ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(self.hold_ms)).await;
        }
        Ok(())
    }
}

impl<DB: ExampleDb> Job<DB> for Noop {
    const KIND: &'static str = <Self as Example>::KIND;
    const BATCH: bool = true;

    fn key(&self) -> Result<JobKey, KeyError> {
        self.job_key()
    }

    async fn run(&self, _conn: &mut DB::Connection) -> Result<(), JobError> {
        Ok(())
    }
}

impl<DB: ExampleDb> Job<DB> for Fail {
    const KIND: &'static str = <Self as Example>::KIND;

    fn key(&self) -> Result<JobKey, KeyError> {
        self.job_key()
    }

    async fn run(&self, _conn: &mut DB::Connection) -> Result<(), JobError> {
        if self.fatal {
            Err(JobError::fatal(format!(
                "fail:{} failed on purpose with a fatal error: no retry, straight to the dead \
                 letters",
                self.id
            )))
        } else {
            Err(JobError::msg(format!(
                "fail:{} failed on purpose with a retryable error: it runs again until its \
                 attempts run out",
                self.id
            )))
        }
    }
}

/// Registers every built-in kind with `worker`; the charge kinds find the payment provider
/// at `JOBGUARD_PROVIDER_URL`.
pub fn register<DB: ExampleDb>(worker: Worker<DB>) -> Worker<DB> {
    let pool = worker.guard().pool().clone();
    let payments = Payments::from_env(pool, PaymentTables::default(), Duration::from_secs(30));
    let worker = worker
        .register::<Credit>()
        .register::<Noop>()
        .register::<Fail>();
    charges::register(worker, payments)
}

/// Creates the tables the built-in jobs write to.
pub async fn migrate<DB: ExampleDb>(pool: &Pool<DB>) -> anyhow::Result<()> {
    DB::create_ledger(pool)
        .await
        .with_context(|| format!("cannot create the ledger table `{LEDGER}`"))?;
    charges::migrate(pool, &PaymentTables::default()).await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn keys_derive_from_the_payload() {
        let credit = check(
            "credit",
            &json!({"order": "o-1", "account": 7, "amount": 5}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(credit.key.as_str(), "credit:o-1");
        let fail = check("fail", &json!({"id": "a:b"})).unwrap().unwrap();
        assert_eq!(fail.key.as_str(), "fail:a%3Ab");
        // Canonical payload: the default is written out, so equal jobs compare equal.
        assert_eq!(fail.payload, json!({"id": "a:b", "fatal": false}));
        assert!(check("email", &json!({})).unwrap().is_none());
    }

    #[test]
    fn bad_payloads_say_what_is_expected() {
        let error = check("credit", &json!({"order": "o-1", "account": 7}))
            .unwrap_err()
            .to_string();
        assert!(error.contains("missing field `amount`"), "{error}");
        assert!(error.contains(r#""amount": <non-zero integer>"#), "{error}");
        let error = check("noop", &json!({"id": "x", "extra": 1}))
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown field `extra`"), "{error}");
        let error = check(
            "credit",
            &json!({"order": "o-1", "account": 7, "amount": 0}),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("non-zero"), "{error}");
        let error = format!("{:#}", check("noop", &json!({"id": ""})).unwrap_err());
        assert!(error.contains("empty"), "{error}");
    }
}
