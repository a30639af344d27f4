//! How both backends report cancelling an abandoned acquire (its caller went away).
//!
//! A client that walks away while the backend cannot commit leaves one failed cancel per
//! waiting call, so failures are logged as a change of state once, summarised once a minute,
//! and the recovery once; a success alone is a debug line. Owns that logging only.

use std::fmt::Debug;
use std::sync::Mutex;
use std::time::Instant;

use lock_api::LockError;

use crate::log_limit::{LogLimit, Note};

/// Logs the outcome of one cancel of an abandoned acquire against the failures in `failing`.
pub(crate) fn note_cancel<T: Debug>(
    failing: &Mutex<LogLimit>,
    now: Instant,
    result: &Result<T, LockError>,
) {
    let mut failing = failing.lock().unwrap_or_else(|e| e.into_inner());
    match result {
        Ok(answer) => {
            tracing::debug!(?answer, "abandoned acquire cancelled");
            if let Some(ended) = failing.succeeded(now) {
                tracing::info!(
                    failing_ms = ended.lasted.as_millis() as u64,
                    failed_cancels = ended.total,
                    "abandoned acquires are cancelled again"
                );
            }
        }
        Err(err) => match failing.failed(now, err) {
            None => {}
            Some(Note::Began) => tracing::info!(
                %err,
                "could not cancel an abandoned acquire; its wait deadline will drop it"
            ),
            Some(Note::Summary(s)) => tracing::info!(
                failing_s = s.lasted.as_secs(),
                failed_cancels = s.count,
                last_error = %s.last_error,
                "abandoned acquires still not cancelled; their wait deadlines drop them"
            ),
        },
    }
}
