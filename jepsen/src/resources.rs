//! What each node costs while the run goes on: CPU seconds, resident memory and log bytes,
//! sampled every [`SAMPLE_EVERY`] from `/proc/PID/stat`, `/proc/PID/status` and the size of the
//! node's log file, on the history's clock.
//!
//! Owns the sample type, reading `/proc`, the sampling loop ([`sample_until`]), the
//! `resources.jsonl` file (one [`Sample`] per line) and the figures derived from samples: rates
//! over a span ([`rate_over`]), per-minute totals ([`per_minute`]). Must not judge (the checker's `outage_cost` does) and must not draw (the
//! report does). A node that is down has no process and is sampled with its log size only.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::cluster::Processes;
use crate::history::{LINE_LEN_MAX, Recorder};

/// Name of the samples file in a run's folder.
pub const RESOURCES_FILE: &str = "resources.jsonl";

/// How often every node is sampled: often enough that a 20 s outage has a dozen samples per
/// survivor, rarely enough that an hour's run is ten thousand small lines and the harness's
/// own reads of `/proc` cost nothing next to the nodes.
pub const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Nanoseconds in a minute, the unit of [`per_minute`].
const MINUTE_NS: u64 = 60_000_000_000;

/// One node at one moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sample {
    /// Nanoseconds since the run started, on the history's clock.
    pub t_ns: u64,
    /// The node.
    pub node: u64,
    /// Its process, absent while it is down (killed, or not yet restarted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// User plus system CPU time of that process since it started, in seconds (all threads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_s: Option<f64>,
    /// Its resident set size, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Size of the node's log file (stderr and stdout of every start), in bytes.
    pub log_bytes: u64,
}

/// CPU time (user + system) in clock ticks from the text of `/proc/PID/stat`: fields 14 and
/// 15, counted after the command name, which is in parentheses and may itself hold spaces or
/// parentheses (hence the last `)`).
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // After the name come field 3 (state) onwards; utime is field 14, stime field 15.
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The resident set in bytes from the text of `/proc/PID/status` (`VmRSS: 1234 kB`).
pub fn parse_status_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut parts = line["VmRSS:".len()..].split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => Some(value * 1024),
        _ => None,
    }
}

/// Samples node `node` (process `pid`, if it runs; log file `log`) at `t_ns`. A process that
/// exited between the caller's look-up and these reads is sampled as down.
pub fn sample(t_ns: u64, node: u64, pid: Option<i32>, log: &Path) -> Sample {
    let log_bytes = std::fs::metadata(log).map_or(0, |m| m.len());
    let proc_dir = pid.map(|p| format!("/proc/{p}"));
    let cpu_s = proc_dir
        .as_ref()
        .and_then(|d| std::fs::read_to_string(format!("{d}/stat")).ok())
        .and_then(|stat| parse_stat_cpu_ticks(&stat))
        .map(|ticks| ticks as f64 / rustix::param::clock_ticks_per_second() as f64);
    let rss_bytes = proc_dir
        .as_ref()
        .and_then(|d| std::fs::read_to_string(format!("{d}/status")).ok())
        .and_then(|status| parse_status_rss_bytes(&status));
    Sample {
        t_ns,
        node,
        pid: pid.filter(|_| cpu_s.is_some()),
        cpu_s,
        rss_bytes,
        log_bytes,
    }
}

/// Samples every node every [`SAMPLE_EVERY`], stamped on `recorder`'s clock, until `stop`
/// turns `true` (or its sender is gone: the run failed); returns the samples.
pub async fn sample_until(
    processes: Processes,
    recorder: Arc<Recorder>,
    mut stop: watch::Receiver<bool>,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    // After a stall (a loaded machine), sample on from now rather than in a burst: a burst
    // would measure rates over microseconds.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = stop.changed() => {
                if changed.is_err() {
                    return samples;
                }
            }
        }
        for (node, pid, log) in processes.snapshot() {
            samples.push(sample(recorder.now_ns(), node, pid, &log));
        }
        if *stop.borrow() {
            return samples;
        }
    }
}

