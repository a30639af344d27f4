//! docs/DESIGN.md §5.3: what was acknowledged stays true across a leader crash or restart — an
//! acknowledged grant is still held until it is released, expires or is revoked, and an
//! acknowledged release or revoke stays done.
//!
//! The history shows a lost grant when its holder hears so *before its client deadline* (the
//! server's expiry is never earlier, FR-11) and no revoke can explain it: a renewal answered
//! "lost", a release answered "not released", or a write fenced out by a newer token (a newer
//! grant was then made while this one was valid). It shows a revived grant when a renewal
//! succeeds after the grant's release or revoke was acknowledged. Answers that arrive after the
//! deadline say nothing (the lease may simply have run out), and must not be judged here.

use super::{Analysis, PropertyResult, secs};
use crate::history::{ERROR_FENCED, ERROR_LOST, F, OpType};

/// Checks that no acknowledged grant, release or revoke is lost.
pub fn check(analysis: &Analysis) -> PropertyResult {
    let mut result = PropertyResult::new(
        "no_lost_grants",
        "DESIGN.md §5.3",
        "An acknowledged grant stays held until released, expired or revoked (across \
         failovers); an acknowledged release or revoke stays done.",
    );
    for grant in &analysis.grants {
        result.checked += 1;
        let deadline = analysis.effective_deadline(grant);
        let mut done_at: Option<(u64, String)> = None;
        for r in &analysis.revokes {
            if r.key == grant.key
                && r.outcome == OpType::Ok
                && r.previous_token == Some(grant.token)
            {
                done_at = Some((r.complete_t, "revoked".into()));
            }
        }
        let mut ops: Vec<usize> = grant.ops.clone();
        ops.sort_by_key(|&i| analysis.client_ops[i].invoke_t);
        for i in ops {
            let cop = &analysis.client_ops[i];
            let lost_answer = match (cop.f, cop.outcome) {
                (F::Renew, OpType::Fail) => cop.error() == Some(ERROR_LOST),
                (F::Release, OpType::Ok) => {
                    cop.completion.as_ref().and_then(|c| c.released) == Some(false)
                }
                (F::Write, OpType::Fail) => cop.error() == Some(ERROR_FENCED),
                _ => false,
            };
            if lost_answer && cop.complete_t < deadline {
                if analysis
                    .possibly_revoked_before(&grant.key, grant.token, cop.complete_t)
                    .is_some()
                {
                    result.excused += 1;
                } else {
                    result.violate(
                        cop.complete_t,
                        Some(&grant.key),
                        format!(
                            "{:?}: client {}'s grant (token {}, acknowledged at {}, valid until \
                             {}) was answered lost by its {} at {} with no revoke",
                            grant.key,
                            grant.process,
                            grant.token,
                            secs(grant.ok_t),
                            secs(deadline),
                            cop.f.name(),
                            secs(cop.complete_t)
                        ),
                    );
                }
            }
            if cop.f == F::Renew
                && cop.outcome == OpType::Ok
                && let Some((t, what)) = &done_at
                && cop.invoke_t > *t
            {
                result.violate(
                    cop.complete_t,
                    Some(&grant.key),
                    format!(
                        "{:?}: client {}'s grant (token {}) was {what} (acknowledged at {}) but \
                         a renewal invoked at {} succeeded",
                        grant.key,
                        grant.process,
                        grant.token,
                        secs(*t),
                        secs(cop.invoke_t)
                    ),
                );
            }
            if cop.f == F::Release
                && cop.outcome == OpType::Ok
                && cop.completion.as_ref().and_then(|c| c.released) == Some(true)
                && done_at.is_none()
            {
                done_at = Some((cop.complete_t, "released".into()));
            }
        }
    }
    result
}
