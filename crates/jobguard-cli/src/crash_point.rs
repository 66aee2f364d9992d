//! The line a process prints where the process that started it kills it: the demo's worker and
//! consumer processes, and `jobguard consume` with the crash flags of a `faults` build.

/// What a process prints at its crash point (right after a job committed and before its ack,
/// or before its commit); the process that started it kills it there.
pub const CRASH_POINT: &str = "JOBGUARD_CRASH_POINT";

/// Prints `line` for the process that started this one, at once: this process may be killed
/// right after.
pub fn report_line(line: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}
