//! The `lockd` binary the nodes run: where it is found (`--lockd`, `$LOCKD_BIN`, next to the
//! harness), and a path the nodes can execute.
//!
//! In namespace mode each node runs as its own uid ([`crate::net::NODE_UID_BASE`] + id), which
//! is neither the binary's owner nor in its group: it can execute the binary only if the file
//! and every folder above it let *others* in. A build under a private home (`/root` is mode
//! 0700) does not, and the node's start would fail with a bare "Permission denied". So the
//! harness looks first ([`blocked_for_others`]) and, if it must, copies the binary into its
//! own work folder with mode 0755 ([`for_node_uids`]). Must not start anything.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// Mode of the copied binary and of the folder holding it: everyone may enter and execute,
/// only root (the harness) may change them.
const COPY_MODE: u32 = 0o755;

/// The lockd binary: `explicit`, else `$LOCKD_BIN`, else `lockd` next to this executable or
/// one folder up (a test executable lives in `target/<profile>/deps/`).
pub fn find(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("LOCKD_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("finding this executable")?;
    for dir in exe.ancestors().skip(1).take(2) {
        let candidate = dir.join("lockd");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "lockd binary not found next to {}; build it with `cargo build -p lockd`, or pass --lockd / set LOCKD_BIN",
        exe.display()
    )
}

/// What stops a user who is neither the owner nor in the group from executing `path`: the
/// first folder above it (after resolving symlinks) without the others' execute bit, or the
/// file itself without it, with its mode. `None` if nothing does.
pub fn blocked_for_others(path: &Path) -> anyhow::Result<Option<(PathBuf, u32)>> {
    let real =
        std::fs::canonicalize(path).with_context(|| format!("resolving {}", path.display()))?;
    let mut chain: Vec<&Path> = real.ancestors().skip(1).collect();
    chain.reverse();
    chain.push(&real);
    for p in chain {
        let mode = std::fs::metadata(p)
            .with_context(|| format!("reading the mode of {}", p.display()))?
            .permissions()
            .mode();
        if mode & 0o001 == 0 {
            return Ok(Some((p.to_path_buf(), mode & 0o7777)));
        }
    }
    Ok(None)
}

/// A path of `lockd` that the nodes' uids can execute: `lockd` itself if they can, else a copy
/// at `dir/bin/lockd` (folder and file mode 0755, owned by the harness) — with a sentence for
/// the run's header saying which and why.
pub fn for_node_uids(lockd: &Path, dir: &Path) -> anyhow::Result<(PathBuf, String)> {
    let Some((blocker, mode)) = blocked_for_others(lockd)? else {
        return Ok((
            lockd.to_path_buf(),
            "run in place (the node uids can execute it)".to_owned(),
        ));
    };
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    let copy = bin.join("lockd");
    std::fs::copy(lockd, &copy)
        .with_context(|| format!("copying {} to {}", lockd.display(), copy.display()))?;
    for p in [&bin, &copy] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(COPY_MODE))
            .with_context(|| format!("chmod {COPY_MODE:o} {}", p.display()))?;
    }
    if let Some((still, mode)) = blocked_for_others(&copy)? {
        bail!(
            "the node uids cannot execute {} ({} is mode {mode:o}), nor a copy at {} ({} is \
             mode {:o}); put lockd where every user can enter each folder (o+x) and pass \
             --lockd, or set TMPDIR to such a folder",
            lockd.display(),
            blocker.display(),
            copy.display(),
            still.display(),
            mode
        );
    }
    Ok((
        copy,
        format!(
            "copied from {}: the node uids cannot execute it there ({} is mode {mode:o})",
            lockd.display(),
            blocker.display()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_binary_under_a_private_folder_is_copied_where_others_can_run_it() {
        let home = tempfile::tempdir().unwrap();
        chmod(home.path(), 0o755);
        let private = home.path().join("private");
        std::fs::create_dir(&private).unwrap();
        let lockd = private.join("lockd");
        std::fs::write(&lockd, b"#!/bin/sh\nexit 0\n").unwrap();
        chmod(&lockd, 0o755);

        // Everyone can reach it: it runs in place.
        assert_eq!(blocked_for_others(&lockd).unwrap(), None);
        let work = tempfile::tempdir().unwrap();
        chmod(work.path(), 0o755);
        let (path, why) = for_node_uids(&lockd, work.path()).unwrap();
        assert_eq!(path, lockd);
        assert!(why.contains("in place"), "{why}");

        // A 0700 folder above it (like /root): copied, and the copy is reachable.
        chmod(&private, 0o700);
        let (blocker, mode) = blocked_for_others(&lockd).unwrap().unwrap();
        assert_eq!(
            (blocker, mode),
            (std::fs::canonicalize(&private).unwrap(), 0o700)
        );
        let (path, why) = for_node_uids(&lockd, work.path()).unwrap();
        assert_eq!(path, work.path().join("bin").join("lockd"));
        assert!(why.contains("mode 700"), "{why}");
        assert_eq!(blocked_for_others(&path).unwrap(), None);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            std::fs::read(&lockd).unwrap()
        );

        // A file others may not execute is copied too.
        chmod(&private, 0o755);
        chmod(&lockd, 0o750);
        assert!(blocked_for_others(&lockd).unwrap().is_some());
        let (path, _) = for_node_uids(&lockd, work.path()).unwrap();
        assert_ne!(path, lockd);
    }
}
