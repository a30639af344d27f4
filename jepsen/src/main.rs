//! `lock-jepsen`: the command line. `check` re-checks a recorded history and writes its report.
//!
//! Exit codes: 0 every property passed; 1 a violation; 3 a property could not be decided
//! (unknown); 2 the harness failed (a malformed history, an unwritable folder) — a harness
//! failure is never reported as a verdict.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use lock_jepsen::args::parse_duration;
use lock_jepsen::checker::{self, Analysis, CheckConfig, Status, duration_ns};
use lock_jepsen::{history, report};

/// Exit code when a property failed.
const EXIT_VIOLATION: u8 = 1;
/// Exit code when the harness itself failed.
const EXIT_HARNESS_FAILURE: u8 = 2;
/// Exit code when the verdict is unknown.
const EXIT_UNKNOWN: u8 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "lock-jepsen",
    version,
    about = "Fault-injection tests for lockd"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Re-checks an existing history and writes results.json and index.html.
    Check {
        /// The history (JSON Lines).
        #[arg(long)]
        history: PathBuf,
        /// Where to write the report (default: the history's folder).
        #[arg(long)]
        out: Option<PathBuf>,
        /// How soon after the last heal every key must be granted again.
        #[arg(long, value_parser = parse_duration, default_value = "20s")]
        recovery_bound: Duration,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(Status::Pass) => ExitCode::SUCCESS,
        Ok(Status::Fail) => ExitCode::from(EXIT_VIOLATION),
        Ok(Status::Unknown) => ExitCode::from(EXIT_UNKNOWN),
        Err(e) => {
            eprintln!("lock-jepsen: harness failure (no verdict): {e:#}");
            ExitCode::from(EXIT_HARNESS_FAILURE)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<Status> {
    match cli.command {
        Command::Check {
            history: path,
            out,
            recovery_bound,
        } => {
            let ops = history::read(&path)?;
            let config = CheckConfig {
                recovery_bound_ns: duration_ns(recovery_bound),
            };
            let analysis = Analysis::new(&ops)?;
            let verdict = checker::check_analysis(&analysis, &config);
            let results = report::results(&ops, &verdict, &config, None);
            let dir = out.unwrap_or_else(|| {
                path.parent()
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from("."))
            });
            report::write(&dir, &analysis, &verdict, &results)?;
            print_verdict(&results);
            eprintln!("report: {}", dir.join(report::HTML_FILE).display());
            Ok(verdict.status)
        }
    }
}

fn print_verdict(results: &report::Results) {
    for p in &results.properties {
        println!(
            "{:<16} {:<8} checked={:<7} excused={:<5} violations={}{}",
            p.name,
            format!("{:?}", p.status).to_lowercase(),
            p.checked,
            p.excused,
            p.violation_count,
            p.note
                .as_deref()
                .map(|n| format!("  ({n})"))
                .unwrap_or_default()
        );
        for v in p.violations.iter().take(5) {
            println!("    {}", v.message);
        }
    }
    println!(
        "verdict: {:?} — {} operations, {} faults installed, {} violations",
        results.status,
        results.stats.operations,
        results.stats.faults_installed(),
        results.violations
    );
}
