//! The harness's side of the lazyfs mounts: one `lock-lazyfs` daemon per node, its data dir
//! the mount, started before the nodes and unmounted after them; commands over each daemon's
//! control socket ([`super::control`]).
//!
//! Layout in the run's work folder: `n<id>` is the mount (the node's `--data-dir`, as
//! [`crate::cluster`] names it), `lazyfs/n<id>` the backing directory (what a disk would hold
//! after a power cut), `lazyfs/n<id>.sock` the control socket and `lazyfs/n<id>.err` the
//! daemon's stderr. Must not decide when to cut (the power-cut nemesis does).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::process::{Child, ChildStdout, Command};

use super::daemon::{READY_LINE_PREFIX, fuse_available};

/// Where to find `lock-lazyfs` if not next to the harness's own executable.
pub const LAZYFS_BIN_ENV: &str = "LOCK_LAZYFS_BIN";

/// How long a daemon may take to mount: a mount is a system call; 10 s means it is stuck.
pub const MOUNT_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one control command may take: a cut writes at most the daemon's bound on unsynced
/// bytes (64 MiB by default) through, well under this on any disk.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a daemon may take to unmount and exit when told.
pub const UNMOUNT_TIMEOUT: Duration = Duration::from_secs(5);

/// The `lock-lazyfs` binary: `$LOCK_LAZYFS_BIN`, else next to this executable (cargo builds
/// both binaries of lock-jepsen into one folder).
pub fn find_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os(LAZYFS_BIN_ENV) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("{LAZYFS_BIN_ENV}={} is not a file", p.display());
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().context("finding the harness's own executable")?;
    let beside = exe.with_file_name("lock-lazyfs");
    if beside.is_file() {
        return Ok(beside);
    }
    bail!(
        "lock-lazyfs not found at {}; build it with `cargo build -p lock-jepsen` or set \
         {LAZYFS_BIN_ENV}",
        beside.display()
    )
}

#[derive(Debug)]
struct Mounted {
    mountpoint: PathBuf,
    control: PathBuf,
}

/// A running daemon's process and its stdout (held open: it must not get SIGPIPE).
#[derive(Debug)]
struct Daemon {
    child: Child,
    mountpoint: PathBuf,
    control: PathBuf,
    _stdout: BufReader<ChildStdout>,
}

/// The mounts of a run.
#[derive(Debug)]
pub struct Mounts {
    nodes: BTreeMap<u64, Mounted>,
    daemons: Mutex<Vec<Daemon>>,
}

impl Mounts {
    /// Mounts a lazyfs at `<work_dir>/n<id>` for each of `ids`; returns once every daemon
    /// printed its ready line. On any failure the daemons already started are unmounted and
    /// the error says why (FUSE missing, the mount refused).
    pub async fn start(binary: &Path, work_dir: &Path, ids: &[u64]) -> anyhow::Result<Self> {
        fuse_available().map_err(|e| anyhow::anyhow!("--nemesis power-cut: {e}"))?;
        let mounts = Self {
            nodes: BTreeMap::new(),
            daemons: Mutex::new(Vec::new()),
        };
        match mounts.start_all(binary, work_dir, ids).await {
            Ok(nodes) => Ok(Self { nodes, ..mounts }),
            Err(e) => {
                mounts.stop().await;
                Err(e)
            }
        }
    }

