//! The byte encoding of what lockd persists and sends through openraft's types (log entries,
//! votes, committed log ids, snapshot metadata) is the one lockd wrote with openraft 0.9.25.
//!
//! The hex strings below were produced by lockd's 0.9.25 build (postcard, the payload inside
//! every codec frame). Decoding them with today's types proves that a data directory written
//! before the openraft 0.10 upgrade opens after it; encoding today's values to the same bytes
//! proves the reverse (a node rolled back reads what the upgraded one wrote).

use std::collections::BTreeMap;

use lock_raft_store::{
    Command, Entry, EntryPayload, LeaderId, LogId, Membership, Node, Request, SnapshotMeta,
    StoredMembership, Vote,
};

const NORMAL_ENTRY: &str = "0702ac0201fbd095ffbc3100027331026f318827";
const BLANK_ENTRY: &str = "0702ac0200";
const MEMBERSHIP_ENTRY: &str = "0702ac0202010301020303010e3132372e302e302e313a37313031020e3132372e302e302e313a37313032030e3132372e302e302e313a37313033";
const COMMITTED_VOTE: &str = "070201";
const COMMITTED_LOG_ID: &str = "010702ac02";
/// 0.9's `SnapshotMeta` also carried a snapshot id ("7-2-300" here); 0.10 reads and ignores
/// it, and writes an empty one, so only decoding is checked for it.
const SNAPSHOT_META: &str = "010702ac02010702ac02010301020303010e3132372e302e302e313a37313031020e3132372e302e302e313a37313032030e3132372e302e302e313a3731303307372d322d333030";

fn bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

fn log_id() -> LogId {
    LogId::new(
        LeaderId {
            term: 7,
            node_id: 2,
        },
        300,
    )
}

fn membership() -> Membership {
    let nodes: BTreeMap<u64, Node> = (1..=3)
        .map(|id| (id, Node::new(format!("127.0.0.1:710{id}"))))
        .collect();
    Membership::new(vec![[1, 2, 3].into()], nodes).expect("membership")
}

fn entry(payload: EntryPayload) -> Entry {
    Entry {
        log_id: log_id(),
        payload,
    }
}

/// `value` encodes to `hex`, and `hex` decodes to `value`.
fn same_both_ways<T>(hex: &str, value: &T)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let decoded: T = postcard::from_bytes(&bytes(hex)).expect("the 0.9 bytes decode");
    assert_eq!(&decoded, value);
    assert_eq!(
        postcard::to_stdvec(value).expect("encode"),
        bytes(hex),
        "today's encoding of {value:?} differs from 0.9's"
    );
}

#[test]
fn log_entries_votes_and_log_ids_encode_as_under_openraft_0_9() {
    same_both_ways(
        NORMAL_ENTRY,
        &entry(EntryPayload::Normal(Request {
            stamp_ms: 1_700_000_000_123,
            command: Command::OpenSession {
                session_id: "s1".into(),
                owner_id: "o1".into(),
                ttl_ms: 5_000,
            },
        })),
    );
    same_both_ways(BLANK_ENTRY, &entry(EntryPayload::Blank));
    same_both_ways(
        MEMBERSHIP_ENTRY,
        &entry(EntryPayload::Membership(membership())),
    );
    same_both_ways(COMMITTED_VOTE, &Vote::new_committed(7, 2));
    same_both_ways(COMMITTED_LOG_ID, &Some(log_id()));
}

#[test]
fn snapshot_metadata_written_under_openraft_0_9_decodes() {
    let meta: SnapshotMeta = postcard::from_bytes(&bytes(SNAPSHOT_META)).expect("decode");
    assert_eq!(
        meta,
        SnapshotMeta {
            last_log_id: Some(log_id()),
            last_membership: StoredMembership::new(Some(log_id()), membership()),
        }
    );
}
