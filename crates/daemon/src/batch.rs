//! The daemon's side of batch demotion: scans the process table, remembers who received
//! requests, matches rules, and hands the classifier's decisions to the actuator.

use std::collections::HashMap;

use appease_actuator::{ActError, KernelActuator};
use appease_config::Config;
use appease_policy::batch::{BatchClassifier, BatchDecision, Class, ProcSample};
use appease_policy::floor::FloorDecision;
use appease_policy::group_mode::{GroupMode, GroupModeKeeper};
use serde::{Deserialize, Serialize};

use crate::host;

pub struct BatchManager {
    classifier: BatchClassifier,
    /// pid -> when any of its threads last received a request.
    last_request: HashMap<u32, u64>,
    /// pid -> (start, cpu_ns, wait_ns) at the last scan: wait time is only re-read for
    /// processes that ran since (reading every thread of every process would cost more).
    seen: HashMap<u32, (u64, u64, u64)>,
    last_scan: Option<u64>,
    next_scan: u64,
    /// Idle, quiet or floor: what the batch group should be, and what it is.
    mode: GroupModeKeeper,
    applied: GroupMode,
    /// The idle group's share of all CPUs over the last scan, percent.
    share_pct: f64,
    /// Processes with a role (fixed nice): request elevation leaves them alone.
    roles: HashMap<u32, i32>,
}

/// The idle group as `appease status` shows it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BatchView {
    /// Share of all CPUs the idle group got over the last scan, percent.
    pub share_pct: f64,
    /// idle (cpu.idle = 1), quiet (no request for a while: a normal weighted group, fair
    /// among batch jobs) or floor (starved while idle: a small weight for a while).
    pub mode: Option<GroupMode>,
    /// The starvation floor is engaged (cpu.idle lifted) right now.
    pub floor_lifted: bool,
    /// How often the floor engaged.
    pub floor_lifts: u64,
}

impl BatchManager {
    pub fn new(cfg: &Config, now: u64) -> Self {
        BatchManager {
            classifier: BatchClassifier::new(cfg.batch_params(clock_tick())),
            last_request: HashMap::new(),
            seen: HashMap::new(),
            last_scan: None,
            next_scan: 0,
            mode: GroupModeKeeper::new(cfg.quiet_after(), cfg.floor_params(), now),
            applied: GroupMode::Idle,
            share_pct: 0.0,
            roles: HashMap::new(),
        }
    }

    /// Whether `pid` has a fixed role priority.
    pub fn is_role(&self, pid: u32) -> bool {
        self.roles.contains_key(&pid)
    }

    pub fn set_config(&mut self, cfg: &Config) {
        self.classifier.set_params(cfg.batch_params(clock_tick()));
        self.mode.set_params(cfg.quiet_after(), cfg.floor_params());
    }

    pub fn view(&self) -> BatchView {
        BatchView {
            share_pct: self.share_pct,
            mode: Some(self.applied),
            floor_lifted: self.mode.floor.lifted(),
            floor_lifts: self.mode.floor.lifts,
        }
    }

    pub fn next_scan(&self) -> u64 {
        self.next_scan
    }

    /// A request arrived: a quiet batch group becomes idle again at once, and a demoted
    /// tree that receives one is scanned (and promoted) at once.
    pub fn on_request(
        &mut self,
        pid: u32,
        ts_ns: u64,
        cfg: &Config,
        actuator: &mut KernelActuator,
    ) {
        self.last_request.insert(pid, ts_ns);
        self.mode.on_request(ts_ns);
        self.sync_mode(ts_ns, cfg, actuator);
        if self.classifier.tree_of(pid).is_some() {
            self.next_scan = 0;
        }
    }

    /// Gives the batch group the mode it should have now, if it has not got it yet.
    fn sync_mode(&mut self, now: u64, cfg: &Config, actuator: &mut KernelActuator) {
        if actuator.take_batch_remade() {
            self.applied = GroupMode::Idle;
        }
        let want = self.mode.mode(now);
        if want == self.applied {
            return;
        }
        let weight = match want {
            GroupMode::Idle => None,
            GroupMode::Quiet => Some(cfg.batch.quiet_weight),
            GroupMode::Floor => Some(cfg.batch.floor_weight),
        };
        match actuator.set_batch_weight(weight) {
            Ok(false) => {} // no group yet: it is created idle; applied on a later pass
            Ok(true) => {
                tracing::info!(from = ?self.applied, to = ?want, ?weight, "batch group mode");
                self.applied = want;
            }
            Err(e) => {
                tracing::warn!(error = %e, to = ?want, "could not change the batch group's mode")
            }
        }
    }

    pub fn on_process_exit(&mut self, pid: u32) {
        self.last_request.remove(&pid);
    }

