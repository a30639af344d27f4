//! One `lockd` node process: spawning it with its output going to log files, noticing its
//! ready line, signalling it, reaping it.
//!
//! Owns the OS process and its log files. It knows nothing about Raft or the cluster; which
//! arguments a node gets is decided by [`crate::Cluster`].

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use crate::HarnessError;
use crate::wait::POLL_INTERVAL;

/// The prefix of the one line a node prints to stdout once it serves (docs/NODE_CLI.md).
pub const READY_LINE_PREFIX: &str = "lockd ready";

/// At most this many bytes of a log file are read to print its tail: enough for the last
/// hundred lines of even verbose logs, without reading a runaway log whole.
const TAIL_BYTES_MAX: u64 = 256 * 1024;

/// Why a node did not become ready.
#[derive(Debug)]
pub(crate) enum NotReady {
    /// The process exited first. `addr_in_use` is set when its stderr says the listen port was
    /// taken, the one failure the harness retries with other ports.
    Exited {
        status: ExitStatus,
        addr_in_use: bool,
    },
    /// Still running but no ready line within the timeout.
    Timeout,
    /// The harness could not read the log or poll the process.
    Harness(HarnessError),
}

/// A node's process slot: stays in the cluster across kills and restarts; `child` is `Some`
/// while a process runs (or is paused).
#[derive(Debug)]
pub(crate) struct NodeProcess {
    pub(crate) id: u64,
    pub(crate) port: u16,
    pub(crate) data_dir: PathBuf,
    pub(crate) stdout_path: PathBuf,
    pub(crate) stderr_path: PathBuf,
    child: Option<Child>,
    paused: bool,
    /// The exit status of a process that exited without the harness stopping or killing it
    /// (a crash), once noticed.
    crashed: Option<ExitStatus>,
    /// How many times a process was spawned for this node.
    runs: u32,
    /// Sizes of the log files when the current process was spawned: its output starts there.
    stdout_start: u64,
    stderr_start: u64,
}

