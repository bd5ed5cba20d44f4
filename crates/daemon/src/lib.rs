//! The daemon: one event loop owns all state. Probe events and load readings go into
//! the pure policy; its decisions go to the actuator; everything is put back on exit.

pub mod batch;
pub mod cadence;
mod configured;
mod connection_sessions;
pub mod control;
mod held;
pub mod host;
pub mod lock;
pub mod log_writer;
pub mod metrics;
mod probe_settings;
mod reload;
pub mod scanner;
mod startup;
pub mod status;
mod thread_times;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use appease_actuator::{ActError, Identity, KernelActuator, Seen, ThreadLookup};
use appease_config::Config;
use appease_policy::{AppChange, Decision, ElevationPolicy, LoadTracker, Source};
use appease_probe::{monotonic_ns, Event, Family, Probe};
use hdrhistogram::Histogram;

pub use lock::RunLock;
pub use startup::{crash_points, preflight, restore_leftovers, run};

/// Load is sampled this often; it is smoothed over a second anyway.
const LOAD_SAMPLE_NS: u64 = 100_000_000;
/// The name of appease's own processes (the daemon, and its commands as clients).
const OWN_COMM: &str = "appease";
/// Tick period while nothing is elevated (forgetting idle threads only).
const IDLE_TICK_NS: u64 = 100_000_000;
/// How long the lock-wait hook stays attached after the last application with sunk
/// threads or demoted trees is unmarked.
const LOCK_WAIT_HOOK_HOLD: Duration = Duration::from_secs(30);
use status::{LatencyView, LoadView, ProbeView, Status, ThreadStatus};

/// Where the journal, lock and status live. `APPEASE_RUN_DIR` overrides it (tests,
/// or a second instance watching a separate set of machines' worth of state).
pub fn run_dir() -> PathBuf {
    std::env::var_os("APPEASE_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/appease"))
}

pub struct DaemonOptions {
    pub config: Config,
    /// Where the config came from, for status and reloads (None: embedded default).
    pub config_path: Option<PathBuf>,
    pub dry_run: bool,
    pub run_dir: PathBuf,
}

/// Signals the daemon reacts to, set by signal handlers.
#[derive(Clone, Default)]
pub struct Controls {
    pub shutdown: Arc<AtomicBool>,
    pub reload: Arc<AtomicBool>,
}

struct Daemon<'obj> {
    opts: DaemonOptions,
    probe: Probe<'obj>,
    actuator: KernelActuator,
    policy: ElevationPolicy,
    load: LoadTracker,
    /// Threads whose restore failed: tried again at every tick.
    restore_again: std::collections::HashSet<u32>,
    /// The applications the probe has been told of: those with sunk threads or demoted
    /// trees.
    marked_apps: HashSet<u32>,
    /// Since when no application has been marked (monotonic ns), if none is.
    unmarked_since_ns: Option<u64>,
    /// Threads the probe knows as held (their requests wake nobody): elevated, with the
    /// levels their last request gave them, or 0 while their budget is spent.
    held: HashMap<u32, u32>,
    /// Server workers in a session (and autogroup) of their own: elevated without the
    /// short slice or the autogroup's raise.
    connection_sessions: connection_sessions::ConnectionSessions,
    cpus: usize,
    /// The clock tick in ns, in which /proc counts start times.
    clock_tick_ns: u64,
    started: u64,
    latency_us: Histogram<u64>,
    deferred_latency_us: Histogram<u64>,
    tick: Duration,
    events: Vec<Event>,
    batch: Option<batch::BatchManager>,
    /// Reads and classifies the process table for `batch`, on a thread of its own.
    scanner: Option<scanner::Scanner>,
    /// The config as the scanner gets it with each request.
    shared_config: Arc<Config>,
    /// Probe events lost so far (a full ring buffer), as last seen.
    lost_seen: u64,
    /// systemd asked for watchdog pings (WatchdogSec=).
    watchdog: bool,
    /// Prometheus counters, moved as things happen (served only with --metrics).
    metrics: Arc<metrics::Metrics>,
    /// What the control socket serves, and its reload requests.
    shared: control::Shared,
    /// /proc/loadavg and /proc/pressure/cpu, kept open (read again from the start).
    load_files: host::LoadFiles,
    /// Threads in an idle cgroup wanting a CPU at the last scan: left out of the load
    /// signal. They get a CPU only when no server wants it, so they are no reason to
    /// elevate one; elevated beside them, a server's requests lost more scheduler ticks
    /// to them than without elevation (docs/RESULTS.md, the synthetic scenario). Used
    /// only when the probe cannot read the run queues, which count them as they are now.
    idle_group_runnable: u32,
    /// `SCHED_IDLE` threads outside idle cgroups wanting a CPU at the last scan: the run
    /// queues count them as idle, yet in a group of their own they compete at its full
    /// weight, so the load signal adds them back.
    sched_idle_runnable: u32,
    /// The idle groups' runnable threads at the last load sample (the status shows it).
    idle_group_now: u32,
    layout: status::LayoutView,
    /// Uids from this one on are unprivileged users, bounded as a whole.
    uid_min: u32,
    /// The watched threads' CPU times.
    thread_times: thread_times::ThreadTimes,
}

