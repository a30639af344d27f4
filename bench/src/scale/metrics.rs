//! One scrape of a node's `/metrics` (docs/METRICS.md) over plain HTTP, and the samples W5
//! reads from it (term, leader changes, applied and commit index, replication lag, snapshot
//! builds, held locks). Owns the HTTP GET and the text parsing; decides nothing.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one scrape may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer read; a node's scrape is tens of KiB.
const SCRAPE_BYTES_MAX: u64 = 8 * 1024 * 1024;

/// The samples of one scrape: series (name with its labels, as printed) and value.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    samples: Vec<(String, f64)>,
}

impl Scrape {
    /// Parses the OpenMetrics text of a scrape; comment and malformed lines are skipped.
    pub fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.trim().to_owned(), value.trim().parse().ok()?))
            })
            .collect();
        Self { samples }
    }

    /// The value of the series printed exactly as `series` (e.g. `lockd_raft_term` or
    /// `lockd_raft_replication_lag_entries{peer="2"}`).
    pub fn get(&self, series: &str) -> Option<f64> {
        self.samples
            .iter()
            .find(|(s, _)| s == series)
            .map(|(_, v)| *v)
    }

    /// The value of `series` as a count (a gauge or counter that only holds integers).
    pub fn count(&self, series: &str) -> Option<u64> {
        self.get(series).map(|v| v.max(0.0) as u64)
    }

    /// The figures W5 reports of a node.
    pub fn view(&self) -> NodeMetrics {
        NodeMetrics {
            term: self.count("lockd_raft_term"),
            is_leader: self.get("lockd_raft_is_leader").map(|v| v == 1.0),
            leader_changes: self.count("lockd_raft_leader_changes_total"),
            commit_index: self.count("lockd_raft_commit_index"),
            applied_index: self.count("lockd_raft_applied_index"),
            purged_index: self.count("lockd_raft_purged_index"),
            locks_held: self.count("lockd_locks_held"),
            sessions: self.count("lockd_sessions"),
            snapshot_bytes: self.count("lockd_snapshot_bytes"),
            snapshot_builds: self.count("lockd_snapshot_build_duration_seconds_count"),
            snapshot_build_secs: self.get("lockd_snapshot_build_duration_seconds_sum"),
            wal_bytes: self.count("lockd_wal_bytes"),
        }
    }
}

/// What a node's metrics said at one moment (`None`: the family was missing).
#[derive(Debug, Clone, Default, Serialize)]
pub struct NodeMetrics {
    /// `lockd_raft_term`.
    pub term: Option<u64>,
    /// `lockd_raft_is_leader`.
    pub is_leader: Option<bool>,
    /// `lockd_raft_leader_changes_total` (since the process started).
    pub leader_changes: Option<u64>,
    /// `lockd_raft_commit_index`.
    pub commit_index: Option<u64>,
    /// `lockd_raft_applied_index`.
    pub applied_index: Option<u64>,
    /// `lockd_raft_purged_index`.
    pub purged_index: Option<u64>,
    /// `lockd_locks_held`.
    pub locks_held: Option<u64>,
    /// `lockd_sessions`.
    pub sessions: Option<u64>,
    /// `lockd_snapshot_bytes`: the newest snapshot file.
    pub snapshot_bytes: Option<u64>,
    /// Snapshots built since the process started (the build histogram's count).
    pub snapshot_builds: Option<u64>,
    /// Seconds spent building them (the build histogram's sum).
    pub snapshot_build_secs: Option<f64>,
    /// `lockd_wal_bytes`: the Raft log on disk.
    pub wal_bytes: Option<u64>,
}

/// GETs `http://<target>/metrics` and parses it.
pub async fn scrape(target: &str) -> Result<Scrape> {
    let text = tokio::time::timeout(SCRAPE_TIMEOUT, get(target, "/metrics"))
        .await
        .with_context(|| format!("scraping {target}: no answer within {SCRAPE_TIMEOUT:?}"))??;
    Ok(Scrape::parse(&text))
}

/// One HTTP/1.1 GET with `Connection: close`; answers the body of a 200.
async fn get(target: &str, path: &str) -> Result<String> {
    let mut stream = TcpStream::connect(target)
        .await
        .with_context(|| format!("connecting to {target}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .with_context(|| format!("writing to {target}"))?;
    let mut answer = Vec::new();
    stream
        .take(SCRAPE_BYTES_MAX)
        .read_to_end(&mut answer)
        .await
        .with_context(|| format!("reading {target}{path}"))?;
    let answer = String::from_utf8_lossy(&answer);
    let Some((head, body)) = answer.split_once("\r\n\r\n") else {
        bail!("{target}{path}: an answer without a header end");
    };
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!(
            "{target}{path} answered {}",
            head.lines().next().unwrap_or("")
        );
    }
    Ok(body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_labelled_series_and_skips_comments() {
        let scrape = Scrape::parse(
            "# HELP lockd_raft_term x\n# TYPE lockd_raft_term gauge\nlockd_raft_term 7\n\
             lockd_raft_replication_lag_entries{peer=\"2\"} 12\n\
             lockd_snapshot_build_duration_seconds_sum 0.25\nbroken line\n# EOF\n",
        );
        assert_eq!(scrape.count("lockd_raft_term"), Some(7));
        assert_eq!(
            scrape.get("lockd_raft_replication_lag_entries{peer=\"2\"}"),
            Some(12.0)
        );
        assert_eq!(scrape.view().snapshot_build_secs, Some(0.25));
        assert_eq!(scrape.get("lockd_sessions"), None);
    }
}
