//! Condition polling with a bounded deadline: the only way the harness and the tests wait.
//!
//! A fixed sleep that stands in for a condition is either too short on a loaded machine (a
//! flaky test) or too long everywhere (a slow suite). [`poll_until`] re-checks the condition
//! every [`POLL_INTERVAL`] and, when the deadline passes, fails with the last thing it saw.
//! This module must not know anything about lockd.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::HarnessError;

/// Pause between two checks of a condition: short enough that a test notices a change within
/// a few tens of milliseconds, long enough not to busy-loop two shared cores.
pub const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// Re-runs `probe` until it answers `Ok(value)`, then returns that value.
///
/// `probe` answers `Err(observation)` while the condition does not hold yet; the observation
/// (what it saw instead) goes into the error once `timeout` has elapsed, so a failing test says
/// *why* it timed out. `what` names the condition for that message. The probe runs at least
/// once, even with a zero timeout.
pub async fn poll_until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut probe: F,
) -> Result<T, HarnessError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    let deadline = started + timeout;
    loop {
        let observation = match probe().await {
            Ok(value) => return Ok(value),
            Err(observation) => observation,
        };
        if Instant::now() >= deadline {
            return Err(HarnessError::new(format!(
                "timed out after {:?} waiting for {what}; last observed: {observation}",
                started.elapsed()
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn returns_the_first_value_the_probe_accepts() {
        let mut calls = 0;
        let got = poll_until("three calls", Duration::from_secs(5), || {
            calls += 1;
            let now = calls;
            async move {
                if now >= 3 {
                    Ok(now)
                } else {
                    Err(format!("{now} calls"))
                }
            }
        })
        .await;
        assert_eq!(got, Ok(3));
    }

    #[tokio::test(start_paused = true)]
    async fn times_out_with_the_last_observation() {
        let err = poll_until("never", Duration::from_millis(100), || async {
            Err::<(), _>("still no".to_owned())
        })
        .await
        .expect_err("the condition never holds");
        assert!(err.message().contains("never"), "{err}");
        assert!(err.message().contains("still no"), "{err}");
    }
}
