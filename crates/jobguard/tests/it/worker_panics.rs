//! A job slot that panics outside the job (here, in the job's decoding, which is the user's
//! code): the jobs it held run again once their leases expire, and the worker keeps its
//! capacity for the other jobs.

use std::time::{Duration, Instant};

use jobguard::queue::{JobState, NewJob};
use jobguard::{Job, JobError, JobKey, KeyError, Worker, WorkerConfig};
use serde::{Deserialize, Deserializer, Serialize};

use crate::common::{Credit, TestDb, draining, ledger_rows, setup};

/// A job whose payload decoder panics when `boom` is set.
#[derive(Serialize, Deserialize)]
struct Touchy {
    order: u32,
    #[serde(deserialize_with = "panics_when_set")]
    boom: bool,
}

fn panics_when_set<'de, D: Deserializer<'de>>(decoder: D) -> Result<bool, D::Error> {
    let boom = bool::deserialize(decoder)?;
    assert!(!boom, "the decoder panicked");
    Ok(boom)
}

impl<DB: TestDb> Job<DB> for Touchy {
    const KIND: &'static str = "touchy";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("touchy", [format!("order-{}", self.order)])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        DB::insert_ledger(conn, 9, 1).await?;
        Ok(())
    }
}

// One slot, nothing fetched ahead: the slot that panics holds the worker's only place. The
// jobs behind it still run, and the job it held is rescued once its lease expires, fetched,
// panics again and is dead-lettered at its last attempt, by the worker's own rescue.
backends!(fn a_slot_that_panics_outside_the_job_gives_up_its_leases_and_its_place);
async fn a_slot_that_panics_outside_the_job_gives_up_its_leases_and_its_place<DB: TestDb>() {
    let Some((pool, queue)) = setup::<DB>("worker_slot_panics").await else {
        return;
    };
    let touchy = NewJob::from_job::<DB, _>(&Touchy {
        order: 1,
        boom: true,
    })
    .unwrap()
    .max_attempts(2);
    let touchy = queue.enqueue(&touchy).await.unwrap().id;
    for order in 1..=3 {
        queue
            .enqueue_job(&Credit { order, amount: 500 })
            .await
            .unwrap();
    }
    let worker = Worker::with_config(
        queue.clone(),
        WorkerConfig {
            concurrency: 1,
            prefetch: Some(0),
            lease: Duration::from_secs(1),
            stop_when_idle: false,
            ..draining()
        },
    )
    .unwrap()
    .register::<Credit>()
    .register::<Touchy>();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    let dead = "select count(*) from jobguard_jobs where state = 'dead'";
    let deadline = Instant::now() + Duration::from_secs(30);
    while (ledger_rows(&pool).await, DB::count(&pool, dead).await) != (3, 1)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(());
    let stats = running.await.unwrap().unwrap();
    assert_eq!(
        ledger_rows(&pool).await,
        3,
        "the jobs behind the panic ran: {stats:?}"
    );
    let row = queue.list(None, Some("touchy"), 1).await.unwrap().remove(0);
    assert_eq!(row.id, touchy);
    assert_eq!(
        (row.state, row.attempt),
        (JobState::Dead, 2),
        "rescued after each panic, dead at its last attempt: {row:?}"
    );
    assert!(
        row.last_error
            .as_deref()
            .unwrap_or_default()
            .contains("lease"),
        "{row:?}"
    );
}
