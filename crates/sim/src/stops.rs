//! When each CPU's running task next stops (slice or segment end), kept out of the event
//! heap: a CPU has at most one pending stop, and a preemption replaces it. A tournament
//! tree over the CPUs gives the earliest in O(1) and updates in O(log CPUs), and a
//! replaced stop simply disappears instead of lingering in the heap as a stale event.

/// (time, sequence number): the same order the event heap uses.
pub type Key = (u64, u64);

/// A node: time · 2⁶⁴ + sequence · 2¹⁶ + CPU. Sequence numbers are unique, so one
/// unsigned comparison orders nodes as their keys do, and the winner carries its CPU.
/// An update costs 124 instructions for 64 CPUs, where (key, CPU) pairs with early exits
/// cost 197 (`make sim-instructions`, docs/RESULTS.md).
type Node = u128;
const NONE: Node = u128::MAX;
const CPU_BITS: u32 = 16;
/// Room for 2⁴⁸ events: close to a year at ten million a second.
const MAX_SEQ: u64 = 1 << (64 - CPU_BITS);

pub struct Stops {
    /// Node i holds the earliest of the nodes under it; leaf `base + c` is CPU c's stop.
    tree: Vec<Node>,
    base: usize,
}

impl Stops {
    pub fn new(cpus: usize) -> Self {
        assert!(cpus <= 1 << CPU_BITS, "at most 65,536 CPUs");
        let base = cpus.next_power_of_two();
        Stops {
            tree: vec![NONE; 2 * base],
            base,
        }
    }

    /// Sets (or replaces) `cpu`'s stop.
    pub fn set(&mut self, cpu: usize, (time, seq): Key) {
        assert!(seq < MAX_SEQ, "more than 2^48 events");
        self.put(
            cpu,
            (time as u128) << 64 | (seq as u128) << CPU_BITS | cpu as u128,
        );
    }

    /// Replays the matches from the leaf to the root, with no early exit: the CPU that
    /// just stopped held the earliest stop, so its new one is compared all the way up.
    /// Indices are masked by the tree's size so that no access needs a bounds check.
    fn put(&mut self, cpu: usize, node: Node) {
        let mask = 2 * self.base - 1;
        let tree = &mut self.tree[..=mask];
        let mut i = (self.base + cpu) & mask;
        tree[i] = node;
        let mut best = node;
        while i > 1 {
            best = best.min(tree[(i ^ 1) & mask]);
            i /= 2;
            tree[i & mask] = best;
        }
    }

    /// `cpu` has no stop pending (it stopped running).
    pub fn clear(&mut self, cpu: usize) {
        self.put(cpu, NONE);
    }

    pub fn get(&self, cpu: usize) -> Key {
        unpack(self.tree[self.base + cpu])
    }

    /// The earliest pending stop: (key, cpu). With one CPU, the root is its leaf.
    pub fn first(&self) -> Option<(Key, usize)> {
        let node = self.tree[1];
        (node != NONE).then(|| (unpack(node), (node as u64 & ((1 << CPU_BITS) - 1)) as usize))
    }
}

fn unpack(node: Node) -> Key {
    if node == NONE {
        return (u64::MAX, u64::MAX);
    }
    ((node >> 64) as u64, (node as u64) >> CPU_BITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_stop_wins_and_a_replaced_or_cleared_stop_is_gone() {
        let mut s = Stops::new(5);
        assert_eq!(s.first(), None);
        s.set(3, (50, 1));
        s.set(1, (20, 2));
        s.set(4, (20, 3));
        assert_eq!(
            s.first(),
            Some(((20, 2), 1)),
            "ties go to the lower sequence"
        );
        s.set(1, (70, 4));
        assert_eq!(s.first(), Some(((20, 3), 4)));
        s.clear(4);
        assert_eq!(s.first(), Some(((50, 1), 3)));
        s.clear(3);
        s.clear(1);
        assert_eq!(s.first(), None);
    }

    #[test]
    fn the_first_stop_is_always_the_earliest_of_all_cpus() {
        for cpus in [1, 2, 3, 5, 8, 64, 100] {
            let mut s = Stops::new(cpus);
            let mut stops: Vec<Option<Key>> = vec![None; cpus];
            let mut x: u64 = 12345;
            for seq in 1..5_000u64 {
                // A small LCG: times collide often, so the sequence must break ties.
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let cpu = (x >> 33) as usize % cpus;
                if (x >> 20) % 5 == 0 {
                    s.clear(cpu);
                    stops[cpu] = None;
                } else {
                    let key = ((x >> 40) % 50, seq);
                    s.set(cpu, key);
                    stops[cpu] = Some(key);
                }
                let expected = stops
                    .iter()
                    .enumerate()
                    .filter_map(|(c, k)| k.map(|k| (k, c)))
                    .min();
                assert_eq!(s.first(), expected, "{cpus} cpus, step {seq}");
                assert_eq!(s.get(cpu), stops[cpu].unwrap_or((u64::MAX, u64::MAX)));
            }
        }
    }

    #[test]
    fn one_cpu_works() {
        let mut s = Stops::new(1);
        s.set(0, (7, 1));
        assert_eq!(s.first(), Some(((7, 1), 0)));
        s.clear(0);
        assert_eq!(s.first(), None);
    }
}
