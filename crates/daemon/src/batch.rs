//! The daemon's side of batch demotion: remembers who received requests, asks the
//! scanner thread for scans and acts on what they found (the classifying happens there,
//! off the event loop), and keeps the idle group's mode.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use appease_actuator::{ActError, KernelActuator};
use appease_config::Config;
use appease_policy::floor::FloorDecision;
use appease_policy::group_mode::{GroupMode, GroupModeKeeper};
use appease_policy::spread::BusyThread;
use appease_policy::{GroupLift, LiftChange};
use serde::{Deserialize, Serialize};

use crate::cadence::Cadence;
use crate::configured::Configured;
use crate::scanner::{FloorSample, Follow, Promotion, Release, ScanCost, ScanRequest, Snapshot};

/// A process: its pid and its start (clock ticks after boot), so a pid reused by another
/// process is not taken for it.
pub type Process = (u32, u64);

pub struct BatchManager {
    /// pid -> (start, when any of its threads last received a request).
    last_request: HashMap<u32, (u64, u64)>,
    /// Of those, the processes of unprivileged users: their requests count (a tree that
    /// serves is not batch), but raise no session's autogroup or branch's weight, which
    /// would give a user's every process a priority the kernel refuses them.
    users_requests: HashSet<u32>,
    /// Of those, the processes whose session's autogroup is not raised: users' and
    /// server workers in a session of their own (`crate::connection_sessions`).
    unraised: HashSet<u32>,
    /// Every process in a demoted tree, as the last scan left them.
    demoted: HashSet<u32>,
    /// The applications with a process in a demoted tree.
    demoted_apps: HashSet<u32>,
    /// Lifted while a serving thread of an application waits on a lock: for which, how
    /// long lifts may last, and the waits to lift once they may.
    lift: GroupLift,
    /// Trees to forget at the next scan (the actuator could not move them).
    forget: Vec<u32>,
    forget_demoted: bool,
    next_scan: u64,
    /// Spreads the scans' start times so they never keep step with the load.
    cadence: Cadence,
    /// Idle, quiet or floor: what the batch group should be, and what it is.
    mode: GroupModeKeeper,
    applied: GroupMode,
    /// The idle group's share of all CPUs over the last scan, percent.
    share_pct: f64,
    /// The configured services and roles, as the last scan found their processes.
    configured: Configured,
    /// The last scan's cost: the scanner thread's, and the event loop's for the rest.
    cost: ScanCost,
    loop_us: u64,
    /// The period scans are drawn around now: `scan_ms`, or longer on a host whose scan
    /// costs more than the budget allows (`scan_period_ns`).
    period_ns: u64,
    /// The scan before the last one's cost, ns: the cheaper of the two sets the period,
    /// so that one costly scan (the first, reading every process afresh) stretches none.
    previous_cost_ns: u64,
    /// Scans that spread the idle group's threads: the plan turns by one at each.
    spread_round: u64,
    /// Threads pinned by the last spread.
    pinned: usize,
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
    /// The last scan: what it read and what it cost.
    #[serde(default)]
    pub scan: ScanCost,
    /// The event loop's time on the last scan's result (acting on it), µs.
    #[serde(default)]
    pub scan_loop_us: u64,
    /// The mean period between scans now, ms: `[batch] scan_ms`, or longer where a scan
    /// costs more than half a percent of a CPU at that period.
    #[serde(default)]
    pub scan_period_ms: u64,
    /// Busy threads of the idle group kept one CPU each (`[batch] spread`).
    #[serde(default)]
    pub pinned: usize,
    /// Scans raised from the idle class to the normal one because they stalled there
    /// (normal-class work kept every CPU busy).
    #[serde(default)]
    pub scans_raised: u64,
}

impl BatchManager {
    pub fn new(cfg: &Config, now: u64) -> Self {
        BatchManager {
            last_request: HashMap::new(),
            users_requests: HashSet::new(),
            unraised: HashSet::new(),
            demoted: HashSet::new(),
            demoted_apps: HashSet::new(),
            lift: GroupLift::full(cfg.elevation.sink.lift_ms * 1_000_000, now),
            forget: Vec::new(),
            forget_demoted: false,
            next_scan: 0,
            cadence: Cadence::default(),
            mode: GroupModeKeeper::new(cfg.quiet_after(), cfg.floor_params(), now),
            applied: GroupMode::Idle,
            share_pct: 0.0,
            configured: Configured::default(),
            cost: ScanCost::default(),
            loop_us: 0,
            period_ns: cfg.batch.scan_ms * 1_000_000,
            previous_cost_ns: 0,
            spread_round: 0,
            pinned: 0,
        }
    }

