//! A set of CPU numbers (the CPUs running nothing), walked in the order the engine's
//! wake-up placement scans: from just after a CPU round to just before it. Placement
//! then costs the number of idle CPUs, not the number of CPUs.

pub struct CpuSet {
    words: Vec<u64>,
    n: usize,
}

impl CpuSet {
    /// All `n` CPUs in the set.
    pub fn full(n: usize) -> Self {
        let mut s = CpuSet {
            words: vec![0; n.div_ceil(64)],
            n,
        };
        (0..n).for_each(|c| s.insert(c));
        s
    }

    pub fn insert(&mut self, c: usize) {
        self.words[c / 64] |= 1 << (c % 64);
    }

    pub fn remove(&mut self, c: usize) {
        self.words[c / 64] &= !(1 << (c % 64));
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// Members in [from, to), ascending.
    fn range(&self, from: usize, to: usize) -> impl Iterator<Item = usize> + '_ {
        let words = if from < to {
            from / 64..to.div_ceil(64)
        } else {
            0..0
        };
        words.flat_map(move |w| {
            let mut bits = self.words[w];
            std::iter::from_fn(move || {
                let b = bits.trailing_zeros();
                (bits != 0).then(|| {
                    bits &= bits - 1;
                    w * 64 + b as usize
                })
            })
            .filter(move |&c| c >= from && c < to)
        })
    }

    /// Members after `c` round to before it: c+1, …, n−1, 0, …, c−1.
    pub fn after(&self, c: usize) -> impl Iterator<Item = usize> + '_ {
        self.range(c + 1, self.n).chain(self.range(0, c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_come_round_from_just_after_a_cpu() {
        let mut s = CpuSet::full(130);
        for c in 0..130 {
            if ![3, 64, 65, 129].contains(&c) {
                s.remove(c);
            }
        }
        assert_eq!(s.after(64).collect::<Vec<_>>(), vec![65, 129, 3]);
        assert_eq!(s.after(129).collect::<Vec<_>>(), vec![3, 64, 65]);
        assert_eq!(s.after(0).collect::<Vec<_>>(), vec![3, 64, 65, 129]);
        s.remove(65);
        s.remove(65);
        s.insert(3);
        assert_eq!(s.after(3).collect::<Vec<_>>(), vec![64, 129]);
        for c in [3, 64, 129] {
            s.remove(c);
        }
        assert_eq!(s.after(5).count(), 0);
    }
}
