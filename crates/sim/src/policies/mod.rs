//! The scheduling policies the simulator compares.

pub mod fair;
pub mod ideal;
pub mod mlfq;
pub mod o1;
pub mod rbpe;
pub mod rr;
mod runq;
pub mod staircase;

use crate::engine::{ms, Scheduler, TaskInfo};
use crate::workload::Workload;

/// Builds the policy `name` (one of [`crate::POLICIES`]).
pub fn build<'w>(
    name: &str,
    w: &'w Workload,
    infos: &[TaskInfo],
) -> Option<Box<dyn Scheduler + 'w>> {
    let t = &w.tunables;
    let cpus = w.sim.cpus;
    Some(match name {
        "rr" => Box::new(rr::RoundRobin::new(cpus, ms(t.quantum_ms))),
        "mlfq" => Box::new(mlfq::Mlfq::new(
            cpus,
            infos.len(),
            ms(t.quantum_ms),
            t.mlfq_queues,
        )),
        "o1" => Box::new(o1::O1::new(cpus, infos)),
        "staircase" => Box::new(staircase::Staircase::new(cpus, infos)),
        "cfs" => Box::new(fair::Fair::new(fair::Mode::Cfs, w, infos)),
        "eevdf" => Box::new(fair::Fair::new(fair::Mode::Eevdf, w, infos)),
        "cfs-rbpe" => Box::new(rbpe::Rbpe::new(w, infos)),
        "unhappiness" => Box::new(ideal::Ideal::new(w, infos)),
        _ => return None,
    })
}