    /// Whether the process has a fixed role priority.
    pub fn is_role(&self, process: Process) -> bool {
        self.configured.is_role(process)
    }

    pub fn set_config(&mut self, cfg: &Config) {
        self.mode.set_params(cfg.quiet_after(), cfg.floor_params());
        // Roles, services and exceptions of a new config apply at once.
        self.scan_now();
    }

    /// `scans_raised`: the scanner keeps that count.
    pub fn view(&self, scans_raised: u64) -> BatchView {
        BatchView {
            share_pct: self.share_pct,
            mode: Some(self.applied),
            floor_lifted: self.mode.floor.lifted(),
            floor_lifts: self.mode.floor.lifts,
            scan: self.cost.clone(),
            scan_loop_us: self.loop_us,
            scan_period_ms: self.period_ns / 1_000_000,
            pinned: self.pinned,
            scans_raised,
        }
    }

    pub fn next_scan(&self) -> u64 {
        self.next_scan
    }

    /// The next scan is due now.
    pub fn scan_now(&mut self) {
        self.next_scan = 0;
    }

    /// A request arrived: a quiet batch group becomes idle again at once, and a demoted
    /// tree that receives one is scanned (and promoted) at once.
    /// `user`: the process is an unprivileged user's; `raise`: its session's autogroup
    /// may be raised.
    pub fn on_request(
        &mut self,
        (pid, start): Process,
        user: bool,
        raise: bool,
        ts_ns: u64,
        cfg: &Config,
        actuator: &mut KernelActuator,
    ) {
        self.last_request.insert(pid, (start, ts_ns));
        match user {
            true => self.users_requests.insert(pid),
            false => self.users_requests.remove(&pid),
        };
        match raise {
            false => self.unraised.insert(pid),
            true => self.unraised.remove(&pid),
        };
        self.mode.on_request(ts_ns);
        self.sync_mode(ts_ns, cfg, actuator);
        actuator.on_request_in_branches(pid);
        if self.demoted.contains(&pid) {
            self.scan_now();
        }
    }

    /// The idle group is lifted for a lock wait now, or a wait is to be once it may:
    /// ticks time both.
    pub fn lift_needs_ticks(&self) -> bool {
        self.lift.needs_ticks()
    }

    /// The applications with a process in a demoted tree, as the last scan found them.
    pub fn demoted_apps(&self) -> &HashSet<u32> {
        &self.demoted_apps
    }

    /// A thread serving a request of `app` waits on a lock, and a demoted tree of `app`
    /// may hold it: the idle group is lifted to a normal group's weight (moving processes per
    /// wait would cost more than it saves) until the wait ends, for at most `lift_ms` at
    /// a stretch and that much a second over time (a wait that finds that time spent is
    /// lifted at a tick once it has refilled).
    pub fn on_wait(&mut self, now: u64, app: u32, cfg: &Config, actuator: &mut KernelActuator) {
        let per_second = cfg.elevation.sink.lift_ms * 1_000_000;
        if per_second == 0 || !self.demoted_apps.contains(&app) {
            return;
        }
        if self.lift.on_wait(now, app, per_second) {
            self.sync_mode(now, cfg, actuator);
        }
    }

    /// The last wait of `app` ended: the idle group is idle again.
    pub fn on_wait_end(&mut self, now: u64, app: u32, cfg: &Config, actuator: &mut KernelActuator) {
        if self.lift.on_wait_end(now, app) {
            self.sync_mode(now, cfg, actuator);
        }
    }

    /// At a tick: ends a lift whose time ran out, returning its application (whose
    /// waiters the probe is to forget: one may have died waiting), or lifts a wait that
    /// found the lifting time spent, once it has refilled.
    pub fn lift_tick(
        &mut self,
        now: u64,
        cfg: &Config,
        actuator: &mut KernelActuator,
    ) -> Option<u32> {
        let per_second = cfg.elevation.sink.lift_ms * 1_000_000;
        if per_second == 0 {
            if self.lift.clear(now) {
                self.sync_mode(now, cfg, actuator);
            }
            return None;
        }
        let demoted_apps = &self.demoted_apps;
        let change = self
            .lift
            .on_tick(now, per_second, |app| demoted_apps.contains(&app))?;
        self.sync_mode(now, cfg, actuator);
        match change {
            LiftChange::Spent(app) => Some(app),
            LiftChange::Started(_) => None,
        }
    }

