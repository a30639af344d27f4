//! The `lockd` command line (`docs/NODE_CLI.md`): `lockd run` starts one node, `lockd dev` a
//! three-node cluster in the foreground.
//!
//! Owns argument parsing, logging set-up, the runtime and the exit code. Configuration errors
//! exit with status 2 and a message naming the field, before anything touches the data dir.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use crate::config::{Config, LogFormat, RunArgs};
use crate::dev::{DevArgs, Signals};

/// The default log filter when `RUST_LOG` is not set: lockd at info, openraft's chattier
/// modules at warn (it logs every vote and membership step at info).
const LOG_FILTER_DEFAULT: &str = "info,openraft=warn";

/// lockd: a Raft-replicated lock service.
#[derive(Parser, Debug)]
#[command(name = "lockd", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: CliCommand,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum CliCommand {
    /// Run one node.
    Run(Box<RunArgs>),
    /// Run a three-node cluster on 127.0.0.1 in the foreground (Ctrl-C stops it).
    Dev(DevArgs),
}

fn init_logging(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(LOG_FILTER_DEFAULT));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only on a terminal: `lockd dev` and the test harness send stderr to files.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The async runtime: `worker_threads` workers, or one per core.
fn runtime(worker_threads: Option<usize>) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = worker_threads {
        builder.worker_threads(n);
    }
    builder.enable_all().build().map_err(|e| {
        eprintln!("lockd: cannot start the async runtime: {e}");
        ExitCode::FAILURE
    })
}

/// Parses the command line and runs it; returns the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        CliCommand::Run(args) => {
            let config = match Config::load(&args) {
                Ok(config) => config,
                Err(err) => {
                    eprintln!("lockd: {err}");
                    return ExitCode::from(2);
                }
            };
            init_logging(config.log_format);
            let rt = match runtime(config.worker_threads) {
                Ok(rt) => rt,
                Err(code) => return code,
            };
            let result = rt.block_on(async move {
                let mut signals = Signals::new()?;
                let shutdown = async move {
                    signals.recv().await;
                    tracing::info!("signal received; shutting down");
                };
                crate::server::run(config, None, shutdown).await
            });
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    tracing::error!("{err:#}");
                    eprintln!("lockd: {err:#}");
                    ExitCode::FAILURE
                }
            }
        }
        CliCommand::Dev(args) => {
            init_logging(LogFormat::Human);
            // The supervisor only starts, watches and stops its three node processes.
            let rt = match runtime(Some(1)) {
                Ok(rt) => rt,
                Err(code) => return code,
            };
            match rt.block_on(crate::dev::run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("lockd dev: {err:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
