//! The scheduling policies the simulator compares.

mod eevdf_queues;
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

/// What to do with a policy once it is built: generic over the policy's type, so that
/// the engine is compiled for each one (see [`crate::engine::Engine`]).
pub trait WithPolicy<'w> {
    type Out;
    fn with<S: Scheduler + 'w>(self, sched: S) -> Self::Out;
}

/// Builds the policy `name` (one of [`crate::POLICIES`]) and hands it to `then`; None
/// for an unknown name.
pub fn build<'w, F: WithPolicy<'w>>(
    name: &str,
    w: &'w Workload,
    infos: &[TaskInfo],
    then: F,
) -> Option<F::Out> {
    let t = &w.tunables;
    let cpus = w.sim.cpus;
    Some(match name {
        "rr" => then.with(rr::RoundRobin::new(cpus, ms(t.quantum_ms))),
        "mlfq" => then.with(mlfq::Mlfq::new(
            cpus,
            infos.len(),
            ms(t.quantum_ms),
            t.mlfq_queues,
        )),
        "o1" => then.with(o1::O1::new(cpus, infos)),
        "staircase" => then.with(staircase::Staircase::new(cpus, infos)),
        "cfs" => then.with(fair::Cfs::new(w, infos)),
        "eevdf" => then.with(fair::Eevdf::new(w, infos)),
        "cfs-rbpe" => then.with(rbpe::Rbpe::new(w, infos)),
        "unhappiness" => then.with(ideal::Ideal::new(w, infos)),
        _ => return None,
    })
}
