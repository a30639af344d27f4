//! The postcard encoding of what the client side of the Raft transport sends and receives:
//! a value into a `RaftPayload`, and a peer's `RaftPayload` back into a value.
//!
//! Bytes from a peer are decoded without trust: a payload that does not decode is a
//! [`CallError::Decode`] (a network failure to openraft), never a panic. Must not look inside
//! the values it encodes.

use lock_proto::v1::RaftPayload;
use lock_raft_store::NodeId;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::call_error::CallError;

/// `value` (a `what`, for the error) as a payload.
pub(super) fn encode<T: Serialize>(what: &str, value: &T) -> Result<RaftPayload, CallError> {
    postcard::to_stdvec(value)
        .map(|data| RaftPayload { data })
        .map_err(|e| CallError::Decode(format!("encoding {what}: {e}")))
}

/// The `what` that peer `target` sent as `payload`.
pub(super) fn decode<T: DeserializeOwned>(
    what: &str,
    target: NodeId,
    payload: &RaftPayload,
) -> Result<T, CallError> {
    postcard::from_bytes(&payload.data).map_err(|e| {
        CallError::Decode(format!(
            "decoding {what} from node {target} ({} bytes): {e}",
            payload.data.len()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_that_does_not_decode_is_a_decode_error_naming_its_peer_and_length() {
        // A postcard `u64` is a varint; a lone continuation byte ends before the value does.
        let payload = RaftPayload { data: vec![0x80] };
        let err = decode::<u64>("answer", 7, &payload).unwrap_err();
        assert!(matches!(&err, CallError::Decode(_)), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("from node 7 (1 bytes)"), "{text}");
    }

    #[test]
    fn what_is_encoded_decodes_to_itself() {
        let payload = encode("value", &(3u64, "x".to_owned())).unwrap();
        let back: (u64, String) = decode("value", 2, &payload).unwrap();
        assert_eq!(back, (3, "x".to_owned()));
    }
}
