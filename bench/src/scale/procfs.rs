//! A node's resident memory (now and peak) and CPU time, from `/proc/<pid>/status` and
//! `/proc/<pid>/stat`. Owns the parsing; knows nothing of lockd.

use serde::Serialize;

/// A process's memory, in MiB, from `/proc/<pid>/status`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Memory {
    /// `VmRSS`: resident now.
    pub rss_mib: f64,
    /// `VmHWM`: the most it was ever resident since it started.
    pub peak_mib: f64,
}

/// Reads process `pid`'s memory; `None` if it is gone or the file lacks the fields.
pub fn memory(pid: u32) -> Option<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status(&status)
}

/// `VmRSS` and `VmHWM` of a `/proc/<pid>/status` text.
fn parse_status(status: &str) -> Option<Memory> {
    let kib = |field: &str| -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(field))?;
        line[field.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<f64>()
            .ok()
    };
    Some(Memory {
        rss_mib: kib("VmRSS:")? / 1024.0,
        peak_mib: kib("VmHWM:")? / 1024.0,
    })
}

/// CPU seconds (user + system) process `pid` has used; `None` if it is gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    crate::procs::process_cpu_seconds(pid)
}

/// The machine's load averages (1, 5 and 15 minutes) as `/proc/loadavg` prints them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rss_and_peak_in_mib() {
        let status = "Name:\tlockd\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nThreads:\t4\n";
        assert_eq!(
            parse_status(status),
            Some(Memory {
                rss_mib: 1.0,
                peak_mib: 2.0
            })
        );
        assert_eq!(parse_status("Name:\tlockd\n"), None);
    }

    #[test]
    fn this_process_has_memory_and_cpu() {
        let me = std::process::id();
        assert!(memory(me).is_some_and(|m| m.rss_mib > 0.0 && m.peak_mib >= m.rss_mib));
        assert!(cpu_seconds(me).is_some());
    }
}