impl NodeProcess {
    pub(crate) fn new(id: u64, port: u16, dir: &Path) -> Self {
        Self {
            id,
            port,
            data_dir: dir.join(format!("node{id}-data")),
            stdout_path: dir.join(format!("node{id}.stdout.log")),
            stderr_path: dir.join(format!("node{id}.stderr.log")),
            child: None,
            paused: false,
            crashed: None,
            runs: 0,
            stdout_start: 0,
            stderr_start: 0,
        }
    }

    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Whether a process is running (possibly paused). Reaps it if it has exited, and then
    /// remembers the exit as a crash: the harness did not stop it.
    pub(crate) fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(Ok(Some(status))) => {
                self.crashed = Some(status);
                self.child = None;
                self.paused = false;
                false
            }
            Some(Err(_)) => {
                self.child = None;
                self.paused = false;
                false
            }
            None => false,
        }
    }

    /// The exit status of a crash noticed so far (an exit the harness did not cause).
    pub(crate) fn crashed(&self) -> Option<ExitStatus> {
        self.crashed
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.paused
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Spawns `binary args…` with stdout/stderr appended to this node's log files, after a
    /// marker line that separates the runs.
    pub(crate) fn spawn(
        &mut self,
        binary: &Path,
        args: &[OsString],
        env: &[(String, String)],
    ) -> Result<(), HarnessError> {
        if self.is_running() {
            return Err(HarnessError::new(format!(
                "node {} is already running (pid {:?})",
                self.id,
                self.pid()
            )));
        }
        std::fs::create_dir_all(&self.data_dir).map_err(|e| {
            HarnessError::new(format!("cannot create {}: {e}", self.data_dir.display()))
        })?;
        self.runs += 1;
        let marker = format!(
            "==== lock-tests: run {} of node {} on {} ====\n",
            self.runs,
            self.id,
            self.addr()
        );
        let (stdout, stdout_start) = open_log(&self.stdout_path, &marker)?;
        let (stderr, stderr_start) = open_log(&self.stderr_path, &marker)?;
        let mut command = Command::new(binary);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("LOCKD_") {
                command.env_remove(name);
            }
        }
        command.envs(env.iter().map(|(k, v)| (k, v)));
        let child = command.spawn().map_err(|e| {
            HarnessError::new(format!(
                "cannot spawn node {} ({}): {e}",
                self.id,
                binary.display()
            ))
        })?;
        self.child = Some(child);
        self.paused = false;
        self.stdout_start = stdout_start;
        self.stderr_start = stderr_start;
        Ok(())
    }

    /// Waits for the current process's ready line, polling its stdout log.
    pub(crate) async fn wait_ready(&mut self, timeout: Duration) -> Result<(), NotReady> {
        let deadline = Instant::now() + timeout;
        loop {
            let out = read_from(&self.stdout_path, self.stdout_start).map_err(NotReady::Harness)?;
            let ready = out.lines().any(|line| {
                line.starts_with(READY_LINE_PREFIX)
                    && line
                        .split_whitespace()
                        .any(|word| word == format!("node_id={}", self.id))
            });
            if ready {
                return Ok(());
            }
            let exited = match self.child.as_mut() {
                None => {
                    return Err(NotReady::Harness(HarnessError::new(format!(
                        "node {} has no process to wait for",
                        self.id
                    ))));
                }
                Some(child) => child.try_wait().map_err(|e| {
                    NotReady::Harness(HarnessError::new(format!(
                        "cannot poll node {}: {e}",
                        self.id
                    )))
                })?,
            };
            if let Some(status) = exited {
                self.child = None;
                let err = read_from(&self.stderr_path, self.stderr_start)
                    .unwrap_or_default()
                    .to_ascii_lowercase();
                let addr_in_use = err.contains("address already in use")
                    || err.contains("addrinuse")
                    || err.contains("address in use");
                return Err(NotReady::Exited {
                    status,
                    addr_in_use,
                });
            }
            if Instant::now() >= deadline {
                return Err(NotReady::Timeout);
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Sends `signal` to the running process.
    pub(crate) fn signal(&mut self, signal: Signal) -> Result<(), HarnessError> {
        let child = self.child.as_ref().ok_or_else(|| {
            HarnessError::new(format!("node {} is not running; cannot signal it", self.id))
        })?;
        kill_process(Pid::from_child(child), signal).map_err(|e| {
            HarnessError::new(format!(
                "cannot send {signal:?} to node {} (pid {}): {e}",
                self.id,
                child.id()
            ))
        })
    }

    /// SIGSTOP: the process freezes, keeping its sockets open (a hung node, a GC pause).
    pub(crate) fn pause(&mut self) -> Result<(), HarnessError> {
        self.signal(Signal::STOP)?;
        self.paused = true;
        Ok(())
    }

    /// SIGCONT after [`NodeProcess::pause`].
    pub(crate) fn resume(&mut self) -> Result<(), HarnessError> {
        self.signal(Signal::CONT)?;
        self.paused = false;
        Ok(())
    }

    /// SIGKILL and reap; `None` if nothing was running.
    pub(crate) fn kill(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        self.paused = false;
        // The process may already have exited; then only the reaping below matters.
        let _ = kill_process(Pid::from_child(&child), Signal::KILL);
        child.wait().ok()
    }

    /// SIGTERM, then waits up to `timeout` for the exit. A paused process is continued so it
    /// can handle the signal. On timeout the process is SIGKILLed and the error says so.
    pub(crate) async fn terminate(
        &mut self,
        timeout: Duration,
    ) -> Result<ExitStatus, HarnessError> {
        self.signal(Signal::TERM)?;
        if self.paused {
            self.resume()?;
        }
        let deadline = Instant::now() + timeout;
        loop {
            let polled = match self.child.as_mut() {
                Some(child) => child.try_wait(),
                None => {
                    return Err(HarnessError::new(format!("node {} vanished", self.id)));
                }
            };
            match polled {
                Ok(Some(status)) => {
                    self.child = None;
                    return Ok(status);
                }
                Ok(None) if Instant::now() < deadline => tokio::time::sleep(POLL_INTERVAL).await,
                Ok(None) => {
                    self.kill();
                    return Err(HarnessError::new(format!(
                        "node {} did not exit within {timeout:?} after SIGTERM; killed it",
                        self.id
                    )));
                }
                Err(e) => {
                    self.kill();
                    return Err(HarnessError::new(format!(
                        "cannot poll node {} after SIGTERM: {e}",
                        self.id
                    )));
                }
            }
        }
    }

    /// The last `lines` lines of the node's stdout and stderr logs, labelled.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        format!(
            "---- node {} ({}) stdout: {} ----\n{}\n---- node {} stderr (last {lines} lines): {} ----\n{}\n",
            self.id,
            self.addr(),
            self.stdout_path.display(),
            tail(&self.stdout_path, lines),
            self.id,
            self.stderr_path.display(),
            tail(&self.stderr_path, lines),
        )
    }
}

/// Opens a log for appending, writes `marker`, and returns it with its size after the marker.
fn open_log(path: &Path, marker: &str) -> Result<(File, u64), HarnessError> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| HarnessError::new(format!("cannot open {}: {e}", path.display())))?;
    file.write_all(marker.as_bytes())
        .and_then(|()| file.flush())
        .map_err(|e| HarnessError::new(format!("cannot write {}: {e}", path.display())))?;
    let len = file
        .metadata()
        .map_err(|e| HarnessError::new(format!("cannot stat {}: {e}", path.display())))?
        .len();
    Ok((file, len))
}

/// The text of `path` from byte `offset` on (lossy UTF-8).
fn read_from(path: &Path, offset: u64) -> Result<String, HarnessError> {
    let mut file = File::open(path)
        .map_err(|e| HarnessError::new(format!("cannot open {}: {e}", path.display())))?;
    let mut bytes = Vec::new();
    file.seek(SeekFrom::Start(offset))
        .and_then(|_| file.read_to_end(&mut bytes))
        .map_err(|e| HarnessError::new(format!("cannot read {}: {e}", path.display())))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The last `lines` lines of `path`, or a note saying why it could not be read.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let len = match std::fs::metadata(path) {
        Ok(meta) => meta.len(),
        Err(e) => return format!("(cannot read {}: {e})", path.display()),
    };
    match read_from(path, len.saturating_sub(TAIL_BYTES_MAX)) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("({e})"),
    }
}
