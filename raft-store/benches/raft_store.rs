//! Benchmarks of the replicated core: how fast the lock table applies commands, and how many
//! durable log appends per second the log store sustains on each engine (real `fdatasync`, on
//! a directory under the cargo target dir, i.e. the real disk rather than a tmpfs).
//!
//! - `apply/acquire_release_pairs`: `Acquire` + `Release` of 1 000 keys (of 10 000, rotating)
//!   on a table with 100 sessions; throughput in commands. `..._among_100000_sessions`: the
//!   same with 99,900 idle sessions beside them (`SESSIONS_MAX` in all), which shows what a
//!   session lookup costs when there are many.
//! - `snapshot_view/{1000,30000,100000}`: a clone of a table holding that many sessions, what
//!   a snapshot build takes under the state lock (the drop is not timed).
//! - `durable_append/{wal,sled}/{1,16,256}`: one `append` call of one entry holding that many
//!   commands (`Batch` above 1), acknowledged after flush + `fdatasync`; throughput in
//!   commands, so entries/s = throughput / commands per entry (= 1 / time per iteration). Both
//!   engines run in one invocation, so their ratio holds on a noisy machine.
//!
//! Run: `cargo bench -p lock-raft-store` (about a minute). `BENCH_DIR=<dir>` puts the store
//! elsewhere.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use lock_raft_store::storage::{self, EngineKind, LogStore};
use lock_raft_store::{
    Command, Entry, EntryPayload, LeaderId, LockTable, LogId, Request, Response,
};
use openraft::storage::RaftLogStorageExt;

const SESSIONS: usize = 100;
const KEYS: usize = 10_000;
const PAIRS_PER_ITER: usize = 1_000;
const STAMP_MS: u64 = 1_700_000_000_000;

fn session_id(i: usize) -> String {
    format!("session-{i:04}")
}

fn key(i: usize) -> String {
    format!("orders/shard-{:05}/lock", i % KEYS)
}

fn bench_apply(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply");
    group.throughput(Throughput::Elements(2 * PAIRS_PER_ITER as u64));
    for (name, idle_sessions) in [
        ("acquire_release_pairs", 0),
        (
            "acquire_release_pairs_among_100000_sessions",
            100_000 - SESSIONS,
        ),
    ] {
        let mut table = table_of_sessions(idle_sessions);
        let mut events = Vec::new();
        for s in 0..SESSIONS {
            table.apply(
                STAMP_MS,
                Command::OpenSession {
                    session_id: session_id(s),
                    owner_id: format!("owner-{s}"),
                    ttl_ms: 60_000,
                },
                &mut events,
            );
        }
        let mut request_id = 0u64;
        let mut next_key = 0usize;
        group.bench_function(name, |b| {
            b.iter(|| {
                for _ in 0..PAIRS_PER_ITER {
                    let session = session_id(next_key % SESSIONS);
                    let key = key(next_key);
                    next_key += 1;
                    request_id += 1;
                    events.clear();
                    let granted = table.apply(
                        STAMP_MS,
                        Command::Acquire {
                            session_id: session.clone(),
                            request_id,
                            key: key.clone(),
                            ttl_ms: 30_000,
                            wait_ms: 0,
                        },
                        &mut events,
                    );
                    let Response::Granted(grant) = granted else {
                        panic!("the bench's keys are free: {granted:?}");
                    };
                    request_id += 1;
                    let released = table.apply(
                        STAMP_MS,
                        Command::Release {
                            session_id: session,
                            request_id,
                            key,
                            token: grant.token,
                        },
                        &mut events,
                    );
                    black_box(released);
                }
            })
        });
    }
    group.finish();
}

/// A table of `sessions` sessions and nothing else.
fn table_of_sessions(sessions: usize) -> LockTable {
    let mut table = LockTable::new();
    let mut events = Vec::new();
    for s in 0..sessions {
        table.apply(
            STAMP_MS,
            Command::OpenSession {
                session_id: format!("{:032x}", (s as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                owner_id: format!("owner-{s}"),
                ttl_ms: 60_000,
            },
            &mut events,
        );
    }
    table
}

fn bench_snapshot_view(c: &mut Criterion) {
    let mut group = c.benchmark_group("snapshot_view");
    for sessions in [1_000, 30_000, 100_000] {
        let table = table_of_sessions(sessions);
        group.bench_function(BenchmarkId::from_parameter(sessions), |b| {
            b.iter_with_large_drop(|| table.clone())
        });
    }
    group.finish();
}

fn entry(index: u64, commands_per_entry: usize) -> Entry {
    let acquire = |i: usize| Command::Acquire {
        session_id: session_id(i % SESSIONS),
        request_id: index * 1_000 + i as u64,
        key: key(i),
        ttl_ms: 30_000,
        wait_ms: 0,
    };
    let command = if commands_per_entry == 1 {
        acquire(0)
    } else {
        Command::Batch((0..commands_per_entry).map(acquire).collect())
    };
    Entry {
        log_id: LogId::new(
            LeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        ),
        payload: EntryPayload::Normal(Request {
            stamp_ms: STAMP_MS,
            command,
        }),
    }
}

fn bench_dir() -> PathBuf {
    std::env::var_os("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")))
}

fn bench_durable_append(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let base = bench_dir();
    std::fs::create_dir_all(&base).expect("bench dir");
    let mut group = c.benchmark_group("durable_append");
    let cases = [EngineKind::Wal, EngineKind::Sled]
        .into_iter()
        .flat_map(|engine| [1usize, 16, 256].map(move |n| (engine, n)));
    for (engine, commands_per_entry) in cases {
        let dir = tempfile::Builder::new()
            .prefix("raft-store-bench-")
            .tempdir_in(&base)
            .expect("temp dir");
        let (mut log, _state_machine): (LogStore, _) =
            storage::open_with(dir.path(), engine, None).expect("open store");
        let mut index = 0u64;
        group.throughput(Throughput::Elements(commands_per_entry as u64));
        group.bench_with_input(
            BenchmarkId::new(engine.name(), commands_per_entry),
            &commands_per_entry,
            |b, &n| {
                b.iter(|| {
                    index += 1;
                    let entry = entry(index, n);
                    runtime
                        .block_on(log.blocking_append([entry]))
                        .expect("append");
                })
            },
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    targets = bench_apply, bench_snapshot_view, bench_durable_append
}
criterion_main!(benches);
