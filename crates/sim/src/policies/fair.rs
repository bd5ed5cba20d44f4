//! The kernel's fair class, CFS (vruntime, sched_latency / min_granularity, sleeper
//! placement, wakeup granularity) or EEVDF (lag, eligibility, virtual deadlines, custom
//! slices), with task groups: per-CPU run queues per group, group entities weighted by
//! shares × the group's load on that CPU / its load everywhere, SCHED_IDLE tasks and idle
//! groups at weight 3 that never preempt and are preempted by any non-idle wakeup.
//!
//! EEVDF follows Linux 6.17+ (the target kernel is 6.18): RUN_TO_PARITY protects the
//! entity picked to run from wakeup preemption until its deadline, or for the shortest
//! slice on its queue if that is shorter than its own; PREEMPT_SHORT lets a woken entity
//! with a shorter slice than the current one ignore that protection.
//!
//! The small helpers on every switch are `#[inline(always)]`: left to itself the compiler
//! kept them as calls that save and restore every register: 5 % of busy cfs's instructions
//! per event (`make sim-instructions`, docs/RESULTS.md).

use super::eevdf_queues::{Avg, EevdfQueues, Keys};
use super::runq::RunQueues;
use crate::engine::{prefetch, How, Ns, Scheduler, TaskId, TaskInfo, View};
use crate::workload::{SchedClass, Workload};
pub use appease_policy::nice_weight;

/// `Ent::own` of a task (it stands for no run queue).
const TASK: u32 = u32::MAX;
/// SCHED_IDLE tasks and idle groups.
pub const WEIGHT_IDLE: u64 = 3;
const NICE_0: u64 = 1024;

/// a/b rounded toward zero, as i128 division does, in 64 bits when a fits: a 128-bit
/// division is a library call of about a hundred cycles.
fn div_i128(a: i128, b: i128) -> i128 {
    match (i64::try_from(a), i64::try_from(b)) {
        (Ok(a), Ok(b)) if b != 0 && !(a == i64::MIN && b == -1) => (a / b) as i128,
        _ => a / b,
    }
}

/// a·b/c, exact: in 64 bits when a·b fits (always, for times below months), else 128.
fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    match a.checked_mul(b) {
        Some(p) => p / c,
        None => (a as u128 * b as u128 / c as u128) as u64,
    }
}

/// A real time as virtual time for an entity of `weight` (a·NICE_0/weight): for nice 0,
/// the usual case, `a` itself, with no division (tens of cycles).
fn to_virtual(a: u64, weight: u64) -> u64 {
    if weight == NICE_0 {
        a
    } else {
        mul_div(a, NICE_0, weight.max(1))
    }
}

