//! Logs a repeating failure as a change of state, not as a line per occurrence.
//!
//! A peer that stays down, a reaper tick that keeps failing or clients that keep walking away
//! fail again on every retry or request; a WARN line each time buries the one line an operator
//! needs (issue 17: 800 000 lines in 20 s for one dead follower). A [`LogLimit`] tracks one such
//! condition and tells its caller what is worth a line: the first failure of an episode
//! ([`Note::Began`], with its cause), then at most one [`Note::Summary`] per summary interval
//! while failures go on (how many, the last error), and on the first success after them an
//! [`Ended`] (how long it lasted, how many failures).
//!
//! Owns the counting only: it never logs, never reads a clock (every call is handed `now`, so
//! tests drive time by hand) and never decides what counts as a failure. The caller words the
//! lines, at the level it chooses.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// The longest a repeating failure goes without a line: one summary a minute per condition
/// keeps an outage visible in the log without filling it.
pub const SUMMARY_INTERVAL: Duration = Duration::from_secs(60);

/// The longest error text kept for a summary, in bytes; longer text is cut at a character
/// boundary. An error's text comes from the network or a peer and is not ours to bound.
pub const LAST_ERROR_BYTES_MAX: usize = 512;

/// One condition that fails repeatedly and recovers: see the module docs.
#[derive(Debug)]
pub struct LogLimit {
    summary_interval: Duration,
    episode: Option<Episode>,
}

/// A run of failures with no success between them.
#[derive(Debug)]
struct Episode {
    began: Instant,
    /// When the last line about this episode was asked for (the first failure or a summary).
    last_line: Instant,
    /// Failures since that line.
    since_line: u64,
    /// Failures in the whole episode.
    total: u64,
    last_error: String,
}

/// What a failure is worth logging, as [`LogLimit::failed`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// The first failure after a success (or ever): log it once, with its cause.
    Began,
    /// Failures went on for another summary interval: log this one line about them.
    Summary(Summary),
}

/// A summary of failures that went on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Failures since the previous line about this episode, this one included.
    pub count: u64,
    /// Failures since the episode began.
    pub total: u64,
    /// How long the episode has lasted so far.
    pub lasted: Duration,
    /// The text of the latest failure (this one).
    pub last_error: String,
}

/// The end of an episode of failures, as [`LogLimit::succeeded`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// From the first failure to the success that ended it.
    pub lasted: Duration,
    /// Failures in the episode.
    pub total: u64,
}

impl Default for LogLimit {
    fn default() -> Self {
        Self::new(SUMMARY_INTERVAL)
    }
}

impl LogLimit {
    /// A condition, not failing, summarised at most once per `summary_interval`.
    pub fn new(summary_interval: Duration) -> Self {
        Self {
            summary_interval,
            episode: None,
        }
    }

    /// Records a failure at `now` with its `error`; returns the line it is worth, or `None`
    /// when it is only counted for the next summary.
    pub fn failed(&mut self, now: Instant, error: &dyn Display) -> Option<Note> {
        let text = bounded(error.to_string());
        let Some(episode) = &mut self.episode else {
            self.episode = Some(Episode {
                began: now,
                last_line: now,
                since_line: 0,
                total: 1,
                last_error: text,
            });
            return Some(Note::Began);
        };
        episode.total += 1;
        episode.since_line += 1;
        episode.last_error = text;
        if now.saturating_duration_since(episode.last_line) < self.summary_interval {
            return None;
        }
        let summary = Summary {
            count: episode.since_line,
            total: episode.total,
            lasted: now.saturating_duration_since(episode.began),
            last_error: episode.last_error.clone(),
        };
        episode.last_line = now;
        episode.since_line = 0;
        Some(Note::Summary(summary))
    }

    /// Records a success at `now`; returns the episode it ended, or `None` if nothing was
    /// failing (then there is nothing to log).
    pub fn succeeded(&mut self, now: Instant) -> Option<Ended> {
        let episode = self.episode.take()?;
        Some(Ended {
            lasted: now.saturating_duration_since(episode.began),
            total: episode.total,
        })
    }

