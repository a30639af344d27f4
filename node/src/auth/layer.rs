//! [`AuthLayer`]: the one authorization layer, a tower layer around every service of the serve
//! loop (docs/SECURITY.md §2, §5). Each request's method is looked up in the table
//! (`methods`), its caller resolved and checked (`policy`), and then either the request goes on
//! with a [`Caller`](crate::peer::Caller) in its extensions, or it is answered at once with
//! `UNAUTHENTICATED` / `PERMISSION_DENIED` carrying the `ErrorDetail`, and no service sees it.
//!
//! On a node started with `--insecure` ([`Access::Open`]) every request goes on unchanged and
//! carries no `Caller`.
//!
//! Refusals are logged as two repeating conditions (unauthenticated, permission denied), each a
//! line at its first occurrence and then one summary a minute (`log_limit`): a misconfigured
//! client retrying in a loop must not write a line per call.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::{Either, Ready, ready};
use lock_api::LockError;
use lock_proto::status_from_lock_error;

use super::methods::requirement;
use super::policy::{AUTHORIZATION_HEADER, Policy};
use crate::log_limit::{LogLimit, Note};
use crate::peer::PeerIdentity;

/// Whether a node checks its callers.
#[derive(Clone, Debug)]
pub enum Access {
    /// `--insecure`: nobody is authenticated, everything is allowed, no `Caller` is inserted.
    Open,
    /// Every call but health and reflection needs an authenticated principal with the role its
    /// method requires.
    Enforced(Arc<Policy>),
}

/// The tower layer the serve loop puts around its router.
#[derive(Clone, Debug)]
pub struct AuthLayer {
    access: Access,
    refusals: Arc<Refusals>,
}

impl AuthLayer {
    /// The layer for `access`.
    pub fn new(access: Access) -> Self {
        Self {
            access,
            refusals: Arc::new(Refusals::default()),
        }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            access: self.access.clone(),
            refusals: self.refusals.clone(),
        }
    }
}

/// The service [`AuthLayer`] wraps around `S`.
#[derive(Clone, Debug)]
pub struct AuthService<S> {
    inner: S,
    access: Access,
    refusals: Arc<Refusals>,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for AuthService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    ResBody: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, Ready<Result<S::Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let Access::Enforced(policy) = &self.access else {
            return Either::Left(self.inner.call(request));
        };
        let path = request.uri().path();
        let decided = policy.decide(
            requirement(path),
            request.extensions().get::<PeerIdentity>(),
            request
                .headers()
                .get(AUTHORIZATION_HEADER)
                .map(|v| v.as_bytes()),
        );
        match decided {
            Ok(caller) => {
                if let Some(caller) = caller {
                    request.extensions_mut().insert(caller);
                }
                Either::Left(self.inner.call(request))
            }
            Err(refusal) => {
                let remote = request
                    .extensions()
                    .get::<PeerIdentity>()
                    .and_then(|p| p.remote);
                self.refusals.note(&refusal, path, remote);
                Either::Right(ready(Ok(status_from_lock_error(&refusal).into_http())))
            }
        }
    }
}

/// The two refusal conditions, each logged as a change of state with a summary a minute.
#[derive(Debug, Default)]
struct Refusals {
    unauthenticated: Mutex<LogLimit>,
    denied: Mutex<LogLimit>,
}

