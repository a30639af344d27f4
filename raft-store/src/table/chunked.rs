//! [`ChunkedMap`]: an ordered map by string key, stored as a sorted list of sorted chunks, each
//! chunk behind an `Arc`. It exists for two reasons, both about a million held locks:
//!
//! - **A clone costs one `Arc` per chunk, not one copy per entry.** The snapshot builder clones
//!   the table under the state lock and encodes the clone on another thread; an apply that then
//!   changes an entry copies only that entry's chunk (`Arc::make_mut`), once per build.
//! - **No duplicate key and no tree slack.** An entry carries its own key ([`Entry::key`]; a
//!   grant's key is `Grant::key`), so the map stores no second copy of it, and a chunk is a
//!   packed `Vec`, not B-tree nodes of eleven slots.
//!
//! A search finds a key's chunk through one packed array of [`Fence`]s, then searches that
//! chunk.
//!
//! Its encoding is a serde map of `(key, value)` in key order, exactly what a `BTreeMap<String,
//! V>` writes, so snapshots written before it (and by builds without it) read and write the
//! same bytes. Owns no lock semantics.

use std::cmp::Ordering;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::decoded::InlineStr;

/// Most entries in one chunk: a chunk past it is split. A copy-on-write copies one chunk, so
/// this bounds the work an apply does while a snapshot build holds the old chunks, and an
/// insert shifts up to this many entries. 128 rather than 256: a million locks filled through
/// the `held_locks` example with builds took 6.1–6.4 s against 6.8–7.7 s, and peaked at
/// 249–254 MiB against 271–282 MiB; 64 saved a little more memory but slowed each snapshot
/// build by a quarter (docs/PERFORMANCE.md, session 18).
const CHUNK_MAX: usize = 128;
/// Entries per chunk when a map is decoded or a chunk is split at its end: chunks filled in
/// key order (a snapshot, a fill in key order) stay nearly full.
const CHUNK_FILL: usize = CHUNK_MAX - CHUNK_MAX / 8;
/// A chunk below this after a removal is merged with its right neighbour if the two fit in one.
const CHUNK_MIN: usize = CHUNK_MAX / 4;

/// What a [`ChunkedMap`] stores: a value together with its key.
pub(crate) trait Entry: Clone {
    /// The value the map's encoding carries under the key.
    type Value;
    /// The entry's key; never changes while the entry is in a map.
    fn key(&self) -> &str;
    /// The value.
    fn value(&self) -> &Self::Value;
    /// The value, for changing anything but the key.
    fn value_mut(&mut self) -> &mut Self::Value;
    /// The entry of `value` under `key`, as decoded; an error if they disagree.
    fn from_parts(key: &str, value: Self::Value) -> Result<Self, String>;
}

/// An ordered map by string key of [`Entry`]s; see the module docs.
#[derive(Clone)]
pub(crate) struct ChunkedMap<E> {
    /// Non-empty chunks, each sorted by key, every key of a chunk below every key of the next.
    chunks: Vec<Arc<Vec<E>>>,
    /// `fences[c]` is the [`Fence`] of the last key of `chunks[c]`, one per chunk.
    fences: Vec<Fence>,
    len: usize,
}

impl<E> Default for ChunkedMap<E> {
    fn default() -> Self {
        ChunkedMap {
            chunks: Vec::new(),
            fences: Vec::new(),
            len: 0,
        }
    }
}

/// Bytes of a chunk's last key kept in its [`Fence`]: 28, so a fence is 32 bytes and two fit
/// a cache line.
const FENCE_HEAD: usize = 28;

/// The head of a chunk's last key and its length, kept in one packed array beside the chunks.
///
/// Finding a key's chunk is a binary search over the chunks' last keys. Read through the
/// chunks, each step of it reads three scattered allocations (the chunk, its last entry, that
/// entry's key): at a million held locks, thousands of chunks, the search alone cost about 2 µs
/// of cache misses per acquire (docs/PERFORMANCE.md, session 18). Against the fences, a step
/// reads 32 packed bytes, and reads the key itself only when both keys are longer than the
/// head and agree on all of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fence {
    head: [u8; FENCE_HEAD],
    len: u32,
}