    async fn start_all(
        &self,
        binary: &Path,
        work_dir: &Path,
        ids: &[u64],
    ) -> anyhow::Result<BTreeMap<u64, Mounted>> {
        let folder = work_dir.join("lazyfs");
        std::fs::create_dir_all(&folder)
            .with_context(|| format!("creating {}", folder.display()))?;
        let mut nodes = BTreeMap::new();
        for &id in ids {
            let backing = folder.join(format!("n{id}"));
            let mountpoint = work_dir.join(format!("n{id}"));
            let control = folder.join(format!("n{id}.sock"));
            let err_path = folder.join(format!("n{id}.err"));
            for dir in [&backing, &mountpoint] {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            let err = std::fs::File::create(&err_path)
                .with_context(|| format!("creating {}", err_path.display()))?;
            let mut child = Command::new(binary)
                .arg("mount")
                .arg("--backing")
                .arg(&backing)
                .arg("--mountpoint")
                .arg(&mountpoint)
                .arg("--control")
                .arg(&control)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::from(err))
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("starting {}", binary.display()))?;
            let mut stdout = BufReader::new(child.stdout.take().context("lock-lazyfs stdout")?);
            let mut line = String::new();
            let ready =
                tokio::time::timeout(MOUNT_READY_TIMEOUT, stdout.read_line(&mut line)).await;
            self.daemons
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Daemon {
                    child,
                    mountpoint: mountpoint.clone(),
                    control: control.clone(),
                    _stdout: stdout,
                });
            let how = match ready {
                Ok(Ok(n)) if n > 0 && line.starts_with(READY_LINE_PREFIX) => None,
                Ok(Ok(0)) => Some("it exited before its ready line".to_owned()),
                Ok(Ok(_)) => Some(format!(
                    "it printed {:?} instead of its ready line",
                    line.trim()
                )),
                Ok(Err(e)) => Some(format!("reading its stdout: {e}")),
                Err(_) => Some(format!("no ready line within {MOUNT_READY_TIMEOUT:?}")),
            };
            if let Some(how) = how {
                let why = std::fs::read_to_string(&err_path).unwrap_or_default();
                bail!(
                    "--nemesis power-cut: lock-lazyfs could not mount node {id}'s data dir {} \
                     ({how}): {}",
                    mountpoint.display(),
                    why.trim()
                );
            }
            nodes.insert(
                id,
                Mounted {
                    mountpoint,
                    control,
                },
            );
        }
        Ok(nodes)
    }

    /// The mount of node `id` (its data dir).
    pub fn mountpoint(&self, id: u64) -> Option<&Path> {
        self.nodes.get(&id).map(|m| m.mountpoint.as_path())
    }

    /// Sends one control command to node `id`'s daemon; its answer, which must say `ok`.
    pub async fn command(&self, id: u64, line: &str) -> anyhow::Result<Value> {
        let mounted = self
            .nodes
            .get(&id)
            .with_context(|| format!("node {id} has no lazyfs mount"))?;
        command_at(&mounted.control, line)
            .await
            .with_context(|| format!("lazyfs of node {id}"))
    }

    /// Unmounts every mount (after the nodes stopped): `unmount` on the control socket, and
    /// if a daemon does not exit, SIGKILL and a lazy unmount of its mountpoint.
    pub async fn stop(&self) {
        let daemons = std::mem::take(&mut *self.daemons.lock().unwrap_or_else(|p| p.into_inner()));
        for mut daemon in daemons {
            let _ = command_at(&daemon.control, "unmount").await;
            if tokio::time::timeout(UNMOUNT_TIMEOUT, daemon.child.wait())
                .await
                .is_err()
            {
                let _ = daemon.child.kill().await;
                let _ = Command::new("umount")
                    .arg("-l")
                    .arg(&daemon.mountpoint)
                    .status()
                    .await;
            }
        }
    }
}

/// Sends one control command to the daemon at `control`; its answer, which must say `ok`.
async fn command_at(control: &Path, line: &str) -> anyhow::Result<Value> {
    let exchange = async {
        let mut stream = UnixStream::connect(control).await?;
        stream.write_all(format!("{line}\n").as_bytes()).await?;
        let mut answer = String::new();
        BufReader::new(&mut stream).read_line(&mut answer).await?;
        anyhow::Ok(answer)
    };
    let answer = tokio::time::timeout(CONTROL_TIMEOUT, exchange)
        .await
        .with_context(|| format!("`{line}` got no answer within {CONTROL_TIMEOUT:?}"))?
        .with_context(|| format!("`{line}`"))?;
    let value: Value =
        serde_json::from_str(&answer).with_context(|| format!("`{line}` answered {answer:?}"))?;
    if value["ok"] != true {
        bail!("`{line}` failed: {}", value["error"]);
    }
    Ok(value)
}
