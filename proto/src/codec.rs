//! The protobuf codec of every lockd service and client: prost's encoding, with one change to
//! decoding. A message that cannot be decoded (a string field that is not UTF-8, a truncated
//! body, a field of the wrong wire type) is answered `INVALID_ARGUMENT` carrying an
//! [`ErrorDetail`](crate::v1::ErrorDetail) `invalid_argument` that names the message and what
//! failed, built by the one error map ([`crate::status_from_lock_error`]).
//!
//! Why not prost's own codec: `tonic_prost::ProstCodec` answers such a body `INTERNAL` with no
//! detail, and a client that follows the rule of [`crate::error`] (no detail and not
//! `INVALID_ARGUMENT` → transient `Contention`) would retry for ever a request that can never
//! succeed. A malformed body is the caller's fault, and the same bytes fail the same way again.
//!
//! The generated clients use this codec too, so a response this build cannot decode (a server
//! speaking another protocol version) is also `InvalidArgument`: not retry-safe, which is right
//! for a mismatch that no retry mends.
//!
//! Owns decoding errors only; encoding is prost's, unchanged.

use std::marker::PhantomData;

use lock_api::LockError;
use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

use crate::status_from_lock_error;

/// The codec named by the generated code (`build.rs`: `codec_path`): prost's encoder and a
/// decoder whose errors are `INVALID_ARGUMENT` with an `ErrorDetail`.
#[derive(Debug, Clone)]
pub struct LockdCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for LockdCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> Codec for LockdCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = LockdDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        LockdDecoder { _pd: PhantomData }
    }
}

/// Decodes one `U`; a body that is not a valid `U` is `INVALID_ARGUMENT` (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct LockdDecoder<U> {
    _pd: PhantomData<U>,
}

impl<U: Message + Default> Decoder for LockdDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf)
            .map(Some)
            .map_err(|e| status_from_lock_error(&undecodable::<U>(&e)))
    }
}

/// The error for a body that is not a valid `U`: names the message type and prost's reason,
/// which names the field (`AcquireRequest.key: invalid string value: data is not UTF-8
/// encoded`).
fn undecodable<U>(error: &prost::DecodeError) -> LockError {
    let full = std::any::type_name::<U>();
    let name = full.rsplit("::").next().unwrap_or(full);
    LockError::invalid(format!("the {name} message could not be decoded: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock_error_from_status;
    use crate::v1::{AcquireRequest, error_detail::Kind};

    #[test]
    fn an_undecodable_body_is_invalid_argument_naming_the_message_and_field() {
        // Field 1 (`session_id`, a string) with a length-delimited value that is not UTF-8.
        let bytes: &[u8] = &[0x0a, 0x02, 0xff, 0xfe];
        let error = AcquireRequest::decode(bytes).expect_err("not UTF-8");
        let status = status_from_lock_error(&undecodable::<AcquireRequest>(&error));
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        let LockError::InvalidArgument { message } = lock_error_from_status(&status) else {
            panic!("not InvalidArgument: {status:?}");
        };
        assert!(message.contains("AcquireRequest"), "{message}");
        assert!(message.contains("session_id"), "{message}");
        let detail = crate::error::error_detail_from_lock_error(&lock_error_from_status(&status));
        assert!(matches!(detail.kind, Some(Kind::InvalidArgument(_))));
    }

    #[test]
    fn a_truncated_body_is_invalid_argument() {
        // A length prefix of 10 bytes with only one following.
        let bytes: &[u8] = &[0x0a, 0x0a, b'x'];
        let error = AcquireRequest::decode(bytes).expect_err("truncated");
        assert!(
            !lock_error_from_status(&status_from_lock_error(&undecodable::<AcquireRequest>(
                &error
            )))
            .is_retry_safe()
        );
    }
}
