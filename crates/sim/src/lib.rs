//! `appease sim`: a deterministic discrete-event simulator of N CPUs under a choice of
//! scheduling policies, with the 2010 customer-appeasement paper's customer-unhappiness accounting. Same workload,
//! policy and seed: same numbers, on any machine.

mod cpuset;
pub mod engine;
pub mod policies;
mod stops;
pub mod sweep;
mod timeline;
pub mod workload;

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use engine::{Engine, TaskInfo, MS};
pub use workload::{Workload, WorkloadError};

/// Every policy, in the order `sim compare` shows them.
pub const POLICIES: &[&str] = &[
    "rr",
    "mlfq",
    "o1",
    "staircase",
    "cfs",
    "eevdf",
    "cfs-rbpe",
    "unhappiness",
];

#[derive(Clone, Debug, Serialize)]
pub struct ProcessReport {
    pub name: String,
    pub instances: usize,
    pub cpu_ms: f64,
    /// Share of all CPU time of the run (cpus × duration).
    pub cpu_share: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RequestSummary {
    pub count: usize,
    /// Sent but not answered by the end.
    pub unfinished: usize,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Unhappiness {
    /// Eq. 5: Σ over customers, requests and processes of W(c)·w·u, in ms.
    pub system: f64,
    /// Eq. 4 per customer, in ms.
    pub per_customer: BTreeMap<String, f64>,
    /// Mean unweighted unhappiness of an answered request, ms.
    pub mean_per_request: f64,
}

/// A lock's contention, in the terms of `appease model contention`.
#[derive(Clone, Debug, Serialize)]
pub struct LockReport {
    pub name: String,
    /// Processes that use it.
    pub contenders: usize,
    pub acquisitions: u64,
    pub mean_hold_ms: f64,
    /// Mean time from asking for the lock to getting it.
    pub mean_wait_ms: f64,
    /// Share of the run the lock was held.
    pub utilization: f64,
    /// Mean wait in mean hold times (the model's `wait_per_hold`).
    pub wait_per_hold: f64,
    /// contenders − Λ·W: processors' worth of time not lost waiting.
    pub effective_power: f64,
}

/// One answered request, for the CSV.
#[derive(Clone, Debug, Serialize)]
pub struct RequestRecord {
    /// Index into the workload's customers (`Report::customers`): a run answers
    /// hundreds of thousands of requests, and a name each would be a string copy each.
    pub customer: usize,
    pub arrive_ms: f64,
    pub response_ms: f64,
    pub cpu_ms: f64,
    pub unhappiness_ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub policy: String,
    pub cpus: usize,
    pub duration_ms: f64,
    pub seed: u64,
    pub events: u64,
    pub events_per_sec: f64,
    pub wall_ms: f64,
    /// Busy CPU time / (cpus × duration).
    pub utilization: f64,
    pub processes: Vec<ProcessReport>,
    pub requests: RequestSummary,
    pub unhappiness: Unhappiness,
    /// Only for workloads with `lock` processes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub locks: Vec<LockReport>,
    #[serde(skip)]
    pub records: Vec<RequestRecord>,
    /// The customers' names, in workload order.
    #[serde(skip)]
    pub customers: Vec<String>,
}

fn task_infos(w: &Workload) -> Vec<TaskInfo> {
    let mut v = Vec::new();
    for p in &w.process {
        let group = p.group.as_ref().map_or(0, |g| {
            1 + w
                .group
                .iter()
                .position(|d| d.path.get_ref() == g.get_ref())
                .expect("checked")
        });
        for _ in 0..p.count {
            v.push(TaskInfo {
                nice: p.nice,
                class: p.sched,
                group,
                slice: p.slice_ms.map(engine::ms),
            });
        }
    }
    v
}

/// Runs the engine with a policy: the outcome and the wall time in seconds.
struct Timed<'w>(&'w Workload);

impl<'w> policies::WithPolicy<'w> for Timed<'w> {
    type Out = (engine::Outcome, f64);
    fn with<S: engine::Scheduler + 'w>(self, sched: S) -> Self::Out {
        let started = Instant::now();
        let out = Engine::new(self.0, sched).run();
        (out, started.elapsed().as_secs_f64())
    }
}

/// The `p`th percentile of sorted values by nearest rank (0 when there are none).
pub(crate) fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