/// Writes `samples` to `path`, one JSON object per line.
pub fn write(path: &Path, samples: &[Sample]) -> anyhow::Result<()> {
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = BufWriter::new(file);
    for s in samples {
        serde_json::to_writer(&mut out, s).context("encoding a resource sample")?;
        out.write_all(b"\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))
}

/// Reads a samples file. Errors name the offending line.
pub fn read(path: &Path) -> anyhow::Result<Vec<Sample>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut samples = Vec::new();
    for (index, line) in BufReader::new(file).lines().enumerate() {
        let line =
            line.with_context(|| format!("{}: reading line {}", path.display(), index + 1))?;
        if line.len() > LINE_LEN_MAX {
            bail!("{}: line {} is too long", path.display(), index + 1);
        }
        if line.trim().is_empty() {
            continue;
        }
        samples.push(
            serde_json::from_str(&line)
                .with_context(|| format!("{}: line {}", path.display(), index + 1))?,
        );
    }
    Ok(samples)
}

/// The nodes that have samples.
pub fn nodes(samples: &[Sample]) -> BTreeSet<u64> {
    samples.iter().map(|s| s.node).collect()
}

/// A node's average use over a span.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Rate {
    /// Start of the measured span (the first sample used), ns.
    pub from_t_ns: u64,
    /// End of the measured span (the last sample used), ns.
    pub to_t_ns: u64,
    /// CPU time per second of wall time: 1.0 is one core busy all the time.
    pub cpu_cores: f64,
    /// Log bytes written per second.
    pub log_bytes_per_s: f64,
    /// Largest resident set seen in the span, bytes.
    pub rss_max_bytes: Option<u64>,
}

/// Node `node`'s rates over `[from_t_ns, to_t_ns]`, from the first and the last sample in it of
/// one process (the first sampled one), if they are at least `min_span_ns` apart.
pub fn rate_over(
    samples: &[Sample],
    node: u64,
    from_t_ns: u64,
    to_t_ns: u64,
    min_span_ns: u64,
) -> Option<Rate> {
    let inside: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.node == node && s.t_ns >= from_t_ns && s.t_ns <= to_t_ns)
        .collect();
    let first = inside.iter().find(|s| s.cpu_s.is_some())?;
    let last = inside
        .iter()
        .rev()
        .find(|s| s.pid == first.pid && s.cpu_s.is_some())?;
    let span_ns = last.t_ns.checked_sub(first.t_ns)?;
    if span_ns < min_span_ns.max(1) {
        return None;
    }
    let span_s = span_ns as f64 / 1e9;
    let cpu = last.cpu_s.unwrap_or(0.0) - first.cpu_s.unwrap_or(0.0);
    let log = last.log_bytes.saturating_sub(first.log_bytes);
    Some(Rate {
        from_t_ns: first.t_ns,
        to_t_ns: last.t_ns,
        cpu_cores: cpu.max(0.0) / span_s,
        log_bytes_per_s: log as f64 / span_s,
        rss_max_bytes: inside
            .iter()
            .filter(|s| s.t_ns >= first.t_ns && s.t_ns <= last.t_ns)
            .filter_map(|s| s.rss_bytes)
            .max(),
    })
}

/// One node's use in one minute of the run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Minute {
    /// The node.
    pub node: u64,
    /// Minute of the run, from 0.
    pub minute: u64,
    /// CPU seconds used in it (every process of the node).
    pub cpu_s: f64,
    /// Log bytes written in it.
    pub log_bytes: u64,
    /// Largest resident set sampled in it, bytes (none if the node was down all minute).
    pub rss_max_bytes: Option<u64>,
}