impl Fence {
    fn of(key: &str) -> Fence {
        let mut head = [0; FENCE_HEAD];
        let kept = key.len().min(FENCE_HEAD);
        head[..kept].copy_from_slice(&key.as_bytes()[..kept]);
        Fence {
            head,
            len: u32::try_from(key.len()).unwrap_or(u32::MAX),
        }
    }

    /// How the fenced key orders against `key`, or `None` when the heads cannot tell: both
    /// keys run past [`FENCE_HEAD`] bytes and agree on all of them.
    fn cmp_key(&self, key: &str) -> Option<Ordering> {
        let len = self.len as usize;
        let own = &self.head[..len.min(FENCE_HEAD)];
        let other = &key.as_bytes()[..key.len().min(FENCE_HEAD)];
        match own.cmp(other) {
            // Equal heads of equal length: unless both keys go on, the shorter one is a prefix
            // of the other, and so comes first.
            Ordering::Equal if len > FENCE_HEAD && key.len() > FENCE_HEAD => None,
            Ordering::Equal => Some(len.cmp(&key.len())),
            order => Some(order),
        }
    }
}

/// A place in a [`ChunkedMap`] for a walk that meets its keys in order
/// ([`ChunkedMap::find_from`]): the entry it expects next.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Cursor {
    chunk: usize,
    at: usize,
}

/// Where a key is, or would be inserted: `(chunk, position)`.
enum Slot {
    Found(usize, usize),
    Vacant(usize, usize),
}

