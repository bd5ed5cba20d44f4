//! The pending events, as a radix heap: a discrete-event simulation never schedules an
//! event before the last one it handled, and for keys that only grow a radix heap
//! costs O(1) per push and an amortized O(log of the key range) per pop, against a
//! binary heap's O(log n) cache misses on every operation. With thousands of sleepers
//! pending (a typical host's daemons), that is the difference that shows.
//!
//! Keys are (time, sequence number) packed in a u128, so the order is the same as the
//! engine's (time first, then the order of scheduling), and keys are unique.

/// Bucket b > 0 holds keys whose highest bit differing from `last` is bit b − 1;
/// bucket 0 holds keys equal to `last`.
const BUCKETS: usize = 129;

pub struct Timeline<T> {
    buckets: Vec<Vec<(u128, T)>>,
    /// Bit b set: bucket b is not empty (so the first one is found in a few words).
    full: [u64; 3],
    /// The smallest key of each non-empty bucket, kept as keys arrive, so that the
    /// earliest is known without a scan.
    mins: [u128; BUCKETS],
    /// An emptied bucket's allocation, reused for the next redistribution.
    spare: Vec<(u128, T)>,
    /// The key of the last event taken out; every pending key is at least this.
    last: u128,
    len: usize,
}

fn pack(at: u64, seq: u64) -> u128 {
    (at as u128) << 64 | seq as u128
}

impl<T> Timeline<T> {
    pub fn new() -> Self {
        Timeline {
            buckets: (0..BUCKETS).map(|_| Vec::new()).collect(),
            full: [0; 3],
            mins: [u128::MAX; BUCKETS],
            spare: Vec::new(),
            last: 0,
            len: 0,
        }
    }

    fn bucket(&self, key: u128) -> usize {
        (128 - (key ^ self.last).leading_zeros()) as usize
    }

    /// Schedules `item` at (`at`, `seq`); the key must not precede the last taken out.
    pub fn push(&mut self, at: u64, seq: u64, item: T) {
        let key = pack(at, seq);
        assert!(key >= self.last, "an event scheduled in the past");
        let b = self.bucket(key);
        self.put(b, key, item);
        self.len += 1;
    }

    /// The earliest pending (time, sequence).
    pub fn peek(&self) -> Option<(u64, u64)> {
        if self.len == 0 {
            return None;
        }
        let m = self.mins[self.first_bucket()];
        Some(((m >> 64) as u64, m as u64))
    }

    /// Takes out the earliest pending event.
    pub fn pop(&mut self) -> Option<(u64, T)> {
        if self.len == 0 {
            return None;
        }
        let b = self.first_bucket();
        let key = self.mins[b];
        let at = (key >> 64) as u64;
        if b > 0 && self.buckets[b].len() == 1 {
            // Alone in its bucket: every other key is in a higher bucket and differs from
            // the new `last` at the same bit as from the old, so none has to move.
            let (k, item) = self.buckets[b].pop().expect("one key");
            debug_assert_eq!(k, key);
            self.empty(b);
            self.last = key;
            self.len -= 1;
            return Some((at, item));
        }
        if b > 0 {
            // Every key of the first non-empty bucket moves to a lower one relative to
            // the new `last`; the earliest lands in bucket 0.
            self.last = key;
            let mut moving =
                std::mem::replace(&mut self.buckets[b], std::mem::take(&mut self.spare));
            self.empty(b);
            for (k, item) in moving.drain(..) {
                let to = self.bucket(k);
                self.put(to, k, item);
            }
            self.spare = moving;
        }
        let (k, item) = self.buckets[0]
            .pop()
            .expect("the earliest key is in bucket 0");
        self.empty(0);
        debug_assert_eq!(k, key);
        debug_assert!(self.buckets[0].is_empty(), "keys are unique");
        self.len -= 1;
        Some((at, item))
    }

    fn put(&mut self, b: usize, key: u128, item: T) {
        self.buckets[b].push((key, item));
        self.full[b / 64] |= 1 << (b % 64);
        self.mins[b] = self.mins[b].min(key);
    }

    /// Bucket `b` was emptied.
    fn empty(&mut self, b: usize) {
        self.full[b / 64] &= !(1 << (b % 64));
        self.mins[b] = u128::MAX;
    }

    fn first_bucket(&self) -> usize {
        let w = self.full.iter().position(|&w| w != 0).expect("len > 0");
        w * 64 + self.full[w].trailing_zeros() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    #[test]
    fn gives_events_in_the_order_a_binary_heap_does() {
        let mut t = Timeline::new();
        let mut h = BinaryHeap::new();
        let (mut now, mut seq, mut s) = (0u64, 0u64, 99u64);
        for step in 0..50_000u64 {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = s >> 33;
            if r % 3 != 0 || h.is_empty() {
                // Same-time events, near ones and far ones.
                let at = now + [0, 1, 7, 1000, 1 << 40][(r % 5) as usize] + (r % 13);
                seq += 1;
                t.push(at, seq, step);
                h.push(Reverse((at, seq, step)));
            } else {
                assert_eq!(t.peek(), h.peek().map(|Reverse((a, q, _))| (*a, *q)));
                let Reverse((at, _, item)) = h.pop().expect("non-empty");
                assert_eq!(t.pop(), Some((at, item)));
                now = at;
            }
        }
        while let Some(Reverse((at, _, item))) = h.pop() {
            assert_eq!(t.pop(), Some((at, item)));
        }
        assert_eq!(t.pop(), None);
        assert_eq!(t.peek(), None);
    }
}
