//! Pickup latency over a rolling window, in bounded memory: one HDR histogram (3 significant
//! figures, microseconds up to an hour) per second of the window, the oldest reused as the
//! window moves on.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// The latencies recorded over the last `span`, to within a second.
pub struct Window {
    /// One histogram per second, with the second it holds (counted from `origin`).
    slots: Vec<(u64, Histogram<u64>)>,
    origin: Instant,
}

impl Window {
    /// An empty window over `span` (at least a second).
    pub fn new(span: Duration) -> Self {
        let seconds = span.as_secs().max(1) as usize;
        let slot = || Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds");
        Window {
            slots: (0..seconds).map(|_| (u64::MAX, slot())).collect(),
            origin: Instant::now(),
        }
    }

    fn second(&self) -> u64 {
        self.origin.elapsed().as_secs()
    }

    /// Records one latency, in microseconds (clamped into the histogram's range).
    pub fn record(&mut self, micros: u64) {
        let second = self.second();
        let len = self.slots.len() as u64;
        let (held, histogram) = &mut self.slots[(second % len) as usize];
        if *held != second {
            histogram.reset();
            *held = second;
        }
        histogram.saturating_record(micros.max(1));
    }

    /// The quantiles `qs` of the latencies in the window, in milliseconds; 0 when it is empty.
    pub fn quantiles_ms<const N: usize>(&self, qs: [f64; N]) -> [f64; N] {
        let now = self.second();
        let len = self.slots.len() as u64;
        let mut merged = Histogram::<u64>::new_from(&self.slots[0].1);
        for (held, histogram) in &self.slots {
            if *held != u64::MAX && now.saturating_sub(*held) < len {
                merged.add(histogram).expect("same bounds");
            }
        }
        if merged.is_empty() {
            return [0.0; N];
        }
        qs.map(|q| merged.value_at_quantile(q) as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::Window;
    use std::time::Duration;

    #[test]
    fn quantiles_of_what_was_recorded() {
        let mut window = Window::new(Duration::from_secs(30));
        assert_eq!(window.quantiles_ms([0.5]), [0.0]);
        for micros in 1..=1000 {
            window.record(micros * 10);
        }
        let [p50, p99] = window.quantiles_ms([0.50, 0.99]);
        assert!((p50 - 5.0).abs() < 0.01, "{p50}");
        assert!((p99 - 9.9).abs() < 0.01, "{p99}");
    }
}
