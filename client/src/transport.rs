//! The connection to one node as every SDK call sees it: a lazily connected tonic channel,
//! plaintext or TLS, with the caller's bearer token (if any) put on every request.
//!
//! Owns how a channel is dialled (scheme, connect timeout, TLS config) and the
//! `authorization` metadata. It knows nothing of which RPC is sent or of retries.

use std::fmt;

use lock_api::LockError;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::config::ClientConfig;

/// The metadata key a bearer token travels in (docs/SECURITY.md §2).
pub(crate) const AUTHORIZATION: &str = "authorization";

/// A channel to one node with the client's credentials on every request.
pub(crate) type Transport = InterceptedService<Channel, Bearer>;

/// Puts `authorization: Bearer <token>` on every request, when the client has a token.
/// The value is marked sensitive, so tonic's and hyper's debug logs do not print it.
#[derive(Clone, Default)]
pub(crate) struct Bearer(Option<AsciiMetadataValue>);

impl fmt::Debug for Bearer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = if self.0.is_some() { "<token>" } else { "none" };
        f.debug_tuple("Bearer").field(&shown).finish()
    }
}

impl Bearer {
    /// The header for `token`; `InvalidArgument` naming `token` if it cannot be a header value
    /// (control characters, non-ASCII). Blank tokens are refused by [`ClientConfig::validate`].
    pub(crate) fn new(token: Option<&str>) -> Result<Self, LockError> {
        let Some(token) = token else {
            return Ok(Self(None));
        };
        let mut value: AsciiMetadataValue = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| {
                LockError::invalid(
                    "client config: token must be printable ASCII (it travels in a header)",
                )
            })?;
        value.set_sensitive(true);
        Ok(Self(Some(value)))
    }
}

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert(AUTHORIZATION, value.clone());
        }
        Ok(request)
    }
}

/// What every channel of one client is built with: read once (the TLS files) when the client
/// is built, cloned into each endpoint's channel.
#[derive(Clone, Debug)]
pub(crate) struct Dialer {
    tls: Option<ClientTlsConfig>,
    bearer: Bearer,
    connect_timeout: std::time::Duration,
}

impl Dialer {
    /// Reads the TLS files of `config` and checks its token; errors name the field or file.
    pub(crate) fn new(config: &ClientConfig) -> Result<Self, LockError> {
        let tls = config.tls.as_ref().map(|tls| tls.load()).transpose()?;
        Ok(Self {
            tls,
            bearer: Bearer::new(config.token.as_deref())?,
            connect_timeout: config.connect_timeout,
        })
    }

    /// Whether channels speak TLS.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// A lazily connected transport to `addr` (`host:port`): `https://` with the TLS config,
    /// else `http://`.
    pub(crate) fn dial(&self, addr: &str) -> Result<Transport, LockError> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|err| LockError::invalid(format!("endpoint {addr:?}: {err}")))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|err| LockError::invalid(format!("endpoint {addr:?}: TLS: {err}")))?;
        }
        Ok(InterceptedService::new(
            endpoint.connect_lazy(),
            self.bearer.clone(),
        ))
    }
}

/// A transport over `channel` without credentials, for callers that build their own channel
/// (`Pipeline::new`).
pub(crate) fn plain(channel: Channel) -> Transport {
    InterceptedService::new(channel, Bearer::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_goes_in_the_authorization_header_of_every_request() {
        let mut bearer = Bearer::new(Some("s3cret")).expect("token");
        for _ in 0..2 {
            let request = bearer.call(tonic::Request::new(())).expect("intercepted");
            assert_eq!(
                request
                    .metadata()
                    .get(AUTHORIZATION)
                    .map(|v| v.to_str().ok()),
                Some(Some("Bearer s3cret"))
            );
        }
        let request = Bearer::new(None)
            .expect("no token")
            .call(tonic::Request::new(()))
            .expect("intercepted");
        assert!(request.metadata().get(AUTHORIZATION).is_none());
        assert!(!format!("{bearer:?}").contains("s3cret"));
    }

    #[test]
    fn a_token_that_cannot_be_a_header_is_refused_by_name() {
        match Bearer::new(Some("line\nbreak")) {
            Err(LockError::InvalidArgument { message }) => assert!(message.contains("token")),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
}
