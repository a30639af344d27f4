//! [`HarnessError`]: why the harness could not do what a test asked (a node that would not
//! start, no leader within the deadline, a condition that never came true).
//!
//! It owns only the description of harness failures; lock failures stay
//! [`lock_api::LockError`] and are never wrapped in it, so a test can match on them.

use std::fmt;

/// A failure of the test harness itself, as opposed to a lock outcome: the message names what
/// was attempted, on which node, and what was observed instead (each node's view, a log tail).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HarnessError {
    message: String,
}

impl HarnessError {
    /// A harness error with the given description.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }

    /// The description.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HarnessError {}
