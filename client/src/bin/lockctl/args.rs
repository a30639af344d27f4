//! lockctl's command line: the flags, their defaults, and the checks that make a value the
//! cluster would refuse a bad command line (exit 2, naming the flag) before anything is sent.
//!
//! The checks are lock-api's own (`validate`, `limits`), so lockctl and the server cannot
//! disagree about what is valid; lockctl only runs them earlier, to name the flag.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use lock_api::validate;
use lock_client::config::TIMEOUT_MAX;
use lock_client::limits::{MAX_WAIT_MAX, TTL_MAX, TTL_MIN};
use lock_client::{LockError, TlsConfig};

use crate::exit::EXIT_CODES;

/// The endpoints of the cluster `lockd dev` starts, used when neither `--endpoints` nor
/// `LOCKD_ENDPOINTS` is given.
pub const DEV_ENDPOINTS: &str = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103";

#[derive(Parser, Debug)]
#[command(
    name = "lockctl",
    version,
    about = "Acquire, inspect and manage locks of a lockd cluster",
    after_help = "Exit codes: 0 done (exec: CMD's own status); 1 refused; 2 bad command line; \
                  3 not granted / lost / nothing released; 4 exec lost the lock; \
                  5 cluster unavailable. `--help` explains each.",
    after_long_help = EXIT_CODES
)]
pub struct Cli {
    /// Comma-separated lockd endpoints (host:port); any node will do, the leader is found.
    #[arg(long, env = "LOCKD_ENDPOINTS", default_value = DEV_ENDPOINTS, value_delimiter = ',', global = true)]
    pub endpoints: Vec<String>,
    /// Budget of the command's calls to the cluster, retries included (e.g. 10s, 500ms);
    /// `acquire` and `exec` may wait --wait on top. Past it lockctl exits 5.
    #[arg(long, default_value = "10s", value_parser = parse_timeout, global = true)]
    pub timeout: Duration,
    /// The CA certificate (PEM) that signs the cluster's certificates; with it lockctl speaks
    /// TLS (`lockd dev`: .lockd-dev/tls/ca.pem). Also `--ca`.
    #[arg(
        long = "tls-ca",
        visible_alias = "ca",
        env = "LOCKD_CA",
        value_name = "PATH",
        value_parser = parse_path,
        global = true
    )]
    pub ca: Option<PathBuf>,
    /// This client's certificate (PEM), for nodes that require one; needs --tls-key. Also
    /// `--cert`.
    #[arg(
        long = "tls-cert",
        visible_alias = "cert",
        env = "LOCKD_CERT",
        value_name = "PATH",
        value_parser = parse_path,
        global = true
    )]
    pub cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert. (Not `--key`: that is the lock key.)
    #[arg(
        long = "tls-key",
        env = "LOCKD_KEY",
        value_name = "PATH",
        value_parser = parse_path,
        global = true
    )]
    pub tls_key: Option<PathBuf>,
    /// A bearer token, for nodes that accept one instead of a client certificate; sent only
    /// over TLS (needs --tls-ca). Not `--token`: that is the fencing token of `renew`/`release`.
    #[arg(
        long,
        env = "LOCKD_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true,
        value_parser = parse_blank_ok,
        global = true
    )]
    pub auth_token: Option<String>,
    #[command(subcommand)]
    pub command: Cmd,
    /// Whether `endpoints` is the default (set after parsing, from clap's value source).
    #[arg(skip)]
    pub endpoints_defaulted: bool,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Acquire a lock, waiting up to --wait; print the handle as JSON.
    Acquire {
        #[command(flatten)]
        lock: LockArgs,
        /// How long to wait for the current holder (at most 5m).
        #[arg(long, default_value = "30s", value_parser = parse_wait)]
        wait: Duration,
    },
    /// Try once to acquire a lock, without waiting; print the handle as JSON.
    Try {
        #[command(flatten)]
        lock: LockArgs,
    },
    /// Extend a lock's lease (and heartbeat its session); print the new handle as JSON.
    Renew {
        #[command(flatten)]
        grant: GrantArgs,
        /// The new lease length (1s to 1h).
        #[arg(long, default_value = "30s", value_parser = parse_ttl)]
        ttl: Duration,
    },
    /// Release a lock; prints {"released": true|false}. When nothing was released it says why
    /// (on stderr, and as "why" in the JSON) and exits 3.
    Release {
        #[command(flatten)]
        grant: GrantArgs,
    },
    /// Show a key's current holder (advisory only, never for correctness decisions).
    Inspect {
        /// The lock key.
        #[arg(long, value_parser = parse_key)]
        key: String,
    },
    /// Break-glass: delete a key's grant whoever holds it and fence its holder out (audited).
    Revoke {
        /// The lock key.
        #[arg(long, value_parser = parse_key)]
        key: String,
        /// Who is revoking, recorded in the audit log. Leave it out over TLS: the node records
        /// the caller's principal (its certificate's or its token's), and a name other than
        /// that is refused. Needed against an `--insecure` node, which authenticates nobody.
        #[arg(long, value_parser = parse_operator)]
        operator: Option<String>,
        /// Why (recorded in the audit log).
        #[arg(long, value_parser = parse_reason)]
        reason: String,
    },
    /// Print the force-revoke audit log, newest first, one JSON object per line (key,
    /// operator, reason, previous_owner_id, previous_token, new_token_floor,
    /// revoked_at_unix_ms, request_id); follows every page. Needs the operator role.
    Audit {
        /// Only the revocations of this key.
        #[arg(long, value_parser = parse_key)]
        key: Option<String>,
    },
    /// Show each node's view of the cluster: role, leader, term, members, log indexes.
    Status,
    /// Run CMD while holding the lock on --key; CMD gets LOCK_FENCING_TOKEN, LOCK_KEY and
    /// LOCK_OWNER in its environment, is killed if the lock is lost, and its exit status is
    /// lockctl's.
    Exec {
        #[command(flatten)]
        lock: LockArgs,
        /// How long to wait for the current holder (at most 5m).
        #[arg(long, default_value = "60s", value_parser = parse_wait)]
        wait: Duration,
        /// The command and its arguments (after `--`).
        #[arg(required = true, last = true)]
        cmd: Vec<String>,
    },
}

