//! Snapshot streaming: a whole snapshot to one peer on one `Snapshot` client stream, a
//! [`SnapshotHeader`] and then the bytes in chunks of [`SNAPSHOT_CHUNK_BYTES`], made one at a
//! time as they leave.
//!
//! Owns the wait for an unreachable peer's turn, the chunking, and the transfer's deadline:
//! openraft's snapshot TTL plus the time the bytes take at [`SNAPSHOT_BYTES_PER_SEC_MIN`].
//! Must not look inside the snapshot: its meta travels in the header as openraft made it, its
//! data as opaque bytes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use lock_proto::v1::RaftPayload;
use lock_raft_store::{Snapshot, SnapshotData, TypeConfig, Vote};
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
/// one shorter, none for no data; each chunk is read from the snapshot's file (on a blocking
/// thread) only when it is next to leave, so the data is never whole in memory. A chunk that
/// cannot be read ends the stream early: the follower refuses a snapshot shorter than its
/// header announced, and openraft sends it again.
fn chunks(data: SnapshotData) -> impl Stream<Item = RaftPayload> {
    let data = Arc::new(data);
    let len = data.len();
    futures::stream::unfold(0u64, move |at| {
        let data = data.clone();
        async move {
            if at >= len {
                return None;
            }
            let n = usize::try_from(len - at)
                .map_or(SNAPSHOT_CHUNK_BYTES, |left| left.min(SNAPSHOT_CHUNK_BYTES));
            let read = tokio::task::spawn_blocking(move || {
                let mut chunk = vec![0u8; n];
                data.read_at(at, &mut chunk).map(|()| chunk)
            })
            .await;
            match read {
                Ok(Ok(chunk)) => Some((RaftPayload { data: chunk }, at + n as u64)),
                Ok(Err(e)) => {
                    tracing::warn!(%e, at, "cannot read the snapshot being sent; the transfer stops");
                    None
                }
                Err(e) => {
                    tracing::warn!(%e, at, "the snapshot read task failed; the transfer stops");
                    None
                }
            }
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
        let data = snapshot.snapshot;
        let data_len = data.len();
        // openraft's TTL (`install_snapshot_timeout`) is meant for one chunk; the whole
        // transfer (and the follower's durable write) also gets the time the bytes take at the
        // slowest rate a healthy link is expected to sustain.
        let ttl = option.hard_ttl()
            + Duration::from_secs_f64(data_len as f64 / SNAPSHOT_BYTES_PER_SEC_MIN as f64);
        let header = SnapshotHeader {
            vote,
            meta: snapshot.meta,
            len: data_len,
        };
        let header =
            encode("snapshot header", &header).map_err(|e| to_streaming(self.error(kind, e)))?;
        let messages = futures::stream::iter([header]).chain(chunks(data));
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

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    async fn sent(data: Vec<u8>) -> Vec<Vec<u8>> {
        chunks(SnapshotData::from(data))
            .map(|chunk| chunk.data)
            .collect()
            .await
    }

    #[tokio::test]
    async fn snapshot_bytes_leave_in_full_chunks_and_one_shorter_last_chunk() {
        for (len, expected) in [
            (0, vec![]),
            (1, vec![1]),
            (SNAPSHOT_CHUNK_BYTES, vec![SNAPSHOT_CHUNK_BYTES]),
            (
                2 * SNAPSHOT_CHUNK_BYTES + 3,
                vec![SNAPSHOT_CHUNK_BYTES, SNAPSHOT_CHUNK_BYTES, 3],
            ),
        ] {
            let lengths: Vec<usize> = sent(data(len)).await.iter().map(Vec::len).collect();
            assert_eq!(lengths, expected, "{len} bytes");
        }
    }

    #[tokio::test]
    async fn the_chunks_put_together_are_the_snapshot() {
        let data = data(SNAPSHOT_CHUNK_BYTES + 10);
        assert_eq!(sent(data.clone()).await.concat(), data);
    }
}
