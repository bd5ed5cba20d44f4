//! EEVDF's run queues: per queue, its waiting entities, of which a pick wants the
//! eligible one (vruntime at most the load-weighted average) with the earliest deadline,
//! ties to the lower entity. Two layouts, by length:
//! - A short queue (the usual: a few tasks per CPU) is an unordered array of (deadline,
//!   vruntime, entity), and a pick reads all of it without a branch: each entry becomes
//!   one number ordered as (ineligible, deadline, entity), and the least wins. Which
//!   entity wins is a coin toss to the branch predictor, and its misses, not the
//!   instructions, set the speed of short queues (docs/RESULTS.md, session 15).
//! - A long queue is two ordered queues ([`RunQueues`]): the eligible entities by
//!   deadline and the others by vruntime. A pick moves the entities the average has
//!   passed from the second to the first, then takes the first's front, which is nearly
//!   always still eligible. The kernel finds the same entity in one deadline tree that
//!   knows the least vruntime under each node.
//!
//! A queued entity's deadline and vruntime do not change (only the current entity
//! runs), so the copies in a short queue stay true.

use super::runq::{RunQueues, Switch};

const NOWHERE: u32 = u32::MAX;
/// A short queue longer than 12 becomes long; a long one shorter than 6 short again.
const SHORT_OR_LONG: Switch = Switch {
    above: 12,
    below: 6,
};

/// What eligibility on a run queue depends on: its load and Σ w·v over its entities.
#[derive(Clone, Copy, Debug)]
pub struct Avg {
    pub load: u64,
    pub sum_wv: i128,
}

impl Avg {
    /// Whether vruntime `v` is eligible: v · load ≤ Σ w·v (any, on an empty queue).
    pub fn eligible(&self, v: i64) -> bool {
        self.load == 0 || (v as i128) * (self.load as i128) <= self.sum_wv
    }

    /// The largest eligible vruntime: v · load ≤ Σ w·v exactly when v ≤ ⌊Σ w·v / load⌋.
    pub fn last_eligible(&self) -> i64 {
        if self.load == 0 {
            return i64::MAX;
        }
        // Euclidean division by a positive divisor rounds down; in 64 bits when the sum
        // fits (always, for times below days): a 128-bit division is a library call.
        match i64::try_from(self.sum_wv) {
            Ok(sum) => sum.div_euclid(self.load as i64),
            Err(_) => {
                let q = self.sum_wv.div_euclid(self.load as i128);
                q.clamp(i64::MIN as i128, i64::MAX as i128) as i64
            }
        }
    }
}

/// An entity's deadline and vruntime, as the fair class keeps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keys {
    pub deadline: i64,
    pub v: i64,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    deadline: i64,
    v: i64,
    e: u32,
}

/// One run queue's layout and length.
#[derive(Clone, Debug, Default)]
struct Queue {
    /// Its entities while it is short (else empty).
    short: Vec<Slot>,
    /// While it is long: how many entities it holds.
    long_len: u32,
    long: bool,
}

pub struct EevdfQueues {
    queue: Vec<Queue>,
    /// Long queue q: eligible entities in queue q, the others in queue `queues + q`.
    ordered: RunQueues,
    queues: usize,
    /// Per entity: its index in its short queue (NOWHERE: in none).
    index: Vec<u32>,
    /// Short queues (a sorted list) become long ones (ordered in `ordered`) and back.
    switch: Switch,
}

impl EevdfQueues {
    pub fn new(queues: usize, entities: usize) -> Self {
        Self::with_limits(queues, entities, SHORT_OR_LONG)
    }

    fn with_limits(queues: usize, entities: usize, switch: Switch) -> Self {
        EevdfQueues {
            queue: vec![Queue::default(); queues],
            ordered: RunQueues::new(2 * queues, entities),
            queues,
            index: vec![NOWHERE; entities],
            switch,
        }
    }

    #[cfg(test)]
    fn len(&self, q: usize) -> usize {
        let queue = &self.queue[q];
        match queue.long {
            true => queue.long_len as usize,
            false => queue.short.len(),
        }
    }

