//! A payment provider over HTTP, for jobguard's tests and demo.
