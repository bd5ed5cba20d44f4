//! What users run instead of appease, as bench modes: system76-scheduler (Pop!_OS: priority
//! profiles by process name and cgroup) and the original Ananicy (rules by process name:
//! nice, I/O class, scheduling policy, a CPU-quota cgroup). Each runs as its users run it,
//! the installed daemon with its own configuration and rules, started before the batch
//! load and stopped after it.
//!
//! Neither daemon undoes what it changed when it stops, so the mode does: it records every
//! thread's nice, policy, I/O priority, OOM score adjustment and CPU cgroup, the cgroups
//! that exist and the scheduler's machine-wide settings before the peer starts, and puts
//! back whatever differs once it has stopped (threads of the run itself end with it). What
//! the peer changed while it ran is reported with the mode's result.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use appease_cgroup::{Cgroups, ProcStat, Version};
use serde::{Deserialize, Serialize};

use crate::find_on_path;

/// A peer daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    Ananicy,
    System76Scheduler,
}

impl Peer {
    /// Its mode name and the program name it is installed under.
    pub fn name(self) -> &'static str {
        match self {
            Peer::Ananicy => "ananicy",
            Peer::System76Scheduler => "system76-scheduler",
        }
    }

    /// How long it needs after the batch starts to have seen it: Ananicy scans every
    /// 5 s, skips processes younger than that, and on a loaded host its scan (a program
    /// run per thread to read its I/O class) takes seconds more; system76-scheduler, without execsnoop
    /// (BPF kprobes, which some kernels lack), rescans every 60 s.
    pub fn settle(self) -> Duration {
        match self {
            Peer::Ananicy => Duration::from_secs(20),
            Peer::System76Scheduler => Duration::from_secs(65),
        }
    }

    /// How to get it, for the message when it is missing.
    fn how_to_get(self) -> &'static str {
        match self {
            Peer::Ananicy => {
                "install the original Ananicy (github.com/Nefelim4ag/Ananicy, tag 2.2.1: `make install`, \
                 which puts its rules in /etc/ananicy.d; `make install PREFIX=DIR` and \
                 --peer-bin ananicy=DIR/usr/bin/ananicy keep it out of /etc) and Debian's schedtool"
            }
            Peer::System76Scheduler => {
                "build system76-scheduler (github.com/pop-os/system76-scheduler) with `just install`, \
                 or put its binary on the PATH (or --peer-bin system76-scheduler=PATH) and its \
                 data/config.kdl and data/pop_os.kdl under /etc/system76-scheduler \
                 (config.kdl, process-scheduler/pop_os.kdl); it also needs Debian's dbus"
            }
        }
    }
}

/// A peer found on this host, with what it needs.
#[derive(Clone, Debug)]
pub struct Located {
    pub peer: Peer,
    pub bin: PathBuf,
    /// Ananicy: the directory of its rules (with a trailing '/', as it expects).
    config_dir: Option<PathBuf>,
}

/// Finds `peer`: `--peer-bin NAME=PATH`, else its program on the PATH; Err is the message
/// that says what is missing and how to get it.
pub fn locate(peer: Peer, given: &[(String, PathBuf)]) -> std::result::Result<Located, String> {
    let missing = |what: String| Err(format!("{what}: {}", peer.how_to_get()));
    let bin = match given.iter().find(|(n, _)| n == peer.name()) {
        Some((_, path)) if path.is_file() => path.clone(),
        Some((_, path)) => {
            return missing(format!(
                "{} is not installed: --peer-bin names {}, which is not a file",
                peer.name(),
                path.display()
            ))
        }
        None => match find_on_path(peer.name()) {
            Some(p) => p,
            None => {
                return missing(format!(
                    "{} is not installed (not on the PATH, no --peer-bin {}=PATH)",
                    peer.name(),
                    peer.name()
                ))
            }
        },
    };
    match peer {
        Peer::Ananicy => {
            // Installed to / it reads /etc/ananicy.d; installed under a prefix, the rules
            // are at PREFIX/etc/ananicy.d beside PREFIX/usr/bin/ananicy.
            let beside = bin
                .parent()
                .and_then(Path::parent)
                .and_then(Path::parent)
                .map(|prefix| prefix.join("etc/ananicy.d"));
            let config_dir = [Some(PathBuf::from("/etc/ananicy.d")), beside]
                .into_iter()
                .flatten()
                .find(|d| d.join("ananicy.conf").is_file());
            let Some(config_dir) = config_dir else {
                return missing(format!(
                    "ananicy's rules are not installed (no ananicy.conf in /etc/ananicy.d or beside {})",
                    bin.display()
                ));
            };
            for (tool, package) in [
                ("python3", "python3"),
                ("schedtool", "schedtool"),
                ("ionice", "util-linux"),
            ] {
                if find_on_path(tool).is_none() {
                    return Err(format!(
                        "ananicy needs {tool}, which is not installed: apt-get install {package}"
                    ));
                }
            }
            Ok(Located {
                peer,
                bin,
                config_dir: Some(config_dir),
            })
        }
        Peer::System76Scheduler => {
            let configs = [
                "/etc/system76-scheduler/config.kdl",
                "/usr/share/system76-scheduler/config.kdl",
            ];
            if !configs.iter().any(|c| Path::new(c).is_file()) {
                return missing(format!(
                    "system76-scheduler's configuration is not installed ({})",
                    configs.join(" or ")
                ));
            }
            if find_on_path("dbus-daemon").is_none() {
                return Err(
                    "system76-scheduler needs a system D-Bus, and dbus-daemon is not installed: apt-get install dbus"
                        .into(),
                );
            }
            Ok(Located {
                peer,
                bin,
                config_dir: None,
            })
        }
    }
}

