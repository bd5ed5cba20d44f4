//! When each CPU's running task next stops (slice or segment end), kept out of the event
//! heap: a CPU has at most one pending stop, and a preemption replaces it. A tournament
//! tree over the CPUs gives the earliest in O(1) and updates in O(log CPUs), and a
//! replaced stop simply disappears instead of lingering in the heap as a stale event.

/// (time, sequence number): the same order the event heap uses.
pub type Key = (u64, u64);

/// A node: time · 2⁶⁴ + sequence · 2¹⁶ + CPU. Sequence numbers are unique, so one
/// unsigned comparison orders nodes as their keys do, and the winner carries its CPU
/// ((key, CPU) pairs with early exits cost more: docs/RESULTS.md, session 10). Kept as
/// its two 64-bit halves, high first, so that `put` can choose each with a conditional
/// move.
type Node = [u64; 2];
const NONE: Node = [u64::MAX; 2];
const CPU_BITS: u32 = 16;
/// Room for 2⁴⁸ events: close to a year at ten million a second.
const MAX_SEQ: u64 = 1 << (64 - CPU_BITS);

pub struct Stops {
    /// Node i holds the earliest of the nodes under it; leaf `base + c` is CPU c's stop.
    tree: Vec<Node>,
    base: usize,
    /// log2(base): the matches a leaf plays on its way to the root.
    levels: u32,
}

impl Stops {
    pub fn new(cpus: usize) -> Self {
        assert!(cpus <= 1 << CPU_BITS, "at most 65,536 CPUs");
        let base = cpus.next_power_of_two();
        Stops {
            tree: vec![NONE; 2 * base],
            base,
            levels: base.trailing_zeros(),
        }
    }

    /// Sets (or replaces) `cpu`'s stop.
    pub fn set(&mut self, cpu: usize, (time, seq): Key) {
        assert!(seq < MAX_SEQ, "more than 2^48 events");
        self.put(cpu, [time, seq << CPU_BITS | cpu as u64]);
    }

    /// Replays the matches from the leaf to the root, with no early exit: the CPU that
    /// just stopped held the earliest stop, so its new one is compared all the way up.
    ///
    /// Which of two nodes wins is a coin toss, so each match must be a conditional move,
    /// not a branch: as branches they were mispredicted often enough to cost a tenth of
    /// the typical host's time (docs/RESULTS.md, session 15). In a loop, x86 code
    /// generation turns those moves into branches whatever the source says, so the
    /// matches are unrolled for each tree height, out of line (inlined, the event loop
    /// would be the loop).
    #[inline(never)]
    fn put(&mut self, cpu: usize, node: Node) {
        match self.levels {
            0 => self.replay::<0>(cpu, node),
            1 => self.replay::<1>(cpu, node),
            2 => self.replay::<2>(cpu, node),
            3 => self.replay::<3>(cpu, node),
            4 => self.replay::<4>(cpu, node),
            5 => self.replay::<5>(cpu, node),
            6 => self.replay::<6>(cpu, node),
            7 => self.replay::<7>(cpu, node),
            8 => self.replay::<8>(cpu, node),
            9 => self.replay::<9>(cpu, node),
            10 => self.replay::<10>(cpu, node),
            11 => self.replay::<11>(cpu, node),
            12 => self.replay::<12>(cpu, node),
            13 => self.replay::<13>(cpu, node),
            14 => self.replay::<14>(cpu, node),
            15 => self.replay::<15>(cpu, node),
            _ => self.replay::<16>(cpu, node), // CPU_BITS: no more than 2^16 CPUs
        }
    }

    /// `put` for a tree of height `LEVELS`. Indices are masked by the tree's size so
    /// that no access needs a bounds check.
    #[inline(always)]
    fn replay<const LEVELS: u32>(&mut self, cpu: usize, node: Node) {
        let mask = 2 * self.base - 1;
        let tree = &mut self.tree[..=mask];
        let mut i = (self.base + cpu) & mask;
        tree[i] = node;
        let [mut hi, mut lo] = node;
        for _ in 0..LEVELS {
            // Each half apart, as 64-bit conditional moves (in the loop, a 128-bit
            // `min` was a branch in every form tried). `select_unpredictable` would say
            // so, but needs Rust 1.88, and unrolled the plain `if` compiles the same.
            let [oh, ol] = tree[(i ^ 1) & mask];
            let take = wide([oh, ol]) < wide([hi, lo]);
            hi = if take { oh } else { hi };
            lo = if take { ol } else { lo };
            i /= 2;
            tree[i & mask] = [hi, lo];
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
        (node != NONE).then(|| (unpack(node), (node[1] & ((1 << CPU_BITS) - 1)) as usize))
    }
}

/// The node as the one number that orders it.
fn wide([hi, lo]: Node) -> u128 {
    (hi as u128) << 64 | lo as u128
}

fn unpack(node: Node) -> Key {
    if node == NONE {
        return (u64::MAX, u64::MAX);
    }
    (node[0], node[1] >> CPU_BITS)
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
    fn the_tallest_tree_finds_the_earliest_stop() {
        let cpus = 1 << CPU_BITS;
        let mut s = Stops::new(cpus);
        for (seq, cpu) in [cpus - 1, 0, cpus / 2 + 1].into_iter().enumerate() {
            s.set(cpu, (100 - seq as u64, seq as u64));
        }
        assert_eq!(s.first(), Some(((98, 2), cpus / 2 + 1)));
        s.clear(cpus / 2 + 1);
        assert_eq!(s.first(), Some(((99, 1), 0)));
        s.clear(0);
        assert_eq!(s.first(), Some(((100, 0), cpus - 1)));
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
