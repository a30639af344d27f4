//! The limit of `SessionService.HeartbeatBatch`, shared by the server that enforces it and the
//! client that splits its batches by it. Owns the number and its check only; it does not
//! heartbeat anything.

use lock_api::LockError;
use lock_api::limits::SESSION_ID_LEN_MAX;

/// Most session ids one `HeartbeatBatch` request may carry.
///
/// The leader looks every id up under one lock of its lease table and answers them all after
/// one leadership-confirmation round, so the batch bounds how long that lock is held and how
/// long the last session of a batch waits for the first. 1,024 ids of at most
/// [`SESSION_ID_LEN_MAX`] bytes are under 70 KiB on the wire: far below the server's message
/// limit, and enough that a client with 10,000 sessions due at once sends ten calls.
pub const HEARTBEAT_BATCH_SESSIONS_MAX: usize = 1024;

/// Upper bound of the encoded size of a full `HeartbeatBatchRequest`: per id, the id and at
/// most 3 bytes of tag and length prefix. The server's message limit must exceed it.
pub const HEARTBEAT_BATCH_REQUEST_BYTES_MAX: usize =
    HEARTBEAT_BATCH_SESSIONS_MAX * (SESSION_ID_LEN_MAX + 3);

/// `Ok` if a batch of `len` session ids is within [`HEARTBEAT_BATCH_SESSIONS_MAX`];
/// otherwise `InvalidArgument` naming the limit and the size sent.
pub fn check_heartbeat_batch_len(len: usize) -> Result<(), LockError> {
    if len > HEARTBEAT_BATCH_SESSIONS_MAX {
        return Err(LockError::invalid(format!(
            "a HeartbeatBatch carries at most {HEARTBEAT_BATCH_SESSIONS_MAX} session ids \
             (HEARTBEAT_BATCH_SESSIONS_MAX); this one carried {len}: split it"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_inclusive_and_named_in_the_refusal() {
        assert_eq!(check_heartbeat_batch_len(0), Ok(()));
        assert_eq!(
            check_heartbeat_batch_len(HEARTBEAT_BATCH_SESSIONS_MAX),
            Ok(())
        );
        let Err(LockError::InvalidArgument { message }) =
            check_heartbeat_batch_len(HEARTBEAT_BATCH_SESSIONS_MAX + 1)
        else {
            panic!("an oversized batch must be InvalidArgument");
        };
        assert!(
            message.contains("HEARTBEAT_BATCH_SESSIONS_MAX"),
            "{message}"
        );
        assert!(message.contains("1024"), "{message}");
    }
}
