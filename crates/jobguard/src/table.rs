//! Validated names for the tables jobguard creates.
//!
//! Table and schema names are the only parts of jobguard's SQL that cannot be bind parameters,
//! so they are checked once, against a strict identifier grammar, and quoted when spliced.

pub use jobguard_core::table::{NameError, TableName};

use crate::error::Error;

impl From<NameError> for Error {
    fn from(error: NameError) -> Self {
        Error::InvalidName {
            what: error.what,
            name: error.name,
        }
    }
}
