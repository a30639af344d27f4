//! [`ClientConfig`]: every timing knob of the SDK, with its default and the reason for it.
//!
//! Owns the numbers and the credentials' names (the TLS files, the token); it performs no IO
//! and starts no task ([`ClientConfig::from_env`] reads environment variables only).
//! [`ClientConfig::validate`] is called by [`crate::LockClient::connect_with`] before anything
//! is dialled, and its errors name the field that is wrong.

use std::fmt;
use std::time::Duration;

use lock_api::LockError;
use lock_api::limits::{TTL_MAX, TTL_MIN};

use crate::tls::{ENV_TOKEN, TlsConfig};

/// Default time one RPC attempt may take before the SDK gives up on that endpoint and retries
/// elsewhere. Two seconds is several election timeouts (the node's default maximum is 800 ms),
/// so a healthy leader is never abandoned by mistake, yet a hung node costs one attempt only.
pub const ATTEMPT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(2);

/// Default budget of a whole call, retries included (FR-28: retries are bounded). Ten seconds
/// outlasts a leader failover (a few election timeouts) with room to spare; past it the call
/// answers `Contention` / `NotLeader` so the caller decides.
pub const CALL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// Default TCP connect timeout. A node on the same network answers a SYN in well under a
/// millisecond; a second covers a loaded host without stalling failover on a dead one.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(1);

/// Default session TTL. The session dies (and every lock on it) if no heartbeat reaches the
/// leader for this long. Heartbeats go at a third of it, so two may be lost in a row, and ten
/// seconds outlasts a failover.
pub const SESSION_TTL_DEFAULT: Duration = Duration::from_secs(10);

/// Longest any timeout or backoff of the config may be. An hour is far beyond any sane call
/// budget, and the bound keeps `Instant + timeout` from overflowing.
pub const TIMEOUT_MAX: Duration = Duration::from_secs(60 * 60);

/// Smallest safety margin the default policy uses (see [`SafetyMargin::Default`]).
pub const SAFETY_MARGIN_FLOOR: Duration = Duration::from_millis(100);

/// The default safety margin is `ttl / SAFETY_MARGIN_TTL_DIVISOR` (10 %), never below
/// [`SAFETY_MARGIN_FLOOR`].
pub const SAFETY_MARGIN_TTL_DIVISOR: u32 = 10;

/// How much of a handle's lease the SDK gives up to be safe (FR-11, C2 D3 `lock.client.safety-margin`).
///
/// A handle's `client_deadline` is `instant before the request was sent + ttl - margin`. The
/// server's lease starts no earlier than it stamps the command, which is after the send, so
/// the send instant alone is already conservative; the margin absorbs what that cannot:
/// the client's and the leader's clocks running at slightly different *rates*, timer and
/// scheduling lag between the deadline passing and the listener stopping the work, and the time
/// the caller's side effect takes to leave the process after its last check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SafetyMargin {
    /// `max(100 ms, ttl / 10)`: for the 1 s minimum TTL that is 100 ms (scheduling lag on a
    /// loaded host); for a 30 s TTL, 3 s (a long GC-like pause, and 0.1 % clock-rate drift is
    /// 30 ms, far inside it). Proportional because longer leases are used for longer critical
    /// sections, whose pauses are longer too.
    #[default]
    Default,
    /// A fixed margin for every TTL. Must be shorter than every TTL you acquire with; an acquire
    /// whose TTL is not longer than the margin is rejected as `InvalidArgument`.
    Fixed(Duration),
}

impl SafetyMargin {
    /// The margin for a lease of `ttl`.
    pub fn for_ttl(self, ttl: Duration) -> Duration {
        match self {
            Self::Default => (ttl / SAFETY_MARGIN_TTL_DIVISOR).max(SAFETY_MARGIN_FLOOR),
            Self::Fixed(margin) => margin,
        }
    }
}

/// Bounded, jittered exponential backoff between retries (FR-28). See [`crate::backoff`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffConfig {
    /// The ceiling of the first delay. Default 25 ms: a leader change is usually resolved by
    /// the next attempt, so the first retry comes quickly.
    pub initial: Duration,
    /// The largest ceiling any delay can reach. Default 1 s: long enough to stop a retry storm
    /// against a cluster that is electing, short enough that a call notices the new leader
    /// within a second of it being elected.
    pub max: Duration,
    /// The ceiling doubles (times this factor) after every retry. Default 2.
    pub multiplier: u32,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(25),
            max: Duration::from_secs(1),
            multiplier: 2,
        }
    }
}