#[derive(Args, Debug)]
pub struct LockArgs {
    /// The lock key (not blank, at most 256 bytes).
    #[arg(long, value_parser = parse_key)]
    pub key: String,
    /// The owner id (default: lockctl@HOST:PID).
    #[arg(long, value_parser = parse_owner)]
    pub owner: Option<String>,
    /// The lease length, 1s to 1h (renewed automatically by `exec`).
    #[arg(long, default_value = "30s", value_parser = parse_ttl)]
    pub ttl: Duration,
    /// The session TTL, 1s to 1h (default: the lease length).
    #[arg(long, value_parser = parse_ttl)]
    pub session_ttl: Option<Duration>,
}

#[derive(Args, Debug)]
pub struct GrantArgs {
    /// The session id printed by `acquire` / `try`.
    #[arg(long, value_parser = parse_session_id)]
    pub session: String,
    /// The lock key.
    #[arg(long, value_parser = parse_key)]
    pub key: String,
    /// The fencing token printed by `acquire` / `try`.
    #[arg(long, value_parser = parse_token)]
    pub token: u64,
}

impl Cli {
    /// The TLS config the flags (or `LOCKD_CA`, `LOCKD_CERT`, `LOCKD_KEY`) give; `Err` naming
    /// the flag and its variable when they do not fit together. A blank value counts as unset.
    pub fn tls(&self) -> Result<Option<TlsConfig>, LockError> {
        let given = |path: &Option<PathBuf>| path.clone().filter(|p| !p.as_os_str().is_empty());
        let (ca, cert, key) = (given(&self.ca), given(&self.cert), given(&self.tls_key));
        let tls = match (ca, &cert, &key) {
            (None, None, None) => None,
            (None, _, _) => {
                return Err(LockError::invalid(
                    "--tls-cert/--tls-key (LOCKD_CERT/LOCKD_KEY) are given but --tls-ca \
                     (LOCKD_CA) is not: give the CA file that signs the cluster's certificates",
                ));
            }
            (Some(_), Some(_), None) => {
                return Err(LockError::invalid(
                    "--tls-cert (LOCKD_CERT) is given but --tls-key (LOCKD_KEY) is not",
                ));
            }
            (Some(_), None, Some(_)) => {
                return Err(LockError::invalid(
                    "--tls-key (LOCKD_KEY) is given but --tls-cert (LOCKD_CERT) is not",
                ));
            }
            (Some(ca), cert, key) => Some(TlsConfig {
                ca,
                cert: cert.clone(),
                key: key.clone(),
            }),
        };
        if tls.is_none() && self.token().is_some() {
            return Err(LockError::invalid(
                "--auth-token (LOCKD_TOKEN) is only sent over TLS: give --tls-ca (LOCKD_CA) too",
            ));
        }
        Ok(tls)
    }

