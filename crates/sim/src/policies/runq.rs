//! The fair class's run queues: per queue, its waiting entities ordered by (key,
//! entity). Every entity sits in at most one queue, so one table of keys, queues and
//! heap slots serves all of them. The order of (key, entity) pairs is total, so every
//! query answers exactly what a sorted set would.
//!
//! A queue is a sorted ring buffer while it is short and an indexed binary min-heap
//! while it is long. The fair class takes from the front, and an entity goes back
//! either at the end (a CPU-bound one that used its slice has the largest key) or at
//! the front (a woken one, placed behind the minimum). In a ring both ends cost O(1),
//! with no sift through the levels of a heap, and an insert or removal in the middle
//! shifts the shorter side: cheap for a hundred entities, but 2–4× slower than a heap
//! at a thousand (measured), hence the switch.

use std::collections::VecDeque;

const NOWHERE: u32 = u32::MAX;
/// Children per heap node (4 was measured slower: more comparisons per level).
const D: usize = 2;
/// A ring longer than 256 becomes a heap; a heap shorter than 64 a ring again.
const RING_OR_HEAP: Switch = Switch {
    above: 256,
    below: 64,
};

/// Where a queue changes layout: to the one for long queues past `above` entities, back
/// below `below` (apart, so that a queue near the limit does not convert back and forth).
#[derive(Clone, Copy, Debug)]
pub struct Switch {
    pub above: usize,
    pub below: usize,
}

enum Queue {
    Ring(VecDeque<(i64, u32)>),
    Heap(Vec<(i64, u32)>),
}

pub struct RunQueues {
    queues: Vec<Queue>,
    /// Per entity: its key, its queue (NOWHERE: none), and its slot if that is a heap.
    key: Vec<i64>,
    home: Vec<u32>,
    pos: Vec<u32>,
    switch: Switch,
}

impl RunQueues {
    pub fn new(queues: usize, entities: usize) -> Self {
        Self::with_limits(queues, entities, RING_OR_HEAP)
    }

    fn with_limits(queues: usize, entities: usize, switch: Switch) -> Self {
        RunQueues {
            queues: (0..queues).map(|_| Queue::Ring(VecDeque::new())).collect(),
            key: vec![0; entities],
            home: vec![NOWHERE; entities],
            pos: vec![NOWHERE; entities],
            switch,
        }
    }

    #[cfg(test)]
    pub fn len(&self, q: usize) -> usize {
        match &self.queues[q] {
            Queue::Ring(r) => r.len(),
            Queue::Heap(h) => h.len(),
        }
    }

    /// The common cases (a ring's either end) are inlined into the caller; the rest
    /// are out of line, so that the short path saves and restores few registers.
    #[inline(always)]
    pub fn insert(&mut self, q: usize, key: i64, e: usize) {
        debug_assert_eq!(self.home[e], NOWHERE, "entity {e} is queued twice");
        self.home[e] = q as u32;
        self.key[e] = key;
        let slot = (key, e as u32);
        if let Queue::Ring(ring) = &mut self.queues[q] {
            if ring.len() < self.switch.above {
                match (ring.front(), ring.back()) {
                    (_, None) => return ring.push_back(slot),
                    (_, Some(&last)) if last < slot => return ring.push_back(slot),
                    (Some(&first), _) if slot < first => return ring.push_front(slot),
                    _ => {}
                }
            }
        }
        self.insert_slow(q, slot);
    }

    #[inline(never)]
    fn insert_slow(&mut self, q: usize, slot: (i64, u32)) {
        match &mut self.queues[q] {
            Queue::Ring(ring) => {
                let i = ring.partition_point(|&s| s < slot);
                ring.insert(i, slot);
                if ring.len() > self.switch.above {
                    self.ring_to_heap(q);
                }
            }
            Queue::Heap(heap) => {
                heap.push(slot);
                let i = heap.len() - 1;
                self.pos[slot.1 as usize] = i as u32;
                self.sift_up(q, i);
            }
        }
    }

    #[cfg(test)]
    fn is_heap(&self, q: usize) -> bool {
        matches!(self.queues[q], Queue::Heap(_))
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
        self.home[e] = NOWHERE;
        let slot = (self.key[e], e as u32);
        match &mut self.queues[q] {
            Queue::Ring(ring) => {
                if ring.front() == Some(&slot) {
                    ring.pop_front();
                } else if ring.back() == Some(&slot) {
                    ring.pop_back();
                } else {
                    let i = ring.partition_point(|&s| s < slot);
                    debug_assert_eq!(
                        ring.get(i),
                        Some(&slot),
                        "entity {e} is not where its key says"
                    );
                    ring.remove(i);
                }
            }
            Queue::Heap(heap) => {
                let i = self.pos[e] as usize;
                debug_assert_eq!(heap.get(i), Some(&slot));
                self.pos[e] = NOWHERE;
                let last = heap.pop().expect("not empty: e is in it");
                if i < heap.len() {
                    heap[i] = last;
                    self.pos[last.1 as usize] = i as u32;
                    // The moved slot may belong above or below.
                    if i > 0 && last < heap[(i - 1) / D] {
                        self.sift_up(q, i);
                    } else {
                        self.sift_down(q, i);
                    }
                }
                if self.heap_len(q) < self.switch.below {
                    self.heap_to_ring(q);
                }
            }
        }
    }