/// The SDK's configuration. [`ClientConfig::from_env`] is what [`crate::LockClient::connect`]
/// uses: the defaults, with TLS and the token from the environment. Every field's default is
/// documented with its reason. `Debug` shows whether a token is set, never the token.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// One RPC attempt's timeout (default [`ATTEMPT_TIMEOUT_DEFAULT`]). A blocking acquire's
    /// attempt gets `max_wait` on top of it, since the server holds that request on purpose.
    pub attempt_timeout: Duration,
    /// A whole call's budget including retries (default [`CALL_TIMEOUT_DEFAULT`]); a blocking
    /// acquire gets `max_wait` on top of it.
    pub call_timeout: Duration,
    /// TCP connect timeout per endpoint (default [`CONNECT_TIMEOUT_DEFAULT`]).
    pub connect_timeout: Duration,
    /// Retry backoff (FR-28).
    pub backoff: BackoffConfig,
    /// Seed of the backoff jitter. `None` (the default) seeds from the OS; tests set it to
    /// replay a run.
    pub jitter_seed: Option<u64>,
    /// The TTL sessions are opened with (default [`SESSION_TTL_DEFAULT`]); heartbeats are sent
    /// every third of it.
    pub session_ttl: Duration,
    /// How much of each lease the client deadline gives up (default [`SafetyMargin::Default`]).
    pub safety_margin: SafetyMargin,
    /// Whether `inspect` asks the leader to confirm its leadership first (default `true`), so
    /// the answer reflects every acknowledged write. `false` lets any node answer from state
    /// that may lag. Either way the answer is advisory only (FR-07).
    pub inspect_leader_confirmed: bool,
    /// TLS towards the nodes (default `None`: plaintext, for nodes run with `--insecure`).
    /// A node that serves TLS refuses a plaintext client; see [`TlsConfig`].
    pub tls: Option<TlsConfig>,
    /// A bearer token sent as `authorization: Bearer <token>` on every call (default `None`),
    /// for a client that authenticates without a certificate. Only over TLS: a token on a
    /// plaintext connection could be read off the wire, so [`ClientConfig::validate`]
    /// refuses a token without [`ClientConfig::tls`].
    pub token: Option<String>,
}

impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("attempt_timeout", &self.attempt_timeout)
            .field("call_timeout", &self.call_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("backoff", &self.backoff)
            .field("jitter_seed", &self.jitter_seed)
            .field("session_ttl", &self.session_ttl)
            .field("safety_margin", &self.safety_margin)
            .field("inspect_leader_confirmed", &self.inspect_leader_confirmed)
            .field("tls", &self.tls)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            attempt_timeout: ATTEMPT_TIMEOUT_DEFAULT,
            call_timeout: CALL_TIMEOUT_DEFAULT,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            backoff: BackoffConfig::default(),
            jitter_seed: None,
            session_ttl: SESSION_TTL_DEFAULT,
            safety_margin: SafetyMargin::Default,
            inspect_leader_confirmed: true,
            tls: None,
            token: None,
        }
    }
}

impl ClientConfig {
    /// The defaults, with [`ClientConfig::tls`] from `LOCKD_CA`, `LOCKD_CERT`, `LOCKD_KEY`
    /// ([`TlsConfig::from_env`]) and [`ClientConfig::token`] from `LOCKD_TOKEN` (blank counts
    /// as unset). Errors name the variables that do not fit together.
    pub fn from_env() -> Result<Self, LockError> {
        Ok(Self {
            tls: TlsConfig::from_env()?,
            token: std::env::var(ENV_TOKEN).ok().filter(|t| !t.is_empty()),
            ..Self::default()
        })
    }

