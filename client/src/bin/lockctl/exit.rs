//! lockctl's exit codes and the wording of its failures: which failure gets which code of the
//! table, and the one stderr line that says what to do about it.

use std::process::ExitCode;
use std::time::Duration;

use lock_client::LockError;

use crate::args::{Cli, show};

/// How to get a cluster to talk to, for the "unavailable" error.
const START_HINT: &str = "start one with `lockd dev` (from a checkout: `cargo run -p lockd -- dev`; \
                          it listens on 127.0.0.1:7101-7103, `--base-port` moves it), \
                          or name a running one with --endpoints or LOCKD_ENDPOINTS";

/// Exit code of an error the cluster answered (or of a CMD that could not be run).
pub const EXIT_ERROR: u8 = 1;
/// Exit code of a bad command line; clap's own for the errors it finds.
pub const EXIT_USAGE: u8 = 2;
/// Exit code of a negative answer (not granted, lost, nothing released).
pub const EXIT_NEGATIVE: u8 = 3;
/// Exit code of `exec` when the lock was lost and CMD killed.
pub const EXIT_LOCK_LOST: u8 = 4;
/// Exit code of a cluster that could not be reached, or did not decide in time.
pub const EXIT_UNAVAILABLE: u8 = 5;

/// The exit-code table, as `lockctl --help` shows it (the module doc has the same table).
pub const EXIT_CODES: &str = "\
Exit codes:
  0  done (exec: CMD's own status instead: its exit code, or 128 + signal)
  1  the cluster refused the request (e.g. an unknown session), or CMD could not be run
  2  bad command line: unknown flag, missing or invalid value (a blank key, a TTL outside
     1s-1h, a malformed endpoint)
  3  a negative answer: not granted (acquire, try, exec), lost (renew), nothing released
     (release; stderr says why)
  4  exec: the lock was lost while CMD ran, and CMD was killed
  5  the cluster is unavailable: no endpoint answered, or no decision within --timeout

Endpoints: --endpoints or LOCKD_ENDPOINTS, default 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103
(the cluster `lockd dev` starts). LOCKCTL_LOG=debug shows the SDK's retries on stderr.";

/// Prints `message` as one line on stderr, whatever it holds.
pub fn say(message: impl std::fmt::Display) {
    let line = message.to_string().replace(['\n', '\r'], " ");
    eprintln!("lockctl: {line}");
}

/// Why a command failed; decides the exit code and the words.
#[derive(Debug)]
pub enum Failure {
    /// Connecting failed: no endpoint answered, or the endpoint list is unusable.
    Connect(LockError),
    /// A call after connecting failed.
    Call(LockError),
    /// The command's calls did not finish within `--timeout` (plus `--wait`).
    TimedOut(Duration),
}

impl From<LockError> for Failure {
    fn from(err: LockError) -> Self {
        Self::Call(err)
    }
}

/// What a retry-safe error says, without the "contention (retry-safe):" prefix a user cannot
/// act on.
fn detail(err: &LockError) -> String {
    match err {
        LockError::Contention { message } => message.clone(),
        other => other.to_string(),
    }
}

/// Reports `failure` on stderr and answers the exit code of the table in [`EXIT_CODES`].
pub fn report(failure: Failure, cli: &Cli) -> ExitCode {
    let code = match failure {
        // Only the endpoint list or the flags derived from it can make connecting invalid.
        Failure::Connect(LockError::InvalidArgument { message }) => {
            say(format!("bad command line: {message}"));
            EXIT_USAGE
        }
        // The SDK's advice names the TLS setting to fix; "start a cluster" would mislead.
        Failure::Connect(err) | Failure::Call(err) if lock_client::tls::is_tls_mismatch(&err) => {
            say(format!(
                "cannot talk to the cluster over TLS: {}",
                detail(&err)
            ));
            EXIT_UNAVAILABLE
        }
        Failure::Connect(err) if err.is_retry_safe() => {
            let which = match cli.endpoints_defaulted {
                true => " at the default endpoints (where `lockd dev` listens)",
                false => "",
            };
            say(format!(
                "cluster unavailable{which}: {}; {START_HINT}",
                detail(&err)
            ));
            EXIT_UNAVAILABLE
        }
        Failure::Call(err) if err.is_retry_safe() => {
            say(format!(
                "cluster unavailable: no decision within --timeout {}: {}; \
                 `lockctl status` shows what each node sees",
                show(cli.timeout),
                detail(&err)
            ));
            EXIT_UNAVAILABLE
        }
        Failure::TimedOut(limit) => {
            say(format!(
                "cluster unavailable: no answer from {} within {} (--timeout {}); \
                 `lockctl status` shows what each node sees",
                cli.endpoints.join(","),
                show(limit),
                show(cli.timeout)
            ));
            EXIT_UNAVAILABLE
        }
        Failure::Connect(err) | Failure::Call(err) => {
            say(err);
            EXIT_ERROR
        }
    };
    ExitCode::from(code)
}