    /// Takes out the smallest (key, entity). Unlike `remove`, it reads nothing of the
    /// entity's own (its key and queue are known from the slot), so the pick of a task
    /// whose data is not in cache does not wait for it.
    #[inline(always)]
    pub fn pop_first(&mut self, q: usize) -> Option<(i64, usize)> {
        let (k, e) = match &mut self.queues[q] {
            Queue::Ring(r) => r.pop_front()?,
            Queue::Heap(_) => self.heap_pop_first(q)?,
        };
        self.home[e as usize] = NOWHERE;
        Some((k, e as usize))
    }

    #[inline(never)]
    fn heap_pop_first(&mut self, q: usize) -> Option<(i64, u32)> {
        let Queue::Heap(h) = &mut self.queues[q] else {
            unreachable!("called on heaps")
        };
        let first = *h.first()?;
        let last = h.pop().expect("not empty");
        if !h.is_empty() {
            h[0] = last;
            self.pos[last.1 as usize] = 0;
            self.sift_down(q, 0);
        }
        self.pos[first.1 as usize] = NOWHERE;
        if self.heap_len(q) < self.switch.below {
            self.heap_to_ring(q);
        }
        Some(first)
    }

    /// The smallest (key, entity).
    #[inline(always)]
    pub fn first(&self, q: usize) -> Option<(i64, usize)> {
        match &self.queues[q] {
            Queue::Ring(r) => r.front(),
            Queue::Heap(h) => h.first(),
        }
        .map(|&(k, e)| (k, e as usize))
    }

    /// The largest (key, entity); in a heap always a leaf, so only the leaves are read.
    pub fn last(&self, q: usize) -> Option<(i64, usize)> {
        match &self.queues[q] {
            Queue::Ring(r) => r.back().copied(),
            Queue::Heap(h) => {
                let n = h.len();
                let first_leaf = n.saturating_sub(2) / D + usize::from(n >= 2);
                h[first_leaf..].iter().max().copied()
            }
        }
        .map(|(k, e)| (k, e as usize))
    }

    /// The entities of queue `q`, in no particular order.
    pub fn entities(&self, q: usize) -> impl Iterator<Item = usize> + '_ {
        let (ring, heap) = match &self.queues[q] {
            Queue::Ring(r) => (Some(r), None),
            Queue::Heap(h) => (None, Some(h)),
        };
        ring.into_iter()
            .flatten()
            .chain(heap.into_iter().flatten())
            .map(|&(_, e)| e as usize)
    }

    fn heap_len(&self, q: usize) -> usize {
        match &self.queues[q] {
            Queue::Heap(h) => h.len(),
            Queue::Ring(_) => unreachable!("called on heaps"),
        }
    }

    /// A sorted array is already a min-heap: only the slots need recording.
    fn ring_to_heap(&mut self, q: usize) {
        let Queue::Ring(ring) = &mut self.queues[q] else {
            unreachable!("called on rings")
        };
        let heap = Vec::from(std::mem::take(ring));
        for (i, &(_, e)) in heap.iter().enumerate() {
            self.pos[e as usize] = i as u32;
        }
        self.queues[q] = Queue::Heap(heap);
    }

    fn heap_to_ring(&mut self, q: usize) {
        let Queue::Heap(heap) = &mut self.queues[q] else {
            unreachable!("called on heaps")
        };
        let mut slots = std::mem::take(heap);
        slots.sort_unstable();
        for &(_, e) in &slots {
            self.pos[e as usize] = NOWHERE;
        }
        self.queues[q] = Queue::Ring(VecDeque::from(slots));
    }

    fn heap_mut(&mut self, q: usize) -> (&mut Vec<(i64, u32)>, &mut Vec<u32>) {
        match &mut self.queues[q] {
            Queue::Heap(h) => (h, &mut self.pos),
            Queue::Ring(_) => unreachable!("called on heaps"),
        }
    }

    fn sift_up(&mut self, q: usize, mut i: usize) {
        let (heap, pos) = self.heap_mut(q);
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
        let (heap, pos) = self.heap_mut(q);
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

/// A small deterministic generator for the queues' tests, so they need no RNG crate
/// setup.
#[cfg(test)]
pub(super) fn lcg(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn answers_every_query_as_a_sorted_set_does() {
        // Rings only, heaps only (past their first few entities), and queues that
        // keep switching between the two.
        assert_eq!(check_against_sorted_sets(usize::MAX, 0), 0);
        assert_eq!(
            check_against_sorted_sets(4, 0),
            3,
            "each queue becomes a heap once"
        );
        let switches = check_against_sorted_sets(52, 48);
        assert!(switches > 20, "{switches} switches");
    }

    /// Random inserts, removals and takes of the first, every query compared; returns how many times a
    /// queue switched between ring and heap.
    fn check_against_sorted_sets(heap_above: usize, ring_below: usize) -> usize {
        const N: usize = 300;
        let switch = Switch {
            above: heap_above,
            below: ring_below,
        };
        let mut rq = RunQueues::with_limits(3, N, switch);
        let mut sets = vec![BTreeSet::new(); 3];
        let mut keys = vec![None; N];
        let mut s = 7;
        let mut switches = 0;
        for step in 0..20_000 {
            let kinds: Vec<bool> = (0..3).map(|q| rq.is_heap(q)).collect();
            let e = (lcg(&mut s) as usize) % N;
            if step % 7 == 0 {
                // Taking out a queue's first, as a pick does.
                let q = (lcg(&mut s) % 3) as usize;
                let got = rq.pop_first(q);
                assert_eq!(got, sets[q].pop_first(), "step {step}");
                if let Some((_, f)) = got {
                    keys[f] = None;
                    assert_eq!(rq.queue_of(f), None);
                }
                continue;
            }
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
                switches += usize::from(rq.is_heap(q) != kinds[q]);
            }
        }
        switches
    }
}
