//! The machine, shared by the tests of one binary: a test that loads every core on purpose
//! (the fault run's worker processes, the busy loops of the SQLite lease test) runs alone, as
//! it did in a test binary of its own, so that it neither slows the others past their leases
//! nor is slowed by them into a different test.

use std::cell::Cell;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static MACHINE: RwLock<()> = RwLock::new(());

thread_local! {
    /// Whether this thread holds the machine alone, or a share of it already.
    static HELD: Cell<bool> = const { Cell::new(false) };
}

/// The machine to the test holding it alone, until dropped.
pub struct Alone {
    _machine: RwLockWriteGuard<'static, ()>,
}

impl Drop for Alone {
    fn drop(&mut self) {
        HELD.set(false);
    }
}

/// Waits until no other test uses the machine and keeps it for this test until dropped.
pub fn alone() -> Alone {
    let guard = MACHINE
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    HELD.set(true);
    Alone { _machine: guard }
}

/// A share of the machine, held by a test's [`Db`](super::Db); `None` when this thread holds
/// the machine alone or a share already (a second share could wait forever behind a test
/// waiting for the machine alone).
pub struct Share {
    _machine: RwLockReadGuard<'static, ()>,
}

impl Drop for Share {
    fn drop(&mut self) {
        HELD.set(false);
    }
}

pub fn share() -> Option<Share> {
    if HELD.get() {
        return None;
    }
    let guard = MACHINE
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    HELD.set(true);
    Some(Share { _machine: guard })
}
