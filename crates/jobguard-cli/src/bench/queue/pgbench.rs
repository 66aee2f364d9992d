//! The reference for the credit job: pgbench running its transaction, statement for statement,
//! over the same number of connections.

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{Context, bail};
use jobguard::{GuardConfig, Queue, TableName};
use sqlx::{Executor, Pool};

use super::drain::{LEDGER, PGBENCH_GUARD, PGBENCH_JOBS};

/// The sequence that hands each pgbench transaction the id of the job it completes.
const PGBENCH_NEXT: &str = "jobguard_bench_pgbench_next";
use crate::demo::ledger::LedgerDb;

/// Runs the credit job's transaction with pgbench, statement for statement as the worker runs
/// it: begin, complete the next job and claim its key, append to the ledger, commit. As many
/// transactions as jobs, each completing a job of its own, over the same number of connections. `None` without pgbench on PATH.
pub async fn tps<DB: LedgerDb>(
    pool: &Pool<DB>,
    url: &str,
    jobs: usize,
    concurrency: u32,
) -> anyhow::Result<Option<f64>>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let Some(pgbench) = find_pgbench() else {
        return Ok(None);
    };
    let queue = Queue::with_table(pool.clone(), TableName::new(PGBENCH_JOBS)?)?;
    queue.migrate().await?;
    queue
        .guard(GuardConfig::default().table(TableName::new(PGBENCH_GUARD)?))?
        .migrate()
        .await?;
    // A job leased at attempt 1 for each transaction to complete: `jobs` rounded to a whole
    // number of transactions per client.
    let transactions = (jobs / concurrency as usize).max(1);
    let jobs = transactions * concurrency as usize;
    let mut conn = pool.acquire().await?;
    conn.execute(sqlx::AssertSqlSafe(format!(
        "insert into {PGBENCH_JOBS}
             (kind, job_key, queue, payload, state, attempt, lease_token, leased_until, max_attempts)
         select 'bench-credit', 'bench-credit:order-' || n, 'default', '{{}}', 'available', 1, 1,
                now() + interval '1 day', 10
         from generate_series(1, {jobs}) n"
    )))
    .await?;
    // Each transaction completes a job of its own, as each of the worker's does: the ids are
    // handed out by a sequence over the jobs just inserted. (Drawn at random, a third of the
    // draws would repeat an id already completed and update nothing.)
    for statement in ["drop sequence if exists", "create sequence"] {
        conn.execute(sqlx::AssertSqlSafe(format!("{statement} {PGBENCH_NEXT}")))
            .await?;
    }
    conn.execute(sqlx::AssertSqlSafe(format!(
        "select setval('{PGBENCH_NEXT}', (select min(id) from {PGBENCH_JOBS}), false)"
    )))
    .await?;
    drop(conn);
    // A fresh key per transaction (a collision now and then only takes the cheaper duplicate
    // path), and the next leased job to complete. No `:` in literals: pgbench reads `:word` as
    // a variable even inside quotes.
    let script = format!(
        "\\set key random(1, 2000000000)\n\
         BEGIN;\n\
         WITH next AS (SELECT nextval('{PGBENCH_NEXT}') AS id), \
         completed AS (UPDATE {PGBENCH_JOBS} j SET state = 'completed', finished_at = now(), leased_until = NULL FROM next WHERE j.id = next.id AND j.lease_token = 1 AND j.state = 'available' AND j.leased_until IS NOT NULL RETURNING 1) \
         SELECT c.*, EXISTS (SELECT 1 FROM completed) FROM {PGBENCH_GUARD}_claim('bench-credit-order-' || CAST(:key AS text), 'bench-credit', NULL, '\\x00'::bytea) c;\n\
         INSERT INTO {LEDGER} (account, amount) VALUES (7, 500);\n\
         COMMIT;\n"
    );
    let path = std::env::temp_dir().join(format!("jobguard-pgbench-{}.sql", std::process::id()));
    std::fs::write(&path, script)?;
    let output = tokio::process::Command::new(pgbench)
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &concurrency.to_string(),
            "-j",
            "2",
        ])
        .args(["-t", &transactions.to_string(), "-f"])
        .arg(&path)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .await
        .context("run pgbench")?;
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "pgbench failed: {}{}",
            stdout,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let tps = stdout
        .lines()
        .find_map(|line| line.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|tps| tps.parse().ok())
        .with_context(|| format!("pgbench printed no tps: {stdout}"))?;
    // The reference is only the worker's transaction if each one completed a job: none is
    // left leased.
    let left = queue.counts().await?.running;
    if left != 0 {
        bail!("pgbench left {left} of its {jobs} leased jobs uncompleted");
    }
    Ok(Some(tps))
}

fn find_pgbench() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("pgbench"))
        .find(|p| p.is_file())
}
