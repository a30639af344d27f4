//! `lock-lazyfs mount`: mounts the file system, says so on stdout, serves the control socket
//! until told to unmount, then unmounts.
//!
//! Owns the mount's life and the checks before it (the FUSE device, the folders); the file
//! system is [`super::fs`]'s, the protocol [`super::control`]'s. As root the kernel is asked
//! directly (mount(2)) and every user may use the mount (`allow_other`: the nodes run as their
//! own users in the harness's namespace); otherwise fuser mounts through `fusermount3`.

use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use fuser::{MountOption, SessionACL};

use super::control;
use super::fs::LazyFs;

/// The line the daemon prints on stdout once the mount serves.
pub const READY_LINE_PREFIX: &str = "lock-lazyfs ready";

/// The FUSE device the kernel serves mounts through.
pub const FUSE_DEVICE: &str = "/dev/fuse";

/// What to install or enable when FUSE cannot mount, in every message that finds it missing.
pub const FUSE_MISSING: &str = "FUSE cannot mount here: it needs the fuse kernel module and \
     /dev/fuse (in a container: --device /dev/fuse and CAP_SYS_ADMIN), and without root the \
     fuse3 package's fusermount3 (apt-get install fuse3)";

/// What `lock-lazyfs mount` is told.
#[derive(Clone, Debug)]
pub struct MountArgs {
    /// The directory whose files the mount shows.
    pub backing: PathBuf,
    /// Where to mount.
    pub mountpoint: PathBuf,
    /// The control socket's path.
    pub control: PathBuf,
    /// The bound on unsynced bytes ([`super::cache::UNSYNCED_BYTES_MAX_DEFAULT`]).
    pub unsynced_bytes_max: u64,
}

/// Whether FUSE can be used at all here: the device exists (a mount can still fail; its
/// error then says why).
pub fn fuse_available() -> Result<(), String> {
    if Path::new(FUSE_DEVICE).exists() {
        Ok(())
    } else {
        Err(format!("{FUSE_DEVICE} does not exist; {FUSE_MISSING}"))
    }
}

/// Mounts, serves and unmounts (see the module's doc).
pub fn run(args: &MountArgs) -> anyhow::Result<()> {
    fuse_available().map_err(|e| anyhow::anyhow!(e))?;
    for (what, dir) in [
        ("--backing", &args.backing),
        ("--mountpoint", &args.mountpoint),
    ] {
        if !dir.is_dir() {
            bail!("{what} {} is not a directory", dir.display());
        }
    }
    let fs = LazyFs::new(&args.backing, args.unsynced_bytes_max)
        .with_context(|| format!("opening --backing {}", args.backing.display()))?;
    let (state, hold) = (fs.state(), fs.hold());
    // A socket left by a daemon that died would make bind fail.
    let _ = std::fs::remove_file(&args.control);
    let listener = UnixListener::bind(&args.control)
        .with_context(|| format!("binding --control {}", args.control.display()))?;
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName("lock-lazyfs".to_owned()),
        MountOption::Subtype("lazyfs".to_owned()),
        MountOption::DefaultPermissions,
    ];
    if rustix::process::geteuid().is_root() {
        config.acl = SessionACL::All;
    }
    let session = fuser::spawn_mount(fs, &args.mountpoint, &config).map_err(|e| {
        anyhow::anyhow!(
            "mounting {} over {}: {e}; {FUSE_MISSING}",
            args.mountpoint.display(),
            args.backing.display()
        )
    })?;
    let mut stdout = std::io::stdout();
    writeln!(
        stdout,
        "{READY_LINE_PREFIX} mountpoint={} backing={} control={}",
        args.mountpoint.display(),
        args.backing.display(),
        args.control.display()
    )?;
    stdout.flush()?;
    control::serve(&listener, &state, &hold);
    hold.release();
    let _ = std::fs::remove_file(&args.control);
    session
        .umount_and_join()
        .with_context(|| format!("unmounting {}", args.mountpoint.display()))
}