impl<'obj> Daemon<'obj> {
    fn new(
        opts: DaemonOptions,
        probe: Probe<'obj>,
        actuator: KernelActuator,
        scanner: Option<scanner::Scanner>,
        shared: control::Shared,
        metrics: Arc<metrics::Metrics>,
    ) -> Self {
        let cpus = host::cpus();
        let shared_config = Arc::new(opts.config.clone());
        let uid_min = opts.config.users.uid_min();
        let batch = scanner
            .is_some()
            .then(|| batch::BatchManager::new(&opts.config, monotonic_ns()));
        Daemon {
            policy: ElevationPolicy::new(opts.config.elevation_params()),
            tick: Duration::from_millis(opts.config.elevation.tick_ms),
            opts,
            probe,
            actuator,
            load: LoadTracker::new(cpus),
            restore_again: Default::default(),
            marked_apps: HashSet::new(),
            unmarked_since_ns: None,
            held: HashMap::new(),
            connection_sessions: Default::default(),
            cpus,
            clock_tick_ns: appease_cgroup::clock_tick_ns().max(1),
            started: appease_actuator::now_secs(),
            latency_us: latency_histogram(),
            deferred_latency_us: latency_histogram(),
            events: Vec::with_capacity(256),
            batch,
            scanner,
            shared_config,
            lost_seen: 0,
            watchdog: sd_notify::watchdog_enabled(false, &mut 0),
            shared,
            metrics,
            load_files: host::LoadFiles::open(),
            idle_group_runnable: 0,
            sched_idle_runnable: 0,
            idle_group_now: 0,
            layout: Default::default(),
            uid_min,
            thread_times: Default::default(),
        }
    }

    fn config_origin(&self) -> String {
        self.opts
            .config_path
            .as_ref()
            .map_or("(embedded default)".to_string(), |p| {
                p.display().to_string()
            })
    }

