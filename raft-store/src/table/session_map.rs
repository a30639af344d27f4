//! [`SessionMap`]: the live sessions, found by id in one hash probe and walked in id order.
//!
//! Every command names its session, and the apply looks it up several times per command (the
//! owner binding, the request window, the lock set). Kept in an ordered map alone, a lookup
//! among 100,000 sessions was some 17 string comparisons, each a cache miss through the
//! entry's id, and W1 lost a fifth of its pairs while 100,000 sessions were kept alive
//! (docs/PERFORMANCE.md, "Session 15", the profile). Here a hash index holds each session under
//! its holder's id, so a lookup costs the same whatever the number of sessions, and an ordered
//! set of the same holders gives the id order that the snapshot's encoding, the invariant check
//! and the promoter's walk need.
//!
//! The hash index's own order depends on a seed drawn per process, so nothing that decides an
//! answer or an event may follow it: only [`SessionMap::sessions_mut_any_order`] does, for
//! changes that touch every session alike. Its encoding is a map of `(id, session)` in id
//! order, exactly what the ordered map before it (and a `BTreeMap<String, Session>` before
//! that) wrote. Owns no lock semantics.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::ops::Bound;
use std::sync::Arc;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::decoded::InlineStr;
use super::held::{BySession, Holder};
use super::holder_pool;
use super::session::Session;
use super::shared::Shared;

/// Capacity of the hash index below which a removal never shrinks it.
const SHRINK_ABOVE: usize = 1_024;

/// The live sessions by id; see the module docs.
///
/// Cloning it copies one entry per session (two `Arc`s each, no session): the table's clone for
/// a snapshot build pays that under the state lock, once per build. Measured in a release build
/// (best of five): 0.03 ms at 1,000 sessions, 1.3 ms at 30,000, 10 ms at 100,000
/// (docs/PERFORMANCE.md, "Session 16"). A session itself stays shared with the clone until one
/// side changes it.
#[derive(Clone, Default)]
pub(crate) struct SessionMap {
    /// Each session under its holder, found by the holder's session id.
    by_id: HashMap<BySession, Shared<Session>>,
    /// The same holders, in id order.
    order: BTreeSet<BySession>,
}

impl SessionMap {
    /// Number of sessions.
    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// The session `id`.
    pub(crate) fn get(&self, id: &str) -> Option<&Session> {
        self.by_id.get(id).map(|s| &**s)
    }

    /// The session `id` with its holder, the one every grant of the session points at.
    pub(crate) fn entry(&self, id: &str) -> Option<(&Arc<Holder>, &Session)> {
        self.by_id.get_key_value(id).map(|(h, s)| (&h.0, &**s))
    }

    /// The session `id`, to change (copied first if a clone of the table shares it).
    pub(crate) fn get_mut(&mut self, id: &str) -> Option<&mut Session> {
        self.by_id.get_mut(id).map(Shared::make_mut)
    }

    /// Files `session` under `holder`'s session id, returning the session it replaced.
    pub(crate) fn insert(
        &mut self,
        holder: Arc<Holder>,
        session: Session,
    ) -> Option<Shared<Session>> {
        let session = Shared::new(session);
        // The holder goes in both places: a replaced session's old holder leaves both.
        let replaced = self.by_id.remove_entry(holder.session_id.as_str());
        self.order.replace(BySession(holder.clone()));
        self.by_id.insert(BySession(holder), session);
        replaced.map(|(_, s)| s)
    }

    /// Removes the session `id` (still shared with a clone of the table that holds it).
    pub(crate) fn remove(&mut self, id: &str) -> Option<Shared<Session>> {
        let (_, session) = self.by_id.remove_entry(id)?;
        self.order.remove(id);
        // A hash map keeps its capacity: after 100,000 sessions closed, give most of it back.
        if self.by_id.capacity() > SHRINK_ABOVE && self.by_id.len() < self.by_id.capacity() / 4 {
            self.by_id.shrink_to(self.by_id.len() * 2);
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
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.order
            .range::<str, _>((from, Bound::Unbounded))
            .map(|holder| {
                self.indexed(holder)
                    .expect("the id order and the hash index hold the same sessions")
            })
    }

    /// `holder`'s session as the hash index holds it, if the index files that very holder
    /// under its id.
    fn indexed(&self, holder: &BySession) -> Option<(&Arc<Holder>, &Session)> {
        let (indexed, session) = self.by_id.get_key_value(holder)?;
        Arc::ptr_eq(&indexed.0, &holder.0).then_some((&indexed.0, &**session))
    }

    /// Every session with its holder, to change anything but its ids, in the hash index's
    /// order, which differs between processes: only for changes that treat every session alike
    /// and whose outcome no order can change (a promote's new deadlines, a decode's sharing).
    pub(crate) fn sessions_mut_any_order(
        &mut self,
    ) -> impl Iterator<Item = (&Arc<Holder>, &mut Session)> {
        self.by_id.iter_mut().map(|(h, s)| (&h.0, s.make_mut()))
    }

    /// Every session with its holder, in id order, as [`SessionMap::iter`] gives them; `None`
    /// if the hash index and the id order do not hold the same holders (for the invariant
    /// check, which walks the sessions anyway: one probe of the index per session checks both).
    pub(crate) fn checked_in_order(&self) -> Option<Vec<(&Arc<Holder>, &Session)>> {
        if self.order.len() != self.by_id.len() {
            return None;
        }
        // As many holders in each, ids unique in the order, and each found in the index as
        // that very holder: the two hold the same ones.
        self.order
            .iter()
            .map(|holder| self.indexed(holder))
            .collect()
    }

    /// Breaks the agreement [`SessionMap::checked_in_order`] checks: drops `id` from the id
    /// order alone.
    #[cfg(test)]
    pub(crate) fn forget_order_of(&mut self, id: &str) {
        self.order.remove(id);
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
            map.by_id.capacity() >= map.len(),
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
        let full = map.by_id.capacity();
        for i in 0..19_900 {
            map.remove(&format!("t{i:06}"));
        }
        assert!(
            map.by_id.capacity() * 8 <= full,
            "{} of {full}",
            map.by_id.capacity()
        );
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