    /// Queues `e` on `q`. `avg` (`q`'s, with or without `e`) only sorts a long queue's
    /// entities between its two ordered queues, where a pick corrects any that the
    /// average has since passed.
    #[inline(always)]
    pub fn insert(&mut self, q: usize, e: usize, k: Keys, avg: Avg) {
        let queue = &mut self.queue[q];
        if queue.long {
            queue.long_len += 1;
            return self.insert_ordered(q, e, k, avg);
        }
        debug_assert_eq!(self.index[e], NOWHERE, "entity {e} is queued twice");
        self.index[e] = queue.short.len() as u32;
        queue.short.push(Slot {
            deadline: k.deadline,
            v: k.v,
            e: e as u32,
        });
        if queue.short.len() > self.switch.above {
            self.lengthen(q, avg);
        }
    }

    #[inline(always)]
    fn insert_ordered(&mut self, q: usize, e: usize, k: Keys, avg: Avg) {
        if avg.eligible(k.v) {
            self.ordered.insert(q, k.deadline, e);
        } else {
            self.ordered.insert(self.queues + q, k.v, e);
        }
    }

    #[inline(never)]
    fn lengthen(&mut self, q: usize, avg: Avg) {
        let queue = &mut self.queue[q];
        queue.long = true;
        queue.long_len = queue.short.len() as u32;
        for s in std::mem::take(&mut self.queue[q].short) {
            self.index[s.e as usize] = NOWHERE;
            let k = Keys {
                deadline: s.deadline,
                v: s.v,
            };
            self.insert_ordered(q, s.e as usize, k, avg);
        }
    }

    /// Takes `e` out of queue `q`, where it must be; `keys` gives any queued entity's
    /// keys (read only if the queue turns short).
    #[inline(always)]
    pub fn remove(&mut self, q: usize, e: usize, keys: impl Fn(usize) -> Keys) {
        let queue = &mut self.queue[q];
        if queue.long {
            queue.long_len -= 1;
            let len = queue.long_len as usize;
            // Nearly always a pick's choice, the first by deadline: taken by position.
            if self.ordered.first(q).is_some_and(|(_, f)| f == e) {
                self.ordered.pop_first(q);
            } else {
                self.ordered.remove(e);
            }
            if len < self.switch.below {
                self.shorten(q, keys);
            }
            return;
        }
        let i = self.index[e] as usize;
        debug_assert_eq!(queue.short.get(i).map(|s| s.e as usize), Some(e));
        self.index[e] = NOWHERE;
        queue.short.swap_remove(i);
        if let Some(moved) = queue.short.get(i) {
            self.index[moved.e as usize] = i as u32;
        }
    }

    #[inline(never)]
    fn shorten(&mut self, q: usize, keys: impl Fn(usize) -> Keys) {
        self.queue[q].long = false;
        let mut short = std::mem::take(&mut self.queue[q].short);
        for from in [q, self.queues + q] {
            while let Some((_, e)) = self.ordered.pop_first(from) {
                let k = keys(e);
                self.index[e] = short.len() as u32;
                short.push(Slot {
                    deadline: k.deadline,
                    v: k.v,
                    e: e as u32,
                });
            }
        }
        self.queue[q].short = short;
    }

    /// The eligible entity with the earliest deadline, left in place; None if none is
    /// eligible. `keys` as for `remove` (a long queue reads the deadline of each entity
    /// it moves).
    #[inline(always)]
    pub fn first_eligible(
        &mut self,
        q: usize,
        avg: Avg,
        keys: impl Fn(usize) -> Keys,
    ) -> Option<usize> {
        let queue = &self.queue[q];
        if queue.long {
            return self.first_eligible_ordered(q, avg, keys);
        }
        let last = avg.last_eligible();
        // (ineligible, deadline, entity) in one unsigned number: the deadline's sign
        // bit flipped so that it orders as unsigned, above the entity's 32 bits.
        let mut best = u128::MAX;
        for s in &queue.short {
            let key = ((s.v > last) as u128) << 127
                | ((s.deadline as u64 ^ 1 << 63) as u128) << 32
                | s.e as u128;
            best = best.min(key);
        }
        (best >> 127 == 0).then_some(best as u32 as usize)
    }