/// What the peer changed while it ran, for the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerReport {
    pub bin: String,
    /// At the end of the measurement, one line per kind of change: "make (12 threads):
    /// nice 0 → 19", …
    pub changed: Vec<String>,
    /// Changes seen while it ran (sampled every `SAMPLE_EVERY` from its start) and gone
    /// by the end: a short-lived process it caught, with the most threads seen at once.
    #[serde(default)]
    pub changed_before_end: Vec<String>,
}

/// How often what a peer has changed is sampled while it runs: the peers scan every 5 s
/// (Ananicy) or 60 s (system76-scheduler without execsnoop).
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Threads changed, per (command, change): how many.
type Counts = BTreeMap<(String, String), usize>;

/// Samples what a peer has changed until finished; returns the most threads seen at once
/// per (command, change).
struct Sampler {
    /// Dropped to end the sampling at once.
    stop: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<Counts>,
}

impl Sampler {
    fn start(before: Arc<Snapshot>, own: u32, every: Duration) -> Self {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let mut seen = Counts::new();
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                most_at_once(&mut seen, count_changes(&before, &without_tree(own)));
            }
            seen
        });
        Sampler { stop, thread }
    }

    fn finish(self) -> Counts {
        drop(self.stop);
        self.thread.join().unwrap_or_default()
    }
}

/// The changes seen while the peer ran that are not there at the end.
fn gone_by_end(seen: Counts, at_end: &Counts) -> Counts {
    seen.into_iter()
        .filter(|(key, _)| !at_end.contains_key(key))
        .collect()
}

/// Keeps in `seen` the most threads each change had at once.
fn most_at_once(seen: &mut Counts, now: Counts) {
    for (key, n) in now {
        let most = seen.entry(key).or_default();
        *most = (*most).max(n);
    }
}

/// The machine's state now, without the peer's own processes (started at its unit's
/// nice: not its doing).
fn without_tree(own: u32) -> Snapshot {
    let mut now = Snapshot::take();
    let tree: Vec<u32> = now
        .threads
        .iter()
        .filter(|(_, t)| descends_from(&now, t.pid, own))
        .map(|(&tid, _)| tid)
        .collect();
    for tid in tree {
        now.threads.remove(&tid);
    }
    now
}

/// Starts Ananicy's daemon class from its installed program (argv 1) with its rules'
/// directory (argv 2). One difference from `ananicy start`: a /proc/PID/exe that root may
/// not resolve (a sandbox's PID 1) reads as unresolved, a process no rule names, where
/// Ananicy's own scan would die of the PermissionError; every other process is handled
/// as Ananicy handles it.
const ANANICY_START: &str = "\
import importlib.machinery, os, sys
resolve = os.path.realpath
def realpath(path, *args, **kwargs):
    try:
        return resolve(path, *args, **kwargs)
    except PermissionError:
        return path
os.path.realpath = realpath
ananicy = importlib.machinery.SourceFileLoader('ananicy', sys.argv[1]).load_module()
ananicy.Ananicy(config_dir=sys.argv[2]).run()
";

/// A running peer, stopped and undone with the run.
pub(crate) struct PeerRun {
    pub peer: Peer,
    child: Child,
    bus: Option<Child>,
    before: Arc<Snapshot>,
    /// What it changes while it runs, sampled until the report.
    sampler: Option<Sampler>,
    bin: PathBuf,
    log: PathBuf,
}

