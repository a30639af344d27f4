//! docs/DESIGN.md §5.1 (INV-04): per key, tokens increase in grant order.
//!
//! "Grant order" is real-time order as the history can see it: if one acquire of a key was
//! acknowledged before another acquire of that key was invoked, the first grant precedes the
//! second, so its token must be smaller. Concurrent acquires are not ordered and not compared.
//! An acknowledged force-revoke orders the same way: every acquire invoked after it completed
//! must get a token above its `new_token_floor` (FR-08). Must not compare across keys.

use std::collections::BTreeMap;

use super::{Analysis, PropertyResult, secs};
use crate::history::OpType;

/// Something that fixed a lower bound for later tokens of a key.
struct Floor {
    at: u64,
    token: u64,
    what: String,
}

/// Checks real-time token order per key.
pub fn check(analysis: &Analysis) -> PropertyResult {
    let mut result = PropertyResult::new(
        "token_order",
        "DESIGN.md §5.1",
        "Per key, a grant acknowledged before another acquire began has the smaller token; \
         a grant after an acknowledged revoke is above its floor.",
    );
    let mut floors: BTreeMap<&str, Vec<Floor>> = BTreeMap::new();
    let mut acquires: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (g, grant) in analysis.grants.iter().enumerate() {
        floors.entry(&grant.key).or_default().push(Floor {
            at: grant.ok_t,
            token: grant.token,
            what: format!(
                "client {}'s grant with token {} acknowledged at {}",
                grant.process,
                grant.token,
                secs(grant.ok_t)
            ),
        });
        acquires.entry(&grant.key).or_default().push(g);
    }
    for r in &analysis.revokes {
        if r.outcome == OpType::Ok
            && let Some(floor) = r.new_token_floor
        {
            floors.entry(&r.key).or_default().push(Floor {
                at: r.complete_t,
                token: floor,
                what: format!(
                    "a revoke acknowledged at {} with token floor {floor}",
                    secs(r.complete_t)
                ),
            });
        }
    }
    for (key, mut grants) in acquires {
        let mut key_floors = floors.remove(key).unwrap_or_default();
        key_floors.sort_by_key(|f| f.at);
        grants.sort_by_key(|&g| analysis.grants[g].invoke_t);
        let mut next = 0;
        let mut highest: Option<usize> = None;
        for g in grants {
            let grant = &analysis.grants[g];
            while next < key_floors.len() && key_floors[next].at < grant.invoke_t {
                if highest.is_none_or(|h| key_floors[next].token > key_floors[h].token) {
                    highest = Some(next);
                }
                next += 1;
            }
            result.checked += 1;
            if let Some(h) = highest
                && key_floors[h].token >= grant.token
            {
                result.violate(
                    grant.ok_t,
                    Some(key),
                    format!(
                        "{key:?}: client {} acquired at {} and got token {}, not above {}",
                        grant.process,
                        secs(grant.invoke_t),
                        grant.token,
                        key_floors[h].what
                    ),
                );
            }
        }
    }
    result
}
