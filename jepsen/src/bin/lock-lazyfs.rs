//! `lock-lazyfs`: a FUSE file system that keeps file writes in memory until they are fsynced
//! and, told `cut SEED` on its control socket, loses a seeded random part of what was never
//! synced — the power-cut nemesis's disk. See `lock_jepsen::lazyfs`.
//!
//! Exit codes: 0 unmounted when told; 2 it could not mount or serve (the message says why).

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lock_jepsen::lazyfs::cache::UNSYNCED_BYTES_MAX_DEFAULT;
use lock_jepsen::lazyfs::daemon::{self, MountArgs};

#[derive(Debug, Parser)]
#[command(
    name = "lock-lazyfs",
    version,
    about = "A file system that loses unsynced writes on command"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Mounts BACKING at MOUNTPOINT and serves the control socket until `unmount`.
    Mount {
        /// The directory whose files the mount shows (and where synced data lands).
        #[arg(long)]
        backing: PathBuf,
        /// Where to mount (an existing, empty directory).
        #[arg(long)]
        mountpoint: PathBuf,
        /// The control socket to create (commands: cut SEED, flush, stats, hold-syncs MS,
        /// release-syncs, unmount).
        #[arg(long)]
        control: PathBuf,
        /// Most unsynced bytes kept in memory; beyond it files are written back (not synced).
        #[arg(long, default_value_t = UNSYNCED_BYTES_MAX_DEFAULT)]
        unsynced_bytes_max: u64,
    },
}

fn main() -> ExitCode {
    let Command::Mount {
        backing,
        mountpoint,
        control,
        unsynced_bytes_max,
    } = Cli::parse().command;
    match daemon::run(&MountArgs {
        backing,
        mountpoint,
        control,
        unsynced_bytes_max,
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lock-lazyfs: {e:#}");
            ExitCode::from(2)
        }
    }
}
