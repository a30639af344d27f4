//! [`ProcStats`]: what a process costs the machine, read from Linux's `/proc`: CPU time (user +
//! system, all threads), resident memory and open file descriptors.
//!
//! For tests that hold a fault for a while and check that a node does not spin, leak memory or
//! leak sockets meanwhile (the cost of a fault over time, docs/DESIGN.md "D-cost"): sample at
//! the start and the end of a window and compare with [`ProcStats::growth_since`]. Owns the
//! parsing of `/proc/PID/stat` and `/proc/PID/status` and nothing else; it knows no lockd and
//! sets no bounds (tests do).

use std::fmt;
use std::time::Duration;

use crate::HarnessError;

/// One sample of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStats {
    /// User plus system CPU time of every thread since the process started
    /// (`utime + stime` of `/proc/PID/stat`).
    pub cpu: Duration,
    /// Resident set size (`VmRSS` of `/proc/PID/status`), in bytes.
    pub rss_bytes: u64,
    /// Entries of `/proc/PID/fd`: open files, sockets, pipes, eventfds.
    pub open_fds: u64,
}

/// How a process changed between two samples; memory and descriptors may shrink, so those are
/// signed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcGrowth {
    /// CPU time spent between the samples.
    pub cpu: Duration,
    /// Change of the resident set size, in bytes.
    pub rss_bytes: i64,
    /// Change of the number of open descriptors.
    pub open_fds: i64,
}

impl ProcStats {
    /// Samples process `pid` now.
    pub fn sample(pid: u32) -> Result<Self, HarnessError> {
        let read = |file: &str| {
            std::fs::read_to_string(format!("/proc/{pid}/{file}"))
                .map_err(|e| HarnessError::new(format!("cannot read /proc/{pid}/{file}: {e}")))
        };
        let ticks = parse_stat_cpu_ticks(&read("stat")?)
            .map_err(|e| HarnessError::new(format!("/proc/{pid}/stat: {e}")))?;
        let rss_kib = parse_status_rss_kib(&read("status")?)
            .map_err(|e| HarnessError::new(format!("/proc/{pid}/status: {e}")))?;
        let open_fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map_err(|e| HarnessError::new(format!("cannot list /proc/{pid}/fd: {e}")))?
            .count();
        Ok(Self {
            cpu: ticks_to_duration(ticks, clock_ticks_per_second()),
            rss_bytes: rss_kib.saturating_mul(1024),
            open_fds: u64::try_from(open_fds).unwrap_or(u64::MAX),
        })
    }

    /// What changed from `earlier` (a sample of the same process) to `self`.
    pub fn growth_since(&self, earlier: &ProcStats) -> ProcGrowth {
        let signed = |now: u64, then: u64| {
            i64::try_from(now)
                .unwrap_or(i64::MAX)
                .saturating_sub(i64::try_from(then).unwrap_or(i64::MAX))
        };
        ProcGrowth {
            cpu: self.cpu.saturating_sub(earlier.cpu),
            rss_bytes: signed(self.rss_bytes, earlier.rss_bytes),
            open_fds: signed(self.open_fds, earlier.open_fds),
        }
    }
}

impl fmt::Display for ProcStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cpu {:.2} s, rss {:.1} MiB, {} fds",
            self.cpu.as_secs_f64(),
            self.rss_bytes as f64 / MIB,
            self.open_fds
        )
    }
}

impl fmt::Display for ProcGrowth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cpu +{:.2} s, rss {:+.1} MiB, fds {:+}",
            self.cpu.as_secs_f64(),
            self.rss_bytes as f64 / MIB,
            self.open_fds
        )
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// The kernel's clock ticks per second (`getconf CLK_TCK`), the unit of `utime` and `stime`.
pub fn clock_ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second()
}

fn ticks_to_duration(ticks: u64, per_second: u64) -> Duration {
    let per_second = per_second.max(1);
    let nanos = u128::from(ticks) * 1_000_000_000 / u128::from(per_second);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// `utime + stime` (fields 14 and 15) of a `/proc/PID/stat` line, in clock ticks. The command
/// name (field 2) is in parentheses and may itself contain spaces and parentheses, so fields
/// are counted from the last `)`.
fn parse_stat_cpu_ticks(stat: &str) -> Result<u64, String> {
    let after_comm = stat
        .rfind(')')
        .map(|at| &stat[at + 1..])
        .ok_or_else(|| format!("no ')' closing the command name in {stat:?}"))?;
    // After the command come field 3 (state) onwards; utime is field 14, stime field 15.
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let field = |n: usize| -> Result<u64, String> {
        let text = fields
            .get(n - 3)
            .ok_or_else(|| format!("only {} fields after the command name", fields.len()))?;
        text.parse()
            .map_err(|e| format!("field {n} {text:?} is not a number: {e}"))
    };
    Ok(field(14)?.saturating_add(field(15)?))
}

/// `VmRSS` of a `/proc/PID/status` text, in KiB.
fn parse_status_rss_kib(status: &str) -> Result<u64, String> {
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .ok_or("no VmRSS line")?;
    let mut words = line.split_whitespace();
    let value = words.next().ok_or("an empty VmRSS line")?;
    if words.next() != Some("kB") {
        return Err(format!("VmRSS is not in kB: {line:?}"));
    }
    value
        .parse()
        .map_err(|e| format!("VmRSS {value:?} is not a number: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_is_utime_plus_stime_counted_after_the_last_parenthesis() {
        // A command name with a space and a ')' in it must not shift the fields.
        let stat = "4242 (lo ck) d) S 1 4242 4242 0 -1 4194560 1234 0 0 0 \
                    731 269 0 0 20 0 9 0 12345 1000000 2000 18446744073709551615";
        assert_eq!(parse_stat_cpu_ticks(stat), Ok(1000));
        assert!(parse_stat_cpu_ticks("4242 (x) S 1 2").is_err());
        assert!(parse_stat_cpu_ticks("no parenthesis").is_err());
    }

    #[test]
    fn status_rss_is_read_in_kib() {
        let status = "Name:\tlockd\nVmPeak:\t  999 kB\nVmRSS:\t   20480 kB\nThreads:\t9\n";
        assert_eq!(parse_status_rss_kib(status), Ok(20480));
        assert!(parse_status_rss_kib("Name:\tx\n").is_err());
        assert!(parse_status_rss_kib("VmRSS:\t12 MB\n").is_err());
    }

    #[test]
    fn ticks_convert_to_time() {
        assert_eq!(ticks_to_duration(250, 100), Duration::from_millis(2500));
        assert_eq!(ticks_to_duration(3, 1000), Duration::from_millis(3));
    }

    #[test]
    fn sampling_this_process_sees_cpu_memory_and_descriptors() {
        let before = ProcStats::sample(std::process::id()).expect("sample");
        // Burn a little CPU so the clock can only move forward.
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let after = ProcStats::sample(std::process::id()).expect("sample");
        assert!(after.rss_bytes > 0, "{after}");
        assert!(after.open_fds >= 3, "{after}");
        assert!(after.cpu >= before.cpu, "{before} then {after}");
        let growth = after.growth_since(&before);
        assert_eq!(growth.cpu, after.cpu - before.cpu);
    }
}
