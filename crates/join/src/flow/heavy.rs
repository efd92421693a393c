//! Probe tuples of heavy keys stay on their node (selective broadcast): they are kept
//! ("materialised") until the build tuples of their key have arrived, then probed
//! against those copies, and later ones are probed at once.
//!
//! Keys become ready in groups (all owners finished broadcasting an iteration's keys;
//! or one owner answered a fetch request). Each group's build tuples form a
//! [`Segment`] with its own matched flags, which never moves, so flags set by one
//! prober are never lost when a later group arrives. Whether a tuple is probed now or
//! kept is decided under the same lock that makes keys ready, so no tuple can be kept
//! after its key's group was drained.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::direct_map::DirectMap;
use super::mix64;
use super::wire::Tup;

/// Hasher for 64-bit keys: one splitmix finaliser.
#[derive(Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        mix64(self.0)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }
}

pub type KeyMap<V> = HashMap<u64, V, BuildHasherDefault<KeyHasher>>;

/// Build tuples of one group of keys (sorted by key, so a key's tuples are one range),
/// with a matched flag each.
#[derive(Debug, Default)]
pub struct Segment {
    pub tuples: Vec<Tup>,
    pub matched: Vec<AtomicBool>,
    index: KeyMap<(u32, u32)>,
}

impl Segment {
    pub fn new(mut tuples: Vec<Tup>) -> Self {
        tuples.sort_unstable_by_key(|t| t.key);
        let mut index: KeyMap<(u32, u32)> = KeyMap::default();
        let mut lo = 0;
        while lo < tuples.len() {
            let key = tuples[lo].key;
            let hi = lo + tuples[lo..].partition_point(|t| t.key == key);
            index.insert(key, (lo as u32, hi as u32));
            lo = hi;
        }
        Segment {
            matched: tuples.iter().map(|_| AtomicBool::new(false)).collect(),
            tuples,
            index,
        }
    }

    /// Positions of the tuples with `key`.
    pub fn rows(&self, key: u64) -> std::ops::Range<usize> {
        self.index
            .get(&key)
            .map_or(0..0, |&(lo, hi)| lo as usize..hi as usize)
    }
}

/// The keys that are ready and where their build tuples are.
#[derive(Debug, Default)]
pub struct ReadyView {
    /// Key -> (segment, first position, end position): one lookup per probe.
    keys: DirectMap<(u32, u32, u32)>,
    segments: Vec<Arc<Segment>>,
}

impl ReadyView {
    /// The segment of a ready key and the positions of its tuples there.
    #[inline]
    pub fn lookup(&self, key: u64) -> Option<(&Segment, std::ops::Range<usize>)> {
        self.keys
            .get(key)
            .map(|(s, lo, hi)| (&*self.segments[s as usize], lo as usize..hi as usize))
    }

    pub fn is_ready(&self, key: u64) -> bool {
        self.keys.contains_key(key)
    }

    pub fn segments(&self) -> &[Arc<Segment>] {
        &self.segments
    }
}

#[derive(Debug, Default)]
struct State {
    view: Arc<ReadyView>,
    /// Kept tuples by key, so activating a group touches only its keys' tuples.
    pending: KeyMap<Vec<Tup>>,
    pending_len: usize,
}

/// See the module doc.
#[derive(Debug, Default)]
pub struct HeavyProbe {
    state: Mutex<State>,
    kept: AtomicU64,
}

impl HeavyProbe {
    /// Hands over probe tuples of heavy keys: the ones whose key is ready come back
    /// (with the view to probe them against), the others are kept.
    pub fn offer(&self, tuples: &mut Vec<Tup>) -> (Arc<ReadyView>, Vec<Tup>) {
        let mut st = self.state.lock().expect("heavy probe lock");
        let view = Arc::clone(&st.view);
        let mut ready = Vec::new();
        let mut kept = 0usize;
        for t in tuples.drain(..) {
            if view.is_ready(t.key) {
                ready.push(t);
            } else {
                st.pending.entry(t.key).or_default().push(t);
                kept += 1;
            }
        }
        st.pending_len += kept;
        self.kept.fetch_add(kept as u64, Ordering::Relaxed);
        (view, ready)
    }

    /// Makes `keys` ready with their build tuples `build` (every tuple's key must be
    /// among `keys`; a key without tuples simply matches nothing). Returns the kept
    /// tuples of those keys to probe now, with the new view.
    pub fn activate(&self, keys: &[u64], build: Vec<Tup>) -> (Arc<ReadyView>, Vec<Tup>) {
        let mut st = self.state.lock().expect("heavy probe lock");
        let seg = Arc::new(Segment::new(build));
        let mut segments = st.view.segments.clone();
        let mut map = st.view.keys.clone();
        let s = segments.len() as u32;
        for &k in keys {
            let r = seg.rows(k);
            map.insert(k, (s, r.start as u32, r.end as u32));
        }
        segments.push(seg);
        let view = Arc::new(ReadyView {
            keys: map,
            segments,
        });
        st.view = Arc::clone(&view);
        let mut ready = Vec::new();
        for k in keys {
            if let Some(v) = st.pending.remove(k) {
                ready.extend(v);
            }
        }
        st.pending_len -= ready.len();
        (view, ready)
    }

    /// Tuples still waiting for their build tuples.
    pub fn pending(&self) -> usize {
        self.state.lock().expect("heavy probe lock").pending_len
    }

    /// Probe tuples that had to wait (materialised) so far.
    pub fn kept(&self) -> u64 {
        self.kept.load(Ordering::Relaxed)
    }

    pub fn view(&self) -> Arc<ReadyView> {
        Arc::clone(&self.state.lock().expect("heavy probe lock").view)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(key: u64, payload: u64) -> Tup {
        Tup {
            key,
            payload,
            id: payload,
        }
    }

    #[test]
    fn tuples_wait_for_their_group_and_nothing_is_lost() {
        let h = HeavyProbe::default();
        let (_, ready) = h.offer(&mut vec![t(1, 10), t(2, 20), t(1, 11)]);
        assert!(ready.is_empty());
        assert_eq!(h.pending(), 3);
        let (view, ready) = h.activate(&[1], vec![t(1, 100), t(1, 101)]);
        assert_eq!(ready.len(), 2);
        let (seg, rows) = view.lookup(1).unwrap();
        assert_eq!(rows, 0..2);
        assert_eq!(seg.tuples[1].payload, 101);
        assert!(view.lookup(2).is_none());
        let (_, ready) = h.offer(&mut vec![t(1, 12), t(2, 21)]);
        assert_eq!(ready, vec![t(1, 12)]);
        // Key 2 has no build tuples at all.
        let (view, ready) = h.activate(&[2], vec![]);
        assert_eq!(ready.len(), 2);
        assert!(view.lookup(2).unwrap().1.is_empty());
        assert_eq!(view.lookup(1).unwrap().1, 0..2);
        assert_eq!(h.pending(), 0);
        assert_eq!(h.kept(), 4);
    }
}
