//! Round robin (the 2010 customer-appeasement paper's §3.1): one FIFO queue per CPU, a fixed quantum, wakers at the
//! tail, no preemption on wakeup.

use std::collections::VecDeque;

use crate::engine::{How, Ns, Scheduler, TaskId, View};

pub struct RoundRobin {
    quantum: Ns,
    queues: Vec<VecDeque<TaskId>>,
}

impl RoundRobin {
    pub fn new(cpus: usize, quantum: Ns) -> Self {
        RoundRobin {
            quantum,
            queues: vec![VecDeque::new(); cpus],
        }
    }
}

impl Scheduler for RoundRobin {
    fn enqueue(&mut self, cpu: usize, t: TaskId, _now: Ns, _how: How, _view: &View) {
        self.queues[cpu].push_back(t);
    }

    fn pick(&mut self, cpu: usize, _now: Ns, _view: &View) -> Option<TaskId> {
        self.queues[cpu].pop_front()
    }

    fn slice(&mut self, _cpu: usize, _t: TaskId, _now: Ns, _view: &View) -> Ns {
        self.quantum
    }

    fn charge(&mut self, _cpu: usize, _t: TaskId, _ran: Ns, _now: Ns) {}

    fn put_prev(&mut self, cpu: usize, t: TaskId, _now: Ns, runnable: Option<How>, _view: &View) {
        if runnable.is_some() {
            self.queues[cpu].push_back(t);
        }
    }

    fn preempts(&self, _cpu: usize, _curr: TaskId, _woken: TaskId, _now: Ns, _view: &View) -> bool {
        false
    }

    fn nr_queued(&self, cpu: usize) -> usize {
        self.queues[cpu].len()
    }

    fn steal(&mut self, cpu: usize, _now: Ns) -> Option<TaskId> {
        self.queues[cpu].pop_back()
    }
}
