//! Who is at the other end of a connection: the address it came from and, on a TLS connection
//! whose client presented a certificate the cluster's CA signed, the principal that certificate
//! names (docs/SECURITY.md).
//!
//! The serve loop attaches one [`PeerIdentity`] to every accepted connection (tonic's
//! `Connected::ConnectInfo`), so every request on it carries the same value in its extensions;
//! the authorization layer and the backends read it from there and nowhere else.

use std::net::SocketAddr;

/// The identity of the peer of one accepted connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The remote address, when the transport knows it.
    pub remote: Option<SocketAddr>,
    /// The principal of the client's verified certificate: its first URI SAN, else its first
    /// DNS SAN, else its subject CN. `None` on a plaintext connection or when the client
    /// presented no certificate.
    pub principal: Option<String>,
}

impl PeerIdentity {
    /// The identity the serve loop attached to `request`'s connection, if any.
    pub fn of<T>(request: &tonic::Request<T>) -> Option<&PeerIdentity> {
        request.extensions().get::<PeerIdentity>()
    }
}

/// The authenticated principal of one request, resolved by the authorization layer from the
/// connection's certificate or the request's bearer token, and inserted into the request's
/// extensions before any service sees it. Absent on a node started with `--insecure`, where
/// nobody is authenticated and every call is allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The principal's name (a certificate SAN or CN, or a bearer token's principal).
    pub principal: String,
}

impl Caller {
    /// The caller the authorization layer attached to `request`, if any.
    pub fn of<T>(request: &tonic::Request<T>) -> Option<&Caller> {
        request.extensions().get::<Caller>()
    }
}
