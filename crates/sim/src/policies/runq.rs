//! The fair class's run queues: per queue, its waiting entities ordered by (key,
//! entity), kept as an indexed binary min-heap. Every entity sits in at most one queue,
//! so one table of positions (queue and heap slot) serves all of them.
//!
//! Why a heap and not a search tree: a CPU-bound entity that used its slice goes back
//! with the largest key, which a heap appends in O(1), and the first is always at the
//! root; a B-tree pays a search and node shifts for both. The order of (key, entity)
//! pairs is total, so every query answers exactly what a sorted set would.
//!
//! Each queue also keeps one slot in front of its heap for an entity that joined with
//! a key below all others: a woken task usually does, and usually runs next, so it
//! comes and goes without climbing to the root and being sifted out again.

const NOWHERE: u32 = u32::MAX;
/// `pos` of the entity in its queue's front slot.
const FRONT: u32 = u32::MAX - 1;
/// Children per heap node (4 was measured slower: more comparisons per level).
const D: usize = 2;

pub struct RunQueues {
    heaps: Vec<Vec<(i64, u32)>>,
    /// Per queue: an entity ordered before every one in its heap, if any.
    fronts: Vec<Option<(i64, u32)>>,
    /// Per entity: its index in its queue's heap (or FRONT), and its queue (NOWHERE:
    /// none).
    pos: Vec<u32>,
    home: Vec<u32>,
}

impl RunQueues {
    pub fn new(queues: usize, entities: usize) -> Self {
        RunQueues {
            heaps: vec![Vec::new(); queues],
            fronts: vec![None; queues],
            pos: vec![NOWHERE; entities],
            home: vec![NOWHERE; entities],
        }
    }

    #[cfg(test)]
    pub fn len(&self, q: usize) -> usize {
        self.heaps[q].len() + usize::from(self.fronts[q].is_some())
    }

    pub fn insert(&mut self, q: usize, key: i64, e: usize) {
        debug_assert_eq!(self.home[e], NOWHERE, "entity {e} is queued twice");
        self.home[e] = q as u32;
        let slot = (key, e as u32);
        let heap_first = self.heaps[q].first().copied();
        let slot = match self.fronts[q] {
            None if heap_first.is_none_or(|h| slot < h) => {
                self.fronts[q] = Some(slot);
                self.pos[e] = FRONT;
                return;
            }
            // The new first takes the front; the old one goes to the heap's root.
            Some(front) if slot < front => {
                self.fronts[q] = Some(slot);
                self.pos[e] = FRONT;
                front
            }
            _ => slot,
        };
        let e = slot.1 as usize;
        let heap = &mut self.heaps[q];
        heap.push(slot);
        let i = heap.len() - 1;
        self.pos[e] = i as u32;
        self.sift_up(q, i);
    }

    /// The queue `e` waits in.
    #[cfg(test)]
    pub fn queue_of(&self, e: usize) -> Option<usize> {
        let q = self.home[e];
        (q != NOWHERE).then_some(q as usize)
    }

    /// Takes `e` out of its queue; it must be in one.
    pub fn remove(&mut self, e: usize) {
        let q = self.home[e] as usize;
        let i = self.pos[e] as usize;
        if self.pos[e] == FRONT {
            self.fronts[q] = None;
            self.pos[e] = NOWHERE;
            self.home[e] = NOWHERE;
            return;
        }
        debug_assert!(self.heaps[q].get(i).is_some_and(|s| s.1 as usize == e));
        self.pos[e] = NOWHERE;
        self.home[e] = NOWHERE;
        let heap = &mut self.heaps[q];
        let last = heap.pop().expect("not empty: e is in it");
        if i == heap.len() {
            return; // it was the last slot
        }
        heap[i] = last;
        self.pos[last.1 as usize] = i as u32;
        // The moved slot may belong above or below.
        if i > 0 && last < self.heaps[q][(i - 1) / D] {
            self.sift_up(q, i);
        } else {
            self.sift_down(q, i);
        }
    }