    fn event_loop(&mut self, controls: &Controls) -> Result<()> {
        let start = monotonic_ns();
        let (mut next_tick, mut next_load, mut next_status) = (start, start, start);
        // Status upkeep about once a second, out of step with any load (crate::cadence).
        let mut status_cadence = cadence::Cadence::default();
        while !controls.shutdown.load(Ordering::Relaxed) {
            if controls.reload.swap(false, Ordering::Relaxed) {
                self.reload();
            }
            let now = monotonic_ns();
            let next_scan = self.batch.as_ref().map_or(u64::MAX, |b| b.next_scan());
            let scanning = self.scanner.as_ref().is_some_and(|s| s.pending());
            let stall = self
                .scanner
                .as_ref()
                .and_then(|s| s.stall_due())
                .unwrap_or(u64::MAX);
            let due = next_wake(
                [next_tick, next_load, next_status, stall],
                next_scan,
                scanning,
            );
            // The ring buffer waits in whole milliseconds: round up, or the last
            // fraction of a millisecond before each deadline would spin.
            let wait = Duration::from_millis(due.saturating_sub(now).div_ceil(1_000_000));
            let wait = self.wait_for_scanner(wait);
            let mut events = std::mem::take(&mut self.events);
            self.probe.poll(wait, |e| events.push(e))?;
            self.handle(&mut events);
            self.events = events;
            let demoted = self.take_snapshot();
            let now = monotonic_ns();
            if demoted {
                // The run queues show the batch in the idle class at once: the load the
                // ladder sees drops now rather than over the smoothing's second, and so
                // does the elevation it held up.
                self.load.rebase_down();
                next_load = now;
            }
            if let Some(s) = self.scanner.as_mut() {
                s.raise_if_stalled(now);
            }
            if now >= next_load {
                self.sample_load(now);
                next_load = now + LOAD_SAMPLE_NS;
            }
            if now >= next_tick {
                self.on_tick(now);
            }
            // Decay needs fine ticks only while something is elevated; the idle group's
            // lift, while it lasts or waits to start.
            let lift_ticks = self.batch.as_ref().is_some_and(|b| b.lift_needs_ticks());
            let tick = if self.policy.any_elevated() || lift_ticks {
                self.tick.as_nanos() as u64
            } else {
                IDLE_TICK_NS
            };
            if now >= next_tick || next_tick > now + tick {
                next_tick = now + tick;
            }
            if now >= next_scan {
                if let (Some(b), Some(s)) = (self.batch.as_mut(), self.scanner.as_mut()) {
                    if !s.pending() {
                        s.request(b.scan_request(now, &self.shared_config, &mut self.actuator));
                    }
                }
            }
            if now >= next_status {
                for tid in self.actuator.audit() {
                    self.policy.forget(tid);
                }
                // A watched thread is read every 100 ms: one unread for a second is no
                // longer watched.
                self.thread_times.forget_unread(Duration::from_secs(1));
                self.release_unheld();
                self.handle_arrived();
                self.resync_after_lost_events();
                self.publish_status();
                self.actuator.trail.report_held();
                // The loop runs: systemd's watchdog (WatchdogSec=) hears it about once a second.
                if self.watchdog {
                    notify_systemd(&[sd_notify::NotifyState::Watchdog]);
                }
                next_status = now + status_cadence.next(1_000_000_000);
            }
        }
        Ok(())
    }

    /// Handles a batch of events, those that woke the daemon first: a request after a
    /// quiet spell is the one a customer waits on; a busy thread's can wait a little.
    fn handle(&mut self, events: &mut Vec<Event>) {
        events.sort_by_key(|e| !matches!(e, Event::Request { woke: true, .. }));
        for e in events.drain(..) {
            self.on_event(e);
        }
    }

    /// Requests that arrived meanwhile, between two pieces of longer work.
    fn handle_arrived(&mut self) {
        let mut events = std::mem::take(&mut self.events);
        if let Err(e) = self.probe.drain(|e| events.push(e)) {
            tracing::warn!(error = %e, "could not read probe events");
        }
        self.handle(&mut events);
        self.events = events;
    }

