//! The daemon's life: start up (checks, locks, leftovers, the probe, capabilities, the
//! control socket, the scanner, the actuator), run the event loop, shut down (everything
//! put back, whatever ended the loop).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use appease_actuator::{restore_journal, Journal, KernelActuator, RestoreReport};
use appease_config::Config;
use appease_probe::{Probe, ProbeConfig, ProbeStorage};

use crate::probe_settings::{held_gap, serving_window};
use crate::{
    control, host, log_writer, metrics, notify_systemd, scanner, services_available, status,
    Controls, Daemon, DaemonOptions, RunLock,
};

/// Checks what the daemon needs before anything is changed.
pub fn preflight() -> Result<()> {
    if !host::is_root() {
        bail!(
            "appease daemon needs root: it loads BPF programs and changes other processes' priorities \
             (run it as root, e.g. with sudo)"
        );
    }
    // A system container (its own PID and cgroup namespaces, systemd as its PID 1) is a
    // host of its own: appease manages what runs there, named as there.
    let own_pids = host::in_nested_pid_namespace();
    let system_container = own_pids && host::pid1_is_systemd();
    if own_pids && !system_container {
        bail!(
            "appease runs in a PID namespace of its own whose PID 1 is not systemd (an \
             application container): it would see and change only that container's \
             processes, not the host's. Run it in the host's PID namespace: `--pid=host` \
             (Docker, Podman), `hostPID: true` (Kubernetes, see deploy/), or on the host; in \
             a system container, systemd as its PID 1"
        );
    }
    if host::in_nested_cgroup_namespace() && !system_container {
        // A container with a private cgroup view (containerd's pods on cgroup v2 nodes),
        // sharing the host's PIDs (checked above).
        if let Err(e) = host::join_host_cgroup_namespace() {
            bail!(
                "appease runs in a cgroup namespace of its own (a container with a private \
                 cgroup view) and could not join the host's ({e}): it must see and change the \
                 host's cgroups. Grant the capabilities SYS_PTRACE and SYS_ADMIN (as \
                 deploy/appease-daemonset.yaml does; both are dropped once joined), or run it \
                 in the host's cgroup namespace: `--cgroupns=host` (Docker, Podman)"
            );
        }
        if host::in_nested_cgroup_namespace() {
            bail!(
                "appease joined kthreadd's cgroup namespace, and it is not the host's: run it \
                 in the host's PID namespace"
            );
        }
        tracing::info!(
            "joined the host's cgroup namespace (kthreadd's): cgroups named and moved as on \
             the host"
        );
    }
    if system_container {
        tracing::info!(
            "in a system container (a PID namespace of its own, systemd as its PID 1): \
             managing the processes and cgroups of this container only"
        );
    }
    Ok(())
}

/// Undoes what an earlier daemon left (after a crash). Needs the run lock.
pub fn restore_leftovers(dir: &Path) -> Result<RestoreReport> {
    restore_journal(dir).with_context(|| format!("restoring from the journal in {}", dir.display()))
}

/// Test builds: the chaos harness's crash points, from FAILPOINTS, while the value lives.
#[cfg(feature = "failpoints")]
pub fn crash_points() -> fail::FailScenario<'static> {
    fail::FailScenario::setup()
}

/// Builds without crash points have none to set up.
#[cfg(not(feature = "failpoints"))]
pub fn crash_points() {}

/// Runs the daemon until `controls` asks it to stop; every change is put back on the
/// way out, whatever ends the loop (signal, error, panic).
pub fn run(opts: DaemonOptions, controls: Controls) -> Result<()> {
    let _failpoints = crash_points();
    preflight()?;
    let _locks = take_locks(&opts)?;
    let mut storage = ProbeStorage::uninit();
    let (mut daemon, servers) = start(opts, &controls, &mut storage)?;
    // Under systemd (Type=notify): started. Nothing happens without NOTIFY_SOCKET.
    notify_systemd(&[sd_notify::NotifyState::Ready]);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        daemon.event_loop(&controls)
    }));
    shut_down(&mut daemon, servers);
    match result {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// The run directory's lock, and the batch group's unless this is a dry run (a dry run
/// changes nothing: it may watch beside a daemon that acts). Each is released when dropped.
fn take_locks(opts: &DaemonOptions) -> Result<(RunLock, Option<RunLock>)> {
    let run = RunLock::acquire(&opts.run_dir)?;
    let group = match opts.dry_run {
        false => Some(RunLock::acquire_group(&opts.config.batch.group)?),
        true => None,
    };
    Ok((run, group))
}

/// What serves the daemon's state to others: stopped after everything is put back.
struct Servers {
    control: control::ControlServer,
    _metrics: Option<metrics::MetricsServer>,
}

/// Everything up to the event loop. Before any of it changes a thing, what an earlier
/// daemon left is put back.
fn start<'obj>(
    opts: DaemonOptions,
    controls: &Controls,
    storage: &'obj mut ProbeStorage,
) -> Result<(Daemon<'obj>, Servers)> {
    for warning in opts.config.comm_trust_warnings() {
        tracing::warn!("{warning}");
    }
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
    let (mut probe, listening) = start_probe(&opts.config, storage)?;
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
    let metrics_server = match opts.config.metrics.listen {
        Some(addr) => Some(metrics::MetricsServer::start(addr, metrics.clone())?),
        None => None,
    };
    let cfg = &opts.config;
    let scans = cfg.batch.enabled || !cfg.services.is_empty() || !cfg.role.is_empty();
    let scanner = match scans {
        true => Some(
            scanner::Scanner::start(probe.take_task_iter(), cfg, listening)
                .context("starting the scanner thread")?,
        ),
        false => None,
    };
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
    services_available(cfg, &layout_view).map_err(anyhow::Error::msg)?;
    let actuator = start_actuator(&opts, &layout)?;
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
    let servers = Servers {
        control,
        _metrics: metrics_server,
    };
    Ok((daemon, servers))
}