/// Starts `located` (and for system76-scheduler a system bus of its own) after
/// recording the machine's state.
pub(crate) fn start(located: &Located, tmp: &Path) -> Result<PeerRun> {
    let before = Arc::new(Snapshot::take());
    let mut bus = None;
    match launch(located, tmp, &mut bus) {
        Ok((child, log)) => {
            let sampler = Some(Sampler::start(before.clone(), child.id(), SAMPLE_EVERY));
            let mut run = PeerRun {
                peer: located.peer,
                child,
                bus,
                before,
                sampler,
                bin: located.bin.clone(),
                log: log.clone(),
            };
            // Up: still running a moment later (a bad install fails at once).
            std::thread::sleep(Duration::from_millis(1500));
            if let Ok(Some(status)) = run.child.try_wait() {
                let text = fs::read_to_string(&log).unwrap_or_default();
                for failed in run.stop_and_restore() {
                    tracing::warn!(
                        "could not put back what {} changed: {failed}",
                        located.peer.name()
                    );
                }
                bail!(
                    "{} exited at once ({status}): {}",
                    located.peer.name(),
                    text.lines().last().unwrap_or("no message")
                );
            }
            // Both peers turn autogroup off. A running task keeps the task group it had
            // (the kernel looks it up again only when the task moves), so the bench's own
            // threads, its client among them, would stay in their session's autogroup, a
            // group of weight 1024 against tasks started later at the root: seated again,
            // they are where a process started after the peer is.
            reseat_own_threads();
            Ok(run)
        }
        Err(e) => {
            // Half started: the bus down, and what was set before the failure put back.
            if let Some(mut b) = bus {
                let _already_gone = b.kill();
                let _reaped = b.wait();
            }
            for failed in before.restore() {
                tracing::warn!(
                    "could not put back what {} changed: {failed}",
                    located.peer.name()
                );
            }
            Err(e)
        }
    }
}