impl<E: Entry> ChunkedMap<E> {
    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Number of chunks (for tests and the memory report).
    #[cfg(test)]
    pub(crate) fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    fn locate(&self, key: &str) -> Slot {
        let Some(last) = self.chunks.len().checked_sub(1) else {
            return Slot::Vacant(0, 0);
        };
        // The first chunk whose last key is not below `key`; past the end, the last chunk.
        let below = |c: usize| match self.fences[c].cmp_key(key) {
            Some(order) => order == Ordering::Less,
            None => self.chunks[c].last().is_some_and(|e| e.key() < key),
        };
        let (mut low, mut high) = (0, self.chunks.len());
        while low < high {
            let mid = low + (high - low) / 2;
            if below(mid) {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        let c = low.min(last);
        match self.chunks[c].binary_search_by(|e| e.key().cmp(key)) {
            Ok(i) => Slot::Found(c, i),
            Err(i) => Slot::Vacant(c, i),
        }
    }

    /// The value under `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&E::Value> {
        match self.locate(key) {
            Slot::Found(c, i) => Some(self.chunks[c][i].value()),
            Slot::Vacant(..) => None,
        }
    }

    /// The values whose keys are above `after` (every value for `None`), in key order: a walk
    /// in steps resumes with one search, not by skipping what it has seen.
    pub(crate) fn values_after(&self, after: Option<&str>) -> impl Iterator<Item = &E::Value> {
        let (c, i) = match after.map(|key| self.locate(key)) {
            None => (0, 0),
            Some(Slot::Found(c, i)) => (c, i + 1),
            Some(Slot::Vacant(c, i)) => (c, i),
        };
        let first = self
            .chunks
            .get(c)
            .map_or(&[][..], |chunk| &chunk[i.min(chunk.len())..]);
        let rest = self.chunks.get(c + 1..).unwrap_or_default();
        first
            .iter()
            .chain(rest.iter().flat_map(|chunk| chunk.iter()))
            .map(Entry::value)
    }

    /// Whether `key` is in the map.
    pub(crate) fn contains_key(&self, key: &str) -> bool {
        matches!(self.locate(key), Slot::Found(..))
    }

    /// Where `key` is, looking first where `cursor` points: a caller visiting keys in this
    /// map's order finds each at the cursor, and a search is the exception. Moves the cursor
    /// past the key found; `None` (the cursor unmoved) if the map lacks it.
    pub(crate) fn find_from(&self, key: &str, cursor: &mut Cursor) -> Option<&E::Value> {
        let (c, i) = self.position_from(key, cursor)?;
        Some(self.chunks[c][i].value())
    }

    /// [`ChunkedMap::find_from`], for changing the value (its chunk copied if a clone shares
    /// it). The key must stay what it is.
    pub(crate) fn find_from_mut(
        &mut self,
        key: &str,
        cursor: &mut Cursor,
    ) -> Option<&mut E::Value> {
        let (c, i) = self.position_from(key, cursor)?;
        Some(Arc::make_mut(&mut self.chunks[c])[i].value_mut())
    }

    fn position_from(&self, key: &str, cursor: &mut Cursor) -> Option<(usize, usize)> {
        let at_cursor = self
            .chunks
            .get(cursor.chunk)
            .and_then(|chunk| chunk.get(cursor.at))
            .is_some_and(|e| e.key() == key);
        let (c, i) = if at_cursor {
            (cursor.chunk, cursor.at)
        } else {
            match self.locate(key) {
                Slot::Found(c, i) => (c, i),
                Slot::Vacant(..) => return None,
            }
        };
        *cursor = if i + 1 < self.chunks[c].len() {
            Cursor {
                chunk: c,
                at: i + 1,
            }
        } else {
            Cursor {
                chunk: c + 1,
                at: 0,
            }
        };
        Some((c, i))
    }

    /// The value under `key`, to change (copies its chunk if a clone shares it).
    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut E::Value> {
        match self.locate(key) {
            Slot::Found(c, i) => Some(Arc::make_mut(&mut self.chunks[c])[i].value_mut()),
            Slot::Vacant(..) => None,
        }
    }

    /// Inserts `entry` under its key, returning the entry it replaced.
    pub(crate) fn insert(&mut self, entry: E) -> Option<E> {
        match self.locate(entry.key()) {
            Slot::Found(c, i) => Some(std::mem::replace(
                &mut Arc::make_mut(&mut self.chunks[c])[i],
                entry,
            )),
            Slot::Vacant(c, i) => {
                self.len += 1;
                if self.chunks.is_empty() {
                    self.fences.push(Fence::of(entry.key()));
                    self.chunks.push(Arc::new(vec![entry]));
                    return None;
                }
                let at_end = c + 1 == self.chunks.len() && i == self.chunks[c].len();
                let chunk = Arc::make_mut(&mut self.chunks[c]);
                if chunk.len() == chunk.capacity() {
                    // Grow by an eighth, not double: chunks are many and mostly full. A small
                    // map (a session's few keys) grows by four, not by one at every insert.
                    chunk.reserve_exact((chunk.len() / 8).max(4));
                }
                let last = i == chunk.len();
                chunk.insert(i, entry);
                if chunk.len() > CHUNK_MAX {
                    // Appending in key order leaves full chunks behind; otherwise halve.
                    let at = if at_end { CHUNK_FILL } else { chunk.len() / 2 };
                    let right = chunk.split_off(at);
                    chunk.shrink_to(at + at / 8);
                    // The right half keeps the chunk's last key; the left half ends anew.
                    let right_fence = right.last().map_or(self.fences[c], |e| Fence::of(e.key()));
                    self.chunks.insert(c + 1, Arc::new(right));
                    self.fences.insert(c + 1, right_fence);
                    self.refence(c);
                } else if last {
                    self.refence(c);
                }
                None
            }
        }
    }

    /// Removes the entry under `key`.
    pub(crate) fn remove(&mut self, key: &str) -> Option<E> {
        let Slot::Found(c, i) = self.locate(key) else {
            return None;
        };
        self.len -= 1;
        let chunk = Arc::make_mut(&mut self.chunks[c]);
        let removed = chunk.remove(i);
        if chunk.is_empty() {
            self.chunks.remove(c);
            self.fences.remove(c);
        } else if chunk.len() < CHUNK_MIN
            && self
                .chunks
                .get(c + 1)
                .is_some_and(|next| next.len() + self.chunks[c].len() <= CHUNK_FILL)
        {
            let next = self.chunks.remove(c + 1);
            let next = Arc::try_unwrap(next).unwrap_or_else(|shared| (*shared).clone());
            Arc::make_mut(&mut self.chunks[c]).extend(next);
            self.fences[c] = self.fences.remove(c + 1);
        } else if i == self.chunks[c].len() {
            self.refence(c);
        }
        Some(removed)
    }

    /// Every entry, in key order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &E> {
        self.chunks.iter().flat_map(|chunk| chunk.iter())
    }