    pub fn scan(&mut self, now: u64, cfg: &Config, actuator: &mut KernelActuator) {
        self.next_scan = now + cfg.batch.scan_ms * 1_000_000;
        // A removed group was empty: what this daemon demoted has all left it, and a
        // tree still soaking is demoted again (into the group made again) like a new one.
        if actuator.batch_group_vanished() {
            for root in self.classifier.demoted_roots() {
                self.classifier.forget(root);
            }
        }
        let mut procs = host::scan_processes();
        // Starved processes in the idle group barely run, yet their waiting is exactly
        // what the floor must see: always re-read theirs.
        let in_group: std::collections::HashSet<u32> =
            actuator.batch_processes().into_iter().collect();
        for p in &mut procs {
            p.wait_ns = match self.seen.get(&p.pid) {
                Some(&(start, cpu, wait))
                    if start == p.start && cpu == p.cpu_ns && !in_group.contains(&p.pid) =>
                {
                    wait
                }
                _ => host::wait_ns_of(p.pid).unwrap_or(0),
            };
        }
        self.apply_floor(now, cfg, &procs, &in_group);
        self.sync_mode(now, cfg, actuator);
        actuator.release_ended_in_place();
        if cfg.batch.enabled {
            actuator.keep_besteffort_pods_idle();
            actuator.keep_engine_parents_idle();
        }
        self.seen = procs
            .iter()
            .map(|p| (p.pid, (p.start, p.cpu_ns, p.wait_ns)))
            .collect();
        self.last_scan = Some(now);
        let (mut forced, services, roles) = classify_by_config(cfg, &procs);
        // The processes this daemon runs under supervise it: never part of a batch tree
        // (else a soaker started by the script that started appease takes the script,
        // and everything else it runs, into the idle group).
        for pid in ancestors_of(std::process::id(), &procs) {
            forced.entry(pid).or_insert(Class::Normal);
        }
        place_services(&procs, &services, actuator);
        apply_roles(&roles, actuator);
        self.roles = roles
            .into_iter()
            .map(|(pid, (nice, _))| (pid, nice))
            .collect();
        let last = &self.last_request;
        let decisions = if cfg.batch.enabled {
            self.classifier.on_scan(
                now,
                &procs,
                |pid| last.get(&pid).copied(),
                |p| forced.get(&p.pid).copied(),
            )
        } else {
            Vec::new()
        };
        let started: std::collections::HashMap<u32, u64> = if decisions.is_empty() {
            Default::default()
        } else {
            procs.iter().map(|p| (p.pid, p.start)).collect()
        };
        for d in decisions {
            match d {
                BatchDecision::Demote {
                    root,
                    members,
                    cpus,
                    why,
                } => {
                    let why = format!("{why}: {cpus:.2} CPUs, no requests");
                    // With the start time the scan saw: a PID reused since is not ours.
                    let members: Vec<(u32, u64)> = members
                        .iter()
                        .filter_map(|pid| Some((*pid, started.get(pid).copied()?)))
                        .collect();
                    match actuator.demote(root, &members, &why) {
                        Ok(0) => self.classifier.forget(root), // all gone already
                        Ok(_) => {}
                        Err(e) => {
                            log_failure(&e, root, "demote");
                            self.classifier.forget(root);
                        }
                    }
                }
                BatchDecision::Promote { root, members } => {
                    if let Err(e) = actuator.promote(root, &members) {
                        log_failure(&e, root, "promote");
                    }
                }
            }
        }
        // A group created by this scan's demotions starts idle: give it its mode.
        self.sync_mode(now, cfg, actuator);
        // Requests of processes that are gone need not be remembered.
        let alive: std::collections::HashSet<u32> = procs.iter().map(|p| p.pid).collect();
        self.last_request.retain(|pid, _| alive.contains(pid));
    }
}

impl BatchManager {
    /// Measures the idle group's CPU share since the last scan and feeds the floor.
    fn apply_floor(
        &mut self,
        now: u64,
        cfg: &Config,
        procs: &[ProcSample],
        in_group: &std::collections::HashSet<u32>,
    ) {
        let Some(last) = self.last_scan else { return };
        let dt = now.saturating_sub(last) as f64;
        if in_group.is_empty() || dt <= 0.0 {
            self.share_pct = 0.0;
            return;
        }
        let (mut cpu, mut wait) = (0u64, 0u64);
        for p in procs.iter().filter(|p| in_group.contains(&p.pid)) {
            if let Some(&(start, c, w)) = self.seen.get(&p.pid) {
                if start == p.start {
                    cpu += p.cpu_ns.saturating_sub(c);
                    wait += p.wait_ns.saturating_sub(w);
                }
            }
        }
        self.share_pct = 100.0 * cpu as f64 / (dt * host::cpus() as f64);
        // Waiting more than a tenth of the time counts as having runnable work; so does a
        // member runnable now, since a thread starved all scan long adds nothing to
        // run_delay until it next gets the CPU.
        let waiting = wait as f64 > 0.1 * dt || in_group.iter().any(|&pid| host::runnable_now(pid));
        tracing::debug!(
            share_pct = self.share_pct,
            waiting,
            processes = in_group.len(),
            "idle group"
        );
        match self.mode.on_floor_sample(now, self.share_pct, waiting) {
            Some(FloorDecision::Lift) => tracing::warn!(
                share_pct = self.share_pct,
                after_ms = cfg.batch.floor_after_ms,
                hold_ms = cfg.batch.floor_hold_ms,
                weight = cfg.batch.floor_weight,
                "starvation floor: batch work starved, lifting the idle flag for a while"
            ),
            Some(FloorDecision::Lower) => {
                tracing::info!("starvation floor released")
            }
            None => {}
        }
    }
}