    /// Whether the condition is failing: a failure was recorded and no success since.
    pub fn is_failing(&self) -> bool {
        self.episode.is_some()
    }
}

/// `text` cut to at most [`LAST_ERROR_BYTES_MAX`] bytes on a character boundary.
fn bounded(mut text: String) -> String {
    if text.len() > LAST_ERROR_BYTES_MAX {
        let mut end = LAST_ERROR_BYTES_MAX;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn the_first_failure_begins_an_episode_and_repeats_are_only_counted() {
        let t0 = Instant::now();
        let mut limit = LogLimit::new(MIN);
        assert!(!limit.is_failing());
        assert_eq!(limit.failed(t0, &"refused"), Some(Note::Began));
        for ms in 1..1_000 {
            let now = t0 + Duration::from_millis(ms * 50);
            assert_eq!(limit.failed(now, &"refused"), None, "at {ms}");
        }
        assert!(limit.is_failing());
    }

    #[test]
    fn failures_that_go_on_are_summarised_once_per_interval() {
        let t0 = Instant::now();
        let mut limit = LogLimit::new(MIN);
        limit.failed(t0, &"refused");
        // One failure a second: the 60th second brings the first summary, counting 60.
        let mut summaries = Vec::new();
        for s in 1..=150 {
            if let Some(note) = limit.failed(t0 + secs(s), &format!("refused #{s}")) {
                summaries.push(note);
            }
        }
        assert_eq!(
            summaries,
            [
                Note::Summary(Summary {
                    count: 60,
                    total: 61,
                    lasted: secs(60),
                    last_error: "refused #60".into(),
                }),
                Note::Summary(Summary {
                    count: 60,
                    total: 121,
                    lasted: secs(120),
                    last_error: "refused #120".into(),
                }),
            ]
        );
    }

    #[test]
    fn a_success_ends_the_episode_with_its_length_and_the_next_failure_begins_anew() {
        let t0 = Instant::now();
        let mut limit = LogLimit::new(MIN);
        assert_eq!(limit.succeeded(t0), None, "nothing was failing");
        limit.failed(t0, &"refused");
        limit.failed(t0 + secs(1), &"refused");
        limit.failed(t0 + secs(2), &"refused");
        assert_eq!(
            limit.succeeded(t0 + secs(30)),
            Some(Ended {
                lasted: secs(30),
                total: 3,
            })
        );
        assert!(!limit.is_failing());
        assert_eq!(limit.succeeded(t0 + secs(31)), None, "ended once");
        assert_eq!(limit.failed(t0 + secs(32), &"reset"), Some(Note::Began));
    }

    #[test]
    fn a_clock_that_reads_earlier_is_not_a_summary() {
        let t0 = Instant::now() + secs(100);
        let mut limit = LogLimit::new(MIN);
        limit.failed(t0, &"refused");
        assert_eq!(limit.failed(t0 - secs(90), &"refused"), None);
        assert_eq!(
            limit.succeeded(t0 - secs(90)),
            Some(Ended {
                lasted: Duration::ZERO,
                total: 2,
            })
        );
    }

    #[test]
    fn a_long_error_is_cut_on_a_character_boundary() {
        let t0 = Instant::now();
        let mut limit = LogLimit::new(Duration::ZERO);
        limit.failed(t0, &"x");
        let long = "é".repeat(LAST_ERROR_BYTES_MAX);
        let Some(Note::Summary(summary)) = limit.failed(t0, &long) else {
            panic!("a zero interval summarises every failure");
        };
        assert!(summary.last_error.len() <= LAST_ERROR_BYTES_MAX);
        assert_eq!(summary.last_error.len(), LAST_ERROR_BYTES_MAX);
        assert!(long.starts_with(&summary.last_error));
    }
}
