//! Turn-taking for writers on a database that admits one writing transaction at a time.
//!
//! SQLite makes a second writer wait in its busy handler, which polls with growing sleeps. When
//! the writers of one process queue on this lock instead, they run back to back, in order.
//!
//! The turn is taken before a connection from the pool, never while holding one: a task that
//! held a connection while it waited for the turn could leave the turn's holder waiting for a
//! connection, each waiting for the other. Lease heartbeats take no turn at all (see
//! `sqlite/heartbeat.rs`): a job waiting for its turn must keep its lease.

use std::sync::Arc;

use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::store::Backend;

/// Shared by the guard and the queue of one database; a no-op on PostgreSQL.
#[derive(Clone, Debug, Default)]
pub(crate) struct WriterLock(Option<Arc<Mutex<()>>>);

impl WriterLock {
    pub(crate) fn for_backend<DB: Backend>() -> Self {
        WriterLock(DB::SINGLE_WRITER.then(|| Arc::new(Mutex::new(()))))
    }

    /// Waits for this process's turn to write; hold the returned guard until commit.
    pub(crate) async fn acquire(&self) -> Option<OwnedMutexGuard<()>> {
        match &self.0 {
            Some(lock) => Some(Arc::clone(lock).lock_owned().await),
            None => None,
        }
    }
}
