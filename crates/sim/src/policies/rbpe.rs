//! CFS with request-based priority elevation: the fair class driven by the daemon's own
//! elevation policy (`appease_policy::ElevationPolicy` with the embedded default config),
//! fed with simulated requests, task CPU times and load, as the daemon feeds it with
//! BPF events and /proc readings.

use appease_policy::{
    elevated_nice, sunk_nice, Decision, DenseIndex, ElevationPolicy, LoadTracker, Source,
};

use super::fair::Cfs;
use crate::engine::{How, Ns, Scheduler, TaskId, TaskInfo, View};
use crate::workload::Workload;

/// The daemon's tick and load-sampling periods.
const TICK_NS: Ns = 20_000_000;
const LOAD_NS: Ns = 100_000_000;

pub struct Rbpe {
    fair: Cfs,
    /// Task ids are dense: the policy finds a thread's state by direct index.
    policy: ElevationPolicy<DenseIndex>,
    load: LoadTracker,
    base_nice: Vec<i32>,
    next_load: Ns,
}

impl Rbpe {
    pub fn new(w: &Workload, infos: &[TaskInfo]) -> Self {
        Rbpe {
            fair: Cfs::new(w, infos),
            policy: ElevationPolicy::with_index(
                appease_config::Config::default().elevation_params(),
            ),
            load: LoadTracker::new(w.sim.cpus),
            base_nice: infos.iter().map(|i| i.nice).collect(),
            next_load: 0,
        }
    }

    fn apply(&mut self, d: Decision) {
        match d {
            Decision::Elevate { tid, levels, .. } => {
                let t = tid as TaskId;
                self.fair
                    .set_nice(t, elevated_nice(self.base_nice[t], levels));
            }
            Decision::Restore { tid, .. } => {
                let t = tid as TaskId;
                self.fair.set_nice(t, self.base_nice[t]);
            }
            Decision::Sink { tid, levels, .. } => {
                let t = tid as TaskId;
                self.fair.set_nice(t, sunk_nice(self.base_nice[t], levels));
            }
        }
    }
}

// The fair class's methods are inlined through these into the engine (about 60
// instructions per event fewer, `make sim-instructions`).
impl Scheduler for Rbpe {
    #[inline(always)]
    fn enqueue(&mut self, cpu: usize, t: TaskId, now: Ns, how: How, view: &View) {
        self.fair.enqueue(cpu, t, now, how, view)
    }
    #[inline(always)]
    fn pick(&mut self, cpu: usize, now: Ns, view: &View) -> Option<TaskId> {
        self.fair.pick(cpu, now, view)
    }
    #[inline(always)]
    fn slice(&mut self, cpu: usize, t: TaskId, now: Ns, view: &View) -> Ns {
        self.fair.slice(cpu, t, now, view)
    }
    #[inline(always)]
    fn charge(&mut self, cpu: usize, t: TaskId, ran: Ns, now: Ns) {
        self.fair.charge(cpu, t, ran, now)
    }
    #[inline(always)]
    fn put_prev(&mut self, cpu: usize, t: TaskId, now: Ns, runnable: Option<How>, view: &View) {
        self.fair.put_prev(cpu, t, now, runnable, view)
    }
    #[inline(always)]
    fn preempts(&self, cpu: usize, curr: TaskId, woken: TaskId, now: Ns, view: &View) -> bool {
        self.fair.preempts(cpu, curr, woken, now, view)
    }
    #[inline(always)]
    fn nr_queued(&self, cpu: usize) -> usize {
        self.fair.nr_queued(cpu)
    }
    #[inline(always)]
    fn prefetch_next(&self, cpu: usize) -> Option<TaskId> {
        self.fair.prefetch_next(cpu)
    }
    fn steal(&mut self, cpu: usize, now: Ns) -> Option<TaskId> {
        self.fair.steal(cpu, now)
    }

    fn on_request(&mut self, t: TaskId, now: Ns, unix: bool, view: &View) {
        let source = if unix { Source::Unix } else { Source::Network };
        let cpu = view.tasks[t].cpu_total;
        let id = t as u32;
        if let Some(d) = self
            .policy
            .on_request(now, id, id, id, source, cpu, self.load.current())
        {
            self.apply(d);
        }
    }

    fn tick(&self) -> Option<Ns> {
        Some(TICK_NS)
    }

    fn on_tick(&mut self, now: Ns, view: &View) {
        if now >= self.next_load {
            // Like the daemon: runnable tasks and the PSI "some" counter in µs.
            self.load.sample(
                now,
                view.runnable() as u32,
                Some(view.some_waiting_ns / 1000),
            );
            self.next_load = now + LOAD_NS;
        }
        let decisions = self.policy.on_tick(now, |_, tid| {
            view.tasks.get(tid as usize).map(|t| t.cpu_total)
        });
        for d in decisions {
            self.apply(d);
        }
    }
}
