//! What a million held locks cost the replicated store: fills a state machine with
//! `SESSIONS × LOCKS` grants through batched log entries (as the leader proposes them), then
//! reports the resident memory per held lock, the snapshot's build time and size, the longest
//! apply while a build runs, a follower's install time and a `Promote`'s apply time.
//!
//! ```text
//! cargo run --release -p lock-raft-store --example held_locks -- [SESSIONS] [LOCKS] [builds]
//! ```
//!
//! With `builds`, the fill runs as a node's does: a snapshot is built on another thread every
//! `BUILD_EVERY` locks while the applies go on, so the applies copy the chunks the builds
//! share.
//!
//! Runs with mimalloc, the `lockd` binary's allocator. Memory is read from `/proc/self/status`
//! (`VmRSS`, `VmHWM`), so the figure is what the process holds, allocator slack included.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lock_raft_store::{Command, Entry, EntryPayload, LeaderId, LogId, Request, storage};
use openraft::RaftSnapshotBuilder;
use openraft::storage::RaftStateMachine;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Commands per log entry, as the leader's proposer batches them (`BATCH_MAX`).
const BATCH: usize = 512;

/// Locks applied between the start of one snapshot build and the next, with `builds`.
const BUILD_EVERY: usize = 100_000;

/// `VmRSS` and `VmHWM` of this process, in bytes.
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

struct Log {
    index: u64,
    stamp: u64,
}

impl Log {
    fn entry(&mut self, command: Command) -> Entry {
        self.index += 1;
        self.stamp += 1;
        Entry {
            log_id: LogId::new(
                LeaderId {
                    term: 1,
                    node_id: 1,
                },
                self.index,
            ),
            payload: EntryPayload::Normal(Request {
                stamp_ms: self.stamp,
                command,
            }),
        }
    }
}

fn session_id(s: usize) -> String {
    format!(
        "{:032x}",
        (s as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835)
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let sessions: usize = args.next().map_or(Ok(1_000), |a| a.parse())?;
    let locks: usize = args.next().map_or(Ok(1_000), |a| a.parse())?;
    let builds = args.next().is_some_and(|a| a == "builds");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(sessions, locks, builds))
}

