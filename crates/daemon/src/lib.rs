//! The daemon: one event loop owns all state. Probe events and load readings go into
//! the pure policy; its decisions go to the actuator; everything is put back on exit.

pub mod batch;
pub mod cadence;
pub mod control;
pub mod host;
pub mod lock;
pub mod log_writer;
pub mod metrics;
pub mod scanner;
pub mod status;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use appease_actuator::{
    restore_journal, ActError, Actuator, Identity, Journal, KernelActuator, RestoreReport,
};
use appease_config::Config;
use appease_policy::{AppChange, Decision, ElevationPolicy, LoadTracker, Source};
use appease_probe::{monotonic_ns, Event, Family, Probe, ProbeConfig, ProbeStorage};
use hdrhistogram::Histogram;

pub use lock::RunLock;

/// Load is sampled this often; it is smoothed over a second anyway.
const LOAD_SAMPLE_NS: u64 = 100_000_000;
/// The name of appease's own processes (the daemon, and its commands as clients).
const OWN_COMM: &str = "appease";
/// Tick period while nothing is elevated (forgetting idle threads only).
const IDLE_TICK_NS: u64 = 100_000_000;
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

/// Checks what the daemon needs before anything is changed.
pub fn preflight() -> Result<()> {
    if !host::is_root() {
        bail!(
            "appease daemon needs root: it loads BPF programs and changes other processes' priorities \
             (run it as root, e.g. with sudo)"
        );
    }
    if host::in_nested_pid_namespace() {
        bail!(
            "appease runs in a PID namespace of its own (a container without the host's \
             process IDs): the request probe and the journal name processes by the host's \
             IDs, which mean other processes here. Run it in the host's PID namespace: \
             `--pid=host` (Docker, Podman), `hostPID: true` (Kubernetes, see deploy/), or on \
             the host"
        );
    }
    if host::in_nested_cgroup_namespace() {
        bail!(
            "appease runs in a cgroup namespace of its own (a container with a private cgroup \
             view): it must see and change the host's cgroups. Run it in the host's cgroup \
             namespace: `--cgroupns=host` (Docker, Podman), or on the host"
        );
    }
    Ok(())
}

/// Undoes what an earlier daemon left (after a crash). Needs the run lock.
pub fn restore_leftovers(dir: &Path) -> Result<RestoreReport> {
    restore_journal(dir).with_context(|| format!("restoring from the journal in {}", dir.display()))
}

