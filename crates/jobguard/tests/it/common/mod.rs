//! The harness every library test shares: a database of the test's own on each backend
//! (`database`), the seed's credit job, the worker set-up and a recorder of the test's own.
//! Finding services, the skip rule, the per-test schemas and files and the backend matrix
//! (`backends!`) come from `jobguard_testsupport`.
#![allow(dead_code)]

mod credit;
mod database;
mod recorder;
mod worker;

pub use credit::*;
pub use database::*;
pub use recorder::*;
pub use worker::*;
