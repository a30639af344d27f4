//! docs/DESIGN.md §5.2, for membership changes: a voter the membership nemesis removed never
//! answers as leader once its removal took effect — a removed node that still led could grant
//! a key the real leader grants too.
//!
//! The nemesis asks the removed node for its status while the fault holds and writes into the
//! heal's `leader_answers` every answer "leader" given later than its grace after the removal
//! (openraft lets a removed leader hand over first) or in a term above the one it was removed
//! in (see [`crate::nemesis::membership`]). Each such answer is a violation. A removal whose
//! heal is missing or could not be watched is excused.

use super::{PropertyResult, secs};
use crate::checker::Analysis;
use crate::history::{F, Outcome};

/// Checks the membership faults' leader answers.
pub fn check(analysis: &Analysis) -> PropertyResult {
    let mut result = PropertyResult::new(
        "removed_not_leader",
        "DESIGN.md §5.2",
        "A voter removed from the membership never answers as leader after its removal took \
         effect.",
    );
    let mut probes = 0;
    for fault in analysis
        .faults
        .iter()
        .filter(|f| f.f == F::Membership && f.start_outcome == Outcome::Installed)
    {
        let node = fault.value.get("removed").and_then(|v| v.as_u64());
        let Some(answers) = fault
            .heal_value
            .get("leader_answers")
            .and_then(|a| a.as_array())
        else {
            result.excused += 1;
            continue;
        };
        result.checked += 1;
        probes += fault
            .heal_value
            .get("probes")
            .and_then(|p| p.as_u64())
            .unwrap_or(0);
        for answer in answers {
            let t_ns = answer
                .get("t_ns")
                .and_then(|t| t.as_u64())
                .unwrap_or(fault.start_t);
            result.violate(
                t_ns,
                None,
                format!(
                    "node {} answered as leader (term {}) at {}, {} ms after its removal at {}",
                    node.map_or("?".to_owned(), |n| n.to_string()),
                    answer.get("term").map_or("?".to_owned(), |t| t.to_string()),
                    secs(t_ns),
                    answer
                        .get("after_removal_ms")
                        .map_or("?".to_owned(), |t| t.to_string()),
                    secs(fault.start_t)
                ),
            );
        }
    }
    result.note = Some(if result.checked == 0 {
        "no membership change in this run".to_owned()
    } else {
        format!(
            "{} removals watched, {probes} status answers from removed nodes",
            result.checked
        )
    });
    result
}