fn keys_of(ent: &Ent) -> Keys {
    Keys {
        deadline: ent.deadline,
        v: ent.v,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Cfs,
    Eevdf,
}

/// Kept small (48 bytes): thousands of tasks rotate through the CPUs, and each pick
/// touches the chosen entity, so how many fit in cache sets the simulator's speed.
#[derive(Clone, Debug, Default)]
struct Ent {
    v: i64,
    deadline: i64,
    /// EEVDF: the lag it left its queue with, while off its queue; while it is its
    /// queue's current entity, the vruntime its slice protection lasts to (the kernel
    /// kept it in the same field before 6.17, for the same reason: the lag is not used
    /// until it leaves).
    vlag: i64,
    weight: u32,
    /// Real-time slice (EEVDF request size).
    slice: Ns,
    on_rq: bool,
    /// The run queue this entity is queued on.
    parent: u32,
    /// Group entities: the run queue they stand for; tasks: `TASK`.
    own: u32,
    idle: bool,
    /// Tasks only: SCHED_BATCH or SCHED_IDLE never preempt on wakeup.
    no_wakeup_preempt: bool,
}
const _: () = assert!(std::mem::size_of::<Ent>() == 48);

/// One group's run queue on one CPU; its waiting entities are in `Fair::queues`.
#[derive(Clone, Debug, Default)]
struct Rq {
    curr: Option<usize>,
    /// Entities on it, current included.
    nr: usize,
    load: u64,
    min_v: i64,
    /// Σ w·v over its entities (EEVDF's average vruntime; not kept up to date under CFS,
    /// which never reads it).
    sum_wv: i128,
    /// Parent group entity (None for a CPU's root queue).
    owner: Option<usize>,
}

/// The fair class; `EEVDF` picks the mode at compile time, so that each mode's engine
/// carries none of the other's branches.
pub struct Fair<const EEVDF: bool> {
    cpus: usize,
    /// Entities below this are tasks, the rest group entities.
    ntasks: usize,
    ents: Vec<Ent>,
    rqs: Vec<Rq>,
    /// The waiting (not current) entities of each run queue: CFS's by vruntime; EEVDF's
    /// in `eevdf`, and this one empty.
    queues: RunQueues,
    eevdf: EevdfQueues,
    /// Per group (0 = root): shares, idle, its load on all CPUs.
    shares: Vec<u64>,
    group_idle: Vec<bool>,
    group_load: Vec<u64>,
    /// Runnable tasks per CPU (running included), and the running one.
    cpu_tasks: Vec<usize>,
    cpu_curr: Vec<Option<TaskId>>,
    latency: Ns,
    min_gran: Ns,
    wakeup_gran: Ns,
    base_slice: Ns,
    /// The shortest slice of any entity: one with this slice is protected to its deadline
    /// without a look at its queue.
    min_slice: Ns,
}

pub type Cfs = Fair<false>;
pub type Eevdf = Fair<true>;

impl<const EEVDF: bool> Fair<EEVDF> {
    const MODE: Mode = if EEVDF { Mode::Eevdf } else { Mode::Cfs };

    pub fn new(w: &Workload, infos: &[TaskInfo]) -> Self {
        let cpus = w.sim.cpus;
        let t = &w.tunables;
        let factor = if t.scale_with_cpus {
            1.0 + (cpus.min(8) as f64).log2().floor()
        } else {
            1.0
        };
        let scaled = |v: f64| crate::engine::ms(v * factor);
        let groups = w.group.len() + 1;
        let mut shares = vec![NICE_0];
        let mut group_idle = vec![false];
        let mut group_parent = vec![0usize];
        for g in &w.group {
            shares.push(g.shares);
            group_idle.push(g.idle);
            let parent = g
                .path
                .get_ref()
                .rsplit_once('/')
                .map(|(a, _)| a)
                .filter(|a| !a.is_empty())
                .and_then(|a| w.group.iter().position(|h| h.path.get_ref() == a))
                .map_or(0, |i| i + 1);
            group_parent.push(parent);
        }
        let ntasks = infos.len();
        let mut ents = Vec::with_capacity(ntasks + (groups - 1) * cpus);
        for info in infos {
            let weight = if info.class == SchedClass::Idle {
                WEIGHT_IDLE
            } else {
                nice_weight(info.nice)
            };
            ents.push(Ent {
                weight: weight as u32,
                own: TASK,
                slice: info.slice.unwrap_or(scaled(t.base_slice_ms)),
                idle: info.class == SchedClass::Idle,
                no_wakeup_preempt: info.class != SchedClass::Normal,
                ..Ent::default()
            });
        }
        // Run queue of group g on cpu c: g * cpus + c. Group entity of g ≥ 1 on c:
        // ntasks + (g - 1) * cpus + c.
        let mut rqs = vec![Rq::default(); groups * cpus];
        for g in 1..groups {
            for c in 0..cpus {
                let e = ntasks + (g - 1) * cpus + c;
                ents.push(Ent {
                    weight: if group_idle[g] {
                        WEIGHT_IDLE
                    } else {
                        shares[g]
                    } as u32,
                    slice: scaled(t.base_slice_ms),
                    parent: (group_parent[g] * cpus + c) as u32,
                    own: (g * cpus + c) as u32,
                    idle: group_idle[g],
                    ..Ent::default()
                });
                rqs[g * cpus + c].owner = Some(e);
            }
        }
        for (i, info) in infos.iter().enumerate() {
            ents[i].parent = (info.group * cpus) as u32; // cpu 0 until placed
        }
        let min_slice = ents.iter().map(|e| e.slice).min().unwrap_or(0);
        Fair {
            min_slice,
            cpus,
            ntasks,
            // The other mode's structure holds nothing, for no entity.
            queues: match EEVDF {
                false => RunQueues::new(rqs.len(), ents.len()),
                true => RunQueues::new(0, 0),
            },
            eevdf: match EEVDF {
                true => EevdfQueues::new(rqs.len(), ents.len()),
                false => EevdfQueues::new(0, 0),
            },
            ents,
            rqs,
            shares,
            group_idle,
            group_load: vec![0; groups],
            cpu_tasks: vec![0; cpus],
            cpu_curr: vec![None; cpus],
            latency: scaled(t.sched_latency_ms),
            min_gran: scaled(t.min_granularity_ms),
            wakeup_gran: scaled(t.wakeup_granularity_ms),
            base_slice: scaled(t.base_slice_ms),
        }
    }

    /// Group entities: the run queue they stand for. Tasks come first among the
    /// entities, so a task is known by its index, without reading its data (on a pick,
    /// not yet in cache).
    fn own(&self, e: usize) -> Option<usize> {
        if e < self.ntasks {
            return None;
        }
        let own = self.ents[e].own;
        (own != TASK).then_some(own as usize)
    }

    fn group_of_rq(&self, rq: usize) -> usize {
        rq / self.cpus
    }

    fn vslice(&self, e: usize) -> i64 {
        let ent = &self.ents[e];
        to_virtual(ent.slice, ent.weight as u64) as i64
    }

    /// Queues `e` (not current) on `rq`.
    #[inline(always)]
    fn wait_in(&mut self, rq: usize, e: usize) {
        match Self::MODE {
            Mode::Cfs => self.queues.insert(rq, self.ents[e].v, e),
            Mode::Eevdf => self
                .eevdf
                .insert(rq, e, keys_of(&self.ents[e]), self.avg(rq)),
        }
    }

    /// Takes `e` off `rq`, where it waits.
    #[inline(always)]
    fn unqueue(&mut self, rq: usize, e: usize) {
        match Self::MODE {
            Mode::Cfs => self.queues.remove(e),
            Mode::Eevdf => {
                let ents = &self.ents;
                self.eevdf.remove(rq, e, |o| keys_of(&ents[o]));
            }
        }
    }

    /// EEVDF: what eligibility on `rq` depends on.
    fn avg(&self, rq: usize) -> Avg {
        let r = &self.rqs[rq];
        Avg {
            load: r.load,
            sum_wv: r.sum_wv,
        }
    }

    /// EEVDF: the waiting eligible entity with the earliest deadline.
    fn first_eligible(&mut self, rq: usize) -> Option<usize> {
        let (ents, avg) = (&self.ents, self.avg(rq));
        self.eevdf.first_eligible(rq, avg, |o| keys_of(&ents[o]))
    }

    /// EEVDF: the waiting entity with the earliest deadline.
    fn earliest(&self, rq: usize) -> Option<usize> {
        self.eevdf.earliest(rq, |o| keys_of(&self.ents[o]))
    }

    /// The entity the balancer takes: the one furthest ahead, which has the least
    /// claim on this CPU (CFS: the latest vruntime; EEVDF: the ineligible one with the
    /// latest vruntime, else the eligible one with the latest deadline, in a long queue
    /// as sorted at its last pick: `EevdfQueues::latest`).
    fn latest(&self, rq: usize) -> Option<usize> {
        match Self::MODE {
            Mode::Cfs => self.queues.last(rq).map(|(_, e)| e),
            Mode::Eevdf => self.eevdf.latest(rq, self.avg(rq)),
        }
    }

    fn waiting(&self, rq: usize) -> impl Iterator<Item = usize> + '_ {
        let (cfs, eevdf) = match Self::MODE {
            Mode::Cfs => (Some(self.queues.entities(rq)), None),
            Mode::Eevdf => (None, Some(self.eevdf.entities(rq))),
        };
        cfs.into_iter().flatten().chain(eevdf.into_iter().flatten())
    }

    /// EEVDF: whether `e` is eligible (v ≤ the load-weighted average).
    fn eligible(&self, rq: usize, e: usize) -> bool {
        self.avg(rq).eligible(self.ents[e].v)
    }

    fn avg_v(&self, rq: usize) -> i64 {
        let r = &self.rqs[rq];
        if r.load == 0 {
            r.min_v
        } else {
            div_i128(r.sum_wv, r.load as i128) as i64
        }
    }

    #[inline(always)]
    fn update_min_v(&mut self, rq: usize) {
        if Self::MODE != Mode::Cfs {
            return;
        }
        let r = &self.rqs[rq];
        let curr = r.curr.map(|c| self.ents[c].v);
        let left = self.queues.first(rq).map(|(v, _)| v);
        let v = match (curr, left) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => return,
        };
        let r = &mut self.rqs[rq];
        r.min_v = r.min_v.max(v);
    }

    /// Where an entity joining `rq` starts (sleeper placement, lag, new-task debit).
    fn place(&mut self, rq: usize, e: usize, how: How) {
        match Self::MODE {
            Mode::Cfs => {
                let min_v = self.rqs[rq].min_v;
                let ent = &mut self.ents[e];
                match how {
                    How::New => ent.v = min_v + (ent.slice as i64).min(self.latency as i64),
                    How::Migrated => ent.v += min_v, // was made relative when it left
                    // Gentle fair sleepers: at most half a latency of credit.
                    _ => ent.v = ent.v.max(min_v - (self.latency / 2) as i64),
                }
            }
            Mode::Eevdf => {
                let avg = self.avg_v(rq);
                let load = self.rqs[rq].load as i128;
                let vslice = self.vslice(e);
                let ent = &mut self.ents[e];
                let lag = if how == How::New || load == 0 {
                    0
                } else {
                    // Keep the lag it left with, as seen after it joins.
                    div_i128(ent.vlag as i128 * (load + ent.weight as i128), load) as i64
                };
                ent.v = avg - lag;
                ent.deadline = ent.v + if how == How::New { vslice / 2 } else { vslice };
            }
        }
    }

    fn rq_add(&mut self, rq: usize, e: usize) {
        let w = self.ents[e].weight as u64;
        let v = self.ents[e].v;
        self.ents[e].on_rq = true;
        self.ents[e].parent = rq as u32;
        self.wait_in(rq, e);
        let r = &mut self.rqs[rq];
        r.nr += 1;
        r.load += w;
        r.sum_wv += w as i128 * v as i128;
        self.load_changed(rq, w as i64);
    }

    /// Removes `e` (queued, or current) from its run queue.
    fn rq_remove(&mut self, e: usize) {
        let rq = self.ents[e].parent as usize;
        let w = self.ents[e].weight as u64;
        let v = self.ents[e].v;
        if Self::MODE == Mode::Eevdf {
            // Lag, bounded as the kernel bounds it.
            let limit = 2 * self.vslice(e).max(1);
            self.ents[e].vlag = (self.avg_v(rq) - v).clamp(-limit, limit);
        }
        let r = &mut self.rqs[rq];
        if r.curr == Some(e) {
            r.curr = None;
        } else {
            // Field by field (not `unqueue`), so that `r` stays borrowed: one bounds
            // check fewer on every dequeue.
            match Self::MODE {
                Mode::Cfs => self.queues.remove(e),
                Mode::Eevdf => self.eevdf.remove(rq, e, |o| keys_of(&self.ents[o])),
            }
        }
        r.nr -= 1;
        r.load -= w;
        r.sum_wv -= w as i128 * v as i128;
        self.ents[e].on_rq = false;
        self.load_changed(rq, -(w as i64));
    }

    /// A group's load on a CPU changed: its entity there is reweighted, up the tree.
    #[inline(always)]
    fn load_changed(&mut self, rq: usize, delta: i64) {
        // The root group has no entity to reweight (and its load is never read).
        if let Some(ge) = self.rqs[rq].owner {
            self.group_load_changed(rq, ge, delta);
        }
    }

    fn group_load_changed(&mut self, rq: usize, ge: usize, delta: i64) {
        let g = self.group_of_rq(rq);
        self.group_load[g] = (self.group_load[g] as i64 + delta).max(0) as u64;
        let new = if self.group_idle[g] {
            WEIGHT_IDLE
        } else {
            let total = self.group_load[g].max(1);
            mul_div(self.shares[g], self.rqs[rq].load, total).clamp(2, self.shares[g])
        };
        self.reweight(ge, new);
    }

    fn reweight(&mut self, e: usize, new: u64) {
        let old = self.ents[e].weight as u64;
        if old == new {
            return;
        }
        if !self.ents[e].on_rq {
            self.ents[e].weight = new as u32;
            return;
        }
        let rq = self.ents[e].parent as usize;
        let queued = self.rqs[rq].curr != Some(e);
        if queued {
            self.unqueue(rq, e);
        }
        let v = self.ents[e].v;
        if Self::MODE == Mode::Eevdf {
            // The rest of its request keeps its real-time size.
            let ent = &mut self.ents[e];
            ent.deadline =
                v + div_i128((ent.deadline - v) as i128 * old as i128, new as i128) as i64;
        }
        self.ents[e].weight = new as u32;
        let r = &mut self.rqs[rq];
        r.load = r.load + new - old;
        r.sum_wv += (new as i128 - old as i128) * v as i128;
        if queued {
            self.wait_in(rq, e);
        }
        self.load_changed(rq, new as i64 - old as i64);
    }

    /// Chooses from one run queue (current entity included).
    fn pick_rq(&mut self, rq: usize) -> Option<usize> {
        let r = &self.rqs[rq];
        match Self::MODE {
            Mode::Cfs => {
                let left = self.queues.first(rq).map(|(_, e)| e);
                match (r.curr, left) {
                    (Some(c), Some(l)) if self.ents[l].v < self.ents[c].v => Some(l),
                    (Some(c), _) => Some(c),
                    (None, l) => l,
                }
            }
            Mode::Eevdf => {
                // The eligible entity with the earliest deadline, the current one included.
                let curr = r.curr;
                let best = curr.filter(|&c| self.eligible(rq, c));
                let found = self.first_eligible(rq).filter(|&e| {
                    best.is_none_or(|b| self.ents[e].deadline < self.ents[b].deadline)
                });
                found.or(best).or(curr).or_else(|| self.earliest(rq))
            }
        }
    }

    /// Makes `e` (waiting on `rq`, or its current one) the current entity of `rq`.
    fn set_curr(&mut self, rq: usize, e: usize) {
        if self.rqs[rq].curr == Some(e) {
            return;
        }
        match Self::MODE {
            // Nearly always the first waiting one.
            Mode::Cfs if self.queues.first(rq).is_some_and(|(_, f)| f == e) => {
                self.queues.pop_first(rq);
            }
            _ => self.unqueue(rq, e),
        }
        if let Some(old) = self.rqs[rq].curr.take() {
            self.wait_in(rq, old);
        }
        self.rqs[rq].curr = Some(e);
        if Self::MODE == Mode::Eevdf {
            self.protect_slice(rq, e);
        }
    }

    /// EEVDF's RUN_TO_PARITY: `e`, just made current, is not preempted on wakeups until
    /// its deadline, or until it has run the shortest slice among the others on its
    /// queue if that is shorter than its own.
    fn protect_slice(&mut self, rq: usize, e: usize) {
        let own = self.ents[e].slice;
        let shortest = if own <= self.min_slice {
            own
        } else {
            self.waiting(rq)
                .map(|o| self.ents[o].slice)
                .fold(own, Ns::min)
        };
        let ent = &self.ents[e];
        let mut vprot = ent.deadline;
        if shortest < own {
            let v = to_virtual(shortest, ent.weight as u64) as i64;
            vprot = vprot.min(ent.v + v);
        }
        self.ents[e].vlag = vprot;
    }

    /// Whether the current entity `c` is still protected from wakeup preemption.
    fn protected(&self, c: usize) -> bool {
        self.ents[c].vlag > self.ents[c].v
    }

    /// Entities from the task up to its root-level ancestor.
    fn path(&self, t: TaskId) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(Some(t), |&e| self.rqs[self.ents[e].parent as usize].owner)
    }

    fn task_rq(&self, t: TaskId, cpu: usize) -> usize {
        let parent = self.ents[t].parent as usize;
        if parent < self.cpus {
            return cpu; // the root group's queues come first
        }
        self.group_of_rq(parent) * self.cpus + cpu
    }

    /// Puts the current entities back with the waiting ones (the CPU stops running them).
    /// Walks up by owner rather than collecting the path first: a task of the root group,
    /// the common case, has a path of one (about 1.1× faster for cfs, docs/RESULTS.md).
    #[inline(always)]
    fn clear_curr(&mut self, t: TaskId) {
        let mut e = t;
        loop {
            let rq = self.ents[e].parent as usize;
            if self.rqs[rq].curr == Some(e) {
                self.rqs[rq].curr = None;
                if self.ents[e].on_rq {
                    self.wait_in(rq, e);
                }
            }
            match self.rqs[rq].owner {
                Some(ge) => e = ge,
                None => break,
            }
        }
    }

    /// Removes a task from its CPU, and group entities left empty on the way up.
    #[inline(always)]
    fn dequeue_task(&mut self, t: TaskId) {
        let mut e = t;
        loop {
            let rq = self.ents[e].parent as usize;
            self.rq_remove(e);
            match self.rqs[rq].owner {
                Some(ge) if self.rqs[rq].nr == 0 => e = ge,
                _ => break,
            }
        }
    }

    /// Changes a task's nice (the request-elevation policy's lever).
    pub fn set_nice(&mut self, t: TaskId, nice: i32) {
        if self.ents[t].idle {
            return;
        }
        self.reweight(t, nice_weight(nice));
    }

    /// The ancestors (or selves) of the current and the woken task that share a queue,
    /// the level where the kernel compares them.
    fn matching(&self, curr: TaskId, woken: TaskId) -> (usize, usize) {
        let up = |e: usize| self.rqs[self.ents[e].parent as usize].owner;
        if up(curr).is_none() && up(woken).is_none() {
            return (curr, woken); // both in root groups: the common case
        }
        let depth = |t: TaskId| self.path(t).count();
        let (mut a, mut b) = (curr, woken);
        let (mut da, mut db) = (depth(curr), depth(woken));
        while da > db {
            a = up(a).expect("deeper than the root");
            da -= 1;
        }
        while db > da {
            b = up(b).expect("deeper than the root");
            db -= 1;
        }
        while self.ents[a].parent != self.ents[b].parent {
            match (up(a), up(b)) {
                (Some(x), Some(y)) => (a, b) = (x, y),
                _ => return (curr, woken), // different CPUs' roots
            }
        }
        (a, b)
    }
}