/// Starts the peer's process (and its bus into `bus`); its log's path.
fn launch(located: &Located, tmp: &Path, bus: &mut Option<Child>) -> Result<(Child, PathBuf)> {
    let log = tmp.join(format!("{}.log", located.peer.name()));
    let out = fs::File::create(&log)?;
    let mut cmd = match located.peer {
        Peer::Ananicy => {
            // As its systemd unit runs it: autogroup off first (put back at the end).
            fs::write("/proc/sys/kernel/sched_autogroup_enabled", "0")
                .context("turning autogroup off, as Ananicy's unit does")?;
            let conf = located.config_dir.as_ref().expect("located with its rules");
            // Its command line fixes the rules at /etc/ananicy.d, so it is started
            // through the class that `ananicy start` runs, with its rules' directory
            // given. -u: its change lines unbuffered into the log.
            // At nice 19, as its systemd unit runs it (Nice=19).
            let mut c = Command::new("nice");
            c.args(["-n", "19", "python3", "-u", "-c", ANANICY_START])
                .arg(&located.bin)
                .arg(format!("{}/", conf.display()));
            c.env("LANG", "").env("LANGUAGE", "");
            c
        }
        Peer::System76Scheduler => {
            let socket = tmp.join("system-bus.sock");
            let conf = tmp.join("system-bus.conf");
            // A system bus of its own (none may run here): it may own its name on it.
            fs::write(
                &conf,
                format!(
                    "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN\"\n \
                     \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n\
                     <busconfig><type>system</type><listen>unix:path={}</listen><auth>EXTERNAL</auth>\
                     <policy context=\"default\"><allow user=\"*\"/><allow own=\"*\"/>\
                     <allow send_destination=\"*\"/><allow receive_sender=\"*\"/></policy></busconfig>\n",
                    socket.display()
                ),
            )?;
            let b = Command::new("dbus-daemon")
                .arg(format!("--config-file={}", conf.display()))
                .args(["--nofork", "--nopidfile"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(out.try_clone()?)
                .spawn()
                .context("starting a system bus for system76-scheduler")?;
            *bus = Some(b);
            crate::wait_until(Duration::from_secs(5), || socket.exists())
                .context("the system bus did not start")?;
            let mut c = Command::new(&located.bin);
            c.arg("daemon").env(
                "DBUS_SYSTEM_BUS_ADDRESS",
                format!("unix:path={}", socket.display()),
            );
            c
        }
    };
    // Its own process group: system76-scheduler leaves helpers behind on SIGTERM.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("starting {}", located.bin.display()))?;
    Ok((child, log))
}

impl PeerRun {
    /// What it has changed, against the state before it started: at the end of the
    /// measurement, and what it changed meanwhile that is gone by then. Ends the sampling.
    pub(crate) fn report(&mut self) -> PeerReport {
        let seen = self.sampler.take().map(Sampler::finish).unwrap_or_default();
        let now = without_tree(self.child.id());
        let at_end = count_changes(&self.before, &now);
        PeerReport {
            bin: self.bin.display().to_string(),
            changed_before_end: lines(gone_by_end(seen, &at_end)),
            changed: summarize(at_end, &self.before, &now),
        }
    }

    /// Stops the peer and its helpers (its process group) and its bus.
    fn stop(&mut self) {
        if let Some(s) = self.sampler.take() {
            s.finish();
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            let group = self.child.id() as libc::pid_t;
            // SAFETY: the process group our own child leads.
            unsafe { libc::kill(-group, libc::SIGTERM) };
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(3) && matches!(self.child.try_wait(), Ok(None))
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            // SAFETY: as above; whatever of the group is left.
            unsafe { libc::kill(-group, libc::SIGKILL) };
        }
        let _reaped = self.child.wait();
        if let Some(mut b) = self.bus.take() {
            let _already_gone = b.kill();
            let _reaped = b.wait();
        }
    }

    /// Stops the peer and puts back what it changed; the run's own processes must be
    /// gone first (their cgroups are removed here). Returns what could not be put back.
    pub(crate) fn stop_and_restore(mut self) -> Vec<String> {
        self.stop();
        if std::env::var_os("APPEASE_BENCH_KEEP").is_some() {
            eprintln!("    {}'s log: {}", self.peer.name(), self.log.display());
        }
        let failed = self.before.restore();
        // Autogroup back on: the bench's threads back in their session's group, as the
        // modes before this one ran.
        reseat_own_threads();
        failed
    }
}

/// One thread's scheduling state, as a peer may change it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ThreadState {
    pid: u32,
    ppid: u32,
    comm: String,
    start: u64,
    nice: i32,
    policy: u32,
    rt_priority: i32,
    ioprio: i32,
    /// Its group in the cpu controller's hierarchy.
    cgroup: Option<String>,
    /// The process's OOM score adjustment.
    oom_score_adj: Option<i32>,
}

impl ThreadState {
    /// What a thread starts with when nobody changed it.
    fn default_for(pid: u32, comm: &str, start: u64) -> Self {
        ThreadState {
            pid,
            ppid: 0,
            comm: comm.into(),
            start,
            nice: 0,
            policy: 0,
            rt_priority: 0,
            ioprio: 0,
            cgroup: Some("/".into()),
            oom_score_adj: Some(0),
        }
    }
}

/// The machine's scheduling state: every user thread's, the cgroups, the settings.
struct Snapshot {
    threads: BTreeMap<u32, ThreadState>,
    groups: BTreeSet<String>,
    settings: Vec<(PathBuf, String)>,
    cgroups: Option<Cgroups>,
}

/// The scheduler settings a peer may write machine-wide (system76-scheduler's CFS
/// profiles, autogroup).
const SETTINGS: &[&str] = &[
    "/proc/sys/kernel/sched_autogroup_enabled",
    "/proc/sys/kernel/sched_cfs_bandwidth_slice_us",
    "/proc/sys/kernel/sched_latency_ns",
    "/proc/sys/kernel/sched_min_granularity_ns",
    "/proc/sys/kernel/sched_wakeup_granularity_ns",
    "/sys/kernel/debug/sched/latency_ns",
    "/sys/kernel/debug/sched/min_granularity_ns",
    "/sys/kernel/debug/sched/wakeup_granularity_ns",
    "/sys/kernel/debug/sched/base_slice_ns",
    "/sys/kernel/debug/sched/preempt",
];

const IOPRIO_WHO_PROCESS: libc::c_int = 1;

fn ioprio_get(tid: u32) -> i32 {
    // SAFETY: ioprio_get only reads.
    unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, tid as libc::c_int) as i32 }
}

fn rt_priority(tid: u32) -> i32 {
    let mut p = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_getparam fills the param it is given.
    if unsafe { libc::sched_getparam(tid as libc::pid_t, &mut p) } == 0 {
        p.sched_priority
    } else {
        0
    }
}

impl Snapshot {
    fn take() -> Self {
        let cgroups = Cgroups::detect().ok();
        let mut threads = BTreeMap::new();
        for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let oom = fs::read_to_string(e.path().join("oom_score_adj"))
                .ok()
                .and_then(|t| t.trim().parse().ok());
            for t in fs::read_dir(e.path().join("task"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let Some(tid) = t.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                let Some(stat) = fs::read_to_string(t.path().join("stat"))
                    .ok()
                    .and_then(|s| ProcStat::parse(&s))
                else {
                    continue;
                };
                if stat.kernel_thread() {
                    break; // a kernel thread's threads are all kernel threads
                }
                let cgroup = cgroups.as_ref().and_then(|cg| {
                    let text = fs::read_to_string(t.path().join("cgroup")).ok()?;
                    appease_cgroup::parse_proc_cgroup(&text, cg.version())
                });
                threads.insert(
                    tid,
                    ThreadState {
                        pid,
                        ppid: stat.ppid,
                        comm: stat.comm,
                        start: stat.start,
                        nice: stat.nice,
                        policy: stat.policy,
                        rt_priority: rt_priority(tid),
                        ioprio: ioprio_get(tid),
                        cgroup,
                        oom_score_adj: oom,
                    },
                );
            }
        }
        let groups = cgroups.as_ref().map(all_groups).unwrap_or_default();
        let settings = SETTINGS
            .iter()
            .filter_map(|p| Some((PathBuf::from(p), fs::read_to_string(p).ok()?)))
            .collect();
        Snapshot {
            threads,
            groups,
            settings,
            cgroups,
        }
    }