    #[inline(always)]
    fn first_eligible_ordered(
        &mut self,
        q: usize,
        avg: Avg,
        keys: impl Fn(usize) -> Keys,
    ) -> Option<usize> {
        let ineligible = self.queues + q;
        // The lowest vruntimes first: once one is not eligible, none after it is. Its
        // key is its vruntime, so the entity is read only when it moves.
        while let Some((v, e)) = self.ordered.first(ineligible) {
            if !avg.eligible(v) {
                break;
            }
            self.ordered.pop_first(ineligible);
            self.ordered.insert(q, keys(e).deadline, e);
        }
        while let Some((_, e)) = self.ordered.first(q) {
            if avg.eligible(keys(e).v) {
                return Some(e);
            }
            self.ordered.pop_first(q);
            self.ordered.insert(ineligible, keys(e).v, e);
        }
        None
    }

    /// In a long queue, the entity the next pick most likely returns: the front of the
    /// eligible ones as the last pick left them (for a prefetch; a short queue's pick
    /// reads no entity). None for a short queue.
    #[inline(always)]
    pub fn likely_first(&self, q: usize) -> Option<usize> {
        match self.queue[q].long {
            true => self.ordered.first(q).map(|(_, e)| e),
            false => None,
        }
    }

    /// The entity with the earliest deadline, eligible or not.
    pub fn earliest(&self, q: usize, keys: impl Fn(usize) -> Keys) -> Option<usize> {
        self.entities(q).min_by_key(|&e| (keys(e).deadline, e))
    }

    /// The entity furthest ahead: the ineligible one with the latest vruntime, else the
    /// one with the latest deadline. A long queue answers from the far ends of its two
    /// ordered queues as its last pick left them, so an entity the average has passed
    /// since may count on the wrong side (the balancer's choice, never a pick's).
    pub fn latest(&self, q: usize, avg: Avg) -> Option<usize> {
        if self.queue[q].long {
            return self
                .ordered
                .last(self.queues + q)
                .or_else(|| self.ordered.last(q))
                .map(|(_, e)| e);
        }
        let short = &self.queue[q].short;
        let ineligible = short.iter().filter(|s| !avg.eligible(s.v));
        ineligible
            .map(|s| (s.v, s.e))
            .max()
            .or_else(|| short.iter().map(|s| (s.deadline, s.e)).max())
            .map(|(_, e)| e as usize)
    }

    /// The entities of queue `q`, in no particular order.
    pub fn entities(&self, q: usize) -> impl Iterator<Item = usize> + '_ {
        let queue = &self.queue[q];
        let long = queue.long.then(|| {
            self.ordered
                .entities(q)
                .chain(self.ordered.entities(self.queues + q))
        });
        queue
            .short
            .iter()
            .map(|s| s.e as usize)
            .chain(long.into_iter().flatten())
    }

    #[cfg(test)]
    fn is_long(&self, q: usize) -> bool {
        self.queue[q].long
    }
}

#[cfg(test)]
mod tests {
    use super::super::runq::lcg;
    use super::*;

    #[test]
    fn last_eligible_is_the_largest_eligible_vruntime() {
        for (load, sum_wv) in [
            (1024u64, 0i128),
            (3, -7),
            (3, 7),
            (1024, -1),
            (2048, 1_000_000_007),
            (5, 1i128 << 70),
        ] {
            let avg = Avg { load, sum_wv };
            let last = avg.last_eligible();
            assert!(avg.eligible(last), "{avg:?}: {last}");
            if last < i64::MAX {
                assert!(!avg.eligible(last + 1), "{avg:?}: {last}");
            }
        }
        // Beyond 64 bits, the nearest that fits.
        let far_below = Avg {
            load: 5,
            sum_wv: -(1i128 << 70),
        };
        assert_eq!(far_below.last_eligible(), i64::MIN);
        let empty = Avg { load: 0, sum_wv: 0 };
        assert_eq!(empty.last_eligible(), i64::MAX);
    }

