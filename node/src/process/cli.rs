//! The `lockd` command line (`docs/NODE_CLI.md`): `lockd run` starts one node, `lockd dev` a
//! three-node cluster in the foreground.
//!
//! Owns argument parsing, logging set-up, the runtime and the exit code. Configuration errors
//! exit with status 2 and a message naming the field, before anything touches the data dir.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use crate::process::config::{Config, LogFormat, RunArgs};
use crate::process::dev::{DevArgs, Signals};
use crate::process::huge_pages;

/// The default log filter when `RUST_LOG` is not set: lockd at info, openraft at warn (it logs
/// every vote and membership step at info), and at error the openraft modules whose warnings
/// come once per retry or per message (issue 17: 800 000 lines in 20 s with one follower down):
///
/// - `openraft::replication`: "ReplicationCore recv RPCError … sending error to RaftCore", per
///   failed stream (its submodules with warnings worth a line stay at warn);
/// - `openraft::engine::handler::replication_handler`: "update progress error", the same
///   failure as seen by RaftCore;
/// - `openraft::core::heartbeat`: "failed to send a heartbeat", per heartbeat interval;
/// - `openraft::core::raft_core`: "while requesting vote/pre-vote, error", per peer per
///   election round, and "a message will be ignored", per stale message.
///
/// lockd says the same once per change instead: `raft::peer_health` logs a peer becoming
/// unreachable and reachable again and summarises the attempts in between. Setting `RUST_LOG`
/// replaces this filter whole, so `RUST_LOG=info,openraft=warn` brings every line back.
const LOG_FILTER_DEFAULT: &str = concat!(
    "info,openraft=warn,",
    "openraft::replication=error,",
    "openraft::replication::stream_state=warn,",
    "openraft::replication::replication_handle=warn,",
    "openraft::replication::snapshot_transmitter=warn,",
    "openraft::engine::handler::replication_handler=error,",
    "openraft::core::heartbeat=error,",
    "openraft::core::raft_core=error",
);

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

/// The log filter: `rust_log` (the `RUST_LOG` variable) when it is set and parses, else
/// [`LOG_FILTER_DEFAULT`].
fn log_filter(rust_log: Option<&str>) -> EnvFilter {
    rust_log
        .and_then(|directives| EnvFilter::try_new(directives).ok())
        .unwrap_or_else(|| EnvFilter::new(LOG_FILTER_DEFAULT))
}

fn init_logging(format: LogFormat) {
    let rust_log = std::env::var(EnvFilter::DEFAULT_ENV).ok();
    let filter = log_filter(rust_log.as_deref());
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
            // Before the runtime's threads start and the state loads: see `huge_pages`.
            let allow = std::env::var(huge_pages::ALLOW_VAR).ok();
            huge_pages::log(&huge_pages::disable_unless_allowed(allow.as_deref()));
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
            match rt.block_on(crate::process::dev::run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("lockd dev: {err:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// Counts the events a filter lets through.
    struct Count(Arc<AtomicUsize>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Count {
        fn on_event(&self, _: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// How many of the events `emit` makes pass `filter`.
    fn passed(filter: EnvFilter, emit: impl FnOnce()) -> usize {
        let count = Arc::new(AtomicUsize::new(0));
        let subscriber = tracing_subscriber::registry()
            .with(filter)
            .with(Count(count.clone()));
        tracing::subscriber::with_default(subscriber, emit);
        count.load(Ordering::SeqCst)
    }

    fn retry_warnings() {
        tracing::warn!(target: "openraft::replication", "ReplicationCore recv RPCError");
        tracing::warn!(target: "openraft::engine::handler::replication_handler", "update progress error");
        tracing::warn!(target: "openraft::core::heartbeat::worker", "failed to send a heartbeat");
        tracing::warn!(target: "openraft::core::raft_core", "while requesting vote, error");
    }

    #[test]
    fn the_default_filter_drops_openrafts_per_retry_warnings_and_keeps_the_rest() {
        assert_eq!(passed(log_filter(None), retry_warnings), 0);
        let kept = passed(log_filter(None), || {
            tracing::info!(target: "lockd::raft::peer_health", "raft peer reachable again");
            tracing::warn!(target: "openraft::storage", "a storage warning");
            tracing::warn!(target: "openraft::replication::stream_state", "a stream warning");
            tracing::error!(target: "openraft::replication", "an error");
            tracing::info!(target: "openraft::core::raft_core", "a vote at info");
        });
        assert_eq!(kept, 4, "only openraft's info line is below the default");
    }

    #[test]
    fn rust_log_replaces_the_default_and_brings_them_back() {
        assert_eq!(
            passed(log_filter(Some("info,openraft=warn")), retry_warnings),
            4
        );
        // A RUST_LOG that does not parse leaves the default in place.
        assert_eq!(passed(log_filter(Some("openraft=loud")), retry_warnings), 0);
    }
}
