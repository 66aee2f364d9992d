//! Payload fingerprints: how the guard tells a redelivery from a reused key.
//!
//! A redelivery carries the same payload as the first delivery; the same key with another payload
//! means the producer derived one key for two different operations. The guard stores a hash of the
//! payload with the key and refuses a mismatch, as payment APIs do with idempotency keys.

pub use jobguard_core::fingerprint::Fingerprint;