    /// The smallest (key, entity).
    pub fn first(&self, q: usize) -> Option<(i64, usize)> {
        self.fronts[q]
            .or_else(|| self.heaps[q].first().copied())
            .map(|(k, e)| (k, e as usize))
    }

    /// The largest (key, entity): always a leaf, so only the leaves are read.
    pub fn last(&self, q: usize) -> Option<(i64, usize)> {
        let heap = &self.heaps[q];
        let n = heap.len();
        let first_leaf = n.saturating_sub(2) / D + usize::from(n >= 2);
        heap[first_leaf..]
            .iter()
            .max()
            .copied()
            .or(self.fronts[q])
            .map(|(k, e)| (k, e as usize))
    }

    /// The entities of queue `q`, in no particular order.
    pub fn entities(&self, q: usize) -> impl Iterator<Item = usize> + '_ {
        self.fronts[q]
            .iter()
            .chain(&self.heaps[q])
            .map(|&(_, e)| e as usize)
    }

    fn sift_up(&mut self, q: usize, mut i: usize) {
        let (heap, pos) = (&mut self.heaps[q], &mut self.pos);
        let item = heap[i];
        while i > 0 {
            let parent = (i - 1) / D;
            if heap[parent] <= item {
                break;
            }
            let moved = heap[parent];
            put(heap, pos, i, moved);
            i = parent;
        }
        put(heap, pos, i, item);
    }

    fn sift_down(&mut self, q: usize, mut i: usize) {
        let (heap, pos) = (&mut self.heaps[q], &mut self.pos);
        let n = heap.len();
        let item = heap[i];
        loop {
            let first = D * i + 1;
            if first >= n {
                break;
            }
            let mut child = first;
            for c in first + 1..(first + D).min(n) {
                if heap[c] < heap[child] {
                    child = c;
                }
            }
            if item <= heap[child] {
                break;
            }
            let moved = heap[child];
            put(heap, pos, i, moved);
            i = child;
        }
        put(heap, pos, i, item);
    }
}

/// Writes `slot` at heap index `i` and records where its entity now is.
fn put(heap: &mut [(i64, u32)], pos: &mut [u32], i: usize, slot: (i64, u32)) {
    heap[i] = slot;
    pos[slot.1 as usize] = i as u32;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// A small deterministic generator, so the test needs no RNG crate setup.
    fn lcg(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *state >> 33
    }

    #[test]
    fn answers_every_query_as_a_sorted_set_does() {
        const N: usize = 300;
        let mut rq = RunQueues::new(3, N);
        let mut sets = vec![BTreeSet::new(); 3];
        let mut keys = vec![None; N];
        let mut s = 7;
        for step in 0..20_000 {
            let e = (lcg(&mut s) as usize) % N;
            match keys[e] {
                Some((q, k)) => {
                    assert_eq!(rq.queue_of(e), Some(q));
                    rq.remove(e);
                    assert!(sets[q].remove(&(k, e)));
                    keys[e] = None;
                    assert_eq!(rq.queue_of(e), None);
                }
                None => {
                    let q = (lcg(&mut s) % 3) as usize;
                    // Few distinct keys, so ties between entities are common.
                    let k = (lcg(&mut s) % 50) as i64 - 25;
                    rq.insert(q, k, e);
                    sets[q].insert((k, e));
                    keys[e] = Some((q, k));
                }
            }
            for (q, set) in sets.iter().enumerate() {
                assert_eq!(rq.len(q), set.len());
                assert_eq!(rq.first(q), set.first().copied(), "step {step}");
                assert_eq!(rq.last(q), set.last().copied(), "step {step}");
                let mut all: Vec<usize> = rq.entities(q).collect();
                all.sort_unstable();
                let mut want: Vec<usize> = set.iter().map(|&(_, e)| e).collect();
                want.sort_unstable();
                assert_eq!(all, want);
            }
        }
    }
}
