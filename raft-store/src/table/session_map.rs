//! [`SessionMap`]: the live sessions, found by id in one hash probe and walked in id order.
//!
//! Every command names its session, and the apply looks it up several times per command (the
//! owner binding, the request window, the lock set). Kept in an ordered map alone, a lookup
//! among 100,000 sessions was some 17 string comparisons, each a cache miss through the
//! entry's id, and W1 lost a fifth of its pairs while 100,000 sessions were kept alive
//! (docs/PERFORMANCE.md, "Session 15", the profile). Here a hash index holds each session under
//! its holder's id, so a lookup costs the same whatever the number of sessions, and a
//! [`ChunkedMap`] of the same holders gives the id order that the snapshot's encoding, the
//! invariant check and the promoter's walk need.
//!
//! Both halves are copy-on-write in pieces, because a snapshot build clones the table under the
//! state lock: the hash index is 256 shards behind `Arc`s, the order is the chunked map's
//! chunks. A clone costs some 700 `Arc`s at `SESSIONS_MAX` (about 5 µs), where one hash map and
//! one ordered set copied an entry per session (3.4–3.8 ms at 100,000; `cargo bench -p
//! lock-raft-store -- snapshot_view`), and lookups cost what they did: one hash of the id
//! picks both the shard and the place in it.
//!
//! The hash index's own order depends on a seed drawn per process, so nothing that decides an
//! answer or an event may follow it: only [`SessionMap::sessions_mut_any_order`] does, for
//! changes that touch every session alike. Its encoding is a map of `(id, session)` in id
//! order, exactly what the ordered map before it (and a `BTreeMap<String, Session>` before
//! that) wrote. Owns no lock semantics.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry as Slot;
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::chunked::{ChunkedMap, Entry};
use super::decoded::InlineStr;
use super::held::{BySession, Holder};
use super::holder_pool;
use super::session::Session;
use super::shared::Shared;

/// Shards of the hash index (a power of two). A clone copies one `Arc` per shard; the first
/// change to a shard after a clone copies that shard, about `SESSIONS_MAX / SHARDS` (390)
/// entries.
const SHARDS: usize = 256;

/// The bits of a session id's hash that pick its shard: bits 32 to 39. A shard's table places
/// an entry by the low bits of the same hash (fewer than 32 of them below 2^32 buckets) and
/// tells entries apart by the top seven, so neither loses a bit to the choice of shard.
const SHARD_SHIFT: u32 = 32;

const _: () = assert!(SHARDS.is_power_of_two() && SHARDS <= 1 << 8);

/// Capacity of one shard below which a removal never shrinks it.
const SHRINK_ABOVE: usize = 8;

/// One shard of the hash index: each session with its holder, found by the hash of its id.
type Shard = HashTable<(BySession, Shared<Session>)>;

/// The live sessions by id; see the module docs.
///
/// Cloning it costs one `Arc` per shard of the hash index and one per chunk of the id order
/// (about 700 at `SESSIONS_MAX`), not one per session: the table's clone for a snapshot build
/// pays it under the state lock, once per build. An apply that then changes a session copies
/// that session's shard and order chunk, once per build. (A single hash map and an ordered set
/// cost 10 ms per clone at 100,000 sessions: docs/PERFORMANCE.md, "Session 17".) A session
/// itself stays shared with the clone until one side changes it.
#[derive(Clone)]
pub(crate) struct SessionMap {
    /// The hash index, in [`SHARDS`] shards, by [`SessionMap::hash`] of the session id.
    shards: Vec<Arc<Shard>>,
    /// Hashes session ids, once per lookup: the hash picks the shard and the place in it.
    hasher: RandomState,
    /// Sessions in all shards.
    len: usize,
    /// The same holders, in id order.
    order: ChunkedMap<BySession>,
}

impl Default for SessionMap {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Arc::default()).collect(),
            hasher: RandomState::new(),
            len: 0,
            order: ChunkedMap::default(),
        }
    }
}

/// Whether `entry` is the session `id`'s.
fn is<'a>(id: &'a str) -> impl Fn(&(BySession, Shared<Session>)) -> bool + 'a {
    move |(holder, _)| holder.0.session_id == id
}

/// The shard of a session whose id hashes to `hash`.
fn shard_of(hash: u64) -> usize {
    ((hash >> SHARD_SHIFT) as usize) & (SHARDS - 1)
}

/// The id order's entry: a holder, under its session id.
impl Entry for BySession {
    type Value = Arc<Holder>;

    fn key(&self) -> &str {
        &self.0.session_id
    }

