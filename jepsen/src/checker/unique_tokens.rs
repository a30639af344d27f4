//! docs/DESIGN.md §5.1 (INV-04, FR-02): a fencing token is never issued twice, and never zero.
//!
//! Reads only acknowledged acquires: an acquire whose outcome is unknown may have taken a token
//! the history never saw, which cannot be a duplicate of a seen one without the cluster also
//! acknowledging that duplicate. Must not consider renewals (a renewal keeps its token).

use std::collections::HashMap;

use super::{Analysis, PropertyResult, secs};

/// Checks that no two acknowledged grants carry the same token, across all keys.
pub fn check(analysis: &Analysis) -> PropertyResult {
    let mut result = PropertyResult::new(
        "unique_tokens",
        "DESIGN.md §5.1",
        "A fencing token is never issued twice (and is never 0).",
    );
    let mut first: HashMap<u64, usize> = HashMap::new();
    for (g, grant) in analysis.grants.iter().enumerate() {
        result.checked += 1;
        if grant.token == 0 {
            result.violate(
                grant.ok_t,
                Some(&grant.key),
                format!(
                    "client {} was granted {:?} with token 0 at {}",
                    grant.process,
                    grant.key,
                    secs(grant.ok_t)
                ),
            );
            continue;
        }
        if let Some(&earlier) = first.get(&grant.token) {
            let e = &analysis.grants[earlier];
            result.violate(
                grant.ok_t,
                Some(&grant.key),
                format!(
                    "token {} granted twice: to client {} on {:?} at {} and to client {} on {:?} at {}",
                    grant.token,
                    e.process,
                    e.key,
                    secs(e.ok_t),
                    grant.process,
                    grant.key,
                    secs(grant.ok_t)
                ),
            );
        } else {
            first.insert(grant.token, g);
        }
    }
    result
}
