//! docs/DESIGN.md §3.2 and §5.3, for damaged disks: a node whose newest WAL segment or
//! snapshot file the corrupt nemesis damaged either starts (the damage was a torn tail it cut,
//! or data it can do without) or refuses to start and names the damaged file, so an operator
//! knows what to rebuild. A refusal that does not name the file is a violation; starting on
//! data it should have refused is for the other properties to catch (a node that serves lost
//! acknowledged state shows as lost grants or token reuse).
//!
//! The power-cut nemesis's restarts are judged the same way: a node that lost its unsynced
//! writes either recovers or refuses naming the file (which the WAL's recovery rule should
//! only do for damage to acknowledged data).
//!
//! The heal's `result` says which happened (see [`crate::nemesis::corrupt`]); a restart that
//! neither got ready nor exited is a harness-level unknown, counted as excused.

use super::{PropertyResult, secs};
use crate::checker::Analysis;
use crate::history::{F, Outcome};

/// Checks the corrupt faults' outcomes.
pub fn check(analysis: &Analysis) -> PropertyResult {
    let mut result = PropertyResult::new(
        "damage_detected",
        "DESIGN.md §3.2, §5.3",
        "A node with a damaged WAL segment or snapshot, or that lost its unsynced writes, \
         starts, or refuses naming the file.",
    );
    let (mut recovered, mut refused) = (0, 0);
    for fault in analysis.faults.iter().filter(|f| {
        matches!(f.f, F::Corrupt | F::PowerCut) && f.start_outcome == Outcome::Installed
    }) {
        let heal = &fault.heal_value;
        match heal.get("result").and_then(|r| r.as_str()) {
            Some("recovered") => {
                recovered += 1;
                result.checked += 1;
            }
            Some("refused-rebuilt" | "refused-not-rebuilt") => {
                refused += 1;
                result.checked += 1;
                if heal.get("named_file").and_then(|n| n.as_bool()) != Some(true) {
                    result.violate(
                        fault.heal_t.unwrap_or(fault.start_t),
                        None,
                        format!(
                            "node {} refused to start at {} after {} of {} without naming the \
                             file; its log: {}",
                            fault
                                .value
                                .get("node")
                                .map_or("?".to_owned(), |n| n.to_string()),
                            secs(fault.heal_t.unwrap_or(fault.start_t)),
                            fault
                                .value
                                .pointer("/what/damage")
                                .and_then(|d| d.as_str())
                                .unwrap_or("damage"),
                            fault
                                .value
                                .get("file")
                                .and_then(|f| f.as_str())
                                .unwrap_or("?"),
                            heal.get("log").and_then(|l| l.as_str()).unwrap_or("")
                        ),
                    );
                }
            }
            _ => result.excused += 1,
        }
    }
    result.note = Some(if result.checked == 0 {
        "no damaged node restarted in this run".to_owned()
    } else {
        format!("{recovered} recovered, {refused} refused (and were rebuilt under a new id)")
    });
    result
}
