//! The line a demo consumer process prints right after a job committed and before its ack, so
//! that the process that started it can kill it there.

/// What a consumer process prints right after a job committed and before its ack; the process
/// that started it kills it there.
pub const CRASH_POINT: &str = "JOBGUARD_CRASH_POINT";

/// Prints `line` for the process that started this one, at once: this process may be killed
/// right after.
pub fn report_line(line: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}
