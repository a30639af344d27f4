//! How long the leader's lease table is held while it fills: adds `GRANTS` grant leases (keys
//! of W5's shape, `w5/sNNNN/kNNNNNN`) in steps of 1,024, as the apply's events and the
//! promoter's reconcile walk add them, and reports the whole fill and its longest step; then
//! the same into a table that made room for them first (`LeaseTable::reserve`, what a
//! reconcile walk does).
//!
//! ```text
//! cargo run --release -p lockd --example lease_growth -- [GRANTS]
//! ```
//!
//! The longest step is where a map grew: the keeper holds its lock for that long, and the
//! apply, every renewal and every heartbeat wait for it (docs/PERFORMANCE.md, session 28).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockd::leader::leases::LeaseTable;

/// Leases added under one hold, as one step of the reconcile walk.
const STEP: usize = 1_024;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let grants: usize = std::env::args()
        .nth(1)
        .map_or(Ok(1_000_000), |a| a.parse())?;
    if grants == 0 {
        return Err("GRANTS must be positive".into());
    }
    let keys: Vec<Arc<str>> = (0..grants)
        .map(|i| format!("w5/s{:04}/k{i:06}", i / 1_000).into())
        .collect();
    for room_first in [false, true] {
        let now = Instant::now();
        let mut table = LeaseTable::new(now);
        if room_first {
            table.reserve(grants, 0);
        }
        let started = Instant::now();
        let mut longest = Duration::ZERO;
        for (n, step) in keys.chunks(STEP).enumerate() {
            let held = Instant::now();
            for (i, key) in step.iter().enumerate() {
                let token = (n * STEP + i + 1) as u64;
                table.insert_grant(key.clone(), token, 3_600_000, now);
            }
            longest = longest.max(held.elapsed());
        }
        println!(
            "{grants} grants, {}: filled in {:.3} s, longest step of {STEP}: {:.1} ms",
            if room_first {
                "room made first"
            } else {
                "growing as they come"
            },
            started.elapsed().as_secs_f64(),
            longest.as_secs_f64() * 1e3
        );
    }
    Ok(())
}
