//! Multilevel feedback queues (the 2010 customer-appeasement paper's §3.2): queues Q0..Qm-1 with quantum 2^i·q and
//! strict priority between them. A task that uses up its quantum in Qi moves to Qi+1;
//! a waking task starts again at the tail of Q0 and preempts a task from a lower queue.

use std::collections::VecDeque;

use crate::engine::{How, Ns, Scheduler, TaskId, View};

pub struct Mlfq {
    quantum: Ns,
    /// Per CPU, per level.
    queues: Vec<Vec<VecDeque<TaskId>>>,
    level: Vec<usize>,
    /// CPU used in the current quantum (a preempted task keeps the rest).
    used: Vec<Ns>,
}

impl Mlfq {
    pub fn new(cpus: usize, tasks: usize, quantum: Ns, levels: usize) -> Self {
        Mlfq {
            quantum,
            queues: vec![vec![VecDeque::new(); levels]; cpus],
            level: vec![0; tasks],
            used: vec![0; tasks],
        }
    }

    fn top_level(&self, cpu: usize) -> Option<usize> {
        self.queues[cpu].iter().position(|q| !q.is_empty())
    }
}

impl Scheduler for Mlfq {
    fn enqueue(&mut self, cpu: usize, t: TaskId, _now: Ns, how: How, _view: &View) {
        if matches!(how, How::Wakeup | How::New) {
            self.level[t] = 0;
            self.used[t] = 0;
        }
        self.queues[cpu][self.level[t]].push_back(t);
    }

    fn pick(&mut self, cpu: usize, _now: Ns, _view: &View) -> Option<TaskId> {
        let l = self.top_level(cpu)?;
        self.queues[cpu][l].pop_front()
    }

    fn slice(&mut self, _cpu: usize, t: TaskId, _now: Ns, _view: &View) -> Ns {
        (self.quantum << self.level[t]).saturating_sub(self.used[t])
    }

    fn charge(&mut self, _cpu: usize, t: TaskId, ran: Ns, _now: Ns) {
        self.used[t] += ran;
    }

    fn put_prev(&mut self, cpu: usize, t: TaskId, _now: Ns, runnable: Option<How>, _view: &View) {
        match runnable {
            Some(How::Expired) => {
                self.level[t] = (self.level[t] + 1).min(self.queues[cpu].len() - 1);
                self.used[t] = 0;
                self.queues[cpu][self.level[t]].push_back(t);
            }
            // Preempted: back to the head of its queue with the rest of its quantum.
            Some(_) => self.queues[cpu][self.level[t]].push_front(t),
            None => {}
        }
    }

    fn preempts(&self, _cpu: usize, curr: TaskId, woken: TaskId, _now: Ns, _view: &View) -> bool {
        self.level[woken] < self.level[curr]
    }

    fn nr_queued(&self, cpu: usize) -> usize {
        self.queues[cpu].iter().map(VecDeque::len).sum()
    }

    fn steal(&mut self, cpu: usize, _now: Ns) -> Option<TaskId> {
        self.queues[cpu]
            .iter_mut()
            .rev()
            .find_map(VecDeque::pop_back)
    }
}
