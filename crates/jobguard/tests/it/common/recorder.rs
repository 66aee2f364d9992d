//! A metrics recorder of the test's own.

use std::future::Future;

use metrics_util::debugging::{DebuggingRecorder, Snapshot};

/// Runs `future` on a current-thread runtime with a fresh recorder installed on this thread
/// only (`metrics::with_local_recorder`), so the metrics of tests running at the same time stay
/// out; returns its output and what it recorded.
pub fn recorded<F: Future>(future: F) -> (F::Output, Snapshot) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let output = metrics::with_local_recorder(&recorder, || runtime.block_on(future));
    (output, snapshotter.snapshot())
}