    /// Every `(key, value)`, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &E::Value)> {
        self.entries().map(|e| (e.key(), e.value()))
    }

    /// Every value, in key order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &E::Value> {
        self.entries().map(Entry::value)
    }

    /// Every value, in key order, to change (copies every chunk a clone shares).
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut E::Value> {
        self.chunks
            .iter_mut()
            .flat_map(|chunk| Arc::make_mut(chunk).iter_mut().map(Entry::value_mut))
    }

    /// Sets chunk `c`'s fence from its last key, after a change at its end.
    fn refence(&mut self, c: usize) {
        if let Some(last) = self.chunks[c].last() {
            self.fences[c] = Fence::of(last.key());
        }
    }

    /// Appends `entry` if its key is above every key in the map (a decode in key order);
    /// otherwise inserts it where it belongs.
    fn push(&mut self, entry: E) {
        let in_order = self
            .chunks
            .last()
            .is_none_or(|chunk| chunk.last().is_none_or(|last| last.key() < entry.key()));
        if !in_order {
            self.insert(entry);
            return;
        }
        let fence = Fence::of(entry.key());
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < CHUNK_FILL => {
                Arc::make_mut(chunk).push(entry);
                if let Some(last) = self.fences.last_mut() {
                    *last = fence;
                }
            }
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK_FILL);
                chunk.push(entry);
                self.chunks.push(Arc::new(chunk));
                self.fences.push(fence);
            }
        }
        self.len += 1;
    }
}

impl<E: Entry> FromIterator<E> for ChunkedMap<E> {
    /// The map of `entries`, cheapest in key order; a key met twice keeps its last entry.
    fn from_iter<I: IntoIterator<Item = E>>(entries: I) -> Self {
        let mut map = ChunkedMap::default();
        for entry in entries {
            map.push(entry);
        }
        map
    }
}

