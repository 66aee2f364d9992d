//! The choices of the fault runs: a seedable generator, and its seed.

use std::time::Duration;

/// SplitMix64: small, seedable, and the same on every platform.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True with probability `percent` in 100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A duration from `low_ms` to `high_ms` milliseconds.
    pub fn millis(&mut self, low_ms: u64, high_ms: u64) -> Duration {
        Duration::from_millis(low_ms + self.below(high_ms - low_ms + 1))
    }
}

/// The seed: `JOBGUARD_CHAOS_SEED`, or drawn from the clock. Tests print it, so that a failed
/// run can be replayed.
pub fn seed() -> u64 {
    match std::env::var("JOBGUARD_CHAOS_SEED") {
        Ok(text) if !text.trim().is_empty() => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("JOBGUARD_CHAOS_SEED={text} is not a number")),
        _ => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            now.as_nanos() as u64 ^ u64::from(std::process::id())
        }
    }
}
