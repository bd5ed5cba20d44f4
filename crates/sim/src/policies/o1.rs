//! Linux 2.6's O(1) scheduler, its core rules: 40 priority lists per CPU in an active and
//! an expired array; dynamic priority = static priority − a bonus of −5..+5 from the
//! sleep average (up to 1 s); time slices by static priority (100 ms at nice 0, 5 ms at
//! nice 19, 800 ms at nice −20); an interactive task whose slice runs out goes back to
//! the active array unless the expired array is starving, others to the expired array;
//! the arrays swap when the active one is empty; a waking task of better priority
//! preempts.

use std::collections::VecDeque;

use crate::engine::{How, Ns, Scheduler, TaskId, TaskInfo, View};

const MAX_SLEEP_AVG: Ns = 1_000_000_000;
const LEVELS: usize = 40;

struct Arrays {
    active: Vec<VecDeque<TaskId>>,
    expired: Vec<VecDeque<TaskId>>,
    nr: usize,
    expired_since: Option<Ns>,
}

pub struct O1 {
    cpus: Vec<Arrays>,
    nice: Vec<i32>,
    sleep_avg: Vec<Ns>,
    slept_at: Vec<Option<Ns>>,
    time_slice: Vec<Ns>,
    prio: Vec<usize>,
    curr: Vec<Option<TaskId>>,
}

fn base_slice(nice: i32) -> Ns {
    let sp = (120 + nice) as u64;
    let per = if sp < 120 { 20 } else { 5 };
    (140 - sp) * per * 1_000_000
}

impl O1 {
    pub fn new(cpus: usize, infos: &[TaskInfo]) -> Self {
        let n = infos.len();
        O1 {
            cpus: (0..cpus)
                .map(|_| Arrays {
                    active: vec![VecDeque::new(); LEVELS],
                    expired: vec![VecDeque::new(); LEVELS],
                    nr: 0,
                    expired_since: None,
                })
                .collect(),
            nice: infos.iter().map(|i| i.nice).collect(),
            sleep_avg: vec![0; n],
            slept_at: vec![None; n],
            time_slice: infos.iter().map(|i| base_slice(i.nice)).collect(),
            prio: infos.iter().map(|i| (i.nice + 20) as usize).collect(),
            curr: vec![None; cpus],
        }
    }

    /// Dynamic priority level 0..39 (0 best).
    fn effective(&self, t: TaskId) -> usize {
        let bonus = (self.sleep_avg[t] * 10 / MAX_SLEEP_AVG) as i32 - 5;
        (self.nice[t] + 20 - bonus).clamp(0, 39) as usize
    }

    fn interactive(&self, t: TaskId) -> bool {
        let delta = self.nice[t] * 10 / 40 + 2;
        self.effective(t) as i32 <= self.nice[t] + 20 - delta
    }

    /// Onto the active array at its priority: a preempted task at the head.
    fn requeue(&mut self, cpu: usize, t: TaskId, how: How) {
        let a = &mut self.cpus[cpu];
        a.nr += 1;
        if how == How::Preempted {
            a.active[self.prio[t]].push_front(t);
        } else {
            a.active[self.prio[t]].push_back(t);
        }
    }

    fn starving(&self, cpu: usize, now: Ns) -> bool {
        let a = &self.cpus[cpu];
        a.expired_since
            .is_some_and(|s| now.saturating_sub(s) >= MAX_SLEEP_AVG * a.nr.max(1) as Ns)
    }
}

impl Scheduler for O1 {
    fn enqueue(&mut self, cpu: usize, t: TaskId, now: Ns, how: How, _view: &View) {
        if how == How::Wakeup {
            if let Some(at) = self.slept_at[t].take() {
                self.sleep_avg[t] = (self.sleep_avg[t] + (now - at)).min(MAX_SLEEP_AVG);
            }
        }
        self.prio[t] = self.effective(t);
        self.requeue(cpu, t, how);
    }

    fn pick(&mut self, cpu: usize, now: Ns, _view: &View) -> Option<TaskId> {
        let a = &mut self.cpus[cpu];
        if a.active.iter().all(VecDeque::is_empty) {
            std::mem::swap(&mut a.active, &mut a.expired);
            a.expired_since = None;
        }
        let t = a.active.iter_mut().find_map(VecDeque::pop_front)?;
        let _ = now;
        self.curr[cpu] = Some(t);
        Some(t)
    }

    fn slice(&mut self, _cpu: usize, t: TaskId, _now: Ns, _view: &View) -> Ns {
        self.time_slice[t]
    }

    fn charge(&mut self, _cpu: usize, t: TaskId, ran: Ns, _now: Ns) {
        self.sleep_avg[t] = self.sleep_avg[t].saturating_sub(ran);
        self.time_slice[t] = self.time_slice[t].saturating_sub(ran);
    }

    fn put_prev(&mut self, cpu: usize, t: TaskId, now: Ns, runnable: Option<How>, _view: &View) {
        self.curr[cpu] = None;
        let a_nr = &mut self.cpus[cpu].nr;
        *a_nr -= 1;
        match runnable {
            None => self.slept_at[t] = Some(now),
            Some(How::Expired) if self.time_slice[t] == 0 => {
                self.time_slice[t] = base_slice(self.nice[t]);
                self.prio[t] = self.effective(t);
                let back_to_active = self.interactive(t) && !self.starving(cpu, now);
                let a = &mut self.cpus[cpu];
                a.nr += 1;
                if back_to_active {
                    a.active[self.prio[t]].push_back(t);
                } else {
                    a.expired_since.get_or_insert(now);
                    a.expired[self.prio[t]].push_back(t);
                }
            }
            Some(how) => self.requeue(cpu, t, how),
        }
    }

    fn preempts(&self, _cpu: usize, curr: TaskId, woken: TaskId, _now: Ns, _view: &View) -> bool {
        self.prio[woken] < self.prio[curr]
    }

    fn nr_queued(&self, cpu: usize) -> usize {
        self.cpus[cpu].nr - self.curr[cpu].is_some() as usize
    }

    fn steal(&mut self, cpu: usize, _now: Ns) -> Option<TaskId> {
        let a = &mut self.cpus[cpu];
        let t = a
            .expired
            .iter_mut()
            .rev()
            .find_map(VecDeque::pop_back)
            .or_else(|| a.active.iter_mut().rev().find_map(VecDeque::pop_back))?;
        a.nr -= 1;
        Some(t)
    }
}