    /// Gives the batch group the mode it should have now, if it has not got it yet.
    fn sync_mode(&mut self, now: u64, cfg: &Config, actuator: &mut KernelActuator) {
        if actuator.take_batch_remade() {
            self.applied = GroupMode::Idle;
        }
        let mut want = self.mode.mode(now);
        let lifted = want == GroupMode::Idle && self.lift.lifted_for().is_some();
        if lifted {
            // A normal group's weight while lifted: the holder shares it with the rest
            // of the batch.
            want = GroupMode::Quiet;
        }
        if want == self.applied {
            return;
        }
        let weight = match want {
            GroupMode::Idle => None,
            GroupMode::Quiet if lifted => Some(lift_weight(
                cfg.batch.quiet_weight,
                actuator.raised_autogroup_nice(),
            )),
            GroupMode::Quiet => Some(cfg.batch.quiet_weight),
            GroupMode::Floor => Some(cfg.batch.floor_weight),
        };
        let why = match want {
            GroupMode::Idle => "mode idle: requests arrive",
            GroupMode::Quiet if lifted => {
                "lifted: a serving thread of an application with a demoted tree waits on a lock"
            }
            GroupMode::Quiet => "mode quiet: no requests lately",
            GroupMode::Floor => "mode floor: batch work starved",
        };
        match actuator.set_batch_weight(weight, why) {
            Ok(false) => {} // no group yet: it is created idle; applied on a later pass
            Ok(true) => self.applied = want,
            Err(e) => {
                tracing::warn!(error = %e, to = ?want, "could not change the batch group's mode")
            }
        }
    }

    pub fn on_process_exit(&mut self, pid: u32) {
        self.last_request.remove(&pid);
        self.users_requests.remove(&pid);
        self.unraised.remove(&pid);
    }

    /// A scan is due: what to ask the scanner for. The next is due about `scan_ms`
    /// later (0.8–1.2 times it, `crate::cadence`), or later where scans cost more than
    /// their budget (`scan_period_ns`).
    pub fn scan_request(
        &mut self,
        now: u64,
        cfg: &Arc<Config>,
        actuator: &mut KernelActuator,
    ) -> ScanRequest {
        let cost_ns = (self.cost.cpu_us + self.loop_us) * 1000;
        let steady_ns = cost_ns.min(self.previous_cost_ns);
        self.previous_cost_ns = cost_ns;
        self.period_ns = scan_period_ns(cfg.batch.scan_ms * 1_000_000, steady_ns);
        self.next_scan = now + self.cadence.next(self.period_ns);
        // A removed group was empty: what this daemon demoted has all left it.
        self.forget_demoted |= actuator.batch_group_vanished();
        ScanRequest {
            cfg: Arc::clone(cfg),
            batch_group: actuator.batch_group(),
            last_request: self.last_request.clone(),
            forget: std::mem::take(&mut self.forget),
            forget_demoted: std::mem::take(&mut self.forget_demoted),
        }
    }