/// Runs `w` under `policy` (the workload's own when None).
pub fn run(w: &Workload, policy: Option<&str>) -> Result<Report, String> {
    let name = policy.unwrap_or(w.sim.policy.get_ref()).to_string();
    let infos = task_infos(w);
    let (out, wall) = policies::build(&name, w, &infos, Timed(w))
        .ok_or_else(|| format!("unknown policy {name:?} (one of {})", POLICIES.join(", ")))?;
    let total = out.duration as f64 * w.sim.cpus as f64;
    let busy: u64 = out.busy.iter().sum();

    let mut processes: Vec<ProcessReport> = w
        .process
        .iter()
        .map(|p| ProcessReport {
            name: p.name.get_ref().clone(),
            instances: p.count,
            cpu_ms: 0.0,
            cpu_share: 0.0,
        })
        .collect();
    for t in &out.view.tasks {
        processes[t.process as usize].cpu_ms += t.cpu_total as f64 / MS;
    }
    for p in &mut processes {
        p.cpu_share = p.cpu_ms * MS / total;
    }

    let mut unhappiness = Unhappiness::default();
    for c in &w.customer {
        unhappiness.per_customer.insert(c.name.clone(), 0.0);
    }
    let mut records = Vec::new();
    let unfinished = out.view.unanswered();
    let mut answered = out.view.answered;
    answered.sort_unstable_by_key(|a| a.id); // arrival order
    for r in &answered {
        let done = r.done;
        let c = &w.customer[r.customer];
        let u = r.unhappiness / MS;
        let weighted = c.weight * c.request_weight * u;
        unhappiness.system += weighted;
        *unhappiness.per_customer.get_mut(&c.name).expect("inserted") += weighted;
        records.push(RequestRecord {
            customer: r.customer,
            arrive_ms: r.arrive as f64 / MS,
            response_ms: (done - r.arrive) as f64 / MS,
            cpu_ms: r.cpu as f64 / MS,
            unhappiness_ms: u,
        });
    }
    if !records.is_empty() {
        unhappiness.mean_per_request =
            records.iter().map(|r| r.unhappiness_ms).sum::<f64>() / records.len() as f64;
    }
    let mut rt: Vec<f64> = records.iter().map(|r| r.response_ms).collect();
    rt.sort_by(f64::total_cmp);
    let pct = |p: f64| nearest_rank(&rt, p);
    let requests = RequestSummary {
        count: rt.len(),
        unfinished,
        mean_ms: if rt.is_empty() {
            0.0
        } else {
            rt.iter().sum::<f64>() / rt.len() as f64
        },
        p50_ms: pct(50.0),
        p99_ms: pct(99.0),
        max_ms: rt.last().copied().unwrap_or(0.0),
    };
    Ok(Report {
        policy: name,
        cpus: w.sim.cpus,
        duration_ms: w.sim.duration_ms,
        seed: w.sim.seed,
        events: out.events,
        events_per_sec: out.events as f64 / wall.max(1e-9),
        wall_ms: wall * 1e3,
        utilization: busy as f64 / total,
        processes,
        requests,
        unhappiness,
        locks: out
            .locks
            .iter()
            .map(|l| lock_report(l, out.duration))
            .collect(),
        records,
        customers: w.customer.iter().map(|c| c.name.clone()).collect(),
    })
}

fn lock_report(l: &engine::Lock, duration: engine::Ns) -> LockReport {
    let per = |total: u128, n: u64| {
        if n == 0 {
            0.0
        } else {
            total as f64 / n as f64 / MS
        }
    };
    let mean_hold_ms = per(l.hold_ns, l.releases);
    let mean_wait_ms = per(l.wait_ns, l.acquisitions);
    let d = duration.max(1) as f64;
    LockReport {
        name: l.name.clone(),
        contenders: l.contenders,
        acquisitions: l.acquisitions,
        mean_hold_ms,
        mean_wait_ms,
        utilization: (l.hold_ns + l.open_hold_ns) as f64 / d,
        wait_per_hold: if mean_hold_ms > 0.0 {
            mean_wait_ms / mean_hold_ms
        } else {
            0.0
        },
        effective_power: l.contenders as f64 - l.wait_ns as f64 / d,
    }
}

/// The per-request CSV (`--out`).
pub fn records_csv(r: &Report) -> String {
    let mut s = String::from("policy,customer,arrive_ms,response_ms,cpu_ms,unhappiness_ms\n");
    for x in &r.records {
        s += &format!(
            "{},{},{:.6},{:.6},{:.6},{:.6}\n",
            r.policy,
            r.customers[x.customer],
            x.arrive_ms,
            x.response_ms,
            x.cpu_ms,
            x.unhappiness_ms
        );
    }
    s
}

/// One line per policy: what `sim compare` prints.
pub fn table(reports: &[Report]) -> String {
    let mut s = format!(
        "{:<12} {:>7} {:>9} {:>9} {:>9} {:>9} {:>12} {:>10}  cpu share per process\n",
        "policy", "util%", "req", "mean ms", "p99 ms", "max ms", "unhappy ms", "Mevents/s"
    );
    for r in reports {
        let shares: Vec<String> = r
            .processes
            .iter()
            .map(|p| format!("{} {:.1}%", p.name, 100.0 * p.cpu_share))
            .collect();
        s += &format!(
            "{:<12} {:>7.1} {:>9} {:>9.2} {:>9.2} {:>9.2} {:>12.1} {:>10.2}  {}\n",
            r.policy,
            100.0 * r.utilization,
            r.requests.count,
            r.requests.mean_ms,
            r.requests.p99_ms,
            r.requests.max_ms,
            r.unhappiness.system,
            r.events_per_sec / 1e6,
            shares.join(", ")
        );
    }
    s
}