/// Moves each configured service's processes (with their current children) into its
/// group; children forked later are born there.
fn place_services(
    procs: &[ProcSample],
    services: &HashMap<u32, String>,
    actuator: &mut KernelActuator,
) {
    if services.is_empty() {
        return;
    }
    let children = appease_policy::tree::Children::new(procs.iter().map(|p| (p.pid, p.ppid)));
    for (&pid, group) in services {
        if actuator.is_moved(pid) {
            continue;
        }
        let members = children.subtree(pid);
        if let Err(e) = actuator.place_in_service(group, pid, &members, "configured service") {
            log_failure(&e, pid, "place in its service group");
        }
    }
}

fn log_failure(e: &ActError, root: u32, what: &str) {
    match e {
        ActError::Cgroup(c) if c.is_gone() => tracing::debug!(root, what, "tree or group vanished"),
        _ => tracing::warn!(root, error = %e, "could not {what} process tree"),
    }
}

type Roles = HashMap<u32, (i32, String)>;

/// Classes forced by the config's rules, services and roles; each service's processes;
/// each role process's fixed nice and label.
/// The host's clock tick, in which /proc counts CPU time.
fn clock_tick() -> std::time::Duration {
    std::time::Duration::from_nanos(appease_cgroup::clock_tick_ns())
}

fn classify_by_config(
    cfg: &Config,
    procs: &[ProcSample],
) -> (HashMap<u32, Class>, HashMap<u32, String>, Roles) {
    let (mut forced, mut services, mut roles) = (HashMap::new(), HashMap::new(), HashMap::new());
    if cfg.rules.is_empty() && cfg.services.is_empty() && cfg.role.is_empty() {
        return (forced, services, roles);
    }
    let (need_cgroup, need_uid) = cfg.matching_needs();
    for p in procs.iter().filter(|p| !p.kernel_thread) {
        let cgroup = need_cgroup.then(|| host::cpu_cgroup_of(p.pid)).flatten();
        let uid = need_uid.then(|| host::uid_of_process(p.pid)).flatten();
        if let Some(c) = cfg.forced_class(&p.comm, cgroup.as_deref(), uid) {
            forced.insert(p.pid, c);
        }
        if let Some(svc) = cfg.service_of(&p.comm, cgroup.as_deref(), uid) {
            services.insert(p.pid, format!("/{}", svc.group_name()));
        }
        if let Some((role, nice)) = cfg.role_of(&p.comm, cgroup.as_deref(), uid) {
            roles.insert(
                p.pid,
                (nice, format!("role {} rank {}", role.app, role.rank)),
            );
        }
    }
    (forced, services, roles)
}

/// Gives every thread of each role process its fixed nice (new threads included).
fn apply_roles(roles: &Roles, actuator: &mut KernelActuator) {
    for (&pid, (nice, label)) in roles {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for tid in tasks
            .flatten()
            .filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok())
        {
            match actuator.fix_nice(pid, tid, *nice, label) {
                Ok(()) | Err(ActError::Gone { .. }) | Err(ActError::HandsOff { .. }) => {}
                Err(e) => {
                    tracing::warn!(pid, tid, error = %e, "could not give a role its priority")
                }
            }
        }
    }
}

/// The parent, grandparent, ... of `pid` among `procs`, up to the first process whose
/// parent is unknown (or itself).
fn ancestors_of(pid: u32, procs: &[ProcSample]) -> Vec<u32> {
    let ppid: HashMap<u32, u32> = procs.iter().map(|p| (p.pid, p.ppid)).collect();
    let mut out = Vec::new();
    let mut at = pid;
    while let Some(&parent) = ppid.get(&at) {
        if parent == at || parent == 0 || out.contains(&parent) {
            break;
        }
        out.push(parent);
        at = parent;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(pid: u32, ppid: u32) -> ProcSample {
        ProcSample {
            pid,
            ppid,
            comm: "p".into(),
            start: 1,
            cpu_ns: 0,
            wait_ns: 0,
            kernel_thread: false,
            has_tty: false,
            age_ns: 0,
        }
    }

    #[test]
    fn ancestors_climb_to_the_first_unknown_parent() {
        // 1 -> 40 -> 41 -> 50 (the daemon); 60 is a sibling's child.
        let procs = [
            proc(1, 0),
            proc(40, 1),
            proc(41, 40),
            proc(50, 41),
            proc(60, 41),
        ];
        assert_eq!(ancestors_of(50, &procs), vec![41, 40, 1]);
        assert_eq!(ancestors_of(60, &procs), vec![41, 40, 1]);
        assert!(ancestors_of(1, &procs).is_empty());
        // A parent missing from the table ends the climb; a loop does not hang it.
        assert_eq!(ancestors_of(7, &[proc(7, 8)]), vec![8]);
        assert_eq!(ancestors_of(7, &[proc(7, 8), proc(8, 7)]), vec![8, 7]);
    }
}