/// CFS's slice for a task of the root group: its weight's share of `period`, at least
/// `min_gran`.
#[inline(always)]
fn root_slice(period: Ns, weight: u64, load: u64, min_gran: Ns) -> Ns {
    let load = load.max(1);
    // A share of at most min_gran, exactly: the answer is min_gran, with no division. It
    // is a busy CPU's usual case (equal weights give exactly min_gran), where waiting for
    // the division was about 13 % of the event loop's own time. The float share below is
    // within 2⁻⁵² of the exact one, so it would not reach min_gran + 1 either: the same
    // answer.
    if period as u128 * weight as u128 <= min_gran as u128 * load as u128 {
        return min_gran;
    }
    // Through i64: one instruction each way, where u64 ↔ f64 takes several (the values
    // are far below 2⁶³, so they are the same).
    let share = period as i64 as f64 * (weight as f64 / load as i64 as f64);
    (share as i64 as Ns).max(min_gran)
}

impl<const EEVDF: bool> Fair<EEVDF> {
    #[inline(always)]
    fn pick_task(&mut self, cpu: usize) -> Option<TaskId> {
        let mut rq = cpu; // the root group's queue on this CPU
        loop {
            let e = match (Self::MODE, self.rqs[rq].curr) {
                // The usual case (`put_prev` left nothing current): CFS runs the
                // leftmost, taken off by position.
                (Mode::Cfs, None) => {
                    let (_, e) = self.queues.pop_first(rq)?;
                    self.rqs[rq].curr = Some(e);
                    e
                }
                _ => {
                    let e = self.pick_rq(rq)?;
                    self.set_curr(rq, e);
                    e
                }
            };
            match self.own(e) {
                Some(child) => rq = child,
                None => {
                    self.cpu_curr[cpu] = Some(e);
                    return Some(e);
                }
            }
        }
    }

