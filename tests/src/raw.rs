//! Bytes that are not well-formed lockd requests, sent to a node's gRPC port: raw TCP junk,
//! an HTTP/1 request, a gRPC call whose body is not the protobuf the method expects.
//!
//! Owns only the sending and the recording of what came back; whether the node's reaction is
//! acceptable is for the test to decide (usually: it answers or closes, and keeps serving).

use std::time::Duration;

use prost::bytes::{Buf, BufMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Endpoint;

use crate::HarnessError;
use crate::client::{CONNECT_TIMEOUT, RPC_TIMEOUT};

/// At most this many bytes of a node's answer to raw bytes are kept: enough to see a status
/// line or an HTTP/2 GOAWAY, without buffering a runaway answer.
pub const RAW_ANSWER_MAX: usize = 64 * 1024;

/// What happened to one raw TCP exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawExchange {
    /// Bytes written before the node closed or reset the connection (all of them, normally).
    pub written: usize,
    /// What the node sent back (at most [`RAW_ANSWER_MAX`] bytes).
    pub received: Vec<u8>,
    /// The node closed the connection (EOF or reset) within the read window; `false` means
    /// it was still open when the harness stopped listening.
    pub closed_by_node: bool,
    /// The error that ended the write or the read, if any (a reset is a fine reaction to junk).
    pub error: Option<String>,
}

impl RawExchange {
    /// The first line of the answer, lossily decoded (e.g. an HTTP/1 status line).
    pub fn first_line(&self) -> String {
        let text = String::from_utf8_lossy(&self.received);
        text.lines().next().unwrap_or_default().to_owned()
    }
}

/// Connects to `addr` (`host:port`), writes `bytes`, half-closes, and reads the answer for up
/// to `read_for`. Fails only if the connection cannot be made at all.
pub async fn send_tcp_bytes(
    addr: &str,
    bytes: &[u8],
    read_for: Duration,
) -> Result<RawExchange, HarnessError> {
    let mut stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Err(HarnessError::new(format!("cannot connect to {addr}: {e}"))),
        Err(_) => {
            return Err(HarnessError::new(format!(
                "cannot connect to {addr} within {CONNECT_TIMEOUT:?}"
            )));
        }
    };
    let mut exchange = RawExchange {
        written: 0,
        received: Vec::new(),
        closed_by_node: false,
        error: None,
    };
    for chunk in bytes.chunks(4096) {
        if let Err(e) = stream.write_all(chunk).await {
            exchange.error = Some(format!("write: {e}"));
            exchange.closed_by_node = true;
            return Ok(exchange);
        }
        exchange.written += chunk.len();
    }
    if let Err(e) = stream.shutdown().await {
        exchange.error = Some(format!("shutdown: {e}"));
    }
    let read_all = async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => return None,
                Ok(n) => {
                    let room = RAW_ANSWER_MAX.saturating_sub(exchange.received.len());
                    exchange.received.extend_from_slice(&buf[..n.min(room)]);
                }
                Err(e) => return Some(format!("read: {e}")),
            }
        }
    };
    match tokio::time::timeout(read_for, read_all).await {
        Ok(error) => {
            exchange.closed_by_node = true;
            if error.is_some() {
                exchange.error = error;
            }
        }
        Err(_) => exchange.closed_by_node = false,
    }
    Ok(exchange)
}

/// A gRPC codec that sends and receives message bodies as they are, so a test can put bytes
/// that are not the method's protobuf into a well-framed gRPC call.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        *self
    }

    fn decoder(&mut self) -> Self::Decoder {
        *self
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// Calls the unary gRPC method `path` (e.g. `/lockd.v1.LockService/Acquire`) at `endpoint`
/// with `body` as the message bytes, over plaintext (a node run with `--insecure`), and returns
/// the raw answer bytes or the status. Bounded by [`RPC_TIMEOUT`] (a timeout is answered as a
/// `DeadlineExceeded` status). [`raw_grpc_unary_on`] for a TLS channel.
pub async fn raw_grpc_unary(
    endpoint: &str,
    path: &str,
    body: Vec<u8>,
) -> Result<Vec<u8>, tonic::Status> {
    let channel = Endpoint::from_shared(endpoint.to_owned())
        .map_err(|e| tonic::Status::invalid_argument(format!("bad endpoint {endpoint:?}: {e}")))?
        .connect_timeout(CONNECT_TIMEOUT)
        .connect_lazy();
    raw_grpc_unary_on(endpoint, channel, path, body).await
}

/// [`raw_grpc_unary`] over an existing `channel` (e.g. [`crate::Cluster::channel`], TLS as the
/// harness's identity) to the node at `endpoint` (used in messages only).
pub async fn raw_grpc_unary_on(
    endpoint: &str,
    channel: tonic::transport::Channel,
    path: &str,
    body: Vec<u8>,
) -> Result<Vec<u8>, tonic::Status> {
    let path: PathAndQuery = path
        .parse()
        .map_err(|e| tonic::Status::invalid_argument(format!("bad method path {path:?}: {e}")))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    let call = async {
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("{endpoint} not ready: {e}")))?;
        grpc.unary(tonic::Request::new(body), path, RawCodec).await
    };
    match tokio::time::timeout(RPC_TIMEOUT, call).await {
        Ok(answer) => answer.map(tonic::Response::into_inner),
        Err(_) => Err(tonic::Status::deadline_exceeded(format!(
            "{endpoint}: no answer within {RPC_TIMEOUT:?}"
        ))),
    }
}