    /// The bearer token of `--auth-token` / `LOCKD_TOKEN`, if one is given (not blank).
    pub fn token(&self) -> Option<String> {
        self.auth_token.clone().filter(|t| !t.trim().is_empty())
    }
}

/// A file path, blank allowed: `LOCKD_CERT=` in the environment means "unset", which
/// [`Cli::tls`] decides, rather than the "a value is required" of clap's own path parser.
fn parse_path(text: &str) -> Result<PathBuf, String> {
    Ok(PathBuf::from(text))
}

/// Any text, blank allowed (`LOCKD_TOKEN=` means "unset"; see [`Cli::token`]).
fn parse_blank_ok(text: &str) -> Result<String, String> {
    Ok(text.to_owned())
}

/// Parses `500ms`, `30s`, `2m`, `1h` or a plain number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 500ms, 30s, 2m or 1h"))?;
    let millis = match unit {
        "ms" => Some(value),
        "" | "s" => value.checked_mul(1_000),
        "m" => value.checked_mul(60_000),
        "h" => value.checked_mul(3_600_000),
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (use ms, s, m or h)"
            ));
        }
    };
    millis
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// A duration as a person writes it: the largest whole unit of `ms`, `s`, `m`, `h`.
pub fn show(duration: Duration) -> String {
    let ms = duration.as_millis();
    match ms {
        0 => "0s".to_owned(),
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1_000) => format!("{}s", ms / 1_000),
        _ => format!("{ms}ms"),
    }
}

/// A lease (`--ttl`, `--session-ttl`): within the contract's bounds, so a TTL the server
/// would refuse is a bad command line (exit 2) that names the flag, before anything is sent.
fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse_duration(text)?;
    if ttl < TTL_MIN || ttl > TTL_MAX {
        return Err(format!(
            "a lease must be between {} and {} (lock-api limits TTL_MIN and TTL_MAX)",
            show(TTL_MIN),
            show(TTL_MAX)
        ));
    }
    Ok(ttl)
}

/// `--wait`: from zero (one attempt) up to the longest server-side wait.
fn parse_wait(text: &str) -> Result<Duration, String> {
    let wait = parse_duration(text)?;
    if wait > MAX_WAIT_MAX {
        return Err(format!(
            "the longest wait is {} (lock-api limit MAX_WAIT_MAX); call again to wait longer",
            show(MAX_WAIT_MAX)
        ));
    }
    Ok(wait)
}

/// `--timeout`: positive (a zero budget could not make one attempt), at most the SDK's bound.
fn parse_timeout(text: &str) -> Result<Duration, String> {
    let timeout = parse_duration(text)?;
    if timeout.is_zero() || timeout > TIMEOUT_MAX {
        return Err(format!(
            "the timeout must be more than 0 and at most {}",
            show(TIMEOUT_MAX)
        ));
    }
    Ok(timeout)
}

/// The message of a contract check, without the "invalid argument:" prefix that clap's
/// "invalid value … for '--flag'" already says.
fn checked(text: &str, check: fn(&str) -> Result<(), LockError>) -> Result<String, String> {
    match check(text) {
        Ok(()) => Ok(text.to_owned()),
        Err(LockError::InvalidArgument { message }) => Err(message),
        Err(other) => Err(other.to_string()),
    }
}

fn parse_key(text: &str) -> Result<String, String> {
    checked(text, validate::key)
}

fn parse_owner(text: &str) -> Result<String, String> {
    checked(text, validate::owner_id)
}

fn parse_session_id(text: &str) -> Result<String, String> {
    checked(text, validate::session_id)
}

fn parse_operator(text: &str) -> Result<String, String> {
    checked(text, validate::operator)
}

fn parse_reason(text: &str) -> Result<String, String> {
    checked(text, validate::reason)
}

