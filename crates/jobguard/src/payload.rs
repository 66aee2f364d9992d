//! The payload rules jobs and outbox messages share, from `jobguard-core` (the Python package
//! applies the same): JSON of at most [`MAX_PAYLOAD_BYTES`], without NUL characters.
//!
//! ```
//! assert_eq!(jobguard::queue::MAX_PAYLOAD_BYTES, 1 << 20);
//! ```

pub use jobguard_core::payload::MAX_PAYLOAD_BYTES;
pub(crate) use jobguard_core::payload::payload_problem;
