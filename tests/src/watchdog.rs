//! A guard against orphaned node processes when the test process dies without unwinding.
//!
//! `Cluster`'s `Drop` kills every node on a normal return and on a panic. It cannot run when
//! the test process itself is killed (a test runner's timeout sends SIGTERM/SIGKILL), and
//! `PR_SET_PDEATHSIG` would need `unsafe` (`pre_exec`), which the workspace forbids. So each
//! cluster starts a tiny `/bin/sh` watchdog that polls whether the test process is alive and,
//! once it is gone, SIGKILLs the node pids the harness last wrote to a file. On a normal drop
//! the harness kills the watchdog after the nodes. This module owns only that watchdog.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::HarnessError;

/// The watchdog's loop: `$1` is the test process id, `$2` the file of node pids. 0.2 s between
/// checks keeps an orphan's lifetime short at a negligible cost.
const SCRIPT: &str = r#"while kill -0 "$1" 2>/dev/null; do sleep 0.2; done
if [ -s "$2" ]; then kill -9 $(cat "$2") 2>/dev/null; fi"#;

/// A running watchdog and the pid file it reads.
#[derive(Debug)]
pub(crate) struct Watchdog {
    child: Child,
    pid_file: PathBuf,
}

impl Watchdog {
    /// Starts a watchdog for the current process, with its pid file in `dir`.
    pub(crate) fn spawn(dir: &Path) -> Result<Self, HarnessError> {
        let pid_file = dir.join("node-pids");
        std::fs::write(&pid_file, b"")
            .map_err(|e| HarnessError::new(format!("cannot write {}: {e}", pid_file.display())))?;
        let child = Command::new("/bin/sh")
            .arg("-c")
            .arg(SCRIPT)
            .arg("lock-tests-watchdog")
            .arg(std::process::id().to_string())
            .arg(&pid_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| HarnessError::new(format!("cannot start the /bin/sh watchdog: {e}")))?;
        Ok(Self { child, pid_file })
    }

    /// Replaces the pids the watchdog would kill (written to a temporary file and renamed, so
    /// the watchdog never reads half a list).
    pub(crate) fn record(&self, pids: &[u32]) -> Result<(), HarnessError> {
        let tmp = self.pid_file.with_extension("tmp");
        let text = pids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(" ");
        std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .and_then(|()| std::fs::rename(&tmp, &self.pid_file))
            .map_err(|e| {
                HarnessError::new(format!("cannot write {}: {e}", self.pid_file.display()))
            })
    }

    /// Stops the watchdog (its nodes are already gone).
    pub(crate) fn stop(&mut self) {
        // Already exited is fine; only reaping matters then.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
