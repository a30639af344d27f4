//! Child processes of the benchmark (lockd and etcd nodes): free loopback ports, finding the
//! binaries, starting with logs to files, stopping with SIGTERM. Owns no protocol knowledge.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::process::{Child, Command};

/// How long a node gets to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Environment variable naming the `lockd` binary to benchmark.
pub const LOCKD_BIN_ENV: &str = "LOCKD_BIN";

/// Environment variable naming the `etcd` binary to benchmark against.
pub const ETCD_BIN_ENV: &str = "ETCD_BIN";

/// Where Debian's `etcd-server` package installs etcd (what CI installs with apt).
pub const ETCD_BIN_DEFAULT: &str = "/usr/bin/etcd";

/// A fresh directory `prefix…` under `root` for one run's node data (removed when dropped,
/// unless kept). `root` is created first if it does not exist: a `--data-root` that names a
/// new folder is what the user asked for, not a mistake.
pub fn data_dir_in(root: &Path, prefix: &str) -> Result<tempfile::TempDir> {
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(root)
        .with_context(|| format!("creating a data directory in {}", root.display()))
}

/// Reserves `count` distinct free TCP ports on 127.0.0.1. The listeners are held until all
/// ports are known, so no port is handed out twice; they are closed before returning, and the
/// caller binds them moments later (a small race with unrelated processes, as in every
/// "free port" helper).
pub fn free_ports(count: usize) -> Result<Vec<u16>> {
    let listeners = (0..count)
        .map(|_| {
            TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0 to find a free port")
        })
        .collect::<Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr().context("reading a bound port")?.port()))
        .collect()
}

/// The `lockd` binary: `--lockd-bin`, else `$LOCKD_BIN`, else `lockd` next to this executable
/// (the same cargo profile: `target/release/lockd` for `cargo run --release`), else
/// `target/release/lockd` when this executable is a test or debug build.
pub fn lockd_binary(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(path) = explicit {
        return existing(path, "--lockd-bin");
    }
    if let Some(path) = std::env::var_os(LOCKD_BIN_ENV) {
        return existing(Path::new(&path), LOCKD_BIN_ENV);
    }
    let exe = std::env::current_exe().context("locating the lock-bench executable")?;
    let mut candidates = Vec::new();
    if let Some(dir) = exe.parent() {
        candidates.push(dir.join("lockd"));
        if let Some(profile_dir) = dir.parent() {
            // `target/<profile>/deps/…` for test executables.
            candidates.push(profile_dir.join("lockd"));
            if let Some(target) = profile_dir.parent() {
                candidates.push(target.join("release").join("lockd"));
            }
        }
    }
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "lockd binary not found next to {}; build it with `cargo build --release -p lockd` \
                 (same CARGO_TARGET_DIR) or set {LOCKD_BIN_ENV}",
                exe.display()
            )
        })
}

/// The `etcd` binary: `--etcd-bin`, else `$ETCD_BIN`, else [`ETCD_BIN_DEFAULT`]. A missing
/// binary is an error that says how to install it.
pub fn etcd_binary(explicit: Option<&Path>) -> Result<PathBuf> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => std::env::var_os(ETCD_BIN_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(ETCD_BIN_DEFAULT)),
    };
    if !path.is_file() {
        bail!(
            "etcd is missing: no file at {} — install Debian's etcd-server \
             (`apt-get install etcd-server`), set {ETCD_BIN_ENV} or --etcd-bin, \
             or run without etcd (`--systems lockd`)",
            path.display()
        );
    }
    Ok(path)
}

fn existing(path: &Path, source: &str) -> Result<PathBuf> {
    if !path.is_file() {
        bail!("{source}={} does not name a file", path.display());
    }
    Ok(path.to_path_buf())
}

/// Clock ticks per second of `/proc/<pid>/stat`'s CPU times (`USER_HZ`): 100 on every Linux
/// architecture the benchmark runs on (the kernel's ABI fixes it; reading it via sysconf would
/// need `unsafe`).
const USER_HZ: f64 = 100.0;

/// A running node process; killed on drop if [`NodeProcess::stop`] was not called.
#[derive(Debug)]
pub struct NodeProcess {
    name: String,
    child: Child,
    /// How it was started, so that [`NodeProcess::restart`] can start it again.
    launch: Launch,
}

/// The command line, environment and log file of a node process.
#[derive(Debug, Clone)]
struct Launch {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log_path: PathBuf,
}

impl Launch {
    /// Starts the process with stdout and stderr to the log: a new log, or appended to it.
    fn spawn(&self, name: &str, append: bool) -> Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&self.log_path)
            .with_context(|| format!("opening {}", self.log_path.display()))?;
        let log_err = log
            .try_clone()
            .with_context(|| format!("duplicating {}", self.log_path.display()))?;
        Command::new(&self.program)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {name}: {}", self.program.display()))
    }
}

