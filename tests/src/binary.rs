//! Finding the `lockd` binary the tests run.
//!
//! Owns only the lookup rule: the `LOCKD_BIN` environment variable, else `lockd` in the cargo
//! target directory the running test executable was built into. It never builds anything: a
//! test that cannot find the binary fails with the command that builds it.

use std::path::PathBuf;

use crate::HarnessError;

/// Environment variable that names the `lockd` binary to test, overriding the lookup in the
/// target directory (e.g. to test a release build or an installed binary).
pub const LOCKD_BIN_ENV: &str = "LOCKD_BIN";

/// The `lockd` binary to run: `$LOCKD_BIN` if set, else `<dir of the test executable>/../lockd`
/// (a test executable lives in `target/<profile>/deps/`, the binary in `target/<profile>/`).
///
/// Fails, naming the paths it tried, if the file does not exist.
pub fn lockd_binary() -> Result<PathBuf, HarnessError> {
    if let Some(path) = std::env::var_os(LOCKD_BIN_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(HarnessError::new(format!(
                "{LOCKD_BIN_ENV}={} does not name a file",
                path.display()
            )))
        };
    }
    let exe = std::env::current_exe()
        .map_err(|e| HarnessError::new(format!("cannot find the test executable's path: {e}")))?;
    let candidate = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile_dir| profile_dir.join("lockd"))
        .ok_or_else(|| {
            HarnessError::new(format!(
                "test executable {} has no grandparent directory",
                exe.display()
            ))
        })?;
    if candidate.is_file() {
        Ok(candidate)
    } else {
        Err(HarnessError::new(format!(
            "lockd binary not found at {}; build it with `cargo build -p lockd` \
             (same profile and CARGO_TARGET_DIR as the tests) or set {LOCKD_BIN_ENV}",
            candidate.display()
        )))
    }
}