    /// Puts back every setting, thread state and cgroup that differs from this snapshot;
    /// threads and groups that came later and are still there are left (the run's own
    /// end with it). Returns what failed.
    fn restore(&self) -> Vec<String> {
        let mut failed = Vec::new();
        for (path, was) in &self.settings {
            let now = fs::read_to_string(path).unwrap_or_default();
            if now != *was {
                if let Err(e) = fs::write(path, setting_value(was)) {
                    failed.push(format!("{}: {e}", path.display()));
                }
            }
        }
        let now = Snapshot::take();
        let mut oom_done = BTreeSet::new();
        for (tid, was) in &self.threads {
            let Some(is) = now.threads.get(tid).filter(|t| t.start == was.start) else {
                continue; // gone, or its tid reused
            };
            if (is.policy, is.rt_priority) != (was.policy, was.rt_priority) {
                let param = libc::sched_param {
                    sched_priority: was.rt_priority,
                };
                // SAFETY: sched_setscheduler with a valid param.
                if unsafe {
                    libc::sched_setscheduler(*tid as libc::pid_t, was.policy as i32, &param)
                } != 0
                {
                    failed.push(format!(
                        "policy of {} [{tid}]: {}",
                        was.comm,
                        std::io::Error::last_os_error()
                    ));
                }
            }
            if is.nice != was.nice {
                // SAFETY: setpriority on one thread.
                if unsafe { libc::setpriority(libc::PRIO_PROCESS, *tid as libc::id_t, was.nice) }
                    != 0
                {
                    failed.push(format!(
                        "nice of {} [{tid}]: {}",
                        was.comm,
                        std::io::Error::last_os_error()
                    ));
                }
            }
            if is.ioprio != was.ioprio {
                // SAFETY: ioprio_set on one thread.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_ioprio_set,
                        IOPRIO_WHO_PROCESS,
                        *tid as libc::c_int,
                        was.ioprio,
                    )
                };
                if r != 0 {
                    failed.push(format!(
                        "I/O priority of {} [{tid}]: {}",
                        was.comm,
                        std::io::Error::last_os_error()
                    ));
                }
            }
            if is.oom_score_adj != was.oom_score_adj && oom_done.insert(was.pid) {
                if let Some(v) = was.oom_score_adj {
                    if let Err(e) =
                        fs::write(format!("/proc/{}/oom_score_adj", was.pid), v.to_string())
                    {
                        failed.push(format!("OOM score of {} [{}]: {e}", was.comm, was.pid));
                    }
                }
            }
            if let (Some(cg), Some(back)) = (&self.cgroups, &was.cgroup) {
                if is.cgroup.as_ref() != Some(back) {
                    if let Err(e) = move_thread(cg, was.pid, *tid, back) {
                        failed.push(format!("cgroup of {} [{tid}]: {e}", was.comm));
                    }
                }
            }
        }
        // Groups the peer made, deepest first, once their threads are back or gone.
        if let Some(cg) = &self.cgroups {
            let made: Vec<String> = all_groups(cg).difference(&self.groups).cloned().collect();
            for g in made.iter().rev() {
                let t = Instant::now();
                let mut r = cg.remove(g);
                while r.is_err() && t.elapsed() < Duration::from_secs(5) {
                    // Its last threads may still be leaving (killed, not yet reaped).
                    for pid in cg.processes(g).unwrap_or_default() {
                        let _best_effort = cg.move_process(pid, "/");
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    r = cg.remove(g);
                }
                if let Err(e) = r {
                    failed.push(format!("removing the cgroup {g}: {e}"));
                }
            }
        }
        failed
    }
}

/// The value to write back: a choice file ("none voluntary (full)") takes the chosen word.
fn setting_value(was: &str) -> String {
    match (was.find('('), was.find(')')) {
        (Some(a), Some(b)) if a < b => was[a + 1..b].to_string(),
        _ => was.trim().to_string(),
    }
}

