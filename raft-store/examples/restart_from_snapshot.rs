//! What a restart and a catch-up cost a node holding `SESSIONS × LOCKS` locks, one step per
//! run so each process's memory is its own:
//!
//! ```text
//! cargo run --release -p lock-raft-store --example restart_from_snapshot -- fill DIR [SESSIONS] [LOCKS]
//! cargo run --release -p lock-raft-store --example restart_from_snapshot -- open DIR [REPLAY]
//! cargo run --release -p lock-raft-store --example restart_from_snapshot -- install DIR
//! cargo run --release -p lock-raft-store --example restart_from_snapshot -- restart-install DIR
//! cargo run --release -p lock-raft-store --example restart_from_snapshot -- send DIR
//! cargo run --release -p lock-raft-store --example restart_from_snapshot -- log DIR [ENTRIES]
//! cargo run --release -p lock-raft-store --example restart_from_snapshot -- log-fill DIR TO_LOCKS [BATCH]
//! cargo run --release -p lock-raft-store --example restart_from_snapshot -- restart DIR
//! ```
//!
//! `fill` builds the state by applying (as the nodes that never stopped did), reports its
//! memory, writes a snapshot into `DIR` (a node's storage) and the snapshot data alone into
//! `DIR/leader.data` (what a leader sends). `open` opens the storage in `DIR` as a restart does
//! (the snapshot file is read, verified and decoded) and applies `REPLAY` log entries of renew
//! batches after it, as openraft replays the log before the node serves. `install` installs
//! `DIR/leader.data` into a fresh state machine (a follower's catch-up); `restart-install`
//! does both, as the restarted node of W5 did. `send` opens `DIR` and reads its current snapshot as
//! a leader does to send it to a follower that lags. `log` appends `ENTRIES` (default 300,000)
//! committed log entries after the snapshot through the log store, as W5's catch-up writes them
//! (an acquire and a release of a new key by one held session, each its own entry); `log-fill`
//! appends the rest of the fill instead (each session's locks up to `TO_LOCKS`, in entries of
//! `BATCH` acquires), the log of a node whose last snapshot was taken part-way through the fill;
//! and
//! `restart` then opens `DIR` and runs openraft's start-up (`StorageHelper::get_initial_state`,
//! which `Raft::new` runs): the snapshot, then the replay of the log up to the committed index,
//! the node's time before it serves anything. Each reports its time and `VmRSS`/`VmHWM` from
//! `/proc/self/status`, under mimalloc, the `lockd` binary's allocator.

use std::path::{Path, PathBuf};
use std::time::Instant;

use lock_raft_store::{Command, Entry, EntryPayload, LeaderId, LogId, Request, storage};
use openraft::RaftSnapshotBuilder;
use openraft::storage::RaftStateMachine;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Commands per log entry, as the leader's proposer batches them (`BATCH_MAX`).
const BATCH: usize = 512;
/// Renews per replayed entry.
const RENEWS: usize = 16;
/// The stamp of the first command.
const STAMP: u64 = 1_700_000_000_000;

/// `VmRSS` and `VmHWM` of this process, in MiB.
fn memory() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn entry(index: u64, stamp_ms: u64, command: Command) -> Entry {
    Entry {
        log_id: LogId::new(
            LeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        ),
        payload: EntryPayload::Normal(Request { stamp_ms, command }),
    }
}

fn session_id(s: usize) -> String {
    format!(
        "{:032x}",
        (s as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835)
    )
}

fn usage() -> Box<dyn std::error::Error> {
    "usage: restart_from_snapshot fill|open|install|restart-install|send|log|log-fill|restart DIR [ARGS]"
        .into()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().ok_or_else(usage)?;
    let dir = PathBuf::from(args.next().ok_or_else(usage)?);
    let rest: Vec<usize> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match mode.as_str() {
            "fill" => {
                fill(
                    &dir,
                    rest.first().copied().unwrap_or(1_000),
                    rest.get(1).copied().unwrap_or(1_000),
                )
                .await
            }
            "open" => open(&dir, rest.first().copied().unwrap_or(17_000)).map(drop),
            "install" => install(&dir, None).await,
            "send" => send(&dir).await,
            "log" => log(&dir, rest.first().copied().unwrap_or(300_000)).await,
            "restart" => restart(&dir).await,
            "log-fill" => {
                log_fill(
                    &dir,
                    rest.first().copied().ok_or_else(usage)?,
                    rest.get(1).copied().unwrap_or(64),
                )
                .await
            }
            "restart-install" => {
                let sm = open(&dir, 0)?;
                install(&dir, Some(sm)).await
            }
            _ => Err(usage()),
        }
    })
}