    /// Acts on what a scan found.
    pub fn on_snapshot(&mut self, snap: Snapshot, cfg: &Config, actuator: &mut KernelActuator) {
        let began = appease_probe::monotonic_ns();
        let now = snap.taken_at;
        self.apply_floor(now, cfg, snap.floor);
        self.sync_mode(now, cfg, actuator);
        actuator.release_ended_in_place();
        if cfg.batch.enabled {
            actuator.keep_besteffort_pods_idle();
            actuator.keep_engine_parents_idle();
        }
        self.configured.apply(snap.services, snap.roles, actuator);
        self.demoted = snap.demoted;
        self.demoted_apps = snap.demoted_apps;
        let feeders = cfg.batch.feeders == appease_config::Feeders::LeastWeight;
        for d in snap.demotions {
            match actuator.demote(d.root, &d.members, &d.why, d.feeds && feeders) {
                Ok(0) => self.forget.push(d.root), // all gone already
                Ok(_) => {}
                Err(e) => {
                    log_failure(&e, d.root, "demote");
                    self.forget.push(d.root);
                }
            }
        }
        for Follow { root, members } in snap.follows {
            if let Err(e) = actuator.follow(root, &members) {
                log_failure(&e, root, "move the newcomers of");
            }
        }
        for Release { root, pid } in snap.releases {
            match actuator.release_process(pid) {
                Ok(true) => {
                    tracing::info!(root, pid, "exempted by the config: out of the idle class")
                }
                Ok(false) => {}
                Err(e) => log_failure(&e, root, "release a process of"),
            }
        }
        for Promotion { root, members } in snap.promotions {
            if let Err(e) = actuator.promote(root, &members) {
                log_failure(&e, root, "promote");
            }
        }
        // A group created by this scan's demotions starts idle: give it its mode.
        self.sync_mode(now, cfg, actuator);
        // A job whose root is no longer in a demoted tree may have ended.
        let demoted = &self.demoted;
        actuator.remove_ended_job_groups(|root| demoted.contains(&root));
        self.spread(now, snap.busy_batch, &snap.facts, cfg, actuator);
        self.raise_serving_autogroups(now, cfg, actuator);
        actuator.sync_idle_branches(&self.serving_beside_batch(now, cfg), &snap.facts);
        // Requests of processes that are gone need not be remembered.
        for (pid, start) in snap.gone {
            if self
                .last_request
                .get(&pid)
                .is_some_and(|&(s, _)| s == start)
            {
                self.last_request.remove(&pid);
                self.users_requests.remove(&pid);
                self.unraised.remove(&pid);
            }
        }
        self.cost = snap.cost;
        self.loop_us = appease_probe::monotonic_ns().saturating_sub(began) / 1000;
    }

    /// While the idle group is idle and holds batch, the session autogroups of processes
    /// that received a request lately are raised (`[batch] serving_autogroup_nice`);
    /// when it is quiet or in the starvation floor, every raised one is put back. A lift
    /// for a lock leaves them (it lasts less than a scan, and the kernel spaces autogroup
    /// writes 100 ms apart): the lift's weight is scaled to match instead (`lift_weight`).
    fn raise_serving_autogroups(&self, now: u64, cfg: &Config, actuator: &mut KernelActuator) {
        let mut serving = self.serving_beside_batch(now, cfg);
        serving.retain(|(pid, _)| !self.unraised.contains(pid));
        actuator.sync_serving_autogroups(
            &serving,
            cfg.batch.serving_autogroup_nice,
            "serving beside batch in the idle group",
        );
    }

    /// The processes that received a request lately while the idle class is in force and
    /// holds batch (none otherwise): whom the batch must yield to, across groups.
    fn serving_beside_batch(&self, now: u64, cfg: &Config) -> Vec<Process> {
        let window = cfg.batch.request_memory_ms * 1_000_000;
        let idle = self.mode.mode(now) == GroupMode::Idle;
        if !idle || self.demoted.is_empty() {
            return Vec::new();
        }
        self.last_request
            .iter()
            .filter(|(pid, &(_, at))| {
                now.saturating_sub(at) < window
                    && !self.demoted.contains(pid)
                    && !self.users_requests.contains(pid)
            })
            .map(|(&pid, &(start, _))| (pid, start))
            .collect()
    }

    /// Shares the idle group's busy threads out evenly over the CPUs while the group is
    /// idle and they outnumber the CPUs (the kernel herds an idle group's tasks); gives
    /// every CPU back once it is quiet (a normal group, which the kernel balances
    /// fairly), they are few enough, or spreading is off.
    fn spread(
        &mut self,
        now: u64,
        busy: Vec<BusyThread>,
        facts: &HashMap<u32, appease_actuator::ProcFacts>,
        cfg: &Config,
        actuator: &mut KernelActuator,
    ) {
        let quiet = self.mode.mode(now) == GroupMode::Quiet;
        if quiet || !cfg.batch.enabled || !cfg.batch.spread {
            self.unspread(
                actuator,
                facts,
                if quiet {
                    "mode quiet: the kernel balances a normal group fairly"
                } else {
                    "spreading turned off"
                },
            );
            return;
        }
        // Only what is still demoted after this scan's promotions, and free to move.
        let online = actuator.spread_cpus();
        let busy: Vec<BusyThread> = busy
            .into_iter()
            .filter(|t| self.demoted.contains(&t.pid) && actuator.may_spread(t.pid, t.tid, &online))
            .collect();
        if !appease_policy::spread::worth_spreading(busy.len(), online.len()) {
            self.unspread(
                actuator,
                facts,
                "no more busy threads than CPUs: the kernel gives each one",
            );
            return;
        }
        self.spread_round += 1;
        let at = actuator.pinned_at(&online);
        let plan: Vec<(u32, u32, usize)> =
            appease_policy::spread::plan(&busy, online.len(), self.spread_round, |tid| {
                at.get(&tid).copied()
            })
            .into_iter()
            .map(|(t, cpu)| (t.pid, t.tid, cpu))
            .collect();
        self.pinned = actuator.spread_after_scan(&plan, &online, facts);
    }

