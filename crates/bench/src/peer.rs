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

mod snapshot;
use snapshot::*;

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
                "`make peers` in appease's repository builds both and prints the --peer-bin to \
                 give; or install the original Ananicy (github.com/Nefelim4ag/Ananicy, tag \
                 2.2.1: `make install`, \
                 which puts its rules in /etc/ananicy.d; `make install PREFIX=DIR` and \
                 --peer-bin ananicy=DIR/usr/bin/ananicy keep it out of /etc) and Debian's schedtool"
            }
            Peer::System76Scheduler => {
                "`make peers` in appease's repository builds both and prints the --peer-bin to \
                 give; or build system76-scheduler (github.com/pop-os/system76-scheduler) with \
                 `just install`, \
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

#[cfg(test)]
mod tests;
