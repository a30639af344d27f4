//! A value built from a set of TLS files and rebuilt when they change on disk: certificate
//! rotation without a restart (docs/SECURITY.md §1).
//!
//! Every [`Reloading::current`] compares the files' fingerprint with the one the current value
//! was built from (three `stat` calls); on a change it rebuilds. A rebuild that fails (a file
//! half-written, a key that does not match its certificate, a missing file) keeps the old value
//! and is logged once for that state of the files: the same broken files are not retried or
//! logged again until they change once more. The caller takes `current()` for each new
//! connection, so connections already open keep the config they were made with.

use std::fmt;
use std::sync::{Arc, Mutex};

use crate::TlsError;
use crate::files::{Fingerprint, TlsFiles};

/// What is built from the files.
pub type Build<T> = Box<dyn Fn(&TlsFiles) -> Result<T, TlsError> + Send + Sync>;

/// A `T` built from `files` by `build`, rebuilt when they change. See the module docs.
pub struct Reloading<T> {
    files: TlsFiles,
    build: Build<T>,
    /// What the value is, for log lines ("server config", "client config").
    what: &'static str,
    state: Mutex<State<T>>,
}

struct State<T> {
    current: Arc<T>,
    /// The fingerprint `current` was built from.
    built_from: Fingerprint,
    /// The fingerprint of the last refused rebuild: not retried until the files change again.
    refused: Option<Fingerprint>,
}

impl<T> fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading")
            .field("what", &self.what)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl<T> Reloading<T> {
    /// Builds the first value; fails if the files are not usable now (start-up must not go on
    /// without a working config).
    pub fn load(
        files: TlsFiles,
        what: &'static str,
        build: impl Fn(&TlsFiles) -> Result<T, TlsError> + Send + Sync + 'static,
    ) -> Result<Self, TlsError> {
        let built_from = files.fingerprint();
        let current = Arc::new(build(&files)?);
        Ok(Self {
            files,
            build: Box::new(build),
            what,
            state: Mutex::new(State {
                current,
                built_from,
                refused: None,
            }),
        })
    }

    /// The files this value follows.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The value for a new connection: rebuilt first if the files changed since it was built,
    /// the old one if that rebuild fails.
    pub fn current(&self) -> Arc<T> {
        // Fingerprint before reading: a write racing the rebuild changes the fingerprint again,
        // so the next call rebuilds once more rather than missing it.
        let now = self.files.fingerprint();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if now == state.built_from || state.refused.as_ref() == Some(&now) {
            return state.current.clone();
        }
        match (self.build)(&self.files) {
            Ok(value) => {
                tracing::info!(what = self.what, files = %self.files.describe(), "TLS files changed; new connections use the new ones");
                state.current = Arc::new(value);
                state.built_from = now;
                state.refused = None;
            }
            Err(err) => {
                tracing::warn!(what = self.what, error = %err, "TLS files changed but cannot be used; keeping the previous ones until they change again");
                state.refused = Some(now);
            }
        }
        state.current.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds the cert file's text, refusing "bad".
    fn build(files: &TlsFiles) -> Result<String, TlsError> {
        let text = std::fs::read_to_string(&files.cert).map_err(|source| TlsError::Read {
            path: files.cert.clone(),
            source,
        })?;
        if text == "bad" {
            return Err(TlsError::Content {
                path: files.cert.clone(),
                reason: "bad".into(),
            });
        }
        Ok(text)
    }

    static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    fn counting_build(files: &TlsFiles) -> Result<String, TlsError> {
        BUILDS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        build(files)
    }

    fn files(dir: &std::path::Path) -> TlsFiles {
        let files = TlsFiles {
            ca: dir.join("ca"),
            cert: dir.join("cert"),
            key: dir.join("key"),
        };
        std::fs::write(&files.ca, "ca").unwrap();
        std::fs::write(&files.key, "key").unwrap();
        files
    }

    #[test]
    fn a_change_is_picked_up_and_a_bad_one_keeps_the_old_value_until_the_next_change() {
        let dir = tempfile::tempdir().unwrap();
        let files = files(dir.path());
        std::fs::write(&files.cert, "one").unwrap();
        let r = Reloading::load(files.clone(), "test", counting_build).unwrap();
        assert_eq!(*r.current(), "one");
        let builds = || BUILDS.load(std::sync::atomic::Ordering::SeqCst);
        let before = builds();
        assert_eq!(*r.current(), "one");
        assert_eq!(builds(), before, "unchanged files are not rebuilt");

        std::fs::write(&files.cert, "two2").unwrap();
        assert_eq!(*r.current(), "two2");

        std::fs::write(&files.cert, "bad").unwrap();
        assert_eq!(*r.current(), "two2", "a bad file keeps the old value");
        let after_bad = builds();
        assert_eq!(*r.current(), "two2");
        assert_eq!(builds(), after_bad, "the same bad files are not retried");

        std::fs::remove_file(&files.cert).unwrap();
        assert_eq!(*r.current(), "two2", "a missing file keeps the old value");

        std::fs::write(&files.cert, "three").unwrap();
        assert_eq!(*r.current(), "three");
    }

    #[test]
    fn unusable_files_at_start_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let files = files(dir.path());
        let err = Reloading::load(files, "test", build)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cert"), "{err}");
    }
}
