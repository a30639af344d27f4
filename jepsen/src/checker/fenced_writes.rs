//! docs/DESIGN.md §5.1 and §5.4 (C2 §2.4, INV-04): the fenced register accepted writes in strictly
//! increasing token order per key, and every accepted token was granted to its writer.
//!
//! The register is the harness's own resource, applying C2's rule (`lock_api::Fence`: accept iff
//! presented > stored). It appends each write's completion while holding its lock, so the order
//! of completion lines in the history is the order it applied them. This property is the safety
//! net for paused and partitioned holders: acting late is allowed, being accepted out of order
//! is not. A fenced-out write must report the last accepted token, and it must be at least its
//! own.

use std::collections::{BTreeMap, HashSet};

use super::{Analysis, PropertyResult, secs};
use crate::history::{ERROR_FENCED, F, OpType};

/// Checks accepted writes per key.
pub fn check(analysis: &Analysis) -> PropertyResult {
    let mut result = PropertyResult::new(
        "fenced_writes",
        "DESIGN.md §5.1, §5.4",
        "Per key, accepted writes' tokens strictly increase in apply order, and each was \
         granted to its writer before the write.",
    );
    let granted: HashSet<(u32, &str, u64)> = analysis
        .grants
        .iter()
        .map(|g| (g.process, g.key.as_str(), g.token))
        .collect();
    let grant_time: BTreeMap<(u32, &str, u64), u64> = analysis
        .grants
        .iter()
        .map(|g| ((g.process, g.key.as_str(), g.token), g.ok_t))
        .collect();
    let mut writes: Vec<usize> = (0..analysis.client_ops.len())
        .filter(|&i| analysis.client_ops[i].f == F::Write)
        .collect();
    writes.sort_by_key(|&i| analysis.client_ops[i].complete_index);
    let mut last: BTreeMap<&str, (u64, u32)> = BTreeMap::new();
    for i in writes {
        let w = &analysis.client_ops[i];
        let Some(token) = w.token else { continue };
        match w.outcome {
            OpType::Ok => {
                result.checked += 1;
                let id = (w.process, w.key.as_str(), token);
                if !granted.contains(&id) {
                    result.violate(
                        w.complete_t,
                        Some(&w.key),
                        format!(
                            "{:?}: write by client {} with token {token} accepted at {}, but \
                             that token was never granted to it",
                            w.key,
                            w.process,
                            secs(w.complete_t)
                        ),
                    );
                } else if grant_time.get(&id).is_some_and(|&ok| ok > w.invoke_t) {
                    result.violate(
                        w.complete_t,
                        Some(&w.key),
                        format!(
                            "{:?}: client {} wrote with token {token} at {} before the grant \
                             was acknowledged",
                            w.key,
                            w.process,
                            secs(w.invoke_t)
                        ),
                    );
                }
                if let Some(&(prev, prev_process)) = last.get(w.key.as_str())
                    && token <= prev
                {
                    result.violate(
                        w.complete_t,
                        Some(&w.key),
                        format!(
                            "{:?}: write with token {token} by client {} accepted at {} after \
                             token {prev} by client {prev_process}: accepted tokens must \
                             strictly increase",
                            w.key,
                            w.process,
                            secs(w.complete_t)
                        ),
                    );
                }
                let entry = last.entry(w.key.as_str()).or_insert((token, w.process));
                if token > entry.0 {
                    *entry = (token, w.process);
                }
            }
            OpType::Fail if w.error() == Some(ERROR_FENCED) => {
                result.checked += 1;
                let stored = w.completion.as_ref().and_then(|c| c.stored).unwrap_or(0);
                let last_accepted = last.get(w.key.as_str()).map_or(0, |&(t, _)| t);
                if stored != last_accepted {
                    result.violate(
                        w.complete_t,
                        Some(&w.key),
                        format!(
                            "{:?}: write with token {token} by client {} was fenced out at {} \
                             by stored token {stored}, but the last accepted token was \
                             {last_accepted}",
                            w.key,
                            w.process,
                            secs(w.complete_t)
                        ),
                    );
                } else if stored < token {
                    result.violate(
                        w.complete_t,
                        Some(&w.key),
                        format!(
                            "{:?}: write with token {token} by client {} was fenced out at {} \
                             by stored token {stored}, which is below it",
                            w.key,
                            w.process,
                            secs(w.complete_t)
                        ),
                    );
                }
            }
            _ => {}
        }
    }
    result
}
