//! Transparent huge pages off for a node's process, unless its operator asks for them.
//!
//! Where the kernel's transparent huge pages are `always` on (as on the machines lockd is
//! measured on), every 2 MiB region of the allocator's arena that anything touches is faulted
//! in whole. mimalloc spreads its small pages (one per size class and thread) across its arena,
//! so a node paid for whole huge pages it used a few KiB of: an idle node held 53 MiB of huge
//! pages and 54 MiB of anonymous memory in all, 34 MiB with this module's call. At a million
//! held locks W5 measured 461–489 MiB per node, peak 502–530, with them and 433–452 MiB, peak
//! 470–481, without, with W1 and W3 unchanged within the run-to-run noise
//! (docs/PERFORMANCE.md, "Session 16").
//!
//! So `lockd run` turns them off for its process before its runtime starts or its state
//! loads (`prctl(PR_SET_THP_DISABLE)`, which is mimalloc's own `MIMALLOC_ALLOW_THP=0`). An
//! operator who wants them sets `MIMALLOC_ALLOW_THP=1`.

/// The variable that keeps huge pages on when it is `1` (mimalloc's own option).
pub const ALLOW_VAR: &str = "MIMALLOC_ALLOW_THP";

/// What [`disable_unless_allowed`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum HugePages {
    /// Turned off for this process.
    Off,
    /// Left as the kernel has them: the operator set [`ALLOW_VAR`] to `1`.
    Allowed,
    /// The kernel refused (a kernel without the call, or a sandbox that forbids it): left on.
    Refused(String),
}

/// Turns transparent huge pages off for this process unless `allow` (the value of
/// [`ALLOW_VAR`]) is `1`.
pub fn disable_unless_allowed(allow: Option<&str>) -> HugePages {
    if allow.map(str::trim) == Some("1") {
        return HugePages::Allowed;
    }
    match rustix::thread::disable_transparent_huge_pages(true) {
        Ok(()) => HugePages::Off,
        Err(e) => HugePages::Refused(e.to_string()),
    }
}

/// Logs what [`disable_unless_allowed`] did: a line only when it is not the default.
pub fn log(outcome: &HugePages) {
    match outcome {
        HugePages::Off => tracing::debug!("transparent huge pages off for this process"),
        HugePages::Allowed => tracing::info!(
            "transparent huge pages left on ({ALLOW_VAR}=1): resident memory may be higher"
        ),
        HugePages::Refused(error) => tracing::warn!(
            %error,
            "cannot turn transparent huge pages off; resident memory may be higher"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the process's THP-disable flag (`/proc/self/status`, `THP_enabled`).
    fn thp_enabled() -> Option<bool> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("THP_enabled:"))?;
        Some(line.split_whitespace().nth(1)? == "1")
    }

    #[test]
    fn an_operator_who_allows_them_keeps_them() {
        assert_eq!(disable_unless_allowed(Some("1")), HugePages::Allowed);
        assert_eq!(disable_unless_allowed(Some(" 1\n")), HugePages::Allowed);
    }

    /// Turns them off for the test process (harmless: it only changes how its memory is
    /// faulted in), and the kernel then reports them off.
    #[test]
    fn otherwise_they_are_turned_off_and_the_kernel_says_so() {
        for allow in [None, Some("0"), Some("yes")] {
            let outcome = disable_unless_allowed(allow);
            assert!(
                matches!(outcome, HugePages::Off | HugePages::Refused(_)),
                "{outcome:?}"
            );
            if outcome == HugePages::Off
                && let Some(enabled) = thp_enabled()
            {
                assert!(!enabled, "the kernel still has them on after {allow:?}");
            }
        }
    }
}
