//! Con Kolivas's Staircase scheduler, its core rules: a task starts at the top of its
//! staircase, `best = nice level − burst`, and drops one priority level for every
//! RR_INTERVAL (10 ms) of CPU it uses; falling off the bottom costs one level of burst
//! and starts it at the top again. A task that slept at least one interval gains a level
//! of burst (up to its nice level) and starts at the top. Priority lists per CPU; a
//! waking task of better priority preempts.

use std::collections::VecDeque;

use crate::engine::{How, Ns, Scheduler, TaskId, TaskInfo, View};

const RR_INTERVAL: Ns = 10_000_000;
const LEVELS: usize = 40;

pub struct Staircase {
    queues: Vec<Vec<VecDeque<TaskId>>>,
    nr: Vec<usize>,
    curr: Vec<Option<TaskId>>,
    base: Vec<usize>,
    burst: Vec<usize>,
    step: Vec<usize>,
    used: Vec<Ns>,
    slept_at: Vec<Option<Ns>>,
}

impl Staircase {
    pub fn new(cpus: usize, infos: &[TaskInfo]) -> Self {
        let n = infos.len();
        Staircase {
            queues: vec![vec![VecDeque::new(); LEVELS]; cpus],
            nr: vec![0; cpus],
            curr: vec![None; cpus],
            base: infos.iter().map(|i| (i.nice + 20) as usize).collect(),
            burst: vec![0; n],
            step: vec![0; n],
            used: vec![0; n],
            slept_at: vec![None; n],
        }
    }

    fn prio(&self, t: TaskId) -> usize {
        (self.base[t] - self.burst[t] + self.step[t]).min(LEVELS - 1)
    }
}

impl Scheduler for Staircase {
    fn enqueue(&mut self, cpu: usize, t: TaskId, now: Ns, how: How, _view: &View) {
        if how == How::Wakeup {
            if let Some(at) = self.slept_at[t].take() {
                if now - at >= RR_INTERVAL {
                    self.burst[t] = (self.burst[t] + 1).min(self.base[t]);
                }
                self.step[t] = 0;
                self.used[t] = 0;
            }
        }
        self.nr[cpu] += 1;
        let p = self.prio(t);
        self.queues[cpu][p].push_back(t);
    }

    fn pick(&mut self, cpu: usize, _now: Ns, _view: &View) -> Option<TaskId> {
        let t = self.queues[cpu].iter_mut().find_map(VecDeque::pop_front)?;
        self.curr[cpu] = Some(t);
        Some(t)
    }

    fn slice(&mut self, _cpu: usize, t: TaskId, _now: Ns, _view: &View) -> Ns {
        RR_INTERVAL - self.used[t]
    }

    fn charge(&mut self, _cpu: usize, t: TaskId, ran: Ns, _now: Ns) {
        self.used[t] += ran;
        while self.used[t] >= RR_INTERVAL {
            self.used[t] -= RR_INTERVAL;
            if self.base[t] - self.burst[t] + self.step[t] >= LEVELS - 1 {
                // Off the bottom: less burst, back to the top.
                self.burst[t] = self.burst[t].saturating_sub(1);
                self.step[t] = 0;
            } else {
                self.step[t] += 1;
            }
        }
    }

    fn put_prev(&mut self, cpu: usize, t: TaskId, now: Ns, runnable: Option<How>, _view: &View) {
        self.curr[cpu] = None;
        self.nr[cpu] -= 1;
        match runnable {
            None => self.slept_at[t] = Some(now),
            Some(how) => {
                self.nr[cpu] += 1;
                let p = self.prio(t);
                if how == How::Preempted {
                    self.queues[cpu][p].push_front(t);
                } else {
                    self.queues[cpu][p].push_back(t);
                }
            }
        }
    }

    fn preempts(&self, _cpu: usize, curr: TaskId, woken: TaskId, _now: Ns, _view: &View) -> bool {
        self.prio(woken) < self.prio(curr)
    }

    fn nr_queued(&self, cpu: usize) -> usize {
        self.nr[cpu] - self.curr[cpu].is_some() as usize
    }

    fn steal(&mut self, cpu: usize, _now: Ns) -> Option<TaskId> {
        let t = self.queues[cpu]
            .iter_mut()
            .rev()
            .find_map(VecDeque::pop_back)?;
        self.nr[cpu] -= 1;
        Some(t)
    }
}
