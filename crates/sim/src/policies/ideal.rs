//! The ideal customer-appeasement scheduler of the 2010 customer-appeasement paper's §4: two queues. Q0 holds the
//! processes with unhappiness (working on, or holding, a pending request) and has strict
//! priority; from it runs the one with the most unhappiness. Q1, everything else, is
//! scheduled by CFS.

use super::fair::Cfs;
use crate::engine::{How, Ns, Scheduler, TaskId, TaskInfo, View};
use crate::workload::Workload;

/// How often the Q0 choice is looked at again while one runs.
const Q0_QUANTUM: Ns = 1_000_000;

pub struct Ideal {
    fair: Cfs,
    q0: Vec<Vec<TaskId>>,
    in_q0: Vec<bool>,
    curr_q0: Vec<bool>,
}

impl Ideal {
    pub fn new(w: &Workload, infos: &[TaskInfo]) -> Self {
        Ideal {
            fair: Cfs::new(w, infos),
            q0: vec![Vec::new(); w.sim.cpus],
            in_q0: vec![false; infos.len()],
            curr_q0: vec![false; w.sim.cpus],
        }
    }
}

// The fair class's methods are inlined through these into the engine (about 60
// instructions per event fewer, `make sim-instructions`).
impl Scheduler for Ideal {
    #[inline(always)]
    fn enqueue(&mut self, cpu: usize, t: TaskId, now: Ns, how: How, view: &View) {
        self.in_q0[t] = view.holds_request(t);
        if self.in_q0[t] {
            self.q0[cpu].push(t);
        } else {
            self.fair.enqueue(cpu, t, now, how, view);
        }
    }

    #[inline(always)]
    fn pick(&mut self, cpu: usize, now: Ns, view: &View) -> Option<TaskId> {
        let q = &self.q0[cpu];
        let best = (0..q.len()).max_by(|&a, &b| {
            view.unhappiness(q[a], now)
                .total_cmp(&view.unhappiness(q[b], now))
                .then(b.cmp(&a)) // ties: the one queued first
        });
        if let Some(i) = best {
            self.curr_q0[cpu] = true;
            return Some(self.q0[cpu].remove(i));
        }
        self.curr_q0[cpu] = false;
        self.fair.pick(cpu, now, view)
    }

    #[inline(always)]
    fn slice(&mut self, cpu: usize, t: TaskId, now: Ns, view: &View) -> Ns {
        if self.curr_q0[cpu] {
            Q0_QUANTUM
        } else {
            self.fair.slice(cpu, t, now, view)
        }
    }

    #[inline(always)]
    fn charge(&mut self, cpu: usize, t: TaskId, ran: Ns, now: Ns) {
        if !self.in_q0[t] {
            self.fair.charge(cpu, t, ran, now);
        }
    }

    #[inline(always)]
    fn put_prev(&mut self, cpu: usize, t: TaskId, now: Ns, runnable: Option<How>, view: &View) {
        if self.in_q0[t] {
            if runnable.is_some() {
                self.q0[cpu].push(t);
            }
        } else {
            self.fair.put_prev(cpu, t, now, runnable, view);
        }
    }

    #[inline(always)]
    fn preempts(&self, cpu: usize, curr: TaskId, woken: TaskId, now: Ns, view: &View) -> bool {
        match (self.in_q0[curr], self.in_q0[woken]) {
            (false, true) => true,
            (true, _) => false,
            (false, false) => self.fair.preempts(cpu, curr, woken, now, view),
        }
    }

    #[inline(always)]
    fn nr_queued(&self, cpu: usize) -> usize {
        self.q0[cpu].len() + self.fair.nr_queued(cpu)
    }

    fn steal(&mut self, cpu: usize, now: Ns) -> Option<TaskId> {
        self.q0[cpu].pop().or_else(|| self.fair.steal(cpu, now))
    }
}