/// Makes the kernel look up the task group of each of the bench's own threads again (an
/// autogroup switched on or off applies to a running task only once it moves): through
/// a group of the bench's and back into its own.
fn reseat_own_threads() {
    let Ok(cg) = Cgroups::detect() else { return };
    let me = std::process::id();
    let Ok(home) = cg.group_of(me) else { return };
    let Ok(via) = cg.ensure_top_group(&format!("appease-bench-{me}.reseat"), false, 100) else {
        return;
    };
    for tid in threads_of(me) {
        let _moved = move_thread(&cg, me, tid, &via);
        let _back = move_thread(&cg, me, tid, &home);
    }
    if let Err(e) = cg.remove(&via) {
        tracing::warn!(error = %e, "could not remove the bench's cgroup {via}");
    }
}

/// The threads of process `pid`.
fn threads_of(pid: u32) -> Vec<u32> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Moves one thread back (cgroup v1 moves threads; v2 moves the whole process).
fn move_thread(cg: &Cgroups, pid: u32, tid: u32, group: &str) -> std::io::Result<()> {
    let dir = cg.root().join(group.trim_start_matches('/'));
    match cg.version() {
        Version::V1 => fs::write(dir.join("tasks"), tid.to_string()),
        Version::V2 => fs::write(dir.join("cgroup.procs"), pid.to_string()),
    }
}

/// Every group in the cpu controller's hierarchy, as "/a/b".
fn all_groups(cg: &Cgroups) -> BTreeSet<String> {
    fn walk(dir: &Path, name: &str, out: &mut BTreeSet<String>) {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let child = format!("{name}/{}", e.file_name().to_string_lossy());
                walk(&e.path(), &child, out);
                out.insert(child);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(cg.root(), "", &mut out);
    out
}

/// What changed between two snapshots: the threads' changes (`count_changes`), one line
/// per command name and kind of change, most threads first, then the cgroups made and
/// the settings changed.
fn summarize(threads: Counts, before: &Snapshot, after: &Snapshot) -> Vec<String> {
    let mut out = lines(threads);
    for g in after.groups.difference(&before.groups) {
        out.push(format!("made the cgroup {g}"));
    }
    for (path, was) in &before.settings {
        if let Some((_, is)) = after.settings.iter().find(|(p, _)| p == path) {
            if is != was {
                out.push(format!(
                    "{}: {} → {}",
                    path.display(),
                    was.trim(),
                    is.trim()
                ));
            }
        }
    }
    out
}

/// The threads' changes from `before` to `after`, per (command, change); a thread born in
/// between is compared with what it inherited, or a fresh thread's state.
fn count_changes(before: &Snapshot, after: &Snapshot) -> Counts {
    let mut counts = Counts::new();
    for (tid, is) in &after.threads {
        let was = match before.threads.get(tid).filter(|w| w.start == is.start) {
            Some(w) => w.clone(),
            None => inherited(before, after, is),
        };
        for change in differences(&was, is) {
            *counts.entry((is.comm.clone(), change)).or_default() += 1;
        }
    }
    counts
}

/// One line per (command, change), most threads first.
fn lines(counts: Counts) -> Vec<String> {
    let mut lines: Vec<(usize, String)> = counts
        .into_iter()
        .map(|((comm, change), n)| {
            let threads = if n == 1 { "thread" } else { "threads" };
            (n, format!("{comm} ({n} {threads}): {change}"))
        })
        .collect();
    lines.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    lines.into_iter().map(|(_, l)| l).collect()
}

/// Process `pid`, then its parent, and so on up to (not including) init, as `s` knows them.
fn ancestors(s: &Snapshot, pid: u32) -> impl Iterator<Item = u32> + '_ {
    std::iter::successors(Some(pid), |&p| {
        s.threads.get(&p).map(|t| t.ppid).filter(|&pp| pp > 1)
    })
    .take(64)
}

/// Whether process `pid` is `root` or below it.
fn descends_from(s: &Snapshot, pid: u32, root: u32) -> bool {
    ancestors(s, pid).any(|p| p == root)
}

/// What a thread born while the peer ran would have had without it: what it inherited,
/// its process's first thread's or its nearest ancestor's state from before (a build
/// started at nice 19 is not the peer's doing); a fresh thread's when nothing is known.
fn inherited(before: &Snapshot, after: &Snapshot, t: &ThreadState) -> ThreadState {
    // The same process before as now (its pid's first thread, started at the same time
    // if it is still there; a parent that has ended since is taken as it was).
    let known = ancestors(after, t.pid).find_map(|pid| {
        let was = before.threads.get(&pid).filter(|w| w.pid == pid)?;
        let same = after
            .threads
            .get(&pid)
            .is_none_or(|is| is.start == was.start);
        same.then_some(was)
    });
    match known {
        Some(known) => ThreadState {
            pid: t.pid,
            ppid: t.ppid,
            comm: t.comm.clone(),
            start: t.start,
            ..known.clone()
        },
        None => ThreadState::default_for(t.pid, &t.comm, t.start),
    }
}