impl NodeProcess {
    /// Starts `program args` with stdout and stderr appended to `<log_dir>/<name>.log`.
    pub fn spawn(name: &str, program: &Path, args: &[String], log_dir: &Path) -> Result<Self> {
        Self::spawn_with_env(name, program, args, &[], log_dir)
    }

    /// [`NodeProcess::spawn`] with `env` added to the inherited environment.
    pub fn spawn_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log_dir: &Path,
    ) -> Result<Self> {
        std::fs::create_dir_all(log_dir)
            .with_context(|| format!("creating {}", log_dir.display()))?;
        let launch = Launch {
            program: program.to_path_buf(),
            args: args.to_vec(),
            env: env.to_vec(),
            log_path: log_dir.join(format!("{name}.log")),
        };
        let child = launch.spawn(name, false)?;
        Ok(Self {
            name: name.to_owned(),
            child,
            launch,
        })
    }

    /// The process id while the process runs (`None` once it has been reaped).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGKILL, and wait until the process is gone (a crash, as far as the node can tell).
    pub async fn kill(&mut self) -> Result<()> {
        self.child
            .kill()
            .await
            .with_context(|| format!("killing {}", self.name))
    }

    /// SIGTERM, and wait up to [`STOP_GRACE`] for the process to exit (then SIGKILL); the
    /// process can be started again with [`NodeProcess::restart`].
    pub async fn terminate(&mut self) -> Result<()> {
        let Some(pid) = self.child.id() else {
            return Ok(());
        };
        let pid = rustix::process::Pid::from_raw(pid as i32)
            .with_context(|| format!("{} has an invalid pid {pid}", self.name))?;
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        match tokio::time::timeout(STOP_GRACE, self.child.wait()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => bail!("waiting for {} to exit: {e}", self.name),
            Err(_) => {
                self.kill().await?;
                bail!(
                    "{} ignored SIGTERM for {STOP_GRACE:?} and was killed",
                    self.name
                )
            }
        }
    }

    /// Starts the process again with the same command line and environment, its output
    /// appended to the same log. Fails if it is still running.
    pub fn restart(&mut self) -> Result<()> {
        if matches!(self.child.try_wait(), Ok(None)) {
            bail!(
                "{} is still running; stop it before restarting it",
                self.name
            );
        }
        self.child = self.launch.spawn(&self.name, true)?;
        Ok(())
    }

    /// Fails if the process has already exited (it crashed or rejected its flags).
    pub fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => bail!("{} exited early with {status}; see its log", self.name),
            Err(e) => bail!("checking {}: {e}", self.name),
        }
    }

    /// CPU time (user + system) the process has used so far, in seconds; `None` if it cannot
    /// be read (the process is gone).
    pub fn cpu_seconds(&self) -> Option<f64> {
        process_cpu_seconds(self.child.id()?)
    }

    /// SIGTERM, then wait up to [`STOP_GRACE`], then SIGKILL.
    pub async fn stop(mut self) -> Result<()> {
        let Some(pid) = self.child.id() else {
            return Ok(()); // already reaped
        };
        let pid = rustix::process::Pid::from_raw(pid as i32)
            .with_context(|| format!("{} has an invalid pid {pid}", self.name))?;
        // The process may have exited between `id()` and here; ESRCH is then fine.
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let started = Instant::now();
        match tokio::time::timeout(STOP_GRACE, self.child.wait()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => bail!("waiting for {} to exit: {e}", self.name),
            Err(_) => {
                self.child
                    .kill()
                    .await
                    .with_context(|| format!("killing {}", self.name))?;
                bail!(
                    "{} ignored SIGTERM for {:?} and was killed",
                    self.name,
                    started.elapsed()
                )
            }
        }
    }
}

/// CPU time (user + system, all threads) process `pid` has used so far, in seconds, from
/// `/proc/<pid>/stat`; `None` if it cannot be read (the process is gone).
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its `)` are plain.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A data root that does not exist yet is created, with the run's directory inside it;
    /// a root that cannot be a directory is refused, naming it.
    #[test]
    fn a_missing_data_root_is_created() {
        let base = tempfile::tempdir().expect("temp dir");
        let root = base.path().join("new").join("root");
        let data = data_dir_in(&root, "lock-bench-").expect("created");
        assert!(data.path().is_dir());
        assert_eq!(data.path().parent(), Some(root.as_path()));
        let file = base.path().join("a-file");
        std::fs::write(&file, b"x").expect("write");
        let err = data_dir_in(&file.join("under"), "lock-bench-").expect_err("not a directory");
        assert!(format!("{err:#}").contains("a-file"), "{err:#}");
    }
}
