//! The control socket: one command per line in, one JSON object per line out.
//!
//! | command | what it does | answer |
//! | --- | --- | --- |
//! | `cut SEED` | a power cut: each file loses a random (seeded) subset of its unsynced pages, the rest are written through; held syncs are released | `{"ok":true,"files":…,"pages_written":…,"pages_dropped":…}` |
//! | `flush` | every unsynced page written through; held syncs released | the same, `pages_dropped` 0 |
//! | `stats` | nothing | `{"ok":true,"unsynced_files":…,"unsynced_pages":…,"pages_written_back":…,"syncs_held":…}` |
//! | `hold-syncs MS` | every fsync from now on waits, for at most MS ms (see [`super::hold`]) | `{"ok":true}` |
//! | `release-syncs` | held syncs go on | `{"ok":true}` |
//! | `unmount` | the daemon unmounts and exits (after answering) | `{"ok":true}` |
//!
//! A line that is not a command gets `{"ok":false,"error":…}`; a line longer than
//! [`LINE_BYTES_MAX`] ends the connection. Owns the protocol only: the cut itself is the
//! [`Cache`](super::cache::Cache)'s.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::fs::State;
use super::hold::SyncHold;

/// The longest command line (the longest real one, `cut` with a 20-digit seed, is 24 bytes).
pub const LINE_BYTES_MAX: u64 = 256;

/// A control command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// `cut SEED`.
    Cut(u64),
    /// `flush`.
    Flush,
    /// `stats`.
    Stats,
    /// `hold-syncs MS`.
    HoldSyncs(Duration),
    /// `release-syncs`.
    ReleaseSyncs,
    /// `unmount`.
    Unmount,
}

impl std::str::FromStr for Command {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, String> {
        let mut words = line.split_whitespace();
        let command = words.next().unwrap_or("");
        let arg = words.next();
        let number = |what: &str| -> Result<u64, String> {
            arg.ok_or_else(|| format!("`{command}` needs {what}"))?
                .parse::<u64>()
                .map_err(|e| format!("`{command}`: {what}: {e}"))
        };
        let parsed = match command {
            "cut" => Self::Cut(number("a seed")?),
            "flush" => Self::Flush,
            "stats" => Self::Stats,
            "hold-syncs" => Self::HoldSyncs(Duration::from_millis(number("milliseconds")?)),
            "release-syncs" => Self::ReleaseSyncs,
            "unmount" => Self::Unmount,
            "" => return Err("empty command".to_owned()),
            other => {
                return Err(format!(
                    "unknown command {other:?}; known: cut SEED, flush, stats, hold-syncs MS, \
                     release-syncs, unmount"
                ));
            }
        };
        let takes_arg = matches!(parsed, Self::Cut(_) | Self::HoldSyncs(_));
        if words.next().is_some() || (!takes_arg && arg.is_some()) {
            return Err(format!("`{command}`: too many arguments"));
        }
        Ok(parsed)
    }
}

/// Carries out `command`; the answer line's object.
pub fn execute(command: Command, state: &Mutex<State>, hold: &SyncHold) -> Value {
    let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
    let report = |r: std::io::Result<super::cache::Report>| match r {
        Ok(r) => json!({
            "ok": true,
            "files": r.files,
            "pages_written": r.pages_written,
            "pages_dropped": r.pages_dropped,
        }),
        Err(e) => json!({"ok": false, "error": format!("writing pages through: {e}")}),
    };
    match command {
        Command::Cut(seed) => {
            let answer = report(state.cache.cut_all(seed));
            hold.release();
            answer
        }
        Command::Flush => {
            let answer = report(state.cache.flush_all());
            hold.release();
            answer
        }
        Command::Stats => {
            let (files, pages) = state.cache.unsynced();
            json!({
                "ok": true,
                "unsynced_files": files,
                "unsynced_pages": pages,
                "pages_written_back": state.cache.pages_written_back(),
                "syncs_held": hold.held(),
            })
        }
        Command::HoldSyncs(d) => {
            hold.hold(d);
            json!({"ok": true})
        }
        Command::ReleaseSyncs => {
            hold.release();
            json!({"ok": true})
        }
        Command::Unmount => json!({"ok": true}),
    }
}

/// Serves connections on `listener` until a client says `unmount`.
pub fn serve(listener: &UnixListener, state: &Arc<Mutex<State>>, hold: &SyncHold) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if serve_one(stream, state, hold) {
            return;
        }
    }
}

/// Serves one connection; `true` if it asked to unmount.
fn serve_one(stream: UnixStream, state: &Arc<Mutex<State>>, hold: &SyncHold) -> bool {
    let Ok(mut out) = stream.try_clone() else {
        return false;
    };
    let mut lines = BufReader::new(stream);
    loop {
        let mut line = String::new();
        match (&mut lines).take(LINE_BYTES_MAX).read_line(&mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) if !line.ends_with('\n') && line.len() as u64 >= LINE_BYTES_MAX => {
                let _ = writeln!(out, "{}", json!({"ok": false, "error": "line too long"}));
                return false;
            }
            Ok(_) => {}
        }
        let (answer, unmount) = match line.trim().parse::<Command>() {
            Ok(command) => (execute(command, state, hold), command == Command::Unmount),
            Err(e) => (json!({"ok": false, "error": e}), false),
        };
        if writeln!(out, "{answer}").is_err() || unmount {
            return unmount;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_and_anything_else_is_an_error_naming_the_known_ones() {
        assert_eq!("cut 42".parse(), Ok(Command::Cut(42)));
        assert_eq!(" flush ".parse(), Ok(Command::Flush));
        assert_eq!(
            "hold-syncs 1500".parse(),
            Ok(Command::HoldSyncs(Duration::from_millis(1500)))
        );
        assert_eq!("unmount".parse(), Ok(Command::Unmount));
        for bad in [
            "",
            "cut",
            "cut x",
            "cut -1",
            "cut 1 2",
            "flush now",
            "format c:",
        ] {
            let err = bad.parse::<Command>().unwrap_err();
            assert!(!err.is_empty(), "{bad:?}");
        }
        assert!("bogus".parse::<Command>().unwrap_err().contains("cut SEED"));
    }
}
