//! A credit job delivered three times at once, as a queue does after a worker crash, applied
//! once. Runs on an embedded SQLite file:
//!
//! ```sh
//! cargo run -p example-credit-ledger
//! ```

use jobguard::{JobKey, Outcome, SqliteGuard};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join("jobguard-example-credit-ledger.db");
    let pool = jobguard::sqlite::connect(&format!("sqlite:{}", path.display()), 4).await?;
    sqlx::query("drop table if exists ledger")
        .execute(&pool)
        .await?;
    sqlx::query("drop table if exists processed_jobs")
        .execute(&pool)
        .await?;
    sqlx::query("create table ledger (account integer not null, amount integer not null)")
        .execute(&pool)
        .await?;

    let guard = SqliteGuard::new(pool.clone());
    guard.migrate().await?;

    // The key names the business operation, so every delivery of this credit has the same key.
    let key = JobKey::new("credit", ["order-8812"])?;
    let payload = json!({"account": 7, "amount": 500});

    let deliveries = (0..3).map(|_| {
        let (guard, key, payload) = (guard.clone(), key.clone(), payload.clone());
        tokio::spawn(async move {
            guard
                .run_with_payload(&key, &payload, async move |conn| {
                    sqlx::query("insert into ledger (account, amount) values (7, 500)")
                        .execute(&mut *conn)
                        .await?;
                    let row: i64 = sqlx::query_scalar("select last_insert_rowid()")
                        .fetch_one(&mut *conn)
                        .await?;
                    Ok(row)
                })
                .await
        })
    });
    for delivery in deliveries {
        match delivery.await?? {
            Outcome::Applied(row) => println!("applied: ledger row {row}"),
            Outcome::Duplicate(dup) => {
                println!("duplicate: already applied as ledger row {:?}", dup.result)
            }
        }
    }

    let (rows, total): (i64, i64) =
        sqlx::query_as("select count(*), coalesce(sum(amount), 0) from ledger")
            .fetch_one(&pool)
            .await?;
    println!("ledger: {rows} row(s), total {total}");
    assert_eq!((rows, total), (1, 500));
    Ok(())
}