async fn fill(dir: &Path, sessions: usize, locks: usize) -> Result<(), Box<dyn std::error::Error>> {
    let (_log, mut sm) = open_loaded(dir)?;
    let (empty, _) = memory();
    let mut index = 0;
    let mut stamp = STAMP;
    let mut next = |command| {
        index += 1;
        stamp += 1;
        entry(index, stamp, command)
    };
    let opens: Vec<Command> = (0..sessions)
        .map(|s| Command::OpenSession {
            session_id: session_id(s),
            owner_id: format!("w5-owner-{s:04}"),
            ttl_ms: 30_000,
        })
        .collect();
    for chunk in opens.chunks(BATCH) {
        sm.apply_entries([next(Command::Batch(chunk.to_vec()))]);
    }
    let started = Instant::now();
    let mut batch = Vec::with_capacity(BATCH);
    for l in 0..locks {
        for s in 0..sessions {
            batch.push(Command::Acquire {
                session_id: session_id(s),
                request_id: l as u64 + 1,
                key: format!("w5/{s:04}/{l:04}"),
                ttl_ms: 30_000,
                wait_ms: 0,
            });
            if batch.len() == BATCH {
                sm.apply_entries([next(Command::Batch(std::mem::take(&mut batch)))]);
            }
        }
    }
    if !batch.is_empty() {
        sm.apply_entries([next(Command::Batch(batch))]);
    }
    let held = sm.reader().read(|t| t.grant_count());
    let (rss, hwm) = memory();
    println!(
        "fill: {held} locks ({sessions} sessions x {locks}) applied in {:.1} s; RSS {rss:.0} MiB (empty {empty:.0}), peak {hwm:.0} MiB",
        started.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    sm.get_snapshot_builder().await.build_snapshot().await?;
    // A build returns the metadata only; the data is read from the current snapshot's file.
    let snapshot = sm
        .get_current_snapshot()
        .await?
        .ok_or("no snapshot after a build")?;
    let data = snapshot.snapshot.to_vec()?;
    std::fs::write(dir.join("leader.data"), &data)?;
    std::fs::write(
        dir.join("shape"),
        format!("{sessions} {locks} {index} {stamp}"),
    )?;
    println!(
        "fill: snapshot of {:.1} MiB written in {:.2} s",
        data.len() as f64 / (1024.0 * 1024.0),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The shape `fill` left: sessions, locks, last index, last stamp.
fn shape(dir: &Path) -> Result<[u64; 4], Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(dir.join("shape"))?;
    let numbers: Vec<u64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    numbers
        .try_into()
        .map_err(|_| "the shape file holds four numbers".into())
}

/// Opens the storage in `dir` and waits for its table: a large snapshot loads behind the open
/// (`storage::own_load`), as it does behind a node's start.
fn open_loaded(
    dir: &Path,
) -> Result<(storage::LogStore, storage::StateMachineStore), Box<dyn std::error::Error>> {
    let (log, sm) = storage::open(dir, None)?;
    wait_loaded(&sm);
    Ok((log, sm))
}

/// Waits until `sm`'s own snapshot has loaded.
fn wait_loaded(sm: &storage::StateMachineStore) {
    let reader = sm.reader();
    while !reader.has_table() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn open(
    dir: &Path,
    replay: usize,
) -> Result<storage::StateMachineStore, Box<dyn std::error::Error>> {
    let [sessions, locks, index, stamp] = shape(dir)?;
    let (before, _) = memory();
    let t = Instant::now();
    let (_log, sm) = open_loaded(dir)?;
    let opened = t.elapsed();
    let (rss, hwm) = memory();
    println!(
        "open: {} locks loaded from the snapshot in {:.2} s; RSS {rss:.0} MiB (before {before:.0}), peak {hwm:.0} MiB",
        sm.reader().read(|t| t.grant_count()),
        opened.as_secs_f64()
    );
    if replay == 0 {
        return Ok(sm);
    }
    // Renews of held keys, spread over the sessions, each with a new request id.
    let entries: Vec<Entry> = (0..replay)
        .map(|i| {
            let renews = (0..RENEWS)
                .map(|j| {
                    let n = (i * RENEWS + j) as u64;
                    let s = n % sessions;
                    let l = (n / sessions) % locks;
                    Command::Renew {
                        session_id: session_id(s as usize),
                        request_id: locks + 1 + n / sessions,
                        key: format!("w5/{s:04}/{l:04}"),
                        token: l * sessions + s + 1,
                        ttl_ms: 30_000,
                    }
                })
                .collect();
            entry(
                index + 1 + i as u64,
                stamp + 1 + i as u64,
                Command::Batch(renews),
            )
        })
        .collect();
    let t = Instant::now();
    let answers = sm.apply_entries(entries);
    let replayed = t.elapsed();
    let renewed = answers
        .iter()
        .filter(|a| format!("{a:?}").contains("Renewed"))
        .count();
    let (rss, hwm) = memory();
    println!(
        "open: {replay} entries of {RENEWS} renews replayed in {:.2} s ({renewed} with renewals); RSS {rss:.0} MiB, peak {hwm:.0} MiB",
        replayed.as_secs_f64()
    );
    Ok(sm)
}

async fn install(
    dir: &Path,
    restarted: Option<storage::StateMachineStore>,
) -> Result<(), Box<dyn std::error::Error>> {
    let [_, _, index, _] = shape(dir)?;
    let data = std::fs::read(dir.join("leader.data"))?;
    let fresh = tempfile::tempdir()?;
    let mut sm = match restarted {
        Some(sm) => sm,
        None => open_loaded(fresh.path())?.1,
    };
    let (before, _) = memory();
    let meta = lock_raft_store::SnapshotMeta {
        last_log_id: Some(LogId::new(
            LeaderId {
                term: 2,
                node_id: 1,
            },
            index + 100_000,
        )),
        last_membership: Default::default(),
    };
    let t = Instant::now();
    sm.install_snapshot(&meta, data.into()).await?;
    let installed = t.elapsed();
    let (rss, hwm) = memory();
    println!(
        "install: {} locks installed in {:.2} s; RSS {rss:.0} MiB (before {before:.0}), peak {hwm:.0} MiB",
        sm.reader().read(|t| t.grant_count()),
        installed.as_secs_f64()
    );
    // The replaced table is freed on a blocking thread: let it go, then look again.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let (rss, _) = memory();
    println!("install: RSS {rss:.0} MiB two seconds later");
    // A node goes on allocating after it caught up: a second of small allocations on a
    // runtime thread, then look again (the allocator purges freed memory lazily).
    let churn = tokio::spawn(async {
        let until = Instant::now() + std::time::Duration::from_secs(1);
        let mut kept = Vec::new();
        while Instant::now() < until {
            kept.push(vec![0u8; 64]);
            if kept.len() == 1_000 {
                kept.clear();
                tokio::task::yield_now().await;
            }
        }
    });
    churn.await?;
    let (rss, _) = memory();
    println!("install: RSS {rss:.0} MiB after a second of allocations on a runtime thread");
    Ok(())
}

async fn send(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let mut sm = open(dir, 0)?;
    // Reset the peak (`clear_refs` 5 resets VmHWM) to see the read's own.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let (before, _) = memory();
    let t = Instant::now();
    let snapshot = sm
        .get_current_snapshot()
        .await?
        .ok_or("no snapshot in DIR")?;
    let read = t.elapsed();
    let (rss, hwm) = memory();
    println!(
        "send: the current snapshot ({:.1} MiB of data) read in {:.2} s; RSS {rss:.0} MiB (before {before:.0}), peak during the read {hwm:.0} MiB",
        snapshot.snapshot.len() as f64 / (1024.0 * 1024.0),
        read.as_secs_f64()
    );
    Ok(())
}

/// Appends `count` single-command entries (acquire, release, acquire...) after the snapshot
/// `fill` left, applying each as it goes to learn the release's token, and saves them committed.
async fn log(dir: &Path, count: usize) -> Result<(), Box<dyn std::error::Error>> {
    use openraft::storage::{IOFlushed, RaftLogStorage};
    let [_, locks, index, stamp] = shape(dir)?;
    let (mut log, sm) = open_loaded(dir)?;
    // A node purges its log up to each snapshot it built.
    if let Some(snapshot) = sm.reader().last_applied() {
        log.purge(snapshot).await?;
    }
    let session = session_id(0);
    let t = Instant::now();
    let mut chunk = Vec::with_capacity(64);
    let mut token = 0;
    let mut last = None;
    for n in 0..count as u64 {
        let key = format!("w5/catch-up/{}", n / 2);
        let command = if n % 2 == 0 {
            Command::Acquire {
                session_id: session.clone(),
                request_id: locks + 1 + n,
                key,
                ttl_ms: 60_000,
                wait_ms: 0,
            }
        } else {
            Command::Release {
                session_id: session.clone(),
                request_id: locks + 1 + n,
                key,
                token,
            }
        };
        let e = entry(index + 1 + n, stamp + 1 + n, command);
        last = Some(e.log_id);
        if let [lock_raft_store::Response::Granted(grant)] =
            sm.apply_entries([e.clone()]).as_slice()
        {
            token = grant.token;
        }
        chunk.push(e);
        if chunk.len() == 64 {
            log.append(std::mem::take(&mut chunk), IOFlushed::noop())
                .await?;
        }
    }
    if !chunk.is_empty() {
        log.append(chunk, IOFlushed::noop()).await?;
    }
    log.save_committed(last).await?;
    // A vote is written and synced at once: it carries the committed id to the disk.
    log.save_vote(&lock_raft_store::Vote::new_committed(1, 1))
        .await?;
    println!(
        "log: {count} entries appended after index {index} in {:.1} s; {} locks held after them",
        t.elapsed().as_secs_f64(),
        sm.reader().read(|t| t.grant_count())
    );
    Ok(())
}

/// Opens `DIR` and runs openraft's start-up on it, as a restarted node does before it serves.
async fn restart(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let t = Instant::now();
    let (mut log, mut sm) = storage::open(dir, None)?;
    let opened = t.elapsed();
    let from = sm.reader().last_applied().map_or(0, |id| id.index);
    let t = Instant::now();
    let state = openraft::StorageHelper::new(&mut log, &mut sm)
        .with_id(1)
        .get_initial_state()
        .await?;
    let started = t.elapsed();
    // The snapshot loads behind the start; the replay waited for it only past the queue.
    wait_loaded(&sm);
    let loaded = t.elapsed();
    let to = sm.reader().last_applied().map_or(0, |id| id.index);
    let (rss, hwm) = memory();
    println!(
        "restart: storage opened in {:.2} s (snapshot at {from}); openraft's start-up took {:.2} s, \
         the table in after {:.2} s, replaying {} entries ({:.0} entries/s) to {to} (snapshot {:?}); \
         {} locks held; RSS {rss:.0} MiB, peak {hwm:.0} MiB",
        opened.as_secs_f64(),
        started.as_secs_f64(),
        loaded.as_secs_f64(),
        to - from,
        (to - from) as f64 / loaded.as_secs_f64(),
        state.snapshot_meta.last_log_id.map(|id| id.index),
        sm.reader().read(|t| t.grant_count()),
    );
    Ok(())
}

/// Appends the rest of `fill`'s acquires, each session's locks from where `fill` stopped up to
/// `to_locks`, in entries of `batch` acquires, after the snapshot, and saves them committed.
async fn log_fill(
    dir: &Path,
    to_locks: usize,
    batch: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    use openraft::storage::{IOFlushed, RaftLogStorage};
    let [sessions, locks, index, stamp] = shape(dir)?;
    let (mut log, sm) = open_loaded(dir)?;
    if let Some(snapshot) = sm.reader().last_applied() {
        log.purge(snapshot).await?;
    }
    let t = Instant::now();
    let mut commands = Vec::with_capacity(batch);
    let mut entries = Vec::with_capacity(64);
    let mut next = index;
    let mut acquires = 0u64;
    for l in locks..to_locks as u64 {
        for s in 0..sessions {
            commands.push(Command::Acquire {
                session_id: session_id(s as usize),
                request_id: l + 1,
                key: format!("w5/{s:04}/{l:04}"),
                ttl_ms: 30_000,
                wait_ms: 0,
            });
            acquires += 1;
            let last = l + 1 == to_locks as u64 && s + 1 == sessions;
            if commands.len() == batch || last {
                next += 1;
                entries.push(entry(
                    next,
                    stamp + next - index,
                    Command::Batch(std::mem::take(&mut commands)),
                ));
            }
            if entries.len() == 64 || (last && !entries.is_empty()) {
                log.append(std::mem::take(&mut entries), IOFlushed::noop())
                    .await?;
            }
        }
    }
    let committed = (next > index).then(|| {
        LogId::new(
            LeaderId {
                term: 1,
                node_id: 1,
            },
            next,
        )
    });
    log.save_committed(committed).await?;
    log.save_vote(&lock_raft_store::Vote::new_committed(1, 1))
        .await?;
    println!(
        "log-fill: {acquires} acquires in {} entries appended after index {index} in {:.1} s",
        next - index,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