pub fn run(opts: DaemonOptions, controls: Controls) -> Result<()> {
    // Test builds: the chaos harness's crash points, from FAILPOINTS.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    preflight()?;
    let _lock = RunLock::acquire(&opts.run_dir)?;
    // A dry run changes nothing: it may watch beside a daemon that acts.
    let _group_lock = match opts.dry_run {
        false => Some(RunLock::acquire_group(&opts.config.batch.group)?),
        true => None,
    };
    let leftovers = restore_leftovers(&opts.run_dir)?;
    if leftovers != RestoreReport::default() {
        tracing::warn!(?leftovers, "restored what a previous daemon left behind");
    }
    host::raise_nofile_limit();
    // Before capabilities are dropped: giving the socket to a group takes CAP_CHOWN.
    let gid = opts
        .config
        .control
        .group
        .as_deref()
        .and_then(appease_config::gid_of);
    let socket = control::BoundSocket::bind(&opts.run_dir, gid)
        .with_context(|| format!("making the control socket in {}", opts.run_dir.display()))?;

    let mut storage = ProbeStorage::uninit();
    let probe_cfg = ProbeConfig {
        min_gap: Duration::from_millis(opts.config.probe.min_gap_ms),
        ignore_pid: Some(std::process::id()),
        serving_window: serving_window(&opts.config),
        ..ProbeConfig::default()
    };
    let mut probe = Probe::load(&probe_cfg, &mut storage).context("starting the request probe")?;
    // The probe sees every listen() from here on; what listened before is read now,
    // while reading other processes' open files is still allowed.
    let listening = match opts.config.batch.enabled || opts.config.elevation.enabled {
        true => host::listening_processes(),
        false => HashSet::new(),
    };
    // Their forks from now on belong to their application (its elevation budget, its
    // lifting), as those of a server started after the probe.
    for &(pid, _) in &listening {
        if let Err(e) = probe.mark_listener(pid) {
            tracing::warn!(error = %e, pid, "could not mark a listening process");
        }
    }
    // The probe is attached: BPF and perf capabilities are no longer needed, nor any
    // other but what changes priorities and makes the idle group.
    match host::drop_capabilities() {
        Ok(kept) => tracing::info!(?kept, "dropped every other capability"),
        Err(e) => tracing::warn!(error = %e, "could not drop capabilities"),
    }
    // Threads started from here on inherit only the capabilities kept: the log's
    // background writer is one.
    log_writer::go_background();
    let shared = control::Shared::new(controls.reload.clone());
    let control = control::ControlServer::start(socket, shared.clone())
        .context("starting the control socket's thread")?;
    let metrics = Arc::new(metrics::Metrics::new());
    let _metrics_server = match opts.config.metrics.listen {
        Some(addr) => Some(metrics::MetricsServer::start(addr, metrics.clone())?),
        None => None,
    };
    let scans = opts.config.batch.enabled
        || !opts.config.services.is_empty()
        || !opts.config.role.is_empty();
    let scanner = match scans {
        true => Some(
            scanner::Scanner::start(probe.take_task_iter(), &opts.config, listening)
                .context("starting the scanner thread")?,
        ),
        false => None,
    };

    let journal = if opts.dry_run {
        None
    } else {
        Some(
            Journal::open(&opts.run_dir)
                .with_context(|| format!("opening the journal in {}", opts.run_dir.display()))?,
        )
    };
    let mut actuator = KernelActuator::new(journal, opts.config.hands_off.comms.clone())
        .context("starting the actuator")?;
    let layout = appease_cgroup::HostLayout::detect();
    tracing::info!(
        layout = layout.kind.name(),
        hierarchy = ?layout.cpu_hierarchy,
        systemd = layout.systemd,
        container = ?layout.container,
        sched_ext = ?layout.sched_ext,
        effects = %layout.effects(),
        "host layout"
    );
    let layout_view = status::LayoutView::from(&layout);
    services_available(&opts.config, &layout_view).map_err(anyhow::Error::msg)?;
    let wants_groups = opts.config.batch.enabled || !opts.config.services.is_empty();
    if wants_groups {
        match appease_cgroup::Cgroups::detect() {
            Ok(cg) => {
                tracing::info!(hierarchy = %cg.root().display(), version = ?cg.version(), "cgroups in use");
                let systemd_owned = cg.version() == appease_cgroup::Version::V2 && layout.systemd;
                let mut groups = appease_actuator::Groups::new(cg, &opts.config.batch.group)
                    .owned_by_systemd(systemd_owned);
                if systemd_owned {
                    match appease_actuator::systemd::SystemBus::connect() {
                        Ok(bus) => groups = groups.with_units(Box::new(bus)),
                        Err(e) => tracing::warn!(
                            error = %e,
                            "systemd's bus is not reachable: batch is demoted per thread only"
                        ),
                    }
                }
                actuator = actuator.with_groups(groups);
            }
            Err(e) if opts.config.services.is_empty() => {
                tracing::warn!(error = %e, "batch demotion off: no usable CPU cgroup hierarchy")
            }
            Err(e) => return Err(e).context("latency services need a CPU cgroup hierarchy"),
        }
    }
    // Service groups are created now: a path the kernel refuses is an error before any
    // process is touched (and the groups made so far are removed again).
    for svc in &opts.config.services {
        if let Err(e) = actuator.ensure_service_group(&svc.group_name(), svc.weight) {
            actuator.restore_all();
            return Err(e).with_context(|| {
                format!(
                    "service {:?}: cannot set up its group /{}",
                    svc.name,
                    svc.group_name()
                )
            });
        }
    }
    // After the actuator has read the kernel's default slice from this thread.
    let priority = host::prioritize_self();
    let mut daemon = Daemon::new(opts, probe, actuator, scanner, shared, metrics);
    daemon.layout = layout_view;
    tracing::info!(
        pid = std::process::id(),
        priority,
        cpus = daemon.cpus,
        dry_run = daemon.opts.dry_run,
        config = %daemon.config_origin(),
        "appease daemon running"
    );
    // Under systemd (Type=notify): started. Nothing happens without NOTIFY_SOCKET.
    notify_systemd(&[sd_notify::NotifyState::Ready]);
    // Whatever ends the loop (signal, error, panic), every change is put back.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        daemon.event_loop(&controls)
    }));
    notify_systemd(&[sd_notify::NotifyState::Stopping]);
    let report = daemon.actuator.restore_all();
    daemon.actuator.trail.report_held();
    // No state served after the exit.
    drop(control);
    let RestoreReport {
        restored,
        gone,
        left_alone,
        failed,
    } = report;
    if failed == 0 {
        tracing::info!(
            restored,
            gone,
            left_alone,
            "restored every thread appease changed; exiting"
        );
    } else {
        // The journal keeps what could not be put back, for `appease restore` to retry.
        tracing::warn!(
            restored,
            gone,
            left_alone,
            failed,
            "could not restore every change (see the warnings above); the journal in {} keeps them for `appease restore`; exiting",
            daemon.opts.run_dir.display()
        );
    }
    match result {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    }
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
            cpus,
            clock_tick_ns: appease_cgroup::clock_tick_ns().max(1),
            started: unix_now(),
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
            let stall = self
                .scanner
                .as_ref()
                .and_then(|s| s.stall_due())
                .unwrap_or(u64::MAX);
            let due = next_tick
                .min(next_load)
                .min(next_status)
                .min(next_scan)
                .min(stall);
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
            // Decay needs fine ticks only while something is elevated.
            let lifted = self.batch.as_ref().is_some_and(|b| b.lifted());
            let tick = if self.policy.any_elevated() || lifted {
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

    fn reload(&mut self) {
        // Under systemd (Type=notify-reload): reloading now, ready again after.
        if let Ok(now) = sd_notify::NotifyState::monotonic_usec_now() {
            notify_systemd(&[sd_notify::NotifyState::Reloading, now]);
        }
        let report = self.load_config_again();
        self.shared.reloaded(&report);
        notify_systemd(&[sd_notify::NotifyState::Ready]);
    }

    /// Reads the config file again and applies all of it but the keys only a restart
    /// changes; an invalid file leaves the running config as it is.
    fn load_config_again(&mut self) -> control::ReloadReport {
        let mut report = control::ReloadReport {
            config: self.config_origin(),
            ..Default::default()
        };
        let Some(path) = self.opts.config_path.clone() else {
            tracing::info!("reload requested; the embedded default config is unchanged");
            report.applied = true;
            return report;
        };
        let mut cfg = match Config::load(&path)
            .map_err(|e| e.to_string())
            .and_then(|c| services_available(&c, &self.layout).map(|()| c))
        {
            Ok(cfg) => cfg,
            Err(e) => {
                tracing::error!(error = %e, "config reload failed; keeping the last good config");
                report.error = Some(e);
                return report;
            }
        };
        let old = self.opts.config.clone();
        // What only a restart changes keeps its running value, and is reported.
        let mut restart_only = |name: &str, changed: bool| {
            if changed {
                report.needs_restart.push(name.to_string());
            }
        };
        restart_only("[probe]", cfg.probe != old.probe);
        restart_only("[batch] enabled", cfg.batch.enabled != old.batch.enabled);
        restart_only("[batch] group", cfg.batch.group != old.batch.group);
        restart_only("[metrics] listen", cfg.metrics != old.metrics);
        restart_only("[control] group", cfg.control != old.control);
        // The probe reports lock waits within the window it was loaded with.
        restart_only(
            "[elevation.sink] lifting (after_cpu_ms, lift_ms)",
            serving_window(&cfg) != serving_window(&old),
        );
        cfg.probe = old.probe.clone();
        cfg.batch.enabled = old.batch.enabled;
        cfg.batch.group = old.batch.group.clone();
        cfg.metrics = old.metrics.clone();
        cfg.control = old.control.clone();
        if self.scanner.is_none() {
            // Nothing scans processes: services and roles would never be applied.
            restart_only("[[service]]", cfg.services != old.services);
            restart_only("[[role]]", cfg.role != old.role || cfg.roles != old.roles);
            cfg.services = old.services.clone();
            cfg.role = old.role.clone();
            cfg.roles = old.roles.clone();
        }
        let changed = &mut report.changed;
        if cfg.elevation != old.elevation {
            self.policy.set_params(cfg.elevation_params());
            self.tick = Duration::from_millis(cfg.elevation.tick_ms);
            changed.push("[elevation]".into());
        }
        if cfg.hands_off != old.hands_off {
            self.actuator.set_exceptions(cfg.hands_off.comms.clone());
            for tid in self.actuator.release_excepted_threads() {
                self.policy.forget(tid);
            }
            let moved = self.actuator.release_excepted_processes();
            changed.push(format!("[hands_off] (processes moved back: {moved})"));
        }
        for svc in &old.services {
            if !cfg.services.iter().any(|s| s.name == svc.name) {
                let r = self.actuator.remove_service_group(&svc.group_name());
                changed.push(format!(
                    "[[service]] {} removed ({} moved back)",
                    svc.name, r.restored
                ));
            }
        }
        for svc in &cfg.services {
            let before = old.services.iter().find(|s| s.name == svc.name);
            if before == Some(svc) {
                continue;
            }
            match self
                .actuator
                .ensure_service_group(&svc.group_name(), svc.weight)
            {
                Ok(_) if before.is_none() => {
                    changed.push(format!("[[service]] {} added", svc.name))
                }
                Ok(_) => changed.push(format!("[[service]] {} changed", svc.name)),
                Err(e) => report.failed.push(format!(
                    "[[service]] {}: cannot set up its group: {e}",
                    svc.name
                )),
            }
        }
        if cfg.role != old.role || cfg.roles != old.roles {
            changed.push("[[role]]".into());
        }
        if cfg.rules != old.rules {
            changed.push("[[rule]]".into());
        }
        if cfg.batch != old.batch {
            changed.push("[batch]".into());
        }
        if let Some(b) = self.batch.as_mut() {
            b.set_config(&cfg);
        }
        self.shared_config = Arc::new(cfg.clone());
        self.opts.config = cfg;
        report.applied = true;
        tracing::info!(
            config = %path.display(),
            changed = ?report.changed,
            "config reloaded"
        );
        if !report.needs_restart.is_empty() {
            tracing::warn!(keys = ?report.needs_restart, "changed keys keep their running value until a restart");
        }
        for f in &report.failed {
            tracing::warn!(failed = %f, "part of the reloaded config could not be applied");
        }
        report
    }

    fn on_event(&mut self, e: Event) {
        match e {
            Event::Request {
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
                ..
            } => {
                // appease's own commands (status, reload) read the daemon's replies from
                // its control socket: not a customer's request.
                if proc_comm == OWN_COMM {
                    return;
                }
                self.metrics.request(family);
                let process = (pid, proc_start_ns / self.clock_tick_ns);
                if let Some(b) = self.batch.as_mut() {
                    b.on_request(process, ts_ns, &self.opts.config, &mut self.actuator);
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
                self.actuator.expect(Some(Identity {
                    tid,
                    start: start_ns / self.clock_tick_ns,
                    comm,
                    proc_comm,
                }));
                if let Some(d) = self.policy.on_app_request(
                    ts_ns,
                    app,
                    pid,
                    tid,
                    source,
                    cpu_ns,
                    self.load.current(),
                ) {
                    if self.apply(d) {
                        let us = monotonic_ns().saturating_sub(ts_ns) / 1000;
                        let h = if woke {
                            self.metrics.elevation_latency(us);
                            &mut self.latency_us
                        } else {
                            &mut self.deferred_latency_us
                        };
                        let _saturates_instead = h.record(us.max(1));
                    }
                }
                self.actuator.expect(None);
                // After the elevation: a surfaced thread's application may need telling.
                self.tell_probe();
            }
            Event::Exit { pid, tid, .. } => {
                self.policy.forget(tid);
                self.actuator.forget(tid);
                if pid == tid {
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
        let decisions = self
            .policy
            .on_tick(now, appease_actuator::sys::thread_cpu_ns);
        self.tell_probe();
        let spent = self
            .batch
            .as_mut()
            .and_then(|b| b.end_spent_lift(now, &self.opts.config, &mut self.actuator));
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
        let restoring = matches!(d, Decision::Restore { .. });
        let counted = match &d {
            Decision::Elevate { reason, .. } | Decision::Sink { reason, .. } => (false, *reason),
            Decision::Restore { reason, .. } => (true, *reason),
        };
        let (tid, result) = match d {
            Decision::Elevate {
                pid,
                tid,
                levels,
                slice,
                reason,
            } => (
                tid,
                self.actuator
                    .elevate(pid, tid, levels, slice, reason.as_str()),
            ),
            Decision::Restore { tid, reason, .. } => {
                (tid, self.actuator.restore(tid, reason.as_str()))
            }
            Decision::Sink {
                pid,
                tid,
                levels,
                reason,
            } => (tid, self.actuator.sink(pid, tid, levels, reason.as_str())),
        };
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
            updated: unix_now(),
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
/// A thread serves a request for as long as a request may compute before it sinks: its
/// lock waits within that time are a customer's (lifting sunk threads needs them). The
/// probe measures it from the thread's last reported request, and reads are reported at
/// most every `min_gap_ms`: never shorter than that.
fn serving_window(cfg: &Config) -> Option<Duration> {
    let sink = &cfg.elevation.sink;
    (cfg.elevation.enabled && sink.after_cpu_ms > 0 && sink.lift_ms > 0)
        .then(|| Duration::from_millis(sink.after_cpu_ms.max(cfg.probe.min_gap_ms).max(10)))
}

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

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