    /// Checks the relations the SDK relies on; the error names the field.
    ///
    /// Every timeout must be positive; the backoff must grow (`multiplier >= 1`, `initial <=
    /// max`); `session_ttl` must lie within the server's TTL limits; a fixed safety margin must
    /// be shorter than `session_ttl`, or every session would be born expired; `tls.cert` and
    /// `tls.key` come together; a `token` must not be blank and needs `tls`.
    pub fn validate(&self) -> Result<(), LockError> {
        let positive = [
            ("attempt_timeout", self.attempt_timeout),
            ("call_timeout", self.call_timeout),
            ("connect_timeout", self.connect_timeout),
            ("backoff.initial", self.backoff.initial),
            ("backoff.max", self.backoff.max),
        ];
        for (name, value) in positive {
            if value.is_zero() {
                return Err(LockError::invalid(format!(
                    "client config: {name} must be positive"
                )));
            }
            if value > TIMEOUT_MAX {
                return Err(LockError::invalid(format!(
                    "client config: {name} is {} s; the limit is {} s",
                    value.as_secs(),
                    TIMEOUT_MAX.as_secs()
                )));
            }
        }
        if self.backoff.multiplier == 0 {
            return Err(LockError::invalid(
                "client config: backoff.multiplier must be at least 1",
            ));
        }
        if self.backoff.initial > self.backoff.max {
            return Err(LockError::invalid(format!(
                "client config: backoff.initial ({} ms) exceeds backoff.max ({} ms)",
                self.backoff.initial.as_millis(),
                self.backoff.max.as_millis()
            )));
        }
        if self.session_ttl < TTL_MIN || self.session_ttl > TTL_MAX {
            return Err(LockError::invalid(format!(
                "client config: session_ttl is {} ms; it must be between {} ms and {} ms",
                self.session_ttl.as_millis(),
                TTL_MIN.as_millis(),
                TTL_MAX.as_millis()
            )));
        }
        if self.safety_margin.for_ttl(self.session_ttl) >= self.session_ttl {
            return Err(LockError::invalid(format!(
                "client config: safety_margin ({} ms) must be shorter than session_ttl ({} ms)",
                self.safety_margin.for_ttl(self.session_ttl).as_millis(),
                self.session_ttl.as_millis()
            )));
        }
        if let Some(tls) = &self.tls {
            tls.validate()?;
        }
        if let Some(token) = &self.token {
            if token.trim().is_empty() {
                return Err(LockError::invalid("client config: token must not be blank"));
            }
            if self.tls.is_none() {
                return Err(LockError::invalid(
                    "client config: token is set but tls is not: a bearer token is only sent \
                     over TLS (set tls, e.g. LOCKD_CA, to the cluster's CA file)",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_margin_is_a_tenth_of_the_ttl_with_a_floor() {
        let m = SafetyMargin::Default;
        assert_eq!(
            m.for_ttl(Duration::from_secs(1)),
            Duration::from_millis(100)
        );
        assert_eq!(m.for_ttl(Duration::from_millis(500)), SAFETY_MARGIN_FLOOR);
        assert_eq!(m.for_ttl(Duration::from_secs(30)), Duration::from_secs(3));
        assert_eq!(
            SafetyMargin::Fixed(Duration::from_millis(7)).for_ttl(Duration::from_secs(30)),
            Duration::from_millis(7)
        );
    }

    #[test]
    fn the_default_config_is_valid_and_bad_fields_are_named() {
        assert_eq!(ClientConfig::default().validate(), Ok(()));
        let cases: Vec<(ClientConfig, &str)> = vec![
            (
                ClientConfig {
                    call_timeout: Duration::ZERO,
                    ..ClientConfig::default()
                },
                "call_timeout",
            ),
            (
                ClientConfig {
                    attempt_timeout: Duration::MAX,
                    ..ClientConfig::default()
                },
                "attempt_timeout",
            ),
            (
                ClientConfig {
                    backoff: BackoffConfig {
                        initial: Duration::from_secs(5),
                        ..BackoffConfig::default()
                    },
                    ..ClientConfig::default()
                },
                "backoff.initial",
            ),
            (
                ClientConfig {
                    session_ttl: Duration::from_millis(10),
                    ..ClientConfig::default()
                },
                "session_ttl",
            ),
            (
                ClientConfig {
                    safety_margin: SafetyMargin::Fixed(Duration::from_secs(60)),
                    ..ClientConfig::default()
                },
                "safety_margin",
            ),
            (
                ClientConfig {
                    token: Some("t0ken".to_owned()),
                    ..ClientConfig::default()
                },
                "token is set but tls is not",
            ),
            (
                ClientConfig {
                    token: Some("  ".to_owned()),
                    tls: Some(TlsConfig::new("ca.pem")),
                    ..ClientConfig::default()
                },
                "token must not be blank",
            ),
            (
                ClientConfig {
                    tls: Some(TlsConfig {
                        cert: Some("c.pem".into()),
                        ..TlsConfig::new("ca.pem")
                    }),
                    ..ClientConfig::default()
                },
                "tls.key",
            ),
        ];
        for (config, field) in cases {
            match config.validate() {
                Err(LockError::InvalidArgument { message }) => {
                    assert!(message.contains(field), "{message} should name {field}")
                }
                other => panic!("{field}: expected InvalidArgument, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_token_over_tls_is_valid_and_debug_never_shows_it() {
        let config = ClientConfig {
            token: Some("s3cret-token".to_owned()),
            tls: Some(TlsConfig::new("ca.pem")),
            ..ClientConfig::default()
        };
        assert_eq!(config.validate(), Ok(()));
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("s3cret-token") && shown.contains("<set>"),
            "{shown}"
        );
    }
}