    #[inline(never)]
    fn pick_task_outlined(&mut self, cpu: usize) -> Option<TaskId> {
        self.pick_task(cpu)
    }
}

impl<const EEVDF: bool> Scheduler for Fair<EEVDF> {
    fn enqueue(&mut self, cpu: usize, t: TaskId, _now: Ns, how: How, _view: &View) {
        self.cpu_tasks[cpu] += 1;
        let mut e = t;
        let mut rq = self.task_rq(t, cpu);
        loop {
            let was_empty = self.rqs[rq].nr == 0;
            self.place(rq, e, if e == t { how } else { How::Wakeup });
            self.rq_add(rq, e);
            self.update_min_v(rq);
            match self.rqs[rq].owner {
                Some(ge) if was_empty && !self.ents[ge].on_rq => {
                    e = ge;
                    rq = self.ents[ge].parent as usize;
                }
                _ => break,
            }
        }
    }

    #[inline(always)]
    fn pick(&mut self, cpu: usize, _now: Ns, _view: &View) -> Option<TaskId> {
        // Inlined into the engine, CFS's short pick saves 20 instructions per event;
        // EEVDF's longer one costs 25 more (`make sim-instructions`).
        if EEVDF {
            self.pick_task_outlined(cpu)
        } else {
            self.pick_task(cpu)
        }
    }

