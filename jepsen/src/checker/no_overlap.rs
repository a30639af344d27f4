//! docs/DESIGN.md §5.2 and §5.4: of one key, at most one grant is valid at a time, and a client
//! that honours its `client_deadline` never overlaps another holder.
//!
//! Each acknowledged grant has a validity window ([`super::Window`]): from its acknowledgement
//! to the earliest of its client deadline (extended by timely renewals), its release, the moment
//! its holder learned it was lost, a revoke that displaced it, or the start of a client pause
//! of its holder (a paused client may act late; the fence is its safety net, checked by
//! `fenced_writes`, never the deadline). Windows of different grants of one key must not
//! overlap. Must not judge writes: acting after the window is what fencing is for.

use super::{Analysis, PropertyResult, WindowEnd, secs};

/// Checks that the validity windows of one key's grants are disjoint.
pub fn check(analysis: &Analysis) -> PropertyResult {
    let mut result = PropertyResult::new(
        "no_overlap",
        "DESIGN.md §5.2, §5.4",
        "Validity windows [ok, min(deadline, release, loss)] of different grants of one key \
         never overlap (paused clients excluded from the pause on).",
    );
    for (key, mut windows) in analysis.windows_by_key() {
        for w in &windows {
            if matches!(w.end_reason, WindowEnd::Paused | WindowEnd::PossiblyRevoked) {
                result.excused += 1;
            }
        }
        windows.retain(|w| w.end > w.start);
        windows.sort_by_key(|w| (w.start, w.end));
        let mut latest: Option<usize> = None;
        for (i, w) in windows.iter().enumerate() {
            result.checked += 1;
            if let Some(l) = latest {
                let prev = &windows[l];
                if w.start < prev.end {
                    let a = &analysis.grants[prev.grant];
                    let b = &analysis.grants[w.grant];
                    result.violate(
                        w.start,
                        Some(key),
                        format!(
                            "{key:?}: client {} (token {}) valid [{}, {}] overlaps client {} \
                             (token {}) valid [{}, {}] by {}",
                            a.process,
                            a.token,
                            secs(prev.start),
                            secs(prev.end),
                            b.process,
                            b.token,
                            secs(w.start),
                            secs(w.end),
                            secs(prev.end.min(w.end) - w.start)
                        ),
                    );
                }
                if w.end > prev.end {
                    latest = Some(i);
                }
            } else {
                latest = Some(i);
            }
        }
    }
    result
}
