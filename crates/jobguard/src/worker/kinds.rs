//! The kinds a worker fetches: by default only those it registered, so that workers running
//! different kinds (a Rust service and a Python one, two Rust services) share one jobs table,
//! each job waiting until a worker that knows its kind takes it.

use super::Worker;
use crate::store::Backend;

/// What a [`Worker`] does with jobs of kinds it has no handler for
/// ([`WorkerConfig::unknown_kinds`](super::WorkerConfig::unknown_kinds)).
///
/// ```
/// use jobguard::{UnknownKinds, WorkerConfig};
///
/// // A worker that owns its queue alone, and dead-letters a kind nobody runs any more.
/// let config = WorkerConfig {
///     unknown_kinds: UnknownKinds::DeadLetter,
///     ..WorkerConfig::default()
/// };
/// assert_eq!(WorkerConfig::default().unknown_kinds, UnknownKinds::Leave);
/// # drop(config);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnknownKinds {
    /// Fetch only the registered kinds: a job of another kind stays waiting, its attempts
    /// untouched, until a worker that registered its kind takes it. Workers in other
    /// languages or services share the queue this way. A kind no running worker registered
    /// waits for ever: `jobguard jobs --state available --kind KIND` lists it.
    #[default]
    Leave,
    /// Fetch every kind, and dead-letter a job whose kind has no handler here, with "unknown
    /// job kind `KIND`: no handler is registered for it in this worker": for a worker that
    /// owns its queue alone and wants a retired kind out of the way rather than waiting.
    DeadLetter,
}

impl<DB: Backend> Worker<DB> {
    /// The kinds the worker's fetches take: `None` for every kind (with
    /// [`UnknownKinds::DeadLetter`]), else the registered kinds, sorted.
    pub(super) fn kinds_to_fetch(&self) -> Option<Vec<String>> {
        match self.config.unknown_kinds {
            UnknownKinds::DeadLetter => None,
            UnknownKinds::Leave => {
                let mut kinds = self.handlers.kinds();
                kinds.sort();
                Some(kinds)
            }
        }
    }
}