fn parse_token(text: &str) -> Result<u64, String> {
    let token: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a fencing token (a positive integer)"))?;
    validate::fencing_token(token).map_err(|err| match err {
        LockError::InvalidArgument { message } => message,
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "s", "1d", "-1s", "1.5s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn durations_show_in_their_largest_whole_unit() {
        assert_eq!(show(Duration::from_millis(1500)), "1500ms");
        assert_eq!(show(Duration::from_secs(1)), "1s");
        assert_eq!(show(Duration::from_secs(300)), "5m");
        assert_eq!(show(Duration::from_secs(3600)), "1h");
    }

    #[test]
    fn values_the_cluster_would_refuse_are_refused_here() {
        assert_eq!(parse_ttl("1s"), Ok(TTL_MIN));
        assert_eq!(parse_ttl("1h"), Ok(TTL_MAX));
        for bad in ["0s", "999ms", "61m"] {
            let err = parse_ttl(bad).expect_err(bad);
            assert!(err.contains("between 1s and 1h"), "{err}");
        }
        assert_eq!(parse_wait("0s"), Ok(Duration::ZERO));
        assert!(parse_wait("301s").is_err());
        assert!(parse_timeout("0s").is_err());
        assert!(parse_key(" ").is_err_and(|e| e.contains("blank")));
        assert_eq!(parse_key("k").as_deref(), Ok("k"));
        assert!(parse_token("0").is_err());
        assert_eq!(parse_token("7"), Ok(7));
    }

    #[test]
    fn tls_flags_that_do_not_fit_together_are_named() {
        // Fields set directly, so a LOCKD_CA exported in the developer's shell cannot leak in.
        let mut cli = Cli::try_parse_from(["lockctl", "status"]).expect("parses");
        let set = |cli: &mut Cli, ca: Option<&str>, cert: Option<&str>, key: Option<&str>| {
            cli.ca = ca.map(PathBuf::from);
            cli.cert = cert.map(PathBuf::from);
            cli.tls_key = key.map(PathBuf::from);
        };
        let named = |result: Result<Option<TlsConfig>, LockError>, words: &[&str]| match result {
            Err(LockError::InvalidArgument { message }) => {
                for word in words {
                    assert!(message.contains(word), "{message} should name {word}");
                }
            }
            other => panic!("expected InvalidArgument naming {words:?}, got {other:?}"),
        };
        cli.auth_token = None;
        set(&mut cli, None, None, None);
        assert_eq!(cli.tls(), Ok(None));
        set(&mut cli, Some("ca.pem"), Some("c.pem"), Some("k.pem"));
        assert_eq!(
            cli.tls(),
            Ok(Some(
                TlsConfig::new("ca.pem").with_identity("c.pem", "k.pem")
            ))
        );
        set(&mut cli, Some(""), None, None);
        assert_eq!(cli.tls(), Ok(None), "a blank LOCKD_CA counts as unset");
        set(&mut cli, None, Some("c.pem"), Some("k.pem"));
        named(cli.tls(), &["--tls-ca", "LOCKD_CA"]);
        set(&mut cli, Some("ca.pem"), Some("c.pem"), None);
        named(cli.tls(), &["--tls-key", "LOCKD_KEY"]);
        set(&mut cli, Some("ca.pem"), None, Some("k.pem"));
        named(cli.tls(), &["--tls-cert", "LOCKD_CERT"]);
        set(&mut cli, None, None, None);
        cli.auth_token = Some("t0ken".to_owned());
        named(cli.tls(), &["--auth-token", "--tls-ca"]);
    }

    #[test]
    fn the_command_line_is_consistent() {
        // Also: no global flag shadows a subcommand's (`--key`, `--token`), which clap only
        // notices when the subcommand's flag is read.
        for args in [
            &[
                "lockctl",
                "--ca",
                "a",
                "--cert",
                "c",
                "--tls-key",
                "k",
                "try",
                "--key",
                "lk",
            ][..],
            &[
                "lockctl",
                "--auth-token",
                "t",
                "release",
                "--session",
                "s",
                "--key",
                "k",
                "--token",
                "3",
            ],
        ] {
            let cli = Cli::try_parse_from(args).expect("parses");
            match &cli.command {
                Cmd::Try { lock } => assert_eq!(lock.key, "lk"),
                Cmd::Release { grant } => assert_eq!((grant.key.as_str(), grant.token), ("k", 3)),
                other => panic!("{other:?}"),
            }
        }
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
