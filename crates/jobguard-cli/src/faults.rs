//! The crash flags of `jobguard consume`, in a build with the `faults` feature only (the fault
//! tests' build, `cargo test --features faults`): they stop the consumer, through the library's
//! fault-injection hooks, where the test kills it with SIGKILL.

use clap::Args;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use jobguard::broker::Consumer;
use jobguard::{Backend, JobKey, Outcome};

use crate::crash_point::{CRASH_POINT, report_line};

/// `--crash-after-commit` and `--crash-before-commit`.
#[derive(Args, Debug)]
pub struct CrashArgs {
    /// After the first job's commit, print JOBGUARD_CRASH_POINT and the job's key and wait to be
    /// killed, never acknowledging its message.
    #[arg(long)]
    crash_after_commit: bool,
    /// After the first transaction's effects and before its commit, print JOBGUARD_CRASH_POINT,
    /// how many keys the transaction claimed and which, and wait to be killed, never
    /// committing.
    #[arg(long, conflicts_with = "crash_after_commit")]
    crash_before_commit: bool,
}

impl CrashArgs {
    /// `consumer` with the hooks the flags ask for.
    pub fn install<DB: Backend>(&self, mut consumer: Consumer<DB>) -> Consumer<DB> {
        if self.crash_after_commit {
            consumer = consumer.before_ack(crash_after_commit);
        }
        if self.crash_before_commit {
            consumer = consumer.before_commit(crash_before_commit);
        }
        consumer
    }
}

/// Between a job's commit and its ack: after the first applied job, prints [`CRASH_POINT`] and
/// waits there to be killed.
fn crash_after_commit(key: &JobKey, outcome: &Outcome<()>) -> BoxFuture<'static, ()> {
    if outcome.is_applied() {
        report_line(&format!("{CRASH_POINT} {key}"));
        return std::future::pending().boxed();
    }
    std::future::ready(()).boxed()
}

/// Between a transaction's effects and its commit: prints [`CRASH_POINT`] with how many keys
/// the transaction claimed and which, and waits there to be killed.
fn crash_before_commit(keys: Vec<JobKey>) -> BoxFuture<'static, ()> {
    let keys: Vec<String> = keys.iter().map(ToString::to_string).collect();
    report_line(&format!("{CRASH_POINT} {} {}", keys.len(), keys.join(" ")));
    std::future::pending().boxed()
}