    /// Random inserts, removals and picks, every answer compared with a scan of a plain
    /// list; returns how many times a queue switched layout.
    fn check_against_a_list(short_max: usize, short_below: usize) -> usize {
        const N: usize = 200;
        const Q: usize = 3;
        let switch = Switch {
            above: short_max,
            below: short_below,
        };
        let mut qs = EevdfQueues::with_limits(Q, N, switch);
        let mut keys = [Keys { deadline: 0, v: 0 }; N];
        let mut queued: Vec<Vec<usize>> = vec![Vec::new(); Q];
        let mut s = 11;
        let mut switches = 0;
        for step in 0..30_000 {
            let before: Vec<bool> = (0..Q).map(|q| qs.is_long(q)).collect();
            let e = lcg(&mut s) as usize % N;
            // The average moves as entities run elsewhere; few distinct values, so
            // ties in deadline and vruntime are common.
            let avg = Avg {
                load: 1 + lcg(&mut s) % 4,
                sum_wv: (lcg(&mut s) % 41) as i128 - 20,
            };
            let keys_now = keys;
            let of = move |e: usize| keys_now[e];
            match queued.iter().position(|l| l.contains(&e)) {
                Some(q) => {
                    qs.remove(q, e, of);
                    queued[q].retain(|&x| x != e);
                }
                None => {
                    let q = lcg(&mut s) as usize % Q;
                    keys[e] = Keys {
                        deadline: (lcg(&mut s) % 30) as i64 - 10,
                        v: (lcg(&mut s) % 30) as i64 - 15,
                    };
                    let keys_now = keys;
                    qs.insert(q, e, keys_now[e], avg);
                    queued[q].push(e);
                }
            }
            let keys_now = keys;
            let of = move |e: usize| keys_now[e];
            for q in 0..Q {
                let list = &queued[q];
                let want = list
                    .iter()
                    .filter(|&&e| avg.eligible(keys[e].v))
                    .min_by_key(|&&e| (keys[e].deadline, e))
                    .copied();
                assert_eq!(qs.first_eligible(q, avg, of), want, "step {step}");
                // Right after a pick, with the same average, the hint is that pick.
                let hint = if qs.is_long(q) { want } else { None };
                assert_eq!(qs.likely_first(q), hint, "step {step}");
                assert_eq!(qs.len(q), list.len());
                let earliest = list.iter().min_by_key(|&&e| (keys[e].deadline, e));
                assert_eq!(qs.earliest(q, of), earliest.copied(), "step {step}");
                let mut all: Vec<usize> = qs.entities(q).collect();
                all.sort_unstable();
                let mut want_all = list.clone();
                want_all.sort_unstable();
                assert_eq!(all, want_all);
                switches += usize::from(qs.is_long(q) != before[q]);
            }
        }
        switches
    }

    #[test]
    fn picks_the_eligible_entity_with_the_earliest_deadline_in_either_layout() {
        assert_eq!(check_against_a_list(usize::MAX, 0), 0, "short only");
        assert_eq!(check_against_a_list(0, 0), 3, "long from the first entity");
        let switches = check_against_a_list(36, 28);
        assert!(switches > 20, "{switches} switches");
    }

    #[test]
    fn the_balancer_takes_the_ineligible_entity_furthest_ahead() {
        let mut qs = EevdfQueues::new(1, 4);
        let avg = Avg {
            load: 2048,
            sum_wv: 2048 * 10,
        };
        let keys = [(5, 8), (9, 30), (7, 20), (40, 10)];
        for (e, &(deadline, v)) in keys.iter().enumerate() {
            qs.insert(0, e, Keys { deadline, v }, avg);
        }
        assert_eq!(
            qs.latest(0, avg),
            Some(1),
            "the latest vruntime past the average"
        );
        let of = |e: usize| Keys {
            deadline: keys[e].0,
            v: keys[e].1,
        };
        qs.remove(0, 1, of);
        qs.remove(0, 2, of);
        assert_eq!(
            qs.latest(0, avg),
            Some(3),
            "all eligible: the latest deadline"
        );
        assert_eq!(qs.first_eligible(0, avg, of), Some(0));
    }
}
