//! Snapshot streaming: a whole snapshot to one peer on one `Snapshot` client stream, a
//! [`SnapshotHeader`] and then the bytes in chunks of [`SNAPSHOT_CHUNK_BYTES`], made one at a
//! time as they leave.
//!
//! Owns the wait for an unreachable peer's turn, the chunking, and the transfer's deadline:
//! openraft's snapshot TTL plus the time the bytes take at [`SNAPSHOT_BYTES_PER_SEC_MIN`].
//! Must not look inside the snapshot: its meta travels in the header as openraft made it, its
//! data as opaque bytes.

use std::future::Future;
use std::time::Duration;

use lock_proto::v1::RaftPayload;
use lock_raft_store::{Snapshot, TypeConfig, Vote};
use openraft::OptionalSend;
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError};
use openraft::network::{RPCOption, RPCTypes};
use openraft::raft::SnapshotResponse;

use super::call_error::{CallError, classify};
use super::payload::{decode, encode};
use super::{PeerClient, RpcError};
use crate::raft::{SNAPSHOT_CHUNK_BYTES, SnapshotHeader};

/// The slowest a snapshot transfer may go, in bytes per second, before it is given up on: a
/// 1 GiB snapshot, the largest accepted, gets 100 s more than openraft's TTL.
const SNAPSHOT_BYTES_PER_SEC_MIN: usize = 10 * 1024 * 1024;

/// `data` as the messages that follow the header: chunks of [`SNAPSHOT_CHUNK_BYTES`], the last
/// one shorter, none for no data; each chunk is copied out only when it is next to leave.
fn chunks(data: Vec<u8>) -> impl Iterator<Item = RaftPayload> {
    let count = data.len().div_ceil(SNAPSHOT_CHUNK_BYTES);
    (0..count).map(move |i| {
        let end = data.len().min((i + 1) * SNAPSHOT_CHUNK_BYTES);
        RaftPayload {
            data: data[i * SNAPSHOT_CHUNK_BYTES..end].to_vec(),
        }
    })
}

/// openraft's error for a call, as the error of a snapshot transfer.
fn to_streaming(err: RpcError) -> StreamingError<TypeConfig> {
    match err {
        RPCError::Timeout(e) => StreamingError::Timeout(e),
        RPCError::Unreachable(e) => StreamingError::Unreachable(e),
        RPCError::Network(e) => StreamingError::Network(e),
        RPCError::RemoteError(e) => StreamingError::Network(NetworkError::new(&e)),
    }
}

impl PeerClient {
    /// `RaftNetworkV2::full_snapshot`: sends `snapshot` of the leader with `vote`, bounded by
    /// openraft's snapshot timeout plus the time the bytes take at
    /// [`SNAPSHOT_BYTES_PER_SEC_MIN`], and given up when `cancel` (openraft closing the
    /// replication) completes.
    pub(super) async fn send_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let kind = RPCTypes::InstallSnapshot;
        let mut cancel = std::pin::pin!(cancel);
        // Wait for an unreachable peer's turn, as a replication stream does: openraft's
        // snapshot transmitter retries a failed transfer after its own backoff, which this
        // makes the floor, not the pace.
        tokio::select! {
            closed = &mut cancel => return Err(StreamingError::Closed(closed)),
            _ = self.health.wait_turn() => {}
        }
        let data_len = snapshot.snapshot.get_ref().len();
        let data = snapshot.snapshot.into_inner();
        // openraft's TTL (`install_snapshot_timeout`) is meant for one chunk; the whole
        // transfer (and the follower's durable write) also gets the time the bytes take at the
        // slowest rate a healthy link is expected to sustain.
        let ttl = option.hard_ttl()
            + Duration::from_secs_f64(data_len as f64 / SNAPSHOT_BYTES_PER_SEC_MIN as f64);
        let header = SnapshotHeader {
            vote,
            meta: snapshot.meta,
            len: data.len() as u64,
        };
        let header =
            encode("snapshot header", &header).map_err(|e| to_streaming(self.error(kind, e)))?;
        let messages = futures::stream::iter(std::iter::once(header).chain(chunks(data)));
        let mut client = self
            .client()
            .map_err(|e| to_streaming(self.error(kind, e)))?;
        let mut request = tonic::Request::new(messages);
        request.set_timeout(ttl);
        let target = self.target;
        let call = async move {
            let response = client.snapshot(request).await.map_err(classify)?;
            decode::<Result<SnapshotResponse<TypeConfig>, String>>(
                "snapshot answer",
                target,
                response.get_ref(),
            )?
            .map_err(CallError::Remote)
        };
        let answer = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            answer = tokio::time::timeout(ttl, call) => match answer {
                Err(_) => Err(CallError::Timeout(ttl)),
                Ok(answer) => answer,
            },
        };
        self.observe(&answer, true);
        answer.map_err(|e| to_streaming(self.error(kind, e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lengths(data_len: usize) -> Vec<usize> {
        let data: Vec<u8> = (0..data_len).map(|i| i as u8).collect();
        chunks(data).map(|chunk| chunk.data.len()).collect()
    }

    #[test]
    fn snapshot_bytes_leave_in_full_chunks_and_one_shorter_last_chunk() {
        assert_eq!(lengths(0), Vec::<usize>::new());
        assert_eq!(lengths(1), [1]);
        assert_eq!(lengths(SNAPSHOT_CHUNK_BYTES), [SNAPSHOT_CHUNK_BYTES]);
        assert_eq!(
            lengths(2 * SNAPSHOT_CHUNK_BYTES + 3),
            [SNAPSHOT_CHUNK_BYTES, SNAPSHOT_CHUNK_BYTES, 3]
        );
    }

    #[test]
    fn the_chunks_put_together_are_the_snapshot() {
        let data: Vec<u8> = (0..SNAPSHOT_CHUNK_BYTES + 10)
            .map(|i| (i % 251) as u8)
            .collect();
        let joined: Vec<u8> = chunks(data.clone()).flat_map(|chunk| chunk.data).collect();
        assert_eq!(joined, data);
    }
}
