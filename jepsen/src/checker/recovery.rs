//! docs/DESIGN.md §5.5: with a majority up and connected every operation completes; a new leader is
//! in place within a few election timeouts of losing the old one.
//!
//! Checked as: once the last fault has healed (time H), every key the workload uses sees a
//! granted acquire within the bound, i.e. in (H, H + bound]. Pass if every key does; fail if a
//! key does not and the history runs past H + bound; unknown if the history ends too early or
//! a fault never healed. Must not judge the faulty period itself: unavailability during a
//! fault is allowed.

use std::collections::BTreeMap;

use super::{Analysis, CheckConfig, PropertyResult, Status, secs};
use crate::history::{F, OpType};

/// Checks recovery after the last heal.
pub fn check(analysis: &Analysis, config: &CheckConfig) -> PropertyResult {
    let mut result = PropertyResult::new(
        "recovery",
        "DESIGN.md §5.5",
        "After the last fault heals, acquires of every key succeed again within the bound.",
    );
    if let Some(open) = analysis
        .faults
        .iter()
        .find(|f| f.took_effect() && f.heal_t.is_none())
    {
        result.status = Status::Unknown;
        result.note = Some(format!(
            "{} started at {} never healed",
            open.f.name(),
            secs(open.start_t)
        ));
        return result;
    }
    let healed = analysis
        .faults
        .iter()
        .filter(|f| f.took_effect())
        .filter_map(|f| f.heal_t)
        .max()
        .unwrap_or(0);
    let limit = healed.saturating_add(config.recovery_bound_ns);
    let mut first_ok: BTreeMap<&str, Option<u64>> = BTreeMap::new();
    for cop in &analysis.client_ops {
        if cop.f != F::Acquire {
            continue;
        }
        let entry = first_ok.entry(cop.key.as_str()).or_default();
        if cop.outcome == OpType::Ok && cop.complete_t > healed && cop.complete_t <= limit {
            *entry = Some(entry.map_or(cop.complete_t, |t| t.min(cop.complete_t)));
        }
    }
    if first_ok.is_empty() {
        result.status = Status::Unknown;
        result.note = Some("the history has no acquires".into());
        return result;
    }
    let mut slowest = 0;
    let mut missing = Vec::new();
    for (key, ok) in &first_ok {
        result.checked += 1;
        match ok {
            Some(t) => slowest = slowest.max(t - healed),
            None => missing.push(*key),
        }
    }
    if missing.is_empty() {
        result.note = Some(format!(
            "last heal at {}; every key granted again within {}",
            secs(healed),
            secs(slowest)
        ));
    } else if analysis.end_t < limit {
        result.status = Status::Unknown;
        result.note = Some(format!(
            "last heal at {}; the history ends at {}, before the bound {} ran out, with keys \
             {missing:?} not yet granted",
            secs(healed),
            secs(analysis.end_t),
            secs(config.recovery_bound_ns)
        ));
    } else {
        for key in missing {
            result.violate(
                limit,
                Some(key),
                format!(
                    "{key:?}: no acquire granted within {} of the last heal at {}",
                    secs(config.recovery_bound_ns),
                    secs(healed)
                ),
            );
        }
    }
    result
}