    fn unspread(
        &mut self,
        actuator: &mut KernelActuator,
        facts: &HashMap<u32, appease_actuator::ProcFacts>,
        why: &str,
    ) {
        if actuator.pinned() > 0 {
            actuator.unspread_after_scan(why, facts);
        }
        self.pinned = 0;
    }

    /// Feeds the idle group's share since the last scan to the starvation floor.
    fn apply_floor(&mut self, now: u64, cfg: &Config, sample: Option<FloorSample>) {
        let Some(s) = sample else {
            self.share_pct = 0.0;
            return;
        };
        self.share_pct = s.share_pct;
        tracing::debug!(
            share_pct = s.share_pct,
            waiting = s.waiting,
            processes = s.processes,
            "idle group"
        );
        match self.mode.on_floor_sample(now, s.share_pct, s.waiting) {
            Some(FloorDecision::Lift) => tracing::warn!(
                share_pct = s.share_pct,
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

/// The idle group's weight while it is lifted for a lock: a normal group's, scaled up as
/// far as the serving autogroups are raised (`raised`: the highest one's nice), so that the
/// holder gets the share beside them it would get beside unraised ones (cpu.weight's
/// scale, at most 10,000).
fn lift_weight(quiet_weight: u32, raised: Option<i32>) -> u32 {
    let scale = raised.map_or(1024, appease_policy::nice_weight);
    (u64::from(quiet_weight) * scale / 1024).clamp(1, 10_000) as u32
}

pub(crate) fn log_failure(e: &ActError, root: u32, what: &str) {
    match e {
        ActError::Cgroup(c) if c.is_gone() => tracing::debug!(root, what, "tree or group vanished"),
        _ => tracing::warn!(root, error = %e, "could not {what} process tree"),
    }
}

/// Scans, the scanner's work and the event loop's on its result, take at most this
/// share of one CPU: on a host of 10,000 processes a scan costs about 20 ms, 2 % of a CPU
/// at one a second.
const SCAN_CPU_BUDGET: u64 = 200; // 1/200: half a percent

/// However costly the scans, the period is at most this many times the configured one:
/// demotion and the starvation floor act on scans, and must still act.
const SCAN_STRETCH_MAX: u64 = 10;

/// The mean period between scans: `nominal_ns`, stretched so that a scan costing `cost_ns`
/// stays within the budget. Demotion and the starvation floor then act that much later.
fn scan_period_ns(nominal_ns: u64, cost_ns: u64) -> u64 {
    cost_ns
        .saturating_mul(SCAN_CPU_BUDGET)
        .clamp(nominal_ns, nominal_ns.saturating_mul(SCAN_STRETCH_MAX))
}

#[cfg(test)]
mod tests {
    use super::{lift_weight, scan_period_ns};

    #[test]
    fn scans_come_less_often_only_where_they_cost_more_than_half_a_percent_of_a_cpu() {
        const MS: u64 = 1_000_000;
        // 77 processes: half a millisecond a scan, one a second as configured.
        assert_eq!(scan_period_ns(1000 * MS, MS / 2), 1000 * MS);
        assert_eq!(scan_period_ns(1000 * MS, 5 * MS), 1000 * MS, "just within");
        // 10,000 processes: 22 ms a scan, one every 4.4 s.
        assert_eq!(scan_period_ns(1000 * MS, 22 * MS), 4400 * MS);
        // Never more than ten times the configured period.
        assert_eq!(scan_period_ns(1000 * MS, 500 * MS), 10_000 * MS);
        assert_eq!(scan_period_ns(200 * MS, 0), 200 * MS);
    }

    #[test]
    fn a_lift_beside_raised_autogroups_weighs_as_much_more_as_they_do() {
        assert_eq!(lift_weight(100, None), 100);
        assert_eq!(lift_weight(100, Some(0)), 100);
        // nice -10: 9,548 against 1,024.
        assert_eq!(lift_weight(100, Some(-10)), 932);
        assert_eq!(lift_weight(10_000, Some(-20)), 10_000, "cpu.weight's top");
    }
}
