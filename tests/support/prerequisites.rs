//! What a suite does when this machine lacks something it needs: it fails, saying what is missing
//! and how to get it, as controller-runtime's envtest does; a suite green with every scenario
//! skipped would prove nothing. Only an explicit opt-out skips: `SKIP_TEST_SUITES` names the
//! suites, comma-separated (`envtest`, `garbage-collector`, `cluster`, `mpi-launchers`,
//! `manifests`, `helm`), and each skipping suite says so once on stderr. `.ci/run` refuses the
//! variable.

use std::io::Write as _;

/// The opt-out variable.
pub const SKIP_VARIABLE: &str = "SKIP_TEST_SUITES";

/// Whether `SKIP_TEST_SUITES` names `suite`.
pub fn opted_out(suite: &str) -> bool {
    std::env::var(SKIP_VARIABLE).is_ok_and(|names| names.split(',').any(|n| n.trim() == suite))
}

/// `suite` lacks `missing`: one line on stderr (once per `notice`) when the user opted out of
/// it, so the caller skips; else a panic that says what is missing, how to get it (`hint`) and
/// how to opt out.
///
/// # Panics
/// Unless `SKIP_TEST_SUITES` names `suite`.
pub fn skip_or_fail(suite: &str, missing: &str, hint: &str, notice: &std::sync::Once) {
    assert!(
        opted_out(suite),
        "{suite}: {missing}; {hint} (or skip these tests with {SKIP_VARIABLE}={suite})"
    );
    notice.call_once(|| {
        // Straight to stderr, not through the test harness's capture, so it is seen.
        let _ = writeln!(
            std::io::stderr(),
            "{suite}: skipped ({SKIP_VARIABLE}={suite}): {missing}"
        );
    });
}
