//! Job keys: the stable identity of a job's effect.
//!
//! A job key names *the business operation a job performs*, not the job run that performs it.
//! jobguard records each key at most once per effect, so two deliveries of the same job, or two
//! producers that both enqueue "credit order 8812", collapse into a single effect as long as they
//! compute the same key. The key is therefore derived from the business operation itself: a kind
//! such as `credit` followed by the identifiers that make the operation unique, such as the order
//! id: `credit:order-8812`.
//!
//! A job that legitimately repeats puts its period in the key. A monthly fee is one effect per
//! account per month, so its key is `fee:account-7:2026-10`; next month's fee is
//! `fee:account-7:2026-11`, a different key, and it runs once more.
//!
//! # Do not use random ids or timestamps
//!
//! Never build a key from a value that changes each time the job is enqueued:
//!
//! * a random id such as a UUID generated per enqueue, or
//! * a timestamp such as the enqueue time (`credit:2026-10-02T10:15`).
//!
//! Producer-side duplicates (a retried HTTP request, a redelivered event, a double click) then get
//! *different* keys, jobguard sees two distinct operations, and **both run**: the customer is
//! credited twice. The only time that belongs in a key is a business period that the operation is
//! defined over (the month of the fee), never the moment the job happened to be created.
//!
//! # Encoding
//!
//! A key is made of a *kind* and one or more *parts*. The kind is a plain identifier (an ASCII
//! letter followed by ASCII letters, digits, `_`, `-` or `.`, at most [`MAX_KIND_LEN`] bytes).
//! Parts are arbitrary non-empty Unicode strings without NUL. The encoded form is the kind
//! followed by `:` and each escaped part; escaping turns `%` into `%25` and `:` into `%3A`, so
//! `("a:b", "c")` and `("a", "b:c")` encode to the distinct keys `k:a%3Ab:c` and `k:a:b%3Ac`. The
//! encoding is canonical: [`JobKey::parse`] accepts exactly the strings that [`JobKey::new`] can
//! produce, and the encoded form is at most [`MAX_KEY_LEN`] bytes. Equality and ordering compare
//! the encoded form.
//!
//! Hash business values that are long (or that you would rather not store in clear) with
//! `blake3` and put the hex digest in the key.
//!
//! # Example
//!
//! ```
//! use jobguard::JobKey;
//!
//! let credit = JobKey::new("credit", ["order-8812"])?;
//! assert_eq!(credit.as_str(), "credit:order-8812");
//! assert_eq!(credit.kind(), "credit");
//!
//! // A monthly fee: the period is part of the key.
//! let fee = JobKey::new("fee", ["account-7", "2026-10"])?;
//! assert_eq!(fee.to_string(), "fee:account-7:2026-10");
//! assert_eq!(fee.parts(), ["account-7", "2026-10"]);
//! assert_eq!(JobKey::parse("fee:account-7:2026-10")?, fee);
//!
//! // Separators inside parts are escaped, so keys stay unambiguous.
//! let a = JobKey::new("k", ["a:b", "c"])?;
//! let b = JobKey::new("k", ["a", "b:c"])?;
//! assert_eq!(a.as_str(), "k:a%3Ab:c");
//! assert_eq!(b.as_str(), "k:a:b%3Ac");
//! assert_ne!(a, b);
//!
//! // Long business values: hash them.
//! let manifest = "s3://imports/2026/10/02/batch-0001.csv ... (thousands of file names)";
//! let digest = blake3::hash(manifest.as_bytes()).to_hex();
//! let import = JobKey::new("import", ["manifest", digest.as_str()])?;
//! assert_eq!(import.as_str().len(), "import:manifest:".len() + 64);
//! # Ok::<(), jobguard::KeyError>(())
//! ```

pub(crate) use jobguard_core::key::check_kind;
#[doc(inline)]
pub use jobguard_core::key::{JobKey, KeyError, MAX_KEY_LEN, MAX_KIND_LEN};
