//! Runs one of `bench/`'s Python tools for the tests of what it prints. Needs `python3`, which
//! README's test command (`scripts/test`) installs.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `name` under `bench/`: a tool, or a fixture under `tests/data/`.
pub fn bench_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(name)
}

/// Runs `bench/<tool>` with `args` and answers how it ended.
pub fn run<I, S>(tool: &str, args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new("python3")
        .arg(bench_path(tool))
        .args(args)
        .output()
        .expect("python3 runs (scripts/test installs it)")
}

/// Runs `bench/<tool>` with `args` and answers its standard output; fails the test with what
/// the tool printed if it did not succeed.
pub fn run_ok<I, S>(tool: &str, args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let output = run(tool, args);
    let stdout = String::from_utf8(output.stdout).expect("the tool writes UTF-8");
    assert!(
        output.status.success(),
        "{tool} failed: {}{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}
