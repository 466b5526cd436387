//! Tests that ran nothing because their server is not configured, counted per reason and
//! reported once per test binary, after the runner's own summary.
//!
//! libtest has no way for a test to mark itself ignored once it runs, so a backend test
//! without its server passes, and its "skipped" line is captured with its output. So that
//! a run without servers does not read as a full pass, each skip is counted here, and the
//! first one registers a handler (C `atexit`) that prints, when the test binary exits, one
//! line per reason:
//!
//! ```text
//! skipped: 53 tests of this binary ran nothing: IDEM_TEST_POSTGRES_URL is not set
//! ```

use std::collections::BTreeMap;
use std::sync::{Mutex, Once};

static SKIPS: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());
static REPORT_AT_EXIT: Once = Once::new();

/// Records that the calling test ran nothing, for `reason` (for example
/// `"IDEM_TEST_POSTGRES_URL is not set"`), and prints that it was skipped.
///
/// When the test binary exits, one line per reason says how many of its tests were
/// skipped, after libtest's `test result:` line, where a run's reader looks. Tests that
/// decide on their own that they cannot run (no binary to start a server with, say) call
/// this too, so that their skips are counted with the others.
///
/// # Panics
///
/// When `IDEM_REQUIRE_BACKENDS=1` (as in CI): there, a test that would run nothing is a
/// failure, whatever its reason.
pub fn skip(reason: &str) {
    if std::env::var("IDEM_REQUIRE_BACKENDS").as_deref() == Ok("1") {
        panic!("IDEM_REQUIRE_BACKENDS=1, but this test would be skipped: {reason}");
    }
    note_skip(reason);
}

/// Counts and prints a skip (what [`skip`] does once it has decided to skip).
fn note_skip(reason: &str) {
    eprintln!("skipped: {reason}");
    if let Ok(mut skips) = SKIPS.lock() {
        *skips.entry(reason.to_owned()).or_default() += 1;
    }
    REPORT_AT_EXIT.call_once(register_report);
}

/// The number of tests skipped so far in this process, for `reason`.
#[doc(hidden)]
pub fn skipped(reason: &str) -> usize {
    SKIPS
        .lock()
        .map(|skips| skips.get(reason).copied().unwrap_or(0))
        .unwrap_or(0)
}

/// The lines printed at exit, one per reason, most skipped first.
fn report_lines() -> Vec<String> {
    // `try_lock`: at exit no test runs, but a test thread that panicked holding the lock
    // must not hang the process.
    let Ok(skips) = SKIPS.try_lock() else {
        return Vec::new();
    };
    let mut rows: Vec<(&String, &usize)> = skips.iter().collect();
    rows.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    rows.into_iter()
        .map(|(reason, n)| {
            let tests = if *n == 1 { "test" } else { "tests" };
            format!("skipped: {n} {tests} of this binary ran nothing: {reason}")
        })
        .collect()
}

extern "C" fn report_at_exit() {
    let lines = report_lines();
    if lines.is_empty() {
        return;
    }
    eprintln!();
    for line in lines {
        eprintln!("{line}");
    }
    eprintln!("(set the variables, or IDEM_REQUIRE_BACKENDS=1 to make a skip fail)");
}

#[cfg(any(unix, windows))]
#[allow(unsafe_code)]
fn register_report() {
    extern "C" {
        // The C standard library's `atexit`, in every libc and the MSVC runtime: runs the
        // handler when the process exits, by returning from `main` or by
        // `std::process::exit` (which libtest calls when a test failed).
        fn atexit(handler: extern "C" fn()) -> std::os::raw::c_int;
    }
    // SAFETY: `report_at_exit` is an `extern "C" fn()` that takes no arguments, does not
    // unwind (it only formats and writes to stderr, and never blocks on a lock), and stays
    // valid for the life of the process, which is what `atexit` asks of its handler.
    unsafe {
        atexit(report_at_exit);
    }
}

#[cfg(not(any(unix, windows)))]
fn register_report() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_are_counted_per_reason_and_reported_most_first() {
        note_skip("UNIT_TEST_A is not set");
        note_skip("UNIT_TEST_B is not set");
        note_skip("UNIT_TEST_B is not set");
        assert_eq!(skipped("UNIT_TEST_A is not set"), 1);
        assert_eq!(skipped("UNIT_TEST_B is not set"), 2);
        let lines = report_lines();
        let b = lines
            .iter()
            .position(|l| {
                l == "skipped: 2 tests of this binary ran nothing: UNIT_TEST_B is not set"
            })
            .expect("a line for B");
        let a = lines
            .iter()
            .position(|l| l == "skipped: 1 test of this binary ran nothing: UNIT_TEST_A is not set")
            .expect("a line for A");
        assert!(b < a, "most skipped first: {lines:?}");
        // Not real skips: this binary's exit summary must not report them.
        SKIPS
            .lock()
            .unwrap()
            .retain(|reason, _| !reason.starts_with("UNIT_TEST_"));
        assert!(report_lines().is_empty(), "{:?}", report_lines());
    }

    /// In the child process only (see below): one skipped test.
    #[test]
    fn child_that_skips() {
        if std::env::var_os("IDEM_SKIPS_CHILD").is_some() {
            skip("IDEM_SKIPS_CHILD_URL is not set");
        }
    }

    /// Runs this test binary again with only `child_that_skips`, and reads what it printed:
    /// the summary line comes after libtest's `test result:` line, in the exit handler.
    #[test]
    fn the_binary_reports_its_skips_after_the_runner_summary() {
        let exe = std::env::current_exe().expect("the test binary's path");
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "testing::skips::tests::child_that_skips",
                "--test-threads=1",
            ])
            .env("IDEM_SKIPS_CHILD", "1")
            .env_remove("IDEM_REQUIRE_BACKENDS")
            .output()
            .expect("run the test binary again");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "child failed: {stdout}\n{stderr}");
        assert!(
            stdout.contains("1 passed"),
            "the child ran the one test: {stdout}"
        );
        assert!(
            stderr.contains(
                "skipped: 1 test of this binary ran nothing: IDEM_SKIPS_CHILD_URL is not set"
            ),
            "the exit summary names the count and the reason: {stderr}"
        );
    }
}