    #[inline(always)]
    fn slice(&mut self, cpu: usize, t: TaskId, _now: Ns, _view: &View) -> Ns {
        match Self::MODE {
            Mode::Cfs => {
                let nr = self.cpu_tasks[cpu] as u64;
                let period = if nr * self.min_gran > self.latency {
                    nr * self.min_gran
                } else {
                    self.latency
                };
                let r = &self.rqs[self.ents[t].parent as usize];
                if r.owner.is_none() {
                    // A task of the root group (the same arithmetic as the loop below).
                    return root_slice(period, self.ents[t].weight as u64, r.load, self.min_gran);
                }
                let mut share = period as f64;
                for e in self.path(t) {
                    let r = &self.rqs[self.ents[e].parent as usize];
                    share *= self.ents[e].weight as f64 / r.load.max(1) as f64;
                }
                (share as Ns).max(self.min_gran)
            }
            Mode::Eevdf => {
                // Until the first deadline, or end of slice protection, on its path.
                let mut until = Ns::MAX;
                for e in self.path(t) {
                    let ent = &self.ents[e];
                    let vleft = (ent.deadline.min(ent.vlag) - ent.v).max(0) as u64;
                    let real = mul_div(vleft, ent.weight as u64, NICE_0);
                    until = until.min(real as Ns);
                }
                until.max(self.base_slice / 10).max(100_000)
            }
        }
    }

