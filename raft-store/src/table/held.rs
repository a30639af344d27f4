//! [`HeldGrant`]: a grant as the lock table stores it, and [`Holder`], the session it belongs
//! to, which every grant of that session shares.
//!
//! A million held locks are mostly a few sessions' grants: storing each grant's owner and
//! session ids as strings of its own repeated them once per lock (about 48 bytes of strings
//! and 48 of `String` headers). A `HeldGrant` points at its session's one `Holder` instead,
//! and its key is an `Arc<str>` the session's [`LockSet`](super::LockSet) lists too; it is 64
//! bytes inline where a [`Grant`] is 112, and copying a chunk of them (the snapshot builder's
//! copy-on-write) copies no string. It encodes exactly
//! as the [`Grant`] it stands for, so snapshots are byte for byte the ones earlier releases
//! wrote and read; what it hands out of the table is a [`Grant`] (`to_grant`) or its fields.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::de::Deserializer;
use serde::ser::{SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};

use super::decoded::{InlineStr, SharedStr};
use super::holder_pool;
use crate::command::Grant;

/// The ids of the session a grant belongs to: one per session, shared by the session's
/// entry in the table and by each of its grants.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    /// The session's id.
    pub(crate) session_id: String,
    /// The owner the session acts for.
    pub(crate) owner_id: String,
}

impl Holder {
    /// The holder of session `session_id` of owner `owner_id`.
    pub(crate) fn new(session_id: String, owner_id: String) -> Arc<Holder> {
        Arc::new(Holder {
            session_id,
            owner_id,
        })
    }
}

/// A holder found by its session id: the key under which the table's session map and a
/// decode's holder pool file it. Hashes, compares and orders exactly as its id does, so a map of
/// them is searched with a `&str`.
#[derive(Clone)]
pub(crate) struct BySession(pub(crate) Arc<Holder>);

impl Borrow<str> for BySession {
    fn borrow(&self) -> &str {
        &self.0.session_id
    }
}

impl Hash for BySession {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.session_id.as_str().hash(state);
    }
}

impl PartialEq for BySession {
    fn eq(&self, other: &Self) -> bool {
        self.0.session_id == other.0.session_id
    }
}

impl Eq for BySession {}

impl PartialOrd for BySession {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for BySession {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.session_id.cmp(&other.0.session_id)
    }
}

/// One grant as the table stores it: its key, its session's shared `Holder` and the grant's
/// numbers. Read it through its accessors, or as a [`Grant`] with [`HeldGrant::to_grant`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldGrant {
    key: Arc<str>,
    holder: Arc<Holder>,
    /// The `Acquire` request that produced this grant.
    pub request_id: u64,
    /// Fencing token, unique and increasing (D-token).
    pub token: u64,
    /// Lease length.
    pub ttl_ms: u64,
    /// Stamp of the grant.
    pub acquired_at_ms: u64,
    /// Stamp-clock expiry as last recorded in the log (grant, `Renew`, `Promote`).
    /// Informational: the leader's in-memory lease decides expiry.
    pub expires_at_ms: u64,
}

impl HeldGrant {
    /// A grant of `key` to the session of `holder`, stamped `stamp_ms`.
    pub(crate) fn new(
        key: Arc<str>,
        holder: Arc<Holder>,
        request_id: u64,
        token: u64,
        ttl_ms: u64,
        stamp_ms: u64,
    ) -> Self {
        HeldGrant {
            key,
            holder,
            request_id,
            token,
            ttl_ms,
            acquired_at_ms: stamp_ms,
            expires_at_ms: stamp_ms.saturating_add(ttl_ms),
        }
    }

    /// The locked key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The key's allocation, which the holder's session lists too.
    pub(crate) fn key_arc(&self) -> &Arc<str> {
        &self.key
    }

    /// The holder's owner id.
    pub fn owner_id(&self) -> &str {
        &self.holder.owner_id
    }

    /// The holder's session id.
    pub fn session_id(&self) -> &str {
        &self.holder.session_id
    }

    /// The session this grant points at.
    pub(crate) fn holder(&self) -> &Arc<Holder> {
        &self.holder
    }

    /// Points the grant at `holder`, the same ids held once for the whole session.
    pub(crate) fn share_holder(&mut self, holder: &Arc<Holder>) {
        if !Arc::ptr_eq(&self.holder, holder) && *self.holder == **holder {
            self.holder = holder.clone();
        }
    }

