//! The lease table's map from key to record, split into [`SHARDS`] hash maps so that growing it
//! never moves more than one shard's entries at once.
//!
//! A `HashMap` grows by moving every entry into a table twice the size, in the one insert that
//! found it full. The keeper's grant map grows from the apply path (each applied grant's event)
//! with the keeper locked, on every node at nearly the same log index: measured in session 28,
//! the insert that grew a one-map table past ~917,000 grants took 220–260 ms (a 1,024-key
//! step of inserts otherwise takes about 1 ms), so the apply, every renewal and every heartbeat
//! waited a quarter of a second on all three nodes at once. Split 256 ways, one growth moves
//! about a 256th of the entries, about a millisecond at a million. Keys spread evenly, so the
//! shards grow at nearly the same total: the longest step of 1,024 inserts, which meets
//! several of those growths, took 10–13 ms (64 shards: 26–44 ms; `examples/lease_growth.rs`).
//!
//! Owns the split only: which shard holds a key, a hash of the key fixed for the map's life.
//! Keys are `Arc<str>`, looked up by `&str`.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;

/// Shards in a map. A power of two, so a shard is picked by a mask.
pub const SHARDS: usize = 256;

/// A map from key to `V` in [`SHARDS`] hash maps.
#[derive(Debug)]
pub struct ShardedMap<V> {
    /// Hashes a key to its shard; independent of each shard's own hasher.
    pick: RandomState,
    shards: Box<[HashMap<Arc<str>, V>]>,
}

impl<V> Default for ShardedMap<V> {
    fn default() -> Self {
        Self {
            pick: RandomState::new(),
            shards: (0..SHARDS).map(|_| HashMap::new()).collect(),
        }
    }
}

impl<V> ShardedMap<V> {
    fn shard_of(&self, key: &str) -> usize {
        self.pick.hash_one(key) as usize & (SHARDS - 1)
    }

    fn shard(&self, key: &str) -> &HashMap<Arc<str>, V> {
        &self.shards[self.shard_of(key)]
    }

    fn shard_mut(&mut self, key: &str) -> &mut HashMap<Arc<str>, V> {
        let i = self.shard_of(key);
        &mut self.shards[i]
    }

    /// Entries in the map.
    pub fn len(&self) -> usize {
        self.shards.iter().map(HashMap::len).sum()
    }

    /// Whether the map holds no entry.
    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(HashMap::is_empty)
    }

    /// Entries the map holds without growing any shard, were they spread as evenly as the
    /// shards' room: the sum of the shards' capacities.
    pub fn capacity(&self) -> usize {
        self.shards.iter().map(HashMap::capacity).sum()
    }

    /// Makes room for `additional` more entries, spread as keys spread: each shard gets room
    /// for its share and a quarter more plus 64, many standard deviations of how unevenly
    /// random keys fall (at a million, a shard's share is 3,906 ± 62), so filling the map by
    /// `additional` grows no shard.
    pub fn reserve(&mut self, additional: usize) {
        if additional == 0 {
            return;
        }
        let share = additional.div_ceil(SHARDS);
        let room = share + share / 4 + 64;
        for shard in self.shards.iter_mut() {
            shard.reserve(room);
        }
    }

    /// The value under `key`.
    pub fn get(&self, key: &str) -> Option<&V> {
        self.shard(key).get(key)
    }

    /// The value under `key`, to change.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.shard_mut(key).get_mut(key)
    }

    /// The stored key and value under `key`.
    pub fn get_key_value(&self, key: &str) -> Option<(&Arc<str>, &V)> {
        self.shard(key).get_key_value(key)
    }

    /// Puts `value` under `key`; answers the value it replaced.
    pub fn insert(&mut self, key: Arc<str>, value: V) -> Option<V> {
        self.shard_mut(&key).insert(key, value)
    }

    /// Takes `key` and its value out.
    pub fn remove_entry(&mut self, key: &str) -> Option<(Arc<str>, V)> {
        self.shard_mut(key).remove_entry(key)
    }

    /// Keeps only the entries `keep` answers `true` for.
    pub fn retain(&mut self, mut keep: impl FnMut(&Arc<str>, &mut V) -> bool) {
        for shard in self.shards.iter_mut() {
            shard.retain(&mut keep);
        }
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &V)> {
        self.shards.iter().flat_map(HashMap::iter)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// The map answers as one `HashMap` does, through inserts, replacements, removals and a
    /// retain.
    #[test]
    fn answers_as_one_hash_map() {
        let mut map = ShardedMap::default();
        let mut model = BTreeMap::new();
        for i in 0..3_000u32 {
            let key: Arc<str> = format!("k{}", i % 2_000).into();
            assert_eq!(map.insert(key.clone(), i), model.insert(key, i));
        }
        for i in (0..2_000).step_by(7) {
            let key = format!("k{i}");
            assert_eq!(
                map.remove_entry(&key).map(|(k, v)| (k.to_string(), v)),
                model.remove(key.as_str()).map(|v| (key.clone(), v))
            );
        }
        *map.get_mut("k1").expect("present") += 1;
        *model.get_mut("k1").expect("present") += 1;
        map.retain(|_, v| *v % 3 != 0);
        model.retain(|_, v| *v % 3 != 0);
        assert_eq!(map.len(), model.len());
        assert!(!map.is_empty());
        for i in 0..2_000 {
            let key = format!("k{i}");
            assert_eq!(map.get(&key), model.get(key.as_str()));
            assert_eq!(
                map.get_key_value(&key).map(|(k, _)| &**k),
                model.get_key_value(key.as_str()).map(|(k, _)| &**k)
            );
        }
        let all: BTreeMap<_, _> = map.iter().map(|(k, v)| (k.clone(), *v)).collect();
        assert_eq!(all, model);
    }

    /// Keys spread over every shard, and a reserve leaves room for the keys it was made for:
    /// filling the map by that many grows no shard.
    #[test]
    fn keys_spread_and_a_reserve_covers_them() {
        let mut map = ShardedMap::default();
        map.reserve(20_000);
        let room: Vec<usize> = map.shards.iter().map(HashMap::capacity).collect();
        for i in 0..20_000u32 {
            map.insert(format!("grant/{i}").into(), i);
        }
        let after: Vec<usize> = map.shards.iter().map(HashMap::capacity).collect();
        assert_eq!(room, after, "no shard grew");
        assert!(
            map.shards.iter().all(|s| s.len() > 20),
            "every shard took keys"
        );
        assert_eq!(map.len(), 20_000);
    }
}
