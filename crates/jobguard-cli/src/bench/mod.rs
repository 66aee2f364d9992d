//! `jobguard bench`: what the guard costs ([`guard`]), how fast the worker drains the queue
//! ([`queue`]), and what pruning and a big guard table cost the jobs that run meanwhile
//! ([`prune`]), what enqueueing in batches saves ([`enqueue`]), when running jobs in batches
//! pays ([`contention`]), what batches save a broker consumer ([`brokers`]), and jobguard as a
//! system of the public cross-system queue benchmark ([`adapter`]), and whether the tables level
//! off under a steady load with pruning ([`soak`]).

pub mod adapter;
pub mod brokers;
pub mod contention;
pub mod enqueue;
pub mod guard;
pub(crate) mod jobs;
pub mod prune;
pub mod queue;
pub mod soak;

/// The middle value of `values`, or the mean of the two middle ones; 0 for none.
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_and_even_rounds() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