async fn run(
    sessions: usize,
    locks: usize,
    builds: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let (_log, mut sm) = storage::open(dir.path(), None)?;
    let (rss_empty, _) = memory();
    let mut log = Log {
        index: 0,
        stamp: 1_700_000_000_000,
    };
    let opens: Vec<Command> = (0..sessions)
        .map(|s| Command::OpenSession {
            session_id: session_id(s),
            owner_id: format!("w5-owner-{s:04}"),
            ttl_ms: 30_000,
        })
        .collect();
    for chunk in opens.chunks(BATCH) {
        sm.apply_entries([log.entry(Command::Batch(chunk.to_vec()))]);
    }
    let started = Instant::now();
    let mut batch = Vec::with_capacity(BATCH);
    let mut building: Option<tokio::task::JoinHandle<Result<(), std::io::Error>>> = None;
    let (mut built, mut since_build) = (0u32, 0usize);
    for l in 0..locks {
        for s in 0..sessions {
            since_build += 1;
            if builds
                && since_build >= BUILD_EVERY
                && building.as_ref().is_none_or(|b| b.is_finished())
            {
                if let Some(done) = building.take() {
                    done.await??;
                    built += 1;
                }
                let mut builder = sm.get_snapshot_builder().await;
                building = Some(tokio::spawn(async move {
                    builder.build_snapshot().await.map(drop)
                }));
                since_build = 0;
            }
            batch.push(Command::Acquire {
                session_id: session_id(s),
                request_id: l as u64 + 1,
                key: format!("w5/{s:04}/{l:04}"),
                ttl_ms: 30_000,
                wait_ms: 0,
            });
            if batch.len() == BATCH {
                sm.apply_entries([log.entry(Command::Batch(std::mem::take(&mut batch)))]);
            }
        }
    }
    if !batch.is_empty() {
        sm.apply_entries([log.entry(Command::Batch(batch))]);
    }
    if let Some(done) = building.take() {
        done.await??;
        built += 1;
    }
    let fill = started.elapsed();
    let reader = sm.reader();
    let held = reader.read(|t| t.grant_count());
    let (rss_full, hwm_full) = memory();
    println!(
        "held {held} locks ({sessions} sessions x {locks}) in {:.1} s: RSS {:.0} MiB (empty {:.0} MiB), {:.0} bytes per held lock; peak so far {:.0} MiB",
        fill.as_secs_f64(),
        mib(rss_full),
        mib(rss_empty),
        (rss_full - rss_empty) as f64 / held.max(1) as f64,
        mib(hwm_full)
    );
    if builds {
        println!("{built} snapshots built during the fill");
    }

    // A snapshot build while applies go on: the longest apply during the build.
    let mut builder = sm.get_snapshot_builder().await;
    let sm = Arc::new(std::sync::Mutex::new(sm));
    let building = Arc::new(AtomicBool::new(true));
    let applier = {
        let sm = sm.clone();
        let building = building.clone();
        let mut log = Log {
            index: log.index + 1_000_000,
            stamp: log.stamp,
        };
        std::thread::spawn(move || {
            let mut longest = Duration::ZERO;
            let mut applied = 0u64;
            while building.load(Ordering::Relaxed) {
                let command = Command::Renew {
                    session_id: session_id(0),
                    request_id: 1_000_000 + applied,
                    key: "w5/0000/0000".into(),
                    token: 1,
                    ttl_ms: 30_000,
                };
                let entry = log.entry(command);
                let t = Instant::now();
                let guard = sm.lock().map_err(|_| "poisoned")?;
                guard.apply_entries([entry]);
                drop(guard);
                longest = longest.max(t.elapsed());
                applied += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok::<_, &'static str>((longest, applied))
        })
    };
    let t = Instant::now();
    let snapshot = builder.build_snapshot().await?;
    let build = t.elapsed();
    building.store(false, Ordering::Relaxed);
    let (longest, applied) = applier.join().map_err(|_| "applier panicked")??;
    // A build returns the metadata only; its data is the file's.
    let file = dir
        .path()
        .join(storage::SNAPSHOT_DIR_NAME)
        .join(storage::snapshot_file_name(
            snapshot.meta.last_log_id.as_ref(),
        ));
    let size = std::fs::metadata(file)?.len();
    let (rss_built, hwm_built) = memory();
    println!(
        "snapshot file of {:.1} MiB built in {:.2} s; {applied} applies meanwhile, the longest {:.1} ms; RSS {:.0} MiB, peak {:.0} MiB",
        mib(size),
        build.as_secs_f64(),
        longest.as_secs_f64() * 1e3,
        mib(rss_built),
        mib(hwm_built)
    );

    // A second build: sized from the first, as every build after a node's first is. The
    // peak is reset first (`clear_refs` 5 resets VmHWM) to see this build's own.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let t = Instant::now();
    let again = builder.build_snapshot().await?;
    let (_, hwm_again) = memory();
    println!(
        "a second snapshot (sized from the first) built in {:.2} s; peak during it {:.0} MiB",
        t.elapsed().as_secs_f64(),
        mib(hwm_again)
    );
    drop(again);
    let mut sm = Arc::try_unwrap(sm)
        .map_err(|_| "the state machine is still shared")?
        .into_inner()
        .map_err(|_| "poisoned")?;
    let snapshot = sm
        .get_current_snapshot()
        .await?
        .ok_or("no current snapshot")?;

    // A follower installing it: first with nothing of its own, then again over the table the
    // first install left (a restarted follower's case). Each install's peak is reported above
    // the memory held before it (this process also holds the leader's table and the data).
    let other = tempfile::tempdir()?;
    let (_log2, mut follower) = storage::open(other.path(), None)?;
    for own in ["nothing", "its own table"] {
        // The received data, as the transport hands it over: written into a file of the
        // follower's inbox as it arrives.
        let received = {
            let bytes = snapshot.snapshot.to_vec()?;
            let mut incoming = follower
                .inbox()
                .receive(&snapshot.meta, bytes.len() as u64)?;
            for chunk in bytes.chunks(1 << 20) {
                incoming.write(chunk)?;
            }
            incoming.finish()?
        };
        let (rss_before, _) = memory();
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let t = Instant::now();
        follower.install_snapshot(&snapshot.meta, received).await?;
        let install = t.elapsed();
        let (_, hwm_installed) = memory();
        println!(
            "installed on a follower holding {own} in {:.2} s (decode, check, durable write); \
             peak {:.0} MiB, {:.0} MiB above the {:.0} MiB before",
            install.as_secs_f64(),
            mib(hwm_installed),
            mib(hwm_installed.saturating_sub(rss_before)),
            mib(rss_before)
        );
    }
    drop(follower);

    // Where an install's time goes: the decode (with the sharing of holders and keys) and the
    // invariant check, apart. `decode_table` does both; the check is then timed again alone
    // on the table it decoded.
    let data = snapshot.snapshot.to_vec()?;
    let t = Instant::now();
    let table = lock_raft_store::storage::decode_table(&data, Path::new("held_locks"))?;
    let whole = t.elapsed();
    let t = Instant::now();
    table.check_invariants()?;
    let check = t.elapsed();
    let t = Instant::now();
    drop(table);
    println!(
        "of an install: decode {:.2} s, invariant check {:.2} s, free {:.2} s",
        whole.saturating_sub(check).as_secs_f64(),
        check.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );

    // A new leader's promote.
    let t = Instant::now();
    let mut promote_log = Log {
        index: log.index + 2_000_000,
        stamp: log.stamp + 10_000,
    };
    let entry = promote_log.entry(Command::Promote);
    sm.apply_entries([entry]);
    println!(
        "Promote applied in {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}