impl<E: Entry> PartialEq for ChunkedMap<E>
where
    E::Value: PartialEq,
{
    /// Equal when the entries are, however they are chunked.
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl<E: Entry> Eq for ChunkedMap<E> where E::Value: Eq {}

impl<E: Entry> fmt::Debug for ChunkedMap<E>
where
    E::Value: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<E: Entry> Serialize for ChunkedMap<E>
where
    E::Value: Serialize,
{
    /// A map of `(key, value)` in key order: what `BTreeMap<String, E::Value>` writes.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.len))?;
        for (key, value) in self.iter() {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

impl<'de, E: Entry> Deserialize<'de> for ChunkedMap<E>
where
    E::Value: Deserialize<'de>,
{
    /// Reads what [`Serialize`] writes (and what a `BTreeMap<String, E::Value>` wrote): a key
    /// met twice keeps its last value, as a `BTreeMap` did.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor<E>(PhantomData<E>);
        impl<'de, E: Entry> Visitor<'de> for MapVisitor<E>
        where
            E::Value: Deserialize<'de>,
        {
            type Value = ChunkedMap<E>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map by string key")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut map = ChunkedMap::default();
                while let Some((key, value)) = access.next_entry::<InlineStr, E::Value>()? {
                    map.push(E::from_parts(key.as_str(), value).map_err(de::Error::custom)?);
                }
                Ok(map)
            }
        }
        deserializer.deserialize_map(MapVisitor(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::ops::Bound;

    use super::*;

    /// A test entry: a key and a number.
    #[derive(Clone, Debug, PartialEq)]
    struct Pair(String, u64);

    impl Entry for Pair {
        type Value = u64;
        fn key(&self) -> &str {
            &self.0
        }
        fn value(&self) -> &u64 {
            &self.1
        }
        fn value_mut(&mut self) -> &mut u64 {
            &mut self.1
        }
        fn from_parts(key: &str, value: u64) -> Result<Self, String> {
            Ok(Pair(key.to_owned(), value))
        }
    }

    fn key(i: u64) -> String {
        format!("k{:06}", (i * 7919) % 10_007)
    }

    /// `values_after` gives the values above any key, present or not, below or above every
    /// key, across many chunks: what a `BTreeMap`'s range gives.
    #[test]
    fn values_after_resume_where_a_btreemaps_range_does() {
        let mut map = ChunkedMap::<Pair>::default();
        let mut model = BTreeMap::new();
        for i in 0..5_000 {
            map.insert(Pair(key(i), i));
            model.insert(key(i), i);
        }
        assert!(map.chunk_count() > 10);
        let mut afters: Vec<String> = (0..6_000).step_by(7).map(key).collect();
        afters.extend([String::new(), "k".into(), "zzz".into()]);
        for after in &afters {
            let got: Vec<u64> = map.values_after(Some(after)).copied().collect();
            let want: Vec<u64> = model
                .range::<str, _>((Bound::Excluded(after.as_str()), Bound::Unbounded))
                .map(|(_, v)| *v)
                .collect();
            assert_eq!(got, want, "after {after:?}");
        }
        assert!(map.values_after(None).copied().eq(model.values().copied()));
        assert_eq!(
            ChunkedMap::<Pair>::default()
                .values_after(Some("a"))
                .count(),
            0
        );
        assert_eq!(ChunkedMap::<Pair>::default().values_after(None).count(), 0);
    }

    /// Random-order inserts, removals and changes give what a `BTreeMap` gives, in the same
    /// order, with chunks within their bounds and each fence its chunk's; the encoding is the
    /// `BTreeMap`'s byte for byte. Keys are short, or share a head longer than a fence's, or
    /// run out at a fence's length and just past it (one key a prefix of another).
    #[test]
    fn behaves_and_encodes_as_a_btreemap() {
        let long = |i: u64| format!("tenant/a-rather-long-prefix/{}", key(i));
        let edge = |i: u64| {
            let n = (i * 7919) % 10_007;
            let base = "x".repeat(FENCE_HEAD - 2);
            // Lengths FENCE_HEAD - 1 ..= FENCE_HEAD + 2, each key a prefix of longer ones.
            format!("{base}{}", &format!("{n:05}")[..1 + (n % 4) as usize])
        };
        for key_of in [key as fn(u64) -> String, long, edge] {
            behaves_and_encodes_as_a_btreemap_with(key_of);
        }
    }

    fn behaves_and_encodes_as_a_btreemap_with(key: fn(u64) -> String) {
        let mut map = ChunkedMap::<Pair>::default();
        let mut model = BTreeMap::new();
        for i in 0..5_000 {
            assert_eq!(
                map.insert(Pair(key(i), i)).map(|p| p.1),
                model.insert(key(i), i)
            );
        }
        assert_fenced(&map);
        for i in (0..5_000).step_by(3) {
            assert_eq!(map.remove(&key(i)).map(|p| p.1), model.remove(&key(i)));
            assert_eq!(map.remove(&key(i)), None);
        }
        assert_fenced(&map);
        for i in (1..5_000).step_by(5) {
            if let Some(v) = map.get_mut(&key(i)) {
                *v += 1;
                *model.get_mut(&key(i)).expect("same keys") += 1;
            }
        }
        assert_eq!(map.len(), model.len());
        assert!(
            map.iter()
                .map(|(k, v)| (k.to_owned(), *v))
                .eq(model.clone())
        );
        assert!(
            map.chunks
                .iter()
                .all(|c| !c.is_empty() && c.len() <= CHUNK_MAX)
        );
        for i in 0..6_000 {
            assert_eq!(map.get(&key(i)), model.get(&key(i)));
            assert_eq!(map.contains_key(&key(i)), model.contains_key(&key(i)));
        }
        let bytes = postcard::to_allocvec(&map).expect("encodes");
        assert_eq!(bytes, postcard::to_allocvec(&model).expect("encodes"));
        let back: ChunkedMap<Pair> = postcard::from_bytes(&bytes).expect("decodes");
        assert_eq!(back, map);
        assert_fenced(&back);
        assert!(
            back.chunk_count() < map.chunk_count(),
            "decoded chunks are full"
        );
    }

    /// Each chunk has one fence, made from its last key.
    fn assert_fenced(map: &ChunkedMap<Pair>) {
        assert_eq!(map.fences.len(), map.chunks.len());
        for (fence, chunk) in map.fences.iter().zip(&map.chunks) {
            assert_eq!(*fence, Fence::of(chunk.last().expect("non-empty").key()));
        }
    }

    /// A fence orders a key as the key itself would, whether the heads tell or not.
    #[test]
    fn a_fence_orders_keys_as_the_keys_do() {
        let head = "h".repeat(FENCE_HEAD);
        let keys = [
            String::new(),
            "a".into(),
            "h".into(),
            head[..FENCE_HEAD - 1].to_owned(),
            head.clone(),
            format!("{head}a"),
            format!("{head}b"),
            format!("{head}ab"),
            "i".into(),
            "é".into(),
        ];
        for fenced in &keys {
            let fence = Fence::of(fenced);
            for key in &keys {
                let want = fenced.as_str().cmp(key.as_str());
                match fence.cmp_key(key) {
                    Some(got) => assert_eq!(got, want, "{fenced:?} against {key:?}"),
                    None => assert!(
                        fenced.len() > FENCE_HEAD && key.len() > FENCE_HEAD,
                        "{fenced:?} against {key:?} undecided"
                    ),
                }
            }
        }
    }

    /// A clone shares every chunk; changing the original copies only the chunk it touches,
    /// and the clone keeps the old values.
    #[test]
    fn a_clone_shares_chunks_until_one_side_changes() {
        let mut map = ChunkedMap::<Pair>::default();
        for i in 0..2_000 {
            map.insert(Pair(format!("k{i:05}"), i));
        }
        let view = map.clone();
        *map.get_mut("k00010").expect("present") = 99;
        map.remove("k01500");
        let shared = map
            .chunks
            .iter()
            .zip(&view.chunks)
            .filter(|(a, b)| Arc::ptr_eq(a, b))
            .count();
        assert!(
            shared + 2 >= view.chunk_count() && shared > 0,
            "{shared} of {} shared",
            view.chunk_count()
        );
        assert_eq!(view.get("k00010"), Some(&10));
        assert_eq!(view.get("k01500"), Some(&1500));
        assert_eq!(map.get("k00010"), Some(&99));
        assert_eq!(map.get("k01500"), None);
        assert_eq!(view.len(), 2_000);
        assert_eq!(map.len(), 1_999);
    }

    /// Keys decoded out of order (never written so, but bytes come from disk and peers) still
    /// give an ordered map, the last value of a repeated key winning.
    #[test]
    fn out_of_order_and_repeated_keys_decode_as_a_btreemap_would() {
        let pairs: Vec<(String, u64)> = vec![
            ("b".into(), 1),
            ("a".into(), 2),
            ("c".into(), 3),
            ("a".into(), 4),
        ];
        // A postcard map is its length as a varint, then the pairs.
        let mut bytes = vec![pairs.len() as u8];
        for pair in &pairs {
            bytes.extend(postcard::to_allocvec(pair).expect("pair"));
        }
        let map: ChunkedMap<Pair> = postcard::from_bytes(&bytes).expect("decodes");
        let model: BTreeMap<String, u64> = postcard::from_bytes(&bytes).expect("decodes");
        assert!(map.iter().map(|(k, v)| (k.to_owned(), *v)).eq(model));
        assert_eq!(map.len(), 3);
    }
}