    fn value(&self) -> &Arc<Holder> {
        &self.0
    }

    fn value_mut(&mut self) -> &mut Arc<Holder> {
        &mut self.0
    }

    fn from_parts(key: &str, holder: Arc<Holder>) -> Result<Self, String> {
        if key == holder.session_id {
            Ok(BySession(holder))
        } else {
            Err(format!(
                "session {key} filed under holder of session {}",
                holder.session_id
            ))
        }
    }
}

impl SessionMap {
    /// Number of sessions.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The hash of the session id `id`.
    fn hash(&self, id: &str) -> u64 {
        self.hasher.hash_one(id)
    }

    /// The session `id`'s entry in the hash index.
    fn find(&self, id: &str) -> Option<&(BySession, Shared<Session>)> {
        let hash = self.hash(id);
        self.shards[shard_of(hash)].find(hash, is(id))
    }

    /// The session `id`.
    pub(crate) fn get(&self, id: &str) -> Option<&Session> {
        self.find(id).map(|(_, s)| &**s)
    }

    /// The session `id` with its holder, the one every grant of the session points at.
    pub(crate) fn entry(&self, id: &str) -> Option<(&Arc<Holder>, &Session)> {
        self.find(id).map(|(h, s)| (&h.0, &**s))
    }

    /// The session `id`, to change (its shard and the session copied first if a clone of the
    /// table shares them; nothing is copied when there is no such session).
    pub(crate) fn get_mut(&mut self, id: &str) -> Option<&mut Session> {
        let hash = self.hash(id);
        let shard = &mut self.shards[shard_of(hash)];
        // Look before copying only when a clone shares the shard: unshared, one probe.
        if Arc::get_mut(shard).is_none() {
            shard.find(hash, is(id))?;
        }
        Arc::make_mut(shard)
            .find_mut(hash, is(id))
            .map(|(_, s)| s.make_mut())
    }

    /// Files `session` under `holder`'s session id, returning the session it replaced.
    pub(crate) fn insert(
        &mut self,
        holder: Arc<Holder>,
        session: Session,
    ) -> Option<Shared<Session>> {
        let hash = self.hash(&holder.session_id);
        let hasher = &self.hasher;
        let shard = Arc::make_mut(&mut self.shards[shard_of(hash)]);
        // The holder goes in both places: a replaced session's old holder leaves both.
        self.order.insert(BySession(holder.clone()));
        let entry = (BySession(holder), Shared::new(session));
        let rehash =
            |(h, _): &(BySession, Shared<Session>)| hasher.hash_one(h.0.session_id.as_str());
        match shard.entry(hash, is(&entry.0.0.session_id), rehash) {
            Slot::Occupied(mut occupied) => Some(std::mem::replace(occupied.get_mut(), entry).1),
            Slot::Vacant(vacant) => {
                vacant.insert(entry);
                self.len += 1;
                None
            }
        }
    }

    /// Removes the session `id` (still shared with a clone of the table that holds it).
    pub(crate) fn remove(&mut self, id: &str) -> Option<Shared<Session>> {
        let hash = self.hash(id);
        let index = shard_of(hash);
        // Look before copying only when a clone shares the shard: unshared, one probe.
        if Arc::get_mut(&mut self.shards[index]).is_none() {
            self.shards[index].find(hash, is(id))?;
        }
        let hasher = &self.hasher;
        let shard = Arc::make_mut(&mut self.shards[index]);
        let ((_, session), _) = shard.find_entry(hash, is(id)).ok()?.remove();
        self.order.remove(id);
        self.len -= 1;
        // A hash table keeps its capacity: after most of a shard's sessions closed, give most
        // of it back.
        if shard.capacity() > SHRINK_ABOVE && shard.len() < shard.capacity() / 4 {
            shard.shrink_to(shard.len() * 2, |(h, _)| {
                hasher.hash_one(h.0.session_id.as_str())
            });
        }
        Some(session)
    }