    /// The grant as the commands' answers and events carry it.
    pub fn to_grant(&self) -> Grant {
        Grant {
            key: self.key.to_string(),
            owner_id: self.holder.owner_id.clone(),
            session_id: self.holder.session_id.clone(),
            request_id: self.request_id,
            token: self.token,
            ttl_ms: self.ttl_ms,
            acquired_at_ms: self.acquired_at_ms,
            expires_at_ms: self.expires_at_ms,
        }
    }
}

impl From<Grant> for HeldGrant {
    /// A grant with a holder of its own, or while a snapshot decodes the one its session's
    /// grants share (`holder_pool`; the table shares it with its session's once decoded).
    fn from(grant: Grant) -> Self {
        HeldGrant {
            key: grant.key.into(),
            holder: holder_pool::holder_of(&grant.session_id, &grant.owner_id),
            request_id: grant.request_id,
            token: grant.token,
            ttl_ms: grant.ttl_ms,
            acquired_at_ms: grant.acquired_at_ms,
            expires_at_ms: grant.expires_at_ms,
        }
    }
}

impl Serialize for HeldGrant {
    /// Writes what `Grant`'s derived encoding writes: the same struct, fields and order.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("Grant", 8)?;
        s.serialize_field("key", &*self.key)?;
        s.serialize_field("owner_id", &self.holder.owner_id)?;
        s.serialize_field("session_id", &self.holder.session_id)?;
        s.serialize_field("request_id", &self.request_id)?;
        s.serialize_field("token", &self.token)?;
        s.serialize_field("ttl_ms", &self.ttl_ms)?;
        s.serialize_field("acquired_at_ms", &self.acquired_at_ms)?;
        s.serialize_field("expires_at_ms", &self.expires_at_ms)?;
        s.end()
    }
}

/// What a `Grant` wrote, read with one allocation (the key's): the ids are only looked up in
/// the decode's pool of holders (`holder_pool`), which allocates a session's once.
#[derive(Deserialize)]
#[serde(rename = "Grant")]
struct DecodedGrant {
    key: SharedStr,
    owner_id: InlineStr,
    session_id: InlineStr,
    request_id: u64,
    token: u64,
    ttl_ms: u64,
    acquired_at_ms: u64,
    expires_at_ms: u64,
}

impl<'de> Deserialize<'de> for HeldGrant {
    /// Reads what a `Grant` wrote.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let g = DecodedGrant::deserialize(deserializer)?;
        Ok(HeldGrant {
            key: g.key.0,
            holder: holder_pool::holder_of(g.session_id.as_str(), g.owner_id.as_str()),
            request_id: g.request_id,
            token: g.token,
            ttl_ms: g.ttl_ms,
            acquired_at_ms: g.acquired_at_ms,
            expires_at_ms: g.expires_at_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant {
        Grant {
            key: "w5/0001/0002".into(),
            owner_id: "w5-owner-0001".into(),
            session_id: "0123456789abcdef0123456789abcdef".into(),
            request_id: 7,
            token: 42,
            ttl_ms: 30_000,
            acquired_at_ms: 1_000,
            expires_at_ms: 31_000,
        }
    }

    #[test]
    fn encodes_byte_for_byte_as_the_grant_it_stands_for() {
        let grant = grant();
        let held = HeldGrant::from(grant.clone());
        let bytes = postcard::to_allocvec(&held).expect("encodes");
        assert_eq!(bytes, postcard::to_allocvec(&grant).expect("encodes"));
        let back: HeldGrant = postcard::from_bytes(&bytes).expect("decodes");
        assert_eq!(back, held);
        assert_eq!(back.to_grant(), grant);
    }

    #[test]
    fn is_smaller_than_a_grant() {
        assert!(std::mem::size_of::<HeldGrant>() <= 64);
        assert!(std::mem::size_of::<HeldGrant>() < std::mem::size_of::<Grant>());
    }

    #[test]
    fn shares_only_a_holder_with_the_same_ids() {
        let mut held = HeldGrant::from(grant());
        let other = Holder::new("another".into(), "w5-owner-0001".into());
        held.share_holder(&other);
        assert!(!Arc::ptr_eq(held.holder(), &other));
        let same = Holder::new(
            "0123456789abcdef0123456789abcdef".into(),
            "w5-owner-0001".into(),
        );
        held.share_holder(&same);
        assert!(Arc::ptr_eq(held.holder(), &same));
    }
}
