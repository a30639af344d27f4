//! `lock-bench plot`: reads the JSON file a run wrote, tells a comparison table's
//! `results.json` from a W5 run's `w5.json` by its `"tool"`, and redraws that run's plots
//! (`figures` or `w5_figures`) into a directory.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use super::figures::{self, Outcome};
use super::w5_figures;

/// Largest JSON file read, in bytes (a full table run with a sweep writes about 100 KiB, a
/// W5 run less).
pub const JSON_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// The `"tool"` of a comparison table's `results.json`.
pub const TABLE_TOOL: &str = "lock-bench";

/// Which run wrote a file, by its `"tool"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The comparison table's `results.json` (`"tool": "lock-bench"`).
    Table,
    /// W5's `w5.json` (`"tool": "lock-bench w5"`).
    W5,
}

/// Only the `"tool"` of a file; every other field is ignored here.
#[derive(Debug, Deserialize)]
struct ToolView {
    tool: Option<serde_json::Value>,
}

/// Which run wrote the JSON text `json`; refuses text that is not JSON or whose `"tool"` is
/// neither lock-bench's table nor W5, naming what it found.
pub fn kind(json: &str) -> Result<Kind> {
    let view: ToolView = serde_json::from_str(json)
        .context("not a lock-bench results.json nor w5.json (not a JSON object)")?;
    match view.tool.as_ref().and_then(serde_json::Value::as_str) {
        Some(TABLE_TOOL) => Ok(Kind::Table),
        Some(w5_figures::TOOL) => Ok(Kind::W5),
        _ => bail!(
            "not a lock-bench results.json nor w5.json: its \"tool\" is {}, not \
             \"{TABLE_TOOL}\" nor \"{}\"",
            view.tool
                .map_or_else(|| "missing".to_owned(), |t| t.to_string()),
            w5_figures::TOOL
        ),
    }
}

/// Reads `path` as text, at most [`JSON_BYTES_MAX`] bytes.
fn read(path: &Path) -> Result<String> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    if size > JSON_BYTES_MAX {
        bail!(
            "{} is {size} bytes, more than a results.json or w5.json can be ({JSON_BYTES_MAX})",
            path.display()
        );
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// `lock-bench plot`: draws every plot `input` (a `results.json` or a `w5.json`) has the data
/// for into `dir` and answers the files written; fails, naming the file and what is missing,
/// when it is neither or has the data for no plot.
pub fn plot_file(input: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    let json = read(input)?;
    let outcomes = match kind(&json).with_context(|| format!("reading {}", input.display()))? {
        Kind::Table => {
            let results = figures::Results::parse(&json)
                .with_context(|| format!("reading {}", input.display()))?;
            figures::write_all(&results, dir)?
        }
        Kind::W5 => {
            let report = w5_figures::W5Report::parse(&json)
                .with_context(|| format!("reading {}", input.display()))?;
            w5_figures::write_all(&report, dir)?
        }
    };
    let (mut written, mut missing) = (Vec::new(), Vec::new());
    for outcome in outcomes {
        match outcome {
            Outcome::Written(path) => written.push(path),
            Outcome::Skipped(file, why) => missing.push(format!("{file}: {why}")),
        }
    }
    if written.is_empty() {
        bail!(
            "nothing to plot in {}:\n  {}",
            input.display(),
            missing.join("\n  ")
        );
    }
    for why in missing {
        eprintln!("lock-bench plot: skipped {why}");
    }
    Ok(written)
}