impl Refusals {
    fn note(&self, refusal: &LockError, path: &str, remote: Option<std::net::SocketAddr>) {
        let limit = match refusal {
            LockError::Unauthenticated { .. } => &self.unauthenticated,
            _ => &self.denied,
        };
        let what = format!("{path}: {refusal}");
        let note = match limit.lock() {
            Ok(mut limit) => limit.failed(Instant::now(), &what),
            // A panic while logging elsewhere must not stop refusals; log this one.
            Err(_) => Some(Note::Began),
        };
        match note {
            Some(Note::Began) => tracing::warn!(
                remote = ?remote,
                refusal = %what,
                "refused a call; further refusals of this kind are summarised once a minute"
            ),
            Some(Note::Summary(summary)) => tracing::warn!(
                refused = summary.count,
                total = summary.total,
                lasted = ?summary.lasted,
                last = %summary.last_error,
                "calls refused in the last minute"
            ),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::convert::Infallible;

    use lock_proto::lock_error_from_status;
    use tower::{Layer, Service, ServiceExt};

    use super::*;
    use crate::auth::roles::Role;
    use crate::auth::tokens::{Tokens, hash_line};
    use crate::peer::Caller;

    /// A service that answers 200 with the caller it saw in a header.
    #[derive(Clone)]
    struct Echo;

    impl Service<http::Request<()>> for Echo {
        type Response = http::Response<String>;
        type Error = Infallible;
        type Future = Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<()>) -> Self::Future {
            let caller = request
                .extensions()
                .get::<Caller>()
                .map_or("none".to_owned(), |c| c.principal.clone());
            ready(Ok(http::Response::new(caller)))
        }
    }

    fn enforced() -> Access {
        let roles = BTreeMap::from([
            ("client".to_owned(), Role::Client),
            ("svc".to_owned(), Role::Client),
        ]);
        let tokens = Tokens::parse(&format!("svc {}", hash_line("t0k"))).expect("tokens");
        Access::Enforced(Arc::new(Policy::new(roles, tokens)))
    }

    fn request(path: &str, principal: Option<&str>, token: Option<&str>) -> http::Request<()> {
        let mut builder = http::Request::builder().uri(path);
        if let Some(token) = token {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        let mut request = builder.body(()).expect("a request");
        request.extensions_mut().insert(PeerIdentity {
            remote: None,
            principal: principal.map(str::to_owned),
        });
        request
    }

    async fn call(access: Access, request: http::Request<()>) -> http::Response<String> {
        let mut service = AuthLayer::new(access).layer(Echo);
        service
            .ready()
            .await
            .expect("ready")
            .call(request)
            .await
            .expect("infallible")
    }

    fn refusal(response: &http::Response<String>) -> LockError {
        let status = tonic::Status::from_header_map(response.headers()).expect("a grpc-status");
        lock_error_from_status(&status)
    }

    #[tokio::test]
    async fn an_allowed_call_goes_on_with_its_caller() {
        let answer = call(
            enforced(),
            request("/lockd.v1.LockService/Acquire", Some("client"), None),
        )
        .await;
        assert_eq!(answer.body(), "client");
        let answer = call(
            enforced(),
            request("/lockd.v1.LockService/Acquire", None, Some("t0k")),
        )
        .await;
        assert_eq!(answer.body(), "svc");
        let answer = call(
            enforced(),
            request("/grpc.health.v1.Health/Check", None, None),
        )
        .await;
        assert_eq!(answer.body(), "none");
    }

    #[tokio::test]
    async fn a_refused_call_never_reaches_the_service_and_carries_the_detail() {
        let answer = call(
            enforced(),
            request("/lockd.v1.LockService/ForceRevoke", Some("client"), None),
        )
        .await;
        assert_eq!(answer.body(), "", "the service did not run");
        assert_eq!(
            refusal(&answer),
            LockError::PermissionDenied {
                principal: "client".into(),
                required_role: "operator".into()
            }
        );
        let answer = call(
            enforced(),
            request("/lockd.v1.LockService/Acquire", None, None),
        )
        .await;
        assert!(matches!(
            refusal(&answer),
            LockError::Unauthenticated { .. }
        ));
        let answer = call(
            enforced(),
            request("/lockd.v1.LockService/Acquire", None, Some("nope")),
        )
        .await;
        assert!(matches!(
            refusal(&answer),
            LockError::Unauthenticated { .. }
        ));
    }

    #[tokio::test]
    async fn an_open_node_lets_everything_through_without_a_caller() {
        let answer = call(
            Access::Open,
            request("/lockd.v1.AdminService/ChangeMembership", None, None),
        )
        .await;
        assert_eq!(answer.body(), "none");
        let answer = call(
            Access::Open,
            request("/lockd.v1.LockService/Acquire", Some("client"), None),
        )
        .await;
        assert_eq!(answer.body(), "none");
    }
}