    #[inline(always)]
    fn charge(&mut self, _cpu: usize, t: TaskId, ran: Ns, _now: Ns) {
        let mut e = t;
        loop {
            let ent = &mut self.ents[e];
            let rq = ent.parent as usize;
            let w = ent.weight as u64;
            let dv = to_virtual(ran, w) as i64;
            ent.v += dv;
            if Self::MODE == Mode::Eevdf {
                self.rqs[rq].sum_wv += w as i128 * dv as i128; // only EEVDF averages
                if self.ents[e].v >= self.ents[e].deadline {
                    // Request served: the next one.
                    let vs = self.vslice(e);
                    self.ents[e].deadline = self.ents[e].v + vs;
                }
            }
            self.update_min_v(rq);
            match self.rqs[rq].owner {
                Some(ge) => e = ge,
                None => break,
            }
        }
    }

    #[inline(always)]
    fn put_prev(&mut self, cpu: usize, t: TaskId, _now: Ns, runnable: Option<How>, _view: &View) {
        self.cpu_curr[cpu] = None;
        match runnable {
            Some(_) => self.clear_curr(t),
            None => {
                self.cpu_tasks[cpu] -= 1;
                self.dequeue_task(t);
                self.clear_curr(t);
            }
        }
    }

    fn preempts(&self, _cpu: usize, curr: TaskId, woken: TaskId, _now: Ns, _view: &View) -> bool {
        let (c, w) = self.matching(curr, woken);
        let (ci, wi) = (self.ents[c].idle, self.ents[w].idle);
        if ci && !wi {
            return true; // anything non-idle preempts idle
        }
        if wi && !ci {
            return false;
        }
        if self.ents[woken].no_wakeup_preempt {
            return false;
        }
        match Self::MODE {
            Mode::Cfs => {
                let gran = to_virtual(self.wakeup_gran, self.ents[w].weight as u64) as i64;
                self.ents[c].v - self.ents[w].v > gran
            }
            Mode::Eevdf => {
                // As the kernel's pick_eevdf(): an eligible current entity keeps the CPU
                // while its slice is protected, unless the woken one has a shorter slice
                // (PREEMPT_SHORT); else the earlier eligible deadline wins.
                let rq = self.ents[w].parent as usize;
                if !self.eligible(rq, w) {
                    return false;
                }
                if !self.eligible(rq, c) {
                    return true;
                }
                let short = self.ents[w].slice < self.ents[c].slice;
                if self.protected(c) && !short {
                    return false;
                }
                self.ents[w].deadline < self.ents[c].deadline
            }
        }
    }

