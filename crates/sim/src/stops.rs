//! When each CPU's running task next stops (slice or segment end), kept out of the event
//! heap: a CPU has at most one pending stop, and a preemption replaces it. A tournament
//! tree over the CPUs gives the earliest in O(1) and updates in O(log CPUs), and a
//! replaced stop simply disappears instead of lingering in the heap as a stale event.

/// (time, sequence number): the same order the event heap uses.
pub type Key = (u64, u64);
const NONE: Key = (u64::MAX, u64::MAX);

pub struct Stops {
    /// Node i holds the smallest (key, CPU) under it; leaf `base + c` is CPU c's stop.
    /// Keys sit in the nodes themselves so an update reads no other array.
    tree: Vec<(Key, u32)>,
    base: usize,
}

impl Stops {
    pub fn new(cpus: usize) -> Self {
        let base = cpus.next_power_of_two();
        let mut tree = vec![(NONE, 0); 2 * base];
        for (c, leaf) in tree[base..].iter_mut().enumerate() {
            leaf.1 = c as u32;
        }
        for i in (1..base).rev() {
            tree[i] = tree[2 * i];
        }
        Stops { tree, base }
    }

    /// Sets (or replaces) `cpu`'s stop.
    pub fn set(&mut self, cpu: usize, key: Key) {
        let mut i = self.base + cpu;
        self.tree[i].0 = key;
        while i > 1 {
            // Pending keys are unique (sequence numbers); only empty ones tie.
            let (mine, sibling) = (self.tree[i], self.tree[i ^ 1]);
            let win = if mine.0 <= sibling.0 { mine } else { sibling };
            i /= 2;
            if self.tree[i] == win {
                break; // nothing above changes
            }
            self.tree[i] = win;
        }
    }

    /// `cpu` has no stop pending (it stopped running).
    pub fn clear(&mut self, cpu: usize) {
        self.set(cpu, NONE);
    }

    pub fn get(&self, cpu: usize) -> Key {
        self.tree[self.base + cpu].0
    }

    /// The earliest pending stop: (key, cpu).
    pub fn first(&self) -> Option<(Key, usize)> {
        let (key, cpu) = self.tree[1];
        (key != NONE).then_some((key, cpu as usize))
    }
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