/// Per node, per minute of the run: CPU seconds, log bytes, largest RSS. Each step between two
/// consecutive samples of a node counts in the minute it ends in; CPU only between samples of
/// one process (a restarted node's counter starts again from zero).
pub fn per_minute(samples: &[Sample]) -> Vec<Minute> {
    let mut by_node: BTreeMap<u64, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        by_node.entry(s.node).or_default().push(s);
    }
    let mut out: BTreeMap<(u64, u64), Minute> = BTreeMap::new();
    for (node, mut series) in by_node {
        series.sort_by_key(|s| s.t_ns);
        let mut previous: Option<&Sample> = None;
        for s in series {
            let minute = s.t_ns / MINUTE_NS;
            let entry = out.entry((node, minute)).or_insert(Minute {
                node,
                minute,
                cpu_s: 0.0,
                log_bytes: 0,
                rss_max_bytes: None,
            });
            if let Some(rss) = s.rss_bytes {
                entry.rss_max_bytes = Some(entry.rss_max_bytes.map_or(rss, |m| m.max(rss)));
            }
            if let Some(p) = previous {
                entry.log_bytes += s.log_bytes.saturating_sub(p.log_bytes);
                if p.pid.is_some()
                    && p.pid == s.pid
                    && let (Some(a), Some(b)) = (p.cpu_s, s.cpu_s)
                {
                    entry.cpu_s += (b - a).max(0.0);
                }
            }
            previous = Some(s);
        }
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_and_status_parse() {
        // A command name with a space and a parenthesis, as `/proc` allows.
        let stat = "4242 (lockd (n1)) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 75 0 0 20 0 \
                    12 0 5000 123456789 2048 18446744073709551615";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(325));
        assert_eq!(parse_stat_cpu_ticks("4242 (lockd) S 1"), None);
        let status = "Name:\tlockd\nVmPeak:\t  90000 kB\nVmRSS:\t   20480 kB\nThreads:\t12\n";
        assert_eq!(parse_status_rss_bytes(status), Some(20480 * 1024));
        assert_eq!(parse_status_rss_bytes("Name:\tlockd\n"), None);
    }

    #[test]
    fn this_process_samples_itself() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("n1.log");
        std::fs::write(&log, b"0123456789").unwrap();
        let pid = i32::try_from(std::process::id()).unwrap();
        let s = sample(5, 1, Some(pid), &log);
        assert_eq!(s.pid, Some(pid));
        assert!(s.cpu_s.is_some());
        assert!(s.rss_bytes.unwrap() > 0);
        assert_eq!(s.log_bytes, 10);
        let down = sample(5, 1, None, &dir.path().join("missing.log"));
        assert_eq!((down.pid, down.cpu_s, down.log_bytes), (None, None, 0));
    }

    fn s(t_s: u64, node: u64, pid: Option<i32>, cpu_s: f64, log_bytes: u64) -> Sample {
        Sample {
            t_ns: t_s * 1_000_000_000,
            node,
            pid,
            cpu_s: pid.map(|_| cpu_s),
            rss_bytes: pid.map(|_| 1000 + t_s),
            log_bytes,
        }
    }

    #[test]
    fn rates_and_minutes_add_up() {
        let samples = vec![
            s(0, 1, Some(10), 0.0, 0),
            s(30, 1, Some(10), 15.0, 3000),
            s(60, 1, Some(10), 30.0, 6000),
            // Killed at 61 s, restarted by 70 s: CPU counts again from zero.
            s(65, 1, None, 0.0, 6000),
            s(70, 1, Some(11), 1.0, 6100),
            s(90, 1, Some(11), 3.0, 6200),
        ];
        let rate = rate_over(&samples, 1, 0, 60_000_000_000, 1).unwrap();
        assert!((rate.cpu_cores - 0.5).abs() < 1e-9, "{rate:?}");
        assert!((rate.log_bytes_per_s - 100.0).abs() < 1e-9, "{rate:?}");
        assert_eq!(rate.rss_max_bytes, Some(1060));
        // Too short a span is no rate at all.
        assert_eq!(
            rate_over(&samples, 1, 0, 60_000_000_000, 61_000_000_000),
            None
        );
        // Across the restart, only the first process's samples count.
        let across = rate_over(&samples, 1, 30_000_000_000, 90_000_000_000, 1).unwrap();
        assert_eq!(across.to_t_ns, 60_000_000_000);
        let minutes = per_minute(&samples);
        assert_eq!(minutes.len(), 2);
        assert_eq!(minutes[0].minute, 0);
        assert!((minutes[0].cpu_s - 15.0).abs() < 1e-9);
        assert_eq!(minutes[0].log_bytes, 3000);
        // Minute 1: 30 → 60 s (15 s), then 2 s after the restart; nothing across it.
        assert!((minutes[1].cpu_s - 17.0).abs() < 1e-9, "{minutes:?}");
        assert_eq!(minutes[1].log_bytes, 3200);
        assert_eq!(minutes[1].rss_max_bytes, Some(1090));
    }

    #[test]
    fn samples_round_trip_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(RESOURCES_FILE);
        let samples = vec![s(1, 1, Some(7), 0.25, 10), s(2, 2, None, 0.0, 20)];
        write(&path, &samples).unwrap();
        assert_eq!(read(&path).unwrap(), samples);
        std::fs::write(&path, "{\"t_ns\":1}\n").unwrap();
        assert!(format!("{:#}", read(&path).unwrap_err()).contains("line 1"));
    }
}
