//! A batch whose commit answer is lost: the connection is cut after the server committed the
//! batch, and the guard row of a key it claimed tells the worker the whole batch applied.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use jobguard::{Job, JobError, JobKey, KeyError, Queue, Worker, WorkerConfig};
use serde::{Deserialize, Serialize};
use sqlx::postgres::Postgres;

use super::{Fault, Proxy, bounded, proxied};
use crate::common::{TestDb, ledger_and_guard_rows};

/// The proxy whose next `COMMIT` the last job's effect cuts: the batch's, not one of the
/// worker's own transactions before it.
static PROXY: Mutex<Option<Arc<Proxy>>> = Mutex::new(None);

#[derive(Serialize, Deserialize)]
struct Credit {
    order: u32,
}

impl Job<Postgres> for Credit {
    const KIND: &'static str = "credit";
    const BATCH: bool = true;

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("credit", [format!("order-{}", self.order)])
    }

    async fn run(&self, conn: &mut sqlx::PgConnection) -> Result<(), JobError> {
        Postgres::insert_ledger(conn, 7, 500).await?;
        if self.order == 5
            && let Some(proxy) = PROXY.lock().unwrap().take()
        {
            proxy.arm(Fault::AfterCommit);
        }
        Ok(())
    }
}

/// Five jobs in one batch; the proxy cuts the connection once the server committed it. The
/// worker reads the first key's guard row on a new connection, finds its own claim token, and
/// reports the five as applied: not as fenced, which is what running them again one per
/// transaction would find (their completions committed with the batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_lost_after_a_batch_commit_is_applied() {
    bounded(async {
        let Some((direct, proxy, pool)) = proxied("batch_after_commit", 4).await else {
            return;
        };
        let queue = Queue::new(pool);
        queue.migrate().await.unwrap();
        queue
            .guard(Default::default())
            .unwrap()
            .migrate()
            .await
            .unwrap();
        let direct_queue = Queue::new(direct.clone());
        for order in 1..=5 {
            assert!(
                direct_queue
                    .enqueue_job(&Credit { order })
                    .await
                    .unwrap()
                    .inserted
            );
        }

        let proxy = Arc::new(proxy);
        *PROXY.lock().unwrap() = Some(Arc::clone(&proxy));
        let config = WorkerConfig {
            concurrency: 1,
            batch_size: 10,
            batch_linger: Duration::ZERO,
            stop_when_idle: true,
            poll_interval: Duration::from_millis(50),
            ..WorkerConfig::default()
        };
        let worker = Worker::with_config(queue, config)
            .unwrap()
            .register::<Credit>();
        let stats = worker.run(std::future::pending()).await.unwrap();
        assert_eq!(proxy.fired().await, 1, "the batch's commit was cut");
        assert!(proxy.server_committed(), "the server committed the batch");
        assert_eq!(
            (stats.applied, stats.fenced, stats.failed, stats.duplicates),
            (5, 0, 0, 0),
            "{stats:?}"
        );
        assert_eq!(ledger_and_guard_rows(&direct).await, (5, 5));
        assert_eq!(direct_queue.counts().await.unwrap().completed, 5);
    })
    .await;
}
