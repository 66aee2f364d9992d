//! `jobguard bench`: what the guard costs ([`guard`]), how fast the worker drains the queue
//! ([`queue`]), and what pruning and a big guard table cost the jobs that run meanwhile
//! ([`prune`]), what enqueueing in batches saves ([`enqueue`]), when running jobs in batches
//! pays ([`contention`]), and what batches save a broker consumer ([`brokers`]).

pub mod brokers;
pub mod contention;
pub mod enqueue;
pub mod guard;
pub mod prune;
pub mod queue;