/// The request probe, loaded and attached, and the processes that listened before it:
/// the probe sees every listen() from now on, and what listened before is read now,
/// while reading other processes' open files is still allowed.
fn start_probe<'obj>(
    cfg: &Config,
    storage: &'obj mut ProbeStorage,
) -> Result<(Probe<'obj>, HashSet<(u32, u64)>)> {
    let probe_cfg = ProbeConfig {
        min_gap: Duration::from_millis(cfg.probe.min_gap_ms),
        ignore_pid: Some(std::process::id()),
        serving_window: serving_window(cfg),
        // Until the first tick finds whether it reads held threads' requests.
        held_gap: held_gap(cfg, false),
        uid_min: cfg.users.uid_min(),
        user_events_per_s: cfg.users.events_per_s,
        users_events_per_s: cfg.users.all_events_per_s,
        ..ProbeConfig::default()
    };
    let mut probe = Probe::load(&probe_cfg, storage).context("starting the request probe")?;
    let listening = match cfg.batch.enabled || cfg.elevation.enabled {
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
    // And the workers they forked before: their server's, as later ones will be.
    if !listening.is_empty() {
        for (pid, app) in host::older_workers(&host::scan_processes(), &listening) {
            if let Err(e) = probe.set_app(pid, app) {
                tracing::warn!(error = %e, pid, app, "could not give a worker its server");
            }
        }
    }
    Ok((probe, listening))
}

/// The actuator with its journal (none in a dry run), its groups where batch or services
/// need them, and the services' groups made: a path the kernel refuses is an error before
/// any process is touched (and the groups made so far are removed again).
fn start_actuator(
    opts: &DaemonOptions,
    layout: &appease_cgroup::HostLayout,
) -> Result<KernelActuator> {
    let cfg = &opts.config;
    let journal = match opts.dry_run {
        true => None,
        false => Some(
            Journal::open(&opts.run_dir)
                .with_context(|| format!("opening the journal in {}", opts.run_dir.display()))?,
        ),
    };
    let mut actuator = KernelActuator::new(journal, cfg.hands_off.comms.clone())
        .context("starting the actuator")?;
    if cfg.batch.enabled || !cfg.services.is_empty() {
        match appease_cgroup::Cgroups::detect() {
            Ok(cg) => actuator = actuator.with_groups(groups_of(cg, cfg, layout)),
            Err(e) if cfg.services.is_empty() => {
                tracing::warn!(error = %e, "batch demotion off: no usable CPU cgroup hierarchy")
            }
            Err(e) => return Err(e).context("latency services need a CPU cgroup hierarchy"),
        }
    }
    for svc in &cfg.services {
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
    Ok(actuator)
}

/// The groups the actuator moves processes in; on a cgroup v2 host under systemd, with
/// systemd's bus for its units when it can be reached.
fn groups_of(
    cg: appease_cgroup::Cgroups,
    cfg: &Config,
    layout: &appease_cgroup::HostLayout,
) -> appease_actuator::Groups {
    tracing::info!(hierarchy = %cg.root().display(), version = ?cg.version(), "cgroups in use");
    let systemd_owned = cg.version() == appease_cgroup::Version::V2 && layout.systemd;
    let groups =
        appease_actuator::Groups::new(cg, &cfg.batch.group).owned_by_systemd(systemd_owned);
    if !systemd_owned {
        return groups;
    }
    match appease_actuator::systemd::SystemBus::connect() {
        Ok(bus) => groups.with_units(Box::new(bus)),
        Err(e) => {
            tracing::warn!(
                error = %e,
                "systemd's bus is not reachable: batch is demoted per thread only"
            );
            groups
        }
    }
}

/// Puts back every change, then stops serving state (none is served after the exit).
fn shut_down(daemon: &mut Daemon, servers: Servers) {
    notify_systemd(&[sd_notify::NotifyState::Stopping]);
    let report = daemon.actuator.restore_all();
    daemon.actuator.trail.report_held();
    drop(servers.control);
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
}
