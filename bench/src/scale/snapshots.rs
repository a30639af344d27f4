//! Snapshots on disk: each node's current snapshot file (`<data>/raft/snapshots/
//! <term>-<node>-<index>.snap`, docs/NODE_CLI.md), and a watcher that notes every new one on
//! every node while W5 runs — how often snapshots happen, how big they are, and whether the
//! nodes take them at the same index. Reads directories only, so it costs the nodes nothing.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often the watcher lists the snapshot directories.
const WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// One snapshot file.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SnapshotFile {
    /// The file name.
    pub name: String,
    /// The last log index it covers (0 for `empty.snap` or a name that does not parse).
    pub index: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

/// The snapshot directory of the node whose `--data-dir` is `data_dir`.
pub fn dir_of(data_dir: &Path) -> PathBuf {
    data_dir.join("raft").join("snapshots")
}

/// The newest complete snapshot file in `data_dir`'s snapshot directory (by index).
pub fn current(data_dir: &Path) -> Option<SnapshotFile> {
    let entries = std::fs::read_dir(dir_of(data_dir)).ok()?;
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let stem = name.strip_suffix(".snap")?.to_owned();
            let bytes = e.metadata().ok()?.len();
            Some(SnapshotFile {
                index: index_of(&stem),
                name,
                bytes,
            })
        })
        .max_by_key(|f| f.index)
}

/// The index of a `<term>-<node>-<index>` file stem; 0 if it does not parse.
fn index_of(stem: &str) -> u64 {
    stem.rsplit('-')
        .next()
        .and_then(|i| i.parse().ok())
        .unwrap_or(0)
}

/// Bytes of every file under `dir`, recursively (0 if it cannot be read).
pub fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

/// A snapshot that appeared on a node while the watcher ran.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotEvent {
    /// The node's id.
    pub node_id: u64,
    /// Seconds since the watcher started.
    pub at_secs: f64,
    /// The log index it covers.
    pub index: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

/// A running watcher of every node's snapshot directory.
#[derive(Debug)]
pub struct SnapshotWatch {
    events: Arc<Mutex<Vec<SnapshotEvent>>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl SnapshotWatch {
    /// Starts watching the nodes `(node id, data dir)`.
    pub fn start(nodes: Vec<(u64, PathBuf)>) -> Self {
        let events = Arc::new(Mutex::new(Vec::new()));
        let (stop, mut stopped) = watch::channel(false);
        let started = Instant::now();
        let task = tokio::spawn({
            let events = events.clone();
            async move {
                let mut seen: Vec<Option<String>> = nodes
                    .iter()
                    .map(|(_, dir)| current(dir).map(|f| f.name))
                    .collect();
                let mut tick = tokio::time::interval(WATCH_INTERVAL);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = stopped.changed() => break,
                    }
                    for ((id, dir), seen) in nodes.iter().zip(seen.iter_mut()) {
                        let Some(file) = current(dir) else { continue };
                        if seen.as_deref() == Some(file.name.as_str()) {
                            continue;
                        }
                        *seen = Some(file.name.clone());
                        events
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(SnapshotEvent {
                                node_id: *id,
                                at_secs: started.elapsed().as_secs_f64(),
                                index: file.index,
                                bytes: file.bytes,
                            });
                    }
                }
            }
        });
        Self { events, stop, task }
    }

    /// Stops watching and answers every snapshot seen.
    pub async fn stop(self) -> Vec<SnapshotEvent> {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_newest_snapshot_by_index() {
        let data = tempfile::tempdir().expect("a temporary directory");
        let dir = dir_of(data.path());
        std::fs::create_dir_all(&dir).expect("the snapshot directory");
        assert_eq!(current(data.path()), None);
        std::fs::write(dir.join("3-1-900.snap"), b"abc").expect("a file");
        std::fs::write(dir.join("3-1-10000.snap"), b"abcdef").expect("a file");
        std::fs::write(dir.join("3-1-20000.tmp"), b"partial").expect("a file");
        let newest = current(data.path()).expect("a snapshot");
        assert_eq!(newest.index, 10_000);
        assert_eq!(newest.bytes, 6);
        assert_eq!(bytes_under(data.path()), 3 + 6 + 7);
    }
}