    fn nr_queued(&self, cpu: usize) -> usize {
        self.cpu_tasks[cpu] - self.cpu_curr[cpu].is_some() as usize
    }

    /// CFS: the root queue's leftmost; EEVDF: a long root queue's earliest eligible
    /// deadline as the last pick left it; if it is a task (not a group). Only where 16
    /// or more tasks share the CPU: a task that waited behind fewer is likely still in
    /// the cache, and the hint cost the typical host's cfs about 5 % (interleaved
    /// `cargo bench` runs).
    #[inline(always)]
    fn prefetch_next(&self, cpu: usize) -> Option<TaskId> {
        if self.cpu_tasks[cpu] < 16 {
            return None;
        }
        let e = match Self::MODE {
            Mode::Cfs => self.queues.first(cpu)?.1,
            Mode::Eevdf => self.eevdf.likely_first(cpu)?,
        };
        if e >= self.ntasks {
            return None;
        }
        prefetch(&self.ents[e]);
        Some(e)
    }

    fn steal(&mut self, cpu: usize, _now: Ns) -> Option<TaskId> {
        let mut rq = cpu;
        let t = loop {
            let e = self.latest(rq)?;
            match self.own(e) {
                Some(child) => rq = child,
                None => break e,
            }
        };
        let min_v = self.rqs[self.ents[t].parent as usize].min_v;
        self.cpu_tasks[cpu] -= 1;
        self.dequeue_task(t);
        if Self::MODE == Mode::Cfs {
            self.ents[t].v -= min_v; // relative until it is placed on the new CPU
        }
        Some(t)
    }
}

#[cfg(test)]
mod tests;
