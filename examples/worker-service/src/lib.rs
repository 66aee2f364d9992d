//! The jobs of the worker-service example and the statements they run, on PostgreSQL and
//! SQLite alike. `main.rs` enqueues them and runs the worker; see there for how to run it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use jobguard::{Backend, Job, JobError, JobKey, KeyError};
use serde::{Deserialize, Serialize};
use sqlx::Pool;

/// Credits an account for an order: appends a ledger row, which is not idempotent, so only the
/// guard row committed with it keeps a second delivery from crediting twice.
#[derive(Debug, Serialize, Deserialize)]
pub struct Credit {
    /// The order paid for; the key is `credit:<order>`.
    pub order: String,
    /// The account credited.
    pub account: i64,
    /// The amount in cents.
    pub amount: i64,
}

impl<DB: Store> Job<DB> for Credit {
    const KIND: &'static str = "credit";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("credit", [&self.order])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        Ok(DB::insert_ledger(conn, &self.order, self.account, self.amount).await?)
    }
}

/// Sets a customer's email: an upsert, idempotent by itself, so running it twice does no harm
/// and the guard only saves the second run's write.
#[derive(Debug, Serialize, Deserialize)]
pub struct SetEmail {
    /// The change request this applies; the key is `set-email:<change>`, so a later change of
    /// the same customer is another job.
    pub change: String,
    /// The customer.
    pub customer: i64,
    /// The new address.
    pub email: String,
}

impl<DB: Store> Job<DB> for SetEmail {
    const KIND: &'static str = "set-email";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("set-email", [&self.change])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        Ok(DB::upsert_email(conn, self.customer, &self.email).await?)
    }
}

/// Whether a receipt's first attempt has failed yet, in this process.
static RECEIPT_FAILED_ONCE: AtomicBool = AtomicBool::new(false);

/// Records a receipt for an order. Its first attempt in a process writes the row and then fails
/// as a mail server that timed out would: the row rolls back with the guard row, and the retry
/// writes it once.
#[derive(Debug, Serialize, Deserialize)]
pub struct Receipt {
    /// The order; the key is `receipt:<order>`.
    pub order: String,
}

impl<DB: Store> Job<DB> for Receipt {
    const KIND: &'static str = "receipt";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("receipt", [&self.order])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        DB::insert_receipt(conn, &self.order).await?;
        if !RECEIPT_FAILED_ONCE.swap(true, Ordering::SeqCst) {
            return Err(JobError::msg("the mail server timed out"));
        }
        Ok(())
    }
}

/// What the service's tables hold after a run.
#[derive(Debug)]
pub struct Summary {
    /// Ledger rows, one per credited order.
    pub ledger_rows: i64,
    /// The sum of the ledger's amounts.
    pub ledger_total: i64,
    /// Orders placed (committed).
    pub orders: i64,
    /// Receipts recorded.
    pub receipts: i64,
    /// Customer 7's email, if set.
    pub email: Option<String>,
}

/// The service's statements, the same SQL on both backends.
pub trait Store: Backend {
    /// How a transaction that writes begins. SQLite's `begin immediate` takes the write lock up
    /// front, so a concurrent writer waits for it instead of failing.
    const BEGIN: &'static str;

    /// Creates the service's tables when missing.
    fn create_tables(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Appends a ledger row.
    fn insert_ledger(
        conn: &mut Self::Connection,
        order: &str,
        account: i64,
        amount: i64,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Sets a customer's email, inserting the customer when new.
    fn upsert_email(
        conn: &mut Self::Connection,
        customer: i64,
        email: &str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Records a receipt.
    fn insert_receipt(
        conn: &mut Self::Connection,
        order: &str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Places an order.
    fn insert_order(
        conn: &mut Self::Connection,
        order: &str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// What the tables hold.
    fn summary(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<Summary>> + Send;
}

const TABLES: [&str; 4] = [
    "create table if not exists ledger (order_id text not null, account bigint not null, \
     amount bigint not null)",
    "create table if not exists customers (id bigint primary key, email text not null)",
    "create table if not exists receipts (order_id text not null)",
    "create table if not exists orders (id text primary key)",
];

macro_rules! store {
    ($db:ty, $begin:literal) => {
        impl Store for $db {
            const BEGIN: &'static str = $begin;

            async fn create_tables(pool: &Pool<Self>) -> sqlx::Result<()> {
                for statement in TABLES {
                    sqlx::query(statement).execute(pool).await?;
                }
                Ok(())
            }

            async fn insert_ledger(
                conn: &mut Self::Connection,
                order: &str,
                account: i64,
                amount: i64,
            ) -> sqlx::Result<()> {
                sqlx::query("insert into ledger (order_id, account, amount) values ($1, $2, $3)")
                    .bind(order)
                    .bind(account)
                    .bind(amount)
                    .execute(conn)
                    .await
                    .map(drop)
            }

            async fn upsert_email(
                conn: &mut Self::Connection,
                customer: i64,
                email: &str,
            ) -> sqlx::Result<()> {
                sqlx::query(
                    "insert into customers (id, email) values ($1, $2) \
                     on conflict (id) do update set email = excluded.email",
                )
                .bind(customer)
                .bind(email)
                .execute(conn)
                .await
                .map(drop)
            }

            async fn insert_receipt(conn: &mut Self::Connection, order: &str) -> sqlx::Result<()> {
                sqlx::query("insert into receipts (order_id) values ($1)")
                    .bind(order)
                    .execute(conn)
                    .await
                    .map(drop)
            }

            async fn insert_order(conn: &mut Self::Connection, order: &str) -> sqlx::Result<()> {
                sqlx::query("insert into orders (id) values ($1)")
                    .bind(order)
                    .execute(conn)
                    .await
                    .map(drop)
            }

            async fn summary(pool: &Pool<Self>) -> sqlx::Result<Summary> {
                let count = async |sql: &'static str| -> sqlx::Result<i64> {
                    sqlx::query_scalar(sql).fetch_one(pool).await
                };
                Ok(Summary {
                    ledger_rows: count("select count(*) from ledger").await?,
                    ledger_total: count(
                        "select cast(coalesce(sum(amount), 0) as bigint) from ledger",
                    )
                    .await?,
                    orders: count("select count(*) from orders").await?,
                    receipts: count("select count(*) from receipts").await?,
                    email: sqlx::query_scalar("select email from customers where id = 7")
                        .fetch_optional(pool)
                        .await?,
                })
            }
        }
    };
}

store!(sqlx::Postgres, "begin");
store!(sqlx::Sqlite, "begin immediate");
