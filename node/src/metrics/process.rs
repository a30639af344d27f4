//! The `process_*` families every Prometheus exporter shares (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_open_fds`), read from `/proc/self` at each
//! scrape.
//!
//! Owns parsing those files; never fails a scrape: on a system without `/proc` (or a file that
//! does not parse) the gauges keep their last value.

use std::sync::Mutex;

use super::families::Families;

/// What one read of `/proc/self` found.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct ProcessSample {
    /// User plus system CPU seconds.
    pub cpu_seconds: f64,
    /// Resident memory in bytes.
    pub resident_bytes: u64,
}

/// Parses `/proc/self/stat` and `/proc/self/statm`: `utime` and `stime` (fields 14 and 15,
/// in clock ticks) and the resident page count (statm's second field). The command name in
/// stat may hold spaces and parentheses, so the fields are counted from its last `)`.
pub fn parse(
    stat: &str,
    statm: &str,
    ticks_per_second: u64,
    page_bytes: u64,
) -> Option<ProcessSample> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // After the name: field 3 (state) is the first; utime is field 14, stime field 15.
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let resident_pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(ProcessSample {
        cpu_seconds: (utime + stime) as f64 / ticks_per_second.max(1) as f64,
        resident_bytes: resident_pages.saturating_mul(page_bytes),
    })
}

/// Reads `/proc/self` into the process families. The CPU counter only moves forward: it adds
/// the difference to the last reading.
#[derive(Debug, Default)]
pub struct ProcessReader {
    last_cpu_seconds: Mutex<f64>,
}

impl ProcessReader {
    /// Updates the three families. Blocking file reads: run it off the async workers.
    pub fn refresh(&self, families: &Families) {
        let stat = std::fs::read_to_string("/proc/self/stat");
        let statm = std::fs::read_to_string("/proc/self/statm");
        if let (Ok(stat), Ok(statm)) = (stat, statm)
            && let Some(sample) = parse(
                &stat,
                &statm,
                rustix::param::clock_ticks_per_second(),
                rustix::param::page_size() as u64,
            )
        {
            let mut last = self
                .last_cpu_seconds
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if sample.cpu_seconds > *last {
                families
                    .process_cpu_seconds
                    .inc_by(sample.cpu_seconds - *last);
                *last = sample.cpu_seconds;
            }
            families
                .process_resident_memory_bytes
                .set(i64::try_from(sample.resident_bytes).unwrap_or(i64::MAX));
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            // The listing includes the descriptor read_dir itself holds open, as every
            // exporter's count does.
            families.process_open_fds.set(fds.count() as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_and_memory_past_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (lockd (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 150 0 0 20 0 \
                    5 0 100 123456789 2000 18446744073709551615";
        let statm = "50000 2000 300 100 0 4000 0";
        let s = parse(stat, statm, 100, 4096).unwrap();
        assert_eq!(s.cpu_seconds, 4.0);
        assert_eq!(s.resident_bytes, 2000 * 4096);
    }

    #[test]
    fn a_truncated_stat_does_not_parse() {
        assert_eq!(parse("1 (lockd) S 1 2", "1 2", 100, 4096), None);
    }

    #[test]
    fn this_process_reads_as_alive() {
        let (families, _registry) = Families::registered(false);
        ProcessReader::default().refresh(&families);
        assert!(families.process_resident_memory_bytes.get() > 0);
        assert!(families.process_open_fds.get() >= 3);
    }
}
