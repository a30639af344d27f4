//! What keeping many sessions alive costs the leader's lease table, apart from gRPC: opens
//! `SESSIONS` sessions of a 15 s TTL, beats each one every third of it (spread evenly, as
//! W5's keepers do, in batches of 1,024 under one clock reading), and runs the reaper's
//! `take_lapsed` every 100 ms, all on a made-up clock over `SECONDS` of lease time. Reports
//! the CPU per beat and per reaper tick, and checks that no session lapsed.
//!
//! ```text
//! cargo run --release -p lockd --example lease_beats -- [SESSIONS] [SECONDS]
//! ```
//!
//! The table is the one `LeaseKeeper` holds behind its mutex; the keeper adds one lock and one
//! clock reading per batch. Session ids are 36-character UUIDs, as lockd makes them; every
//! session is bound to one principal and beats as it, so each beat also checks its caller, as
//! on a node that authenticates its callers.

use std::time::{Duration, Instant};

use lockd::leader::leases::{LeaseTable, REAP_PER_TICK_MAX, REAP_TICK};

/// Session TTL, as W5's many-sessions step opens them.
const TTL: Duration = Duration::from_secs(15);
/// Ids per heartbeat batch (`HEARTBEAT_BATCH_SESSIONS_MAX`).
const BATCH: usize = 1_024;
/// The reaper's safety margin past a deadline.
const MARGIN: Duration = Duration::from_millis(100);
/// The principal every session is bound to and beats as.
const PRINCIPAL: &str = "client";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let sessions: usize = args.next().map_or(Ok(100_000), |a| a.parse())?;
    let seconds: u64 = args.next().map_or(Ok(60), |a| a.parse())?;
    if sessions == 0 || seconds == 0 {
        return Err("SESSIONS and SECONDS must be positive".into());
    }
    let ids: Vec<String> = (0..sessions)
        .map(|i| {
            let n = (i as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
            let hex = format!("{n:032x}");
            format!(
                "{}-{}-{}-{}-{}",
                &hex[0..8],
                &hex[8..12],
                &hex[12..16],
                &hex[16..20],
                &hex[20..32]
            )
        })
        .collect();
    let t0 = Instant::now();
    let mut table = LeaseTable::new(t0);
    let ttl_ms = TTL.as_millis() as u64;
    for id in &ids {
        table.insert_session(id, ttl_ms, Some(PRINCIPAL), t0);
    }
    // Batches of sessions, each due every TTL/3 from its own offset within the first period.
    let period = TTL / 3;
    let batches: Vec<&[String]> = ids.chunks(BATCH).collect();
    let offset = |b: usize| period.mul_f64(b as f64 / batches.len() as f64);
    let mut next_beat: Vec<Duration> = (0..batches.len()).map(offset).collect();
    let (mut beats, mut beat_cpu) = (0u64, Duration::ZERO);
    let (mut ticks, mut tick_cpu, mut lapsed) = (0u64, Duration::ZERO, 0usize);
    let end = Duration::from_secs(seconds);
    let mut now = Duration::ZERO;
    while now < end {
        now += REAP_TICK;
        for (b, due) in next_beat.iter_mut().enumerate() {
            while *due <= now {
                let at = t0 + *due;
                let started = Instant::now();
                for id in batches[b] {
                    if table.restart_session_as(id, Some(PRINCIPAL), at)?.is_none() {
                        return Err(format!("session {id} lapsed at {due:?}").into());
                    }
                }
                beat_cpu += started.elapsed();
                beats += batches[b].len() as u64;
                *due += period;
            }
        }
        let started = Instant::now();
        loop {
            let taken = table.take_lapsed(REAP_PER_TICK_MAX, MARGIN, t0 + now);
            lapsed += taken.grants.len() + taken.sessions.len();
            if !taken.more {
                break;
            }
        }
        tick_cpu += started.elapsed();
        ticks += 1;
    }
    table.check_invariants();
    if lapsed > 0 {
        return Err(format!("{lapsed} leases lapsed; none should").into());
    }
    let per_sec = |cpu: Duration| cpu.as_secs_f64() / seconds as f64 * 100.0;
    println!(
        "{sessions} sessions beating every {period:?} over {seconds} s of lease time: \
         {beats} beats, {:.0} ns each ({:.2} % of a core); {ticks} reaper ticks, {:.1} µs each \
         ({:.2} % of a core); together {:.0} ns per beat",
        beat_cpu.as_nanos() as f64 / beats as f64,
        per_sec(beat_cpu),
        tick_cpu.as_secs_f64() * 1e6 / ticks as f64,
        per_sec(tick_cpu),
        (beat_cpu + tick_cpu).as_nanos() as f64 / beats as f64,
    );
    Ok(())
}