    /// Every session with its holder, in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Arc<Holder>, &Session)> {
        self.iter_after(None)
    }

    /// The sessions whose ids are above `after` (all of them for `None`), in id order: a walk
    /// in steps resumes here at the cost of one search, not by skipping what it has seen.
    pub(crate) fn iter_after(
        &self,
        after: Option<&str>,
    ) -> impl Iterator<Item = (&Arc<Holder>, &Session)> {
        self.order.values_after(after).map(|holder| {
            self.indexed(holder)
                .expect("the id order and the hash index hold the same sessions")
        })
    }

    /// `holder`'s session as the hash index holds it, if the index files that very holder
    /// under its id.
    fn indexed(&self, holder: &Arc<Holder>) -> Option<(&Arc<Holder>, &Session)> {
        let (indexed, session) = self.find(&holder.session_id)?;
        Arc::ptr_eq(&indexed.0, holder).then_some((&indexed.0, &**session))
    }

    /// Every session with its holder, to change anything but its ids, in the hash index's
    /// order, which differs between processes: only for changes that treat every session alike
    /// and whose outcome no order can change (a promote's new deadlines, a decode's sharing).
    pub(crate) fn sessions_mut_any_order(
        &mut self,
    ) -> impl Iterator<Item = (&Arc<Holder>, &mut Session)> {
        self.shards
            .iter_mut()
            .flat_map(|shard| Arc::make_mut(shard).iter_mut())
            .map(|(h, s)| (&h.0, s.make_mut()))
    }

    /// Every session with its holder, in id order, as [`SessionMap::iter`] gives them; `None`
    /// if the hash index and the id order do not hold the same holders (for the invariant
    /// check, which walks the sessions anyway: one probe of the index per session checks both).
    pub(crate) fn checked_in_order(&self) -> Option<Vec<(&Arc<Holder>, &Session)>> {
        let indexed: usize = self.shards.iter().map(|shard| shard.len()).sum();
        if self.order.len() != self.len || indexed != self.len {
            return None;
        }
        // As many holders in each, ids unique in the order, and each found in the index as
        // that very holder: the two hold the same ones.
        self.order
            .values()
            .map(|holder| self.indexed(holder))
            .collect()
    }

    /// Breaks the agreement [`SessionMap::checked_in_order`] checks: drops `id` from the id
    /// order alone.
    #[cfg(test)]
    pub(crate) fn forget_order_of(&mut self, id: &str) {
        self.order.remove(id);
    }

    /// The hash index's capacity, all shards together.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.shards.iter().map(|shard| shard.capacity()).sum()
    }
}

impl PartialEq for SessionMap {
    /// Equal when they hold the same sessions under the same ids.
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len()
            && self
                .iter()
                .map(|(h, s)| (&h.session_id, s))
                .eq(other.iter().map(|(h, s)| (&h.session_id, s)))
    }
}

impl Eq for SessionMap {}

impl fmt::Debug for SessionMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|(h, s)| (&h.session_id, s)))
            .finish()
    }
}