fn policy_name(p: u32) -> String {
    match p {
        0 => "normal".into(),
        1 => "fifo".into(),
        2 => "rr".into(),
        3 => "batch".into(),
        5 => "idle".into(),
        6 => "deadline".into(),
        n => format!("policy {n}"),
    }
}

fn ioprio_name(v: i32) -> String {
    let (class, level) = (v >> 13, v & 0x1fff);
    match class {
        0 => "none".into(),
        1 => format!("realtime {level}"),
        2 => format!("best-effort {level}"),
        3 => "idle".into(),
        c => format!("class {c}"),
    }
}

fn differences(was: &ThreadState, is: &ThreadState) -> Vec<String> {
    let mut out = Vec::new();
    if was.nice != is.nice {
        out.push(format!("nice {} → {}", was.nice, is.nice));
    }
    if (was.policy, was.rt_priority) != (is.policy, is.rt_priority) {
        out.push(format!(
            "policy {} → {}",
            policy_name(was.policy),
            policy_name(is.policy)
        ));
    }
    if was.ioprio != is.ioprio {
        out.push(format!(
            "I/O {} → {}",
            ioprio_name(was.ioprio),
            ioprio_name(is.ioprio)
        ));
    }
    if was.oom_score_adj != is.oom_score_adj {
        out.push(format!(
            "oom_score_adj {} → {}",
            was.oom_score_adj.unwrap_or(0),
            is.oom_score_adj.unwrap_or(0)
        ));
    }
    if was.cgroup != is.cgroup {
        out.push(format!(
            "cgroup {} → {}",
            was.cgroup.as_deref().unwrap_or("?"),
            is.cgroup.as_deref().unwrap_or("?")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(comm: &str, nice: i32, policy: u32, ioprio: i32, cgroup: &str) -> ThreadState {
        ThreadState {
            pid: 10,
            ppid: 1,
            comm: comm.into(),
            start: 5,
            nice,
            policy,
            rt_priority: 0,
            ioprio,
            cgroup: Some(cgroup.into()),
            oom_score_adj: Some(0),
        }
    }

    fn snapshot(threads: Vec<(u32, ThreadState)>, groups: &[&str], autogroup: &str) -> Snapshot {
        Snapshot {
            threads: threads.into_iter().collect(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            settings: vec![(
                "/proc/sys/kernel/sched_autogroup_enabled".into(),
                autogroup.into(),
            )],
            cgroups: None,
        }
    }

    #[test]
    fn the_report_says_what_changed_per_command_most_threads_first() {
        let before = snapshot(
            vec![(1, thread("make", 0, 0, 0, "/"))],
            &["/appease.batch"],
            "1\n",
        );
        let after = snapshot(
            vec![
                (1, thread("make", 19, 5, 3 << 13, "/cpu80")),
                // Born after the peer started: compared with a fresh thread.
                (2, thread("gcc", 19, 5, 3 << 13, "/cpu80")),
                (3, thread("gcc", 19, 5, 3 << 13, "/cpu80")),
                (4, thread("bash", 0, 0, 0, "/")),
            ],
            &["/appease.batch", "/cpu80", "/cpu90"],
            "0\n",
        );
        let mut after = after;
        // A build started at nice 19 by a shell the snapshot knew: inherited, not changed.
        let mut shell = thread("bash", 19, 0, 0, "/");
        shell.pid = 50;
        let mut cargo = thread("cargo", 19, 0, 0, "/");
        (cargo.pid, cargo.ppid) = (51, 50);
        after.threads.insert(51, cargo);
        let mut before = before;
        before.threads.insert(50, shell);
        let lines = summarize(count_changes(&before, &after), &before, &after);
        assert_eq!(
            lines,
            [
                "gcc (2 threads): I/O none → idle",
                "gcc (2 threads): cgroup / → /cpu80",
                "gcc (2 threads): nice 0 → 19",
                "gcc (2 threads): policy normal → idle",
                "make (1 thread): I/O none → idle",
                "make (1 thread): cgroup / → /cpu80",
                "make (1 thread): nice 0 → 19",
                "make (1 thread): policy normal → idle",
                "made the cgroup /cpu80",
                "made the cgroup /cpu90",
                "/proc/sys/kernel/sched_autogroup_enabled: 1 → 0",
            ]
        );
    }

    #[test]
    fn a_reused_pid_is_not_taken_for_the_parent_it_was() {
        // pid 60 was a process at nice 19 that ended; a new process got pid 60 and its
        // child was reniced by the peer: the old one's nice is not what it inherited.
        let mut old = thread("sh", 19, 0, 0, "/");
        (old.pid, old.start) = (60, 5);
        let before = snapshot(vec![(60, old)], &[], "1\n");
        let mut new = thread("sh", 0, 0, 0, "/");
        (new.pid, new.start) = (60, 9);
        let mut child = thread("make", 19, 0, 0, "/");
        (child.pid, child.ppid, child.start) = (61, 60, 10);
        let after = snapshot(vec![(60, new), (61, child)], &[], "1\n");
        assert_eq!(
            summarize(count_changes(&before, &after), &before, &after),
            ["make (1 thread): nice 0 → 19"]
        );
    }

    #[test]
    fn names_of_classes_and_choice_files() {
        assert_eq!(ioprio_name((2 << 13) | 7), "best-effort 7");
        assert_eq!(ioprio_name(0), "none");
        assert_eq!(policy_name(5), "idle");
        assert_eq!(setting_value("none voluntary (full) lazy\n"), "full");
        assert_eq!(setting_value("1\n"), "1");
    }

    #[test]
    #[ignore = "needs root (priorities, I/O classes, cgroups): make test runs it"]
    fn what_a_peer_changes_is_reported_and_put_back() {
        // A peer's doing, by hand: a process reniced, made SCHED_IDLE, its I/O idle and
        // moved into a cgroup made for it, as Ananicy does to make.
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let cg = Cgroups::detect().unwrap();
        let before = Arc::new(Snapshot::take());
        assert!(before.threads.contains_key(&pid));
        // Samples while the changes are made (own: a pid nothing descends from).
        let sampler = Sampler::start(before.clone(), u32::MAX, Duration::from_millis(100));
        let group = format!("/appease-peer-test-{}", std::process::id());
        fs::create_dir(cg.root().join(&group[1..])).unwrap();
        cg.move_process(pid, &group).unwrap();
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: our own child.
        unsafe {
            assert_eq!(libc::setpriority(libc::PRIO_PROCESS, pid, 19), 0);
            assert_eq!(
                libc::sched_setscheduler(pid as i32, libc::SCHED_IDLE, &param),
                0
            );
            let idle = 3 << 13;
            assert_eq!(
                libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, pid as i32, idle),
                0
            );
        }
        let now = Snapshot::take();
        let changed = summarize(count_changes(&before, &now), &before, &now);
        for want in [
            "sleep (1 thread): nice 0 → 19",
            "sleep (1 thread): policy normal → idle",
            "sleep (1 thread): I/O none → idle",
        ] {
            assert!(changed.iter().any(|l| l == want), "{want} in {changed:?}");
        }
        // A change undone before the end is reported as seen before it.
        std::thread::sleep(Duration::from_millis(400));
        // SAFETY: our own child.
        unsafe {
            let best_effort_4 = (2 << 13) | 4;
            assert_eq!(
                libc::syscall(
                    libc::SYS_ioprio_set,
                    IOPRIO_WHO_PROCESS,
                    pid as i32,
                    best_effort_4
                ),
                0
            );
        }
        let seen = sampler.finish();
        let at_end = count_changes(&before, &Snapshot::take());
        let gone = lines(gone_by_end(seen, &at_end));
        assert_eq!(gone, vec!["sleep (1 thread): I/O none → idle".to_string()]);
        assert!(
            changed
                .iter()
                .any(|l| l == &format!("made the cgroup {group}")),
            "{changed:?}"
        );
        let failed = before.restore();
        assert!(failed.is_empty(), "{failed:?}");
        let after = Snapshot::take();
        let (was, is) = (&before.threads[&pid], &after.threads[&pid]);
        assert_eq!(was, is, "every field of the thread back");
        assert!(
            !cg.root().join(&group[1..]).exists(),
            "the peer's cgroup removed"
        );
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_missing_peer_is_a_message_that_says_how_to_get_it() {
        let e = locate(
            Peer::Ananicy,
            &[("ananicy".into(), "/nonexistent/ananicy".into())],
        )
        .unwrap_err();
        assert!(
            e.contains("ananicy is not installed") && e.contains("make install"),
            "{e}"
        );
        let e = locate(
            Peer::System76Scheduler,
            &[("system76-scheduler".into(), "/nonexistent/s76".into())],
        )
        .unwrap_err();
        assert!(
            e.contains("system76-scheduler is not installed") && e.contains("just install"),
            "{e}"
        );
    }
}
