//! The `lockd` binary: see [`lockd::cli`].

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    lockd::cli::main()
}
