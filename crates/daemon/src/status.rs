//! The daemon's state as `appease status`, `appease top` and the metrics endpoint see it,
//! published once a second through the control socket.

use appease_actuator::{ActCounters, AutogroupView, ManagedView, MovedView};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Status {
    pub pid: u32,
    /// Seconds since the epoch.
    pub started: u64,
    pub updated: u64,
    pub config: String,
    pub dry_run: bool,
    pub cpus: usize,
    pub load: LoadView,
    pub probe: ProbeView,
    pub actuator: ActuatorView,
    /// Read -> elevation applied, for requests that woke the daemon at once (the first
    /// of a burst: the latency that matters).
    pub elevation_latency_us: LatencyView,
    /// The same for requests of threads already busy, read at the next tick.
    pub deferred_elevation_latency_us: LatencyView,
    /// Threads under watch for their CPU budget (elevated or recently so).
    pub watched: usize,
    pub threads: Vec<ThreadStatus>,
    /// Processes in the idle group: pid, comm, class, group, original group, tree, why, since.
    #[serde(default)]
    pub processes: Vec<ProcessStatus>,
    /// Serving processes' session autogroups appease raised (`[batch] serving_autogroup_nice`).
    #[serde(default)]
    pub autogroups: Vec<AutogroupView>,
    /// The idle group: its CPU share and the starvation floor (None when batch demotion is off).
    #[serde(default)]
    pub batch: Option<crate::batch::BatchView>,
    /// The host's layout, detected at start, and what of appease's work has effect on it.
    #[serde(default)]
    pub layout: LayoutView,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LayoutView {
    /// cgroup-v1, cgroup-v2, cgroup-v2-systemd or none.
    pub kind: String,
    pub cpu_hierarchy: Option<String>,
    pub systemd: bool,
    /// The container appease itself runs in, if any.
    pub container: Option<String>,
    /// The sched_ext scheduler loaded, if any.
    pub sched_ext: Option<String>,
    pub effects: String,
}

impl From<&appease_cgroup::HostLayout> for LayoutView {
    fn from(l: &appease_cgroup::HostLayout) -> Self {
        LayoutView {
            kind: l.kind.name().to_string(),
            cpu_hierarchy: l.cpu_hierarchy.as_ref().map(|p| p.display().to_string()),
            systemd: l.systemd,
            container: l.container.clone(),
            sched_ext: l.sched_ext.clone(),
            effects: l.effects(),
        }
    }
}

pub type ProcessStatus = MovedView;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LoadView {
    pub runnable_per_cpu: f64,
    /// Threads running or waiting in an idle cgroup at the last load sample, left out of
    /// `runnable_per_cpu`.
    #[serde(default)]
    pub idle_group_runnable: u32,
    pub psi_some_pct: f64,
    pub ladder_step: usize,
    pub unix_nice: i32,
    pub inet_nice: i32,
    pub decay_ms: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ProbeView {
    pub socket_reads: u64,
    pub request_events: u64,
    pub lost_events: u64,
    /// Reads on the side of a connection its process connected: responses to its own
    /// requests (a client's, a dump's, a download's), never a request.
    #[serde(default)]
    pub response_reads: u64,
    /// Requests of unprivileged users beyond their events' bound (`[users]`), dropped in
    /// the kernel.
    #[serde(default)]
    pub throttled_events: u64,
    /// Requests after a quiet spell of held threads (elevated already, or their budget
    /// spent), read at the next tick instead of waking the daemon.
    #[serde(default)]
    pub held_requests: u64,
    /// Requests that woke the daemon at once (the rest are read at its next tick).
    #[serde(default)]
    pub waking_requests: u64,
    /// Whether the lock-wait hook (on every context switch) is attached: while an
    /// application has sunk threads or demoted trees, and for a while after.
    #[serde(default)]
    pub lock_wait_hook: bool,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ActuatorView {
    pub changes: u64,
    pub restores: u64,
    pub gone: u64,
    pub hands_off: u64,
    pub failures: u64,
    /// Failures by what refused (errno name, "journal", "systemd").
    #[serde(default)]
    pub failures_by_cause: std::collections::BTreeMap<String, u64>,
    #[serde(default)]
    pub demotions: u64,
    #[serde(default)]
    pub promotions: u64,
}

impl From<ActCounters> for ActuatorView {
    fn from(c: ActCounters) -> Self {
        ActuatorView {
            changes: c.changes,
            restores: c.restores,
            gone: c.gone,
            hands_off: c.hands_off,
            failures: c.failures,
            failures_by_cause: c.failures_by_cause,
            demotions: c.demotions,
            promotions: c.promotions,
        }
    }
}

/// Time from a request's socket read (in the kernel) to its elevation being applied.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LatencyView {
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ThreadStatus {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub class: String,
    pub nice: i32,
    pub original_nice: i32,
    pub levels: u32,
    pub slice_us: u64,
    pub budget_ms: f64,
    pub why: String,
    pub since: u64,
}

impl ThreadStatus {
    pub fn new(m: ManagedView, levels: u32, budget_ms: f64) -> Self {
        ThreadStatus {
            pid: m.pid,
            tid: m.tid,
            comm: m.comm,
            class: m.class.to_string(),
            nice: m.nice,
            original_nice: m.original_nice,
            levels,
            slice_us: m.slice_ns / 1000,
            budget_ms,
            why: m.why,
            since: m.since,
        }
    }
}