impl Serialize for SessionMap {
    /// A map of `(id, session)` in id order: what `BTreeMap<String, Session>` writes.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.len()))?;
        for (holder, session) in self.iter() {
            map.serialize_entry(holder.session_id.as_str(), session)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for SessionMap {
    /// Reads what [`Serialize`] writes: each session gets the holder its grants decode with
    /// (`holder_pool`); an id met twice keeps its last session, as a `BTreeMap` did.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor;
        impl<'de> Visitor<'de> for MapVisitor {
            type Value = SessionMap;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of sessions by id")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<SessionMap, A::Error> {
                let mut map = SessionMap::default();
                while let Some((id, session)) = access.next_entry::<InlineStr, Session>()? {
                    let holder = holder_pool::holder_of(id.as_str(), &session.owner_id);
                    map.insert(holder, session);
                }
                Ok(map)
            }
        }
        deserializer.deserialize_map(MapVisitor)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn session(owner: &str, ttl_ms: u64) -> Session {
        Session::new(owner.to_owned(), None, ttl_ms, 1_000)
    }

    fn holder(id: &str, owner: &str) -> Arc<Holder> {
        Holder::new(id.to_owned(), owner.to_owned())
    }

    /// Ids in an order unlike their sorted one.
    fn id(i: u64) -> String {
        format!("s{:05}", (i * 7919) % 10_007)
    }

    #[test]
    fn lookups_follow_inserts_and_removes_and_the_walk_is_in_id_order() {
        let mut map = SessionMap::default();
        let mut model = BTreeMap::new();
        for i in 0..2_000 {
            map.insert(holder(&id(i), "o"), session("o", i));
            model.insert(id(i), i);
        }
        for i in (0..2_000).step_by(3) {
            assert_eq!(map.remove(&id(i)).map(|s| s.ttl_ms), Some(i));
            model.remove(&id(i));
        }
        assert_eq!(map.remove("absent"), None);
        // A second insert under an id replaces the session and its holder.
        let replaced = map.insert(holder(&id(1), "o2"), session("o2", 77));
        assert_eq!(replaced.map(|s| s.ttl_ms), Some(1));
        model.insert(id(1), 77);

        assert_eq!(map.len(), model.len());
        assert!(map.checked_in_order().is_some());
        assert!(
            map.capacity() >= map.len(),
            "the index never shrinks below what it holds"
        );
        for i in 0..2_000 {
            assert_eq!(
                map.get(&id(i)).map(|s| s.ttl_ms),
                model.get(&id(i)).copied()
            );
        }
        let (holder_1, _) = map.entry(&id(1)).expect("live");
        assert_eq!(holder_1.owner_id, "o2");
        let walked: Vec<(String, u64)> = map
            .iter()
            .map(|(h, s)| (h.session_id.clone(), s.ttl_ms))
            .collect();
        let expected: Vec<(String, u64)> = model.clone().into_iter().collect();
        assert_eq!(walked, expected);
        // Resuming after any id, present or not, gives the rest of the order.
        for after in ["s00000", "s05000", &id(4), "t"] {
            let rest: Vec<&String> = map
                .iter_after(Some(after))
                .map(|(h, _)| &h.session_id)
                .collect();
            let expected: Vec<&String> = model.keys().filter(|k| k.as_str() > after).collect();
            assert_eq!(rest, expected, "after {after}");
        }
    }

    /// After most sessions end, the index gives back most of its capacity.
    #[test]
    fn the_index_shrinks_when_most_sessions_are_gone() {
        let mut map = SessionMap::default();
        for i in 0..20_000 {
            map.insert(holder(&format!("t{i:06}"), "o"), session("o", i));
        }
        let full = map.capacity();
        for i in 0..19_900 {
            map.remove(&format!("t{i:06}"));
        }
        assert!(map.capacity() * 8 <= full, "{} of {full}", map.capacity());
        assert!(map.checked_in_order().is_some());
        assert_eq!(map.iter().count(), 100);
    }

    #[test]
    fn a_clone_shares_sessions_until_one_side_changes_them() {
        let mut map = SessionMap::default();
        map.insert(holder("s1", "o"), session("o", 10));
        map.insert(holder("s2", "o"), session("o", 20));
        let view = map.clone();
        map.get_mut("s1").expect("live").ttl_ms = 11;
        for (_, s) in map.sessions_mut_any_order() {
            s.expires_at_ms = 5;
        }
        assert_eq!(view.get("s1").map(|s| s.ttl_ms), Some(10));
        assert!(view.iter().all(|(_, s)| s.expires_at_ms != 5));
        assert_eq!(map.get("s1").map(|s| s.ttl_ms), Some(11));
        assert!(map.iter().all(|(_, s)| s.expires_at_ms == 5));
        assert_ne!(map, view);
    }

    #[test]
    fn a_change_after_a_clone_copies_one_shard_and_a_miss_copies_none() {
        let mut map = SessionMap::default();
        for i in 0..5_000 {
            map.insert(holder(&id(i), "o"), session("o", i));
        }
        let view = map.clone();
        let shared = |map: &SessionMap| {
            map.shards
                .iter()
                .zip(&view.shards)
                .filter(|(a, b)| Arc::ptr_eq(a, b))
                .count()
        };
        assert_eq!(shared(&map), SHARDS);
        assert!(map.get_mut("absent").is_none());
        assert!(map.remove("absent").is_none());
        assert_eq!(shared(&map), SHARDS, "a miss copies nothing");
        map.get_mut(&id(7)).expect("live").ttl_ms = 1;
        assert_eq!(shared(&map), SHARDS - 1);
        assert_eq!(view.get(&id(7)).map(|s| s.ttl_ms), Some(7));
        assert_eq!(map.get(&id(7)).map(|s| s.ttl_ms), Some(1));
        assert!(map.checked_in_order().is_some() && view.checked_in_order().is_some());
    }

    #[test]
    fn it_encodes_as_the_ordered_map_did_and_reads_back_the_same() {
        let mut map = SessionMap::default();
        let mut reference = BTreeMap::new();
        for i in 0..500 {
            map.insert(holder(&id(i), "o"), session("o", i));
            reference.insert(id(i), session("o", i));
        }
        let bytes = postcard::to_allocvec(&map).expect("encodes");
        assert_eq!(bytes, postcard::to_allocvec(&reference).expect("encodes"));
        let back: SessionMap = postcard::from_bytes(&bytes).expect("decodes");
        assert_eq!(back, map);
        assert!(back.checked_in_order().is_some());
    }

    #[test]
    fn a_broken_index_is_seen() {
        let mut map = SessionMap::default();
        map.insert(holder("s1", "o"), session("o", 10));
        assert!(map.checked_in_order().is_some());
        map.forget_order_of("s1");
        assert!(map.checked_in_order().is_none());
    }
}