    /// With a scan under way, waits for its snapshot as well as for probe events;
    /// returns what is left of `wait` for the probe.
    fn wait_for_scanner(&mut self, wait: Duration) -> Duration {
        let Some(s) = self.scanner.as_ref().filter(|s| s.pending()) else {
            return wait;
        };
        let mut fds = [
            libc::pollfd {
                fd: self.probe.epoll_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: s.wake_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = wait.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: two valid pollfds; a signal or an error only ends the wait early.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        Duration::ZERO
    }

    /// A scan's snapshot, if one is ready: classified and acted on. True if it demoted.
    fn take_snapshot(&mut self) -> bool {
        let (Some(b), Some(s)) = (self.batch.as_mut(), self.scanner.as_mut()) else {
            return false;
        };
        if let Some(snap) = s.take() {
            self.idle_group_runnable = snap.idle_group_runnable;
            self.sched_idle_runnable = snap.sched_idle_runnable;
            let demoting = !snap.demotions.is_empty();
            b.on_snapshot(snap, &self.opts.config, &mut self.actuator);
            self.probe
                .set_exec_events(self.actuator.wants_exec_events());
            self.mark_apps(Ok(()));
            return demoting;
        }
        false
    }

    /// Events lost to a full ring buffer: a request (its thread is not muted for it, so
    /// the next one is reported), an exit (the audit that runs with this finds the thread
    /// gone) or an exec (the scan asked for now sees it).
    fn resync_after_lost_events(&mut self) {
        let lost = self.probe.counters().lost;
        if lost > self.lost_seen {
            tracing::warn!(
                lost = lost - self.lost_seen,
                "probe events lost (ring buffer full): managed threads rechecked, a scan made now"
            );
            self.lost_seen = lost;
            if let Some(b) = self.batch.as_mut() {
                b.scan_now();
            }
        }
    }

    /// A request event: the batch manager hears of it, and the elevation policy decides.
    fn on_request_event(&mut self, e: Event) {
        let Event::Request {
            ts_ns,
            cpu_ns,
            pid,
            tid,
            family,
            woke,
            start_ns,
            proc_start_ns,
            comm,
            proc_comm,
            app,
            uid,
            own_autogroup,
            ..
        } = e
        else {
            return;
        };
        // appease's own commands (status, reload) read the daemon's replies from
        // its control socket: not a customer's request.
        if proc_comm.as_bytes() == OWN_COMM.as_bytes() {
            return;
        }
        self.metrics.request(family);
        let process = (pid, proc_start_ns / self.clock_tick_ns);
        let own_session = self.connection_sessions.check(process, app, own_autogroup);
        if let Some(b) = self.batch.as_mut() {
            let user = appease_config::unprivileged(uid, self.uid_min);
            let raise = !user && !own_session;
            b.on_request(
                process,
                user,
                raise,
                ts_ns,
                &self.opts.config,
                &mut self.actuator,
            );
        }
        // Roles have fixed priorities: requests do not move them.
        let role = self.batch.as_ref().is_some_and(|b| b.is_role(process));
        if !self.opts.config.elevation.enabled || role {
            return;
        }
        let source = match family {
            Family::Unix => Source::Unix,
            Family::Inet | Family::Inet6 => Source::Network,
            Family::Other(_) => return,
        };
        let user = appease_config::unprivileged(uid, self.uid_min).then_some(uid);
        if let Some(d) = self.policy.on_user_request(
            ts_ns,
            app,
            user,
            pid,
            tid,
            source,
            cpu_ns,
            self.load.current(),
        ) {
            // The names made text only for a change (most requests change nothing).
            let seen = Identity {
                tid,
                start: start_ns / self.clock_tick_ns,
                comm: comm.escaped(),
                proc_comm: proc_comm.escaped(),
            };
            if self.apply_seen(d, Some(seen)) {
                let us = monotonic_ns().saturating_sub(ts_ns) / 1000;
                let h = if woke {
                    self.metrics.elevation_latency(us);
                    &mut self.latency_us
                } else {
                    &mut self.deferred_latency_us
                };
                let _saturates_instead = h.record(us.max(1));
            }
        } else if !self.held.contains_key(&tid) && self.policy.spent(tid) {
            // Its application's (or user's) budget is spent: its requests raise nothing
            // until refilled, so they wait for the next tick instead of waking the daemon.
            // (One held elevated keeps its levels: the tick's restore for the budget
            // releases it. Held first: most requests are of held threads, and it is the
            // cheaper lookup.)
            self.hold(tid, Some(0));
        }
        // After the elevation: a surfaced thread's application may need telling.
        self.tell_probe();
    }

    fn on_event(&mut self, e: Event) {
        match e {
            Event::Request { .. } => self.on_request_event(e),
            Event::Exit {
                pid, tid, start_ns, ..
            } => {
                if !self
                    .actuator
                    .forget_exited(tid, start_ns / self.clock_tick_ns)
                {
                    return;
                }
                self.policy.forget(tid);
                // The kernel dropped its mark with it.
                self.held.remove(&tid);
                if pid == tid {
                    self.connection_sessions.forget(pid);
                    if let Some(b) = self.batch.as_mut() {
                        b.on_process_exit(pid);
                    }
                }
            }
            Event::Exec { pid, .. } => {
                self.actuator.on_exec(pid);
                self.probe
                    .set_exec_events(self.actuator.wants_exec_events());
            }
            Event::Wait { ts_ns, app } => {
                for d in self.policy.on_wait(ts_ns, app) {
                    self.apply(d);
                }
                if let Some(b) = self.batch.as_mut() {
                    b.on_wait(ts_ns, app, &self.opts.config, &mut self.actuator);
                }
            }
            Event::WaitEnd { ts_ns, app } => {
                for d in self.policy.on_wait_end(ts_ns, app) {
                    self.apply(d);
                }
                if let Some(b) = self.batch.as_mut() {
                    b.on_wait_end(ts_ns, app, &self.opts.config, &mut self.actuator);
                }
                self.tell_probe();
            }
        }
    }

    /// Tells the probe what the policy changed about applications (which have sunk
    /// threads, whose lifts ended without their waits' end). Called after each request:
    /// nothing to do, nothing done.
    fn tell_probe(&mut self) {
        let changes = self.policy.take_app_changes();
        if changes.is_empty() {
            return;
        }
        let mut result = Ok(());
        for change in changes {
            if let AppChange::ResetWaits(app) = change {
                result = result.and(self.probe.reset_waits(app));
            }
        }
        self.mark_apps(result);
    }

    /// Marks in the probe the applications with sunk threads or demoted trees, and
    /// unmarks the others (after a scan, whose demoted trees may have changed).
    fn mark_apps(&mut self, mut result: Result<(), appease_probe::ProbeError>) {
        let demoted = self.batch.as_ref().map(|b| b.demoted_apps());
        let wanted =
            |app: &u32| self.policy.has_sunk(*app) || demoted.is_some_and(|d| d.contains(app));
        let gone: Vec<u32> = self
            .marked_apps
            .iter()
            .filter(|a| !wanted(a))
            .copied()
            .collect();
        let new: Vec<u32> = self
            .policy
            .sunk_apps()
            .chain(demoted.into_iter().flatten().copied())
            .filter(|a| !self.marked_apps.contains(a))
            .collect();
        for app in gone {
            self.marked_apps.remove(&app);
            result = result.and(self.probe.set_sunk_app(app, false));
        }
        for app in new {
            if self.marked_apps.insert(app) {
                result = result.and(self.probe.set_sunk_app(app, true));
            }
        }
        if let Err(e) = result {
            tracing::warn!(error = %e, "could not update the probe's applications");
        }
        // From the last unmark on, the tick counts down to detaching the lock-wait hook.
        if !self.marked_apps.is_empty() {
            self.unmarked_since_ns = None;
        } else if self.unmarked_since_ns.is_none() && self.probe.lock_waits_attached() {
            self.unmarked_since_ns = Some(monotonic_ns());
        }
    }

    /// Detaches the lock-wait hook, which costs every context switch of the host, once no
    /// application has been marked for `LOCK_WAIT_HOOK_HOLD` (attaching and detaching it
    /// patch the kernel's code on every CPU, so a sink that comes and goes keeps it).
    fn release_lock_wait_hook(&mut self, now: u64) {
        let Some(since) = self.unmarked_since_ns else {
            return;
        };
        if now.saturating_sub(since) < LOCK_WAIT_HOOK_HOLD.as_nanos() as u64 {
            return;
        }
        self.unmarked_since_ns = None;
        if self.probe.detach_lock_waits() {
            tracing::debug!("no application sunk for a while: the lock-wait hook detached");
        }
    }

    /// Runnable tasks but the idle class's and the loop's own, from the run queues now
    /// (or, if the probe cannot read them, /proc/loadavg less the last scan's idle-group
    /// count, which lags by up to a scan).
    fn sample_load(&mut self, now: u64) {
        // Until a scan has met a task on every CPU, some run queues are not known.
        let live = self
            .probe
            .runnable()
            .filter(|r| r.cpus as usize >= self.cpus);
        let runnable = match live {
            Some(r) => {
                self.idle_group_now = r.idle_class.saturating_sub(self.sched_idle_runnable);
                (r.all.saturating_sub(r.idle_class) + self.sched_idle_runnable).saturating_sub(1)
            }
            None => {
                self.idle_group_now = self.idle_group_runnable;
                self.load_files
                    .runnable()
                    .unwrap_or(0)
                    .saturating_sub(self.idle_group_runnable)
            }
        };
        let psi = self.load_files.psi();
        self.load.sample(now, runnable, psi);
    }

    fn on_tick(&mut self, now: u64) {
        if !self.restore_again.is_empty() {
            self.retry_restores();
        }
        self.release_lock_wait_hook(now);
        self.policy.on_load(self.load.current());
        let wanted: Vec<(u32, u32)> = self.policy.cpu_wanted(now).collect();
        let times = &mut self.thread_times;
        times.sync_held_gap(&mut self.probe, &self.opts.config);
        times.read_ahead(&mut self.probe, &wanted);
        let load = self.load.current();
        let mut decisions: Vec<Decision> = (times.latest_requests())
            .filter_map(|(tid, at, cpu)| self.policy.note_request(tid, at, cpu, load))
            .collect();
        decisions.extend(self.policy.on_tick(now, |pid, tid| times.get(pid, tid)));
        self.tell_probe();
        let spent = self
            .batch
            .as_mut()
            .and_then(|b| b.lift_tick(now, &self.opts.config, &mut self.actuator));
        if let Some(app) = spent {
            // Its waiters are forgotten: one may have died waiting.
            if let Err(e) = self.probe.reset_waits(app) {
                tracing::warn!(error = %e, "could not update the probe's applications");
            }
        }
        for d in decisions {
            self.apply(d);
            // A request that arrived meanwhile goes before the next restore.
            self.handle_arrived();
        }
    }

    /// Applies one decision; true when the kernel state now matches it.
    fn apply(&mut self, d: Decision) -> bool {
        self.apply_seen(d, None)
    }

    /// Applies `d`; `seen` is the thread as the event that caused it described it.
    fn apply_seen(&mut self, d: Decision, identity: Option<Identity>) -> bool {
        let restoring = matches!(d, Decision::Restore { .. });
        let counted = match &d {
            Decision::Elevate { reason, .. } | Decision::Sink { reason, .. } => (false, *reason),
            Decision::Restore { reason, .. } => (true, *reason),
        };
        let hold = held::held_after(&d, &self.held);
        let (tid, result) = match d {
            Decision::Elevate {
                pid,
                tid,
                levels,
                slice,
                reason,
            } => {
                let slice = slice.filter(|_| !self.connection_sessions.contains(pid));
                let mut lookup = self
                    .thread_times
                    .lookup(&mut self.probe, self.clock_tick_ns);
                let seen = identity.map(|identity| Seen {
                    identity,
                    lookup: Some(&mut lookup as &mut dyn ThreadLookup),
                });
                (
                    tid,
                    self.actuator
                        .elevate(pid, tid, levels, slice, reason.as_str(), seen),
                )
            }
            Decision::Restore { tid, reason, .. } => {
                (tid, self.actuator.restore(tid, reason.as_str()))
            }
            Decision::Sink {
                pid,
                tid,
                levels,
                reason,
            } => {
                let slice = self
                    .connection_sessions
                    .contains(pid)
                    .then_some(connection_sessions::SUNK_SLICE);
                (
                    tid,
                    self.actuator.sink(pid, tid, levels, slice, reason.as_str()),
                )
            }
        };
        self.hold(tid, hold.filter(|_| result.is_ok()));
        match result {
            Ok(()) => {
                match counted {
                    (false, reason) => self.metrics.elevated(reason),
                    (true, reason) => self.metrics.restored(reason),
                }
                true
            }
            Err(ActError::Gone { tid }) => {
                tracing::debug!(tid, "thread gone");
                self.policy.forget(tid);
                false
            }
            Err(ActError::HandsOff { .. }) => {
                self.policy.forget(tid);
                false
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not apply decision");
                if restoring {
                    // Still changed in the kernel: tried again at every tick.
                    self.restore_again.insert(tid);
                } else {
                    // Nothing was changed (journal first): the policy must not think it
                    // was, or the next request would find the thread "elevated" already.
                    self.policy.forget(tid);
                }
                false
            }
        }
    }

    /// Tells the probe whether `tid` is held (`Some` of the levels a request gave it, 0 for
    /// a thread whose budget is spent), when that changed.
    fn hold(&mut self, tid: u32, levels: Option<u32>) {
        let changed = match levels {
            Some(l) => self.held.insert(tid, l).is_none(),
            None => self.held.remove(&tid).is_some(),
        };
        if changed {
            if let Err(e) = self.probe.set_held(tid, levels.is_some()) {
                // Unmarked, its requests wake the daemon as any other's.
                tracing::debug!(error = %e, tid, "could not mark a held thread in the probe");
                self.held.remove(&tid);
            }
        }
    }

    /// Threads the policy no longer holds elevated (forgotten by the audit, an exception
    /// of a new config) and threads whose budget has refilled wake the daemon again.
    fn release_unheld(&mut self) {
        let unheld: Vec<u32> = self
            .held
            .keys()
            .filter(|&&t| self.policy.levels(t) == 0 && !self.policy.spent(t))
            .copied()
            .collect();
        for tid in unheld {
            self.hold(tid, None);
        }
    }

    /// Restores that failed (a full disk under the journal, a refused syscall) are tried
    /// again until they succeed or the thread is gone.
    fn retry_restores(&mut self) {
        let tids: Vec<u32> = self.restore_again.drain().collect();
        for tid in tids {
            match self.actuator.restore(tid, "restore, tried again") {
                Ok(()) | Err(ActError::Gone { .. }) | Err(ActError::HandsOff { .. }) => {}
                Err(_) => {
                    self.restore_again.insert(tid);
                }
            }
        }
    }

    /// The state the control socket and the metrics endpoint serve, once a second.
    fn publish_status(&self) {
        let load = self.load.current();
        let params = self.policy.params();
        let idx = load.ladder_index(params.min_psi_pct);
        let step_no = params.ladder.step_index_for(idx);
        let step = &params.ladder.steps()[step_no];
        let c = self.probe.counters();
        let views = self.policy.view();
        let threads = self
            .actuator
            .managed()
            .into_iter()
            .map(|m| {
                let v = views.iter().find(|v| v.tid == m.tid);
                let (levels, budget) = v.map_or((0, 0.0), |v| (v.levels, v.budget_ms));
                ThreadStatus::new(m, levels, budget)
            })
            .collect();
        let status = Status {
            pid: std::process::id(),
            started: self.started,
            updated: appease_actuator::now_secs(),
            config: self.config_origin(),
            dry_run: self.opts.dry_run,
            cpus: self.cpus,
            load: LoadView {
                runnable_per_cpu: load.runnable_per_cpu,
                idle_group_runnable: self.idle_group_now,
                psi_some_pct: load.psi_some_pct,
                ladder_step: step_no,
                unix_nice: step.unix_nice,
                inet_nice: step.inet_nice,
                decay_ms: step.decay.as_millis() as u64,
            },
            probe: ProbeView {
                socket_reads: c.socket_reads,
                request_events: c.requests,
                lost_events: c.lost,
                response_reads: c.responses,
                throttled_events: c.throttled,
                held_requests: c.held,
                waking_requests: c.woke,
                lock_wait_hook: self.probe.lock_waits_attached(),
            },
            actuator: self.actuator.counters.clone().into(),
            elevation_latency_us: latency_view(&self.latency_us),
            deferred_elevation_latency_us: latency_view(&self.deferred_latency_us),
            watched: self.policy.tracked(),
            threads,
            processes: self.actuator.moved(),
            autogroups: self.actuator.autogroups(),
            batch: self
                .batch
                .as_ref()
                .map(|b| b.view(self.scanner.as_ref().map_or(0, |s| s.raised_scans))),
            layout: self.layout.clone(),
        };
        self.metrics.update(&status);
        self.shared.publish(Arc::new(status));
    }
}

/// Latency service groups are not built for a cgroup v2 host under systemd: a config
/// with services is refused there, at start and on reload.
fn services_available(cfg: &Config, layout: &status::LayoutView) -> Result<(), String> {
    let v2_systemd = appease_cgroup::LayoutKind::CgroupV2Systemd.name();
    match cfg.services.first() {
        Some(svc) if layout.systemd && layout.kind == v2_systemd => Err(format!(
            "service {:?}: latency service groups are not available on a cgroup v2 host \
             under systemd yet (systemd owns the cgroup tree; service groups through its \
             D-Bus API are not built); remove the [[service]] entries or run on cgroup v1",
            svc.name
        )),
        _ => Ok(()),
    }
}

/// Tells systemd (when it started the daemon with Type=notify) how it is doing.
fn notify_systemd(state: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(false, state) {
        tracing::warn!(error = %e, "could not notify systemd");
    }
}

/// When the loop must wake next: the earliest of its deadlines. A scan due while one is
/// under way waits for that one's snapshot, which wakes the loop by itself: counted here,
/// its deadline (often 0, asked by a request of a demoted tree or a lost event) would make
/// every wait zero, and the real-time loop spin until the scan ended. It did, for
/// seconds, as 256 new database connections kept asking for scans while a slow one ran.
fn next_wake(deadlines: [u64; 4], next_scan: u64, scanning: bool) -> u64 {
    let scan = if scanning { u64::MAX } else { next_scan };
    deadlines.into_iter().fold(scan, u64::min)
}

fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 2).expect("valid histogram bounds")
}

fn latency_view(h: &Histogram<u64>) -> LatencyView {
    LatencyView {
        count: h.len(),
        p50: h.value_at_quantile(0.5),
        p99: h.value_at_quantile(0.99),
        max: h.max(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scan_due_while_one_runs_never_makes_the_loop_wake_at_once() {
        let later = [5_000, 7_000, 9_000, u64::MAX];
        // Asked for now while one runs: the loop sleeps until its next deadline (the
        // running scan's snapshot wakes it sooner).
        assert_eq!(next_wake(later, 0, true), 5_000);
        assert_eq!(next_wake(later, 0, false), 0);
        assert_eq!(next_wake(later, 3_000, false), 3_000);
        assert_eq!(next_wake([u64::MAX; 4], 3_000, true), u64::MAX);
    }
}
