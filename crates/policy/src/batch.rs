//! Batch demotion: process trees that soak CPU and answer no requests go to the idle
//! group; a tree that starts answering requests comes back.
//!
//! Fed with periodic snapshots of the process table. A tree is the subtree under the
//! highest ancestor whose descendants account for the CPU use: a `make` and its
//! compilers, not the shell that started it. Interactive shells, terminals, session
//! managers, the service manager and kernel threads are never demoted, and nothing above
//! them is considered.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::Nanos;

/// One process as the scan sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcSample {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    /// Start time (clock ticks after boot): with the pid, the process's identity.
    pub start: u64,
    /// CPU time of the process and of its reaped children (utime+stime+cutime+cstime), ns.
    pub cpu_ns: u64,
    /// Time its threads spent runnable but waiting for a CPU (schedstat run_delay), ns.
    /// With `cpu_ns` this is the process's demand (a response reader's is its CPU alone):
    /// a soaker that gets a quarter of a CPU on a crowded machine still wants a whole one.
    pub wait_ns: u64,
    pub kernel_thread: bool,
    /// Has a controlling terminal.
    pub has_tty: bool,
    /// It listens for connections: a thread of it called listen() on a TCP socket since
    /// the probe was loaded, or it held a listening socket when the daemon started. A
    /// server, even before its first request.
    pub listens: bool,
    /// How long the process has existed, ns.
    pub age_ns: u64,
    /// Its main thread is of the `SCHED_IDLE` policy.
    pub sched_idle: bool,
    /// When a thread of it last read a response: what a client reads on a connection it
    /// made (None: never, or unknown where the probe's task iterator is not used).
    pub last_response: Option<Nanos>,
}

impl ProcSample {
    /// A thread of it read a response at or after `t`.
    fn read_response_since(&self, t: Nanos) -> bool {
        self.last_response.is_some_and(|r| r >= t)
    }
}

/// A class forced by a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// Goes to the idle group at once, whatever it does.
    Batch,
    /// Never demoted.
    Latency,
    /// Never demoted, never elevated specially: left to the kernel.
    Normal,
}

#[derive(Clone, Debug, PartialEq)]
pub struct BatchParams {
    /// CPUs a tree must want on average (running or waiting to run) to count as a soaker ...
    pub min_cpus: f64,
    /// ... for at least this long, without a request.
    pub after: Duration,
    /// A tree any of whose processes received a request this recently is not demoted.
    pub request_memory: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub enum BatchDecision {
    /// Move these processes (the tree under `root`) to the idle group.
    Demote {
        root: u32,
        members: Vec<u32>,
        cpus: f64,
        why: &'static str,
        /// A process of the tree read responses while it soaked: it feeds on a server's
        /// output (a dump, a download, an ETL query), so its progress waits on each
        /// hand-off from the server, which the idle class delays (`[batch] feeders`).
        feeds: bool,
    },
    /// Move these processes, found in the demoted tree under `root` since its last scan,
    /// where the tree went: one forked between the scan that demoted the tree and its
    /// parent's move was born outside the group (a loop's next download and compressor).
    Follow { root: u32, members: Vec<u32> },
    /// Move the tree under `root` back where its processes came from.
    Promote { root: u32, members: Vec<u32> },
    /// Move one process of the demoted tree under `root` back: the config now exempts it
    /// (a service, a role, an exception or a rule a reload added); the rest stays.
    Release { root: u32, pid: u32 },
}

/// Names that are never batch and that a tree never climbs past.
const PROTECTED: &[&str] = &[
    "systemd",
    "init",
    "sshd",
    // OpenSSH 9.8 and later: each connection's own process (the session's parent).
    "sshd-session",
    "login",
    "su",
    "sudo",
    "tmux",
    "tmux: server",
    "screen",
    "SCREEN",
    "agetty",
    "getty",
    "cron",
    "crond",
    "atd",
    "dbus-daemon",
    "containerd-shim",
    "conmon",
    "runc",
    "xterm",
    "gnome-terminal-",
    "konsole",
    "kitty",
    "alacritty",
    "wezterm-gui",
    "foot",
];
/// A process wanting at least this many CPUs is busy itself.
const BUSY_CPUS: f64 = 0.1;

const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "fish", "ksh", "tcsh", "csh", "mksh", "ash",
];

/// Never demoted, and the climb to a tree's root stops below it.
pub fn protected(p: &ProcSample) -> bool {
    p.kernel_thread
        || p.pid <= 2
        || p.ppid == 2
        || PROTECTED.contains(&p.comm.as_str())
        // A shell with a terminal is interactive; one without (a script, `ssh host cmd`,
        // `sh -c 'while :; do :; done'` in a service) is like any other program.
        || (SHELLS.contains(&p.comm.as_str()) && p.has_tty)
}

#[derive(Clone, Debug)]
struct Demoted {
    start: u64,
    /// Members the config exempts, moved back already.
    released: HashSet<u32>,
    at: Nanos,
    members: HashSet<u32>,
    /// Members that listened for connections when it was demoted.
    listening: HashSet<u32>,
}

/// A tree that soaks, not demoted yet.
#[derive(Clone, Copy, Debug)]
struct Heavy {
    /// Its root's start time.
    start: u64,
    since: Nanos,
    /// A process of it read a response since `since` (members that lived a second, a
    /// loop's `psql` or `curl`, count though gone by the demotion).
    feeds: bool,
}

pub struct BatchClassifier {
    params: BatchParams,
    /// pid -> (start, cpu_ns, wait_ns) at the previous scan.
    prev: HashMap<u32, (u64, u64, u64)>,
    prev_at: Option<Nanos>,
    /// Candidate roots -> since when heavy, and whether they fed on responses meanwhile.
    heavy_since: HashMap<u32, Heavy>,
    demoted: HashMap<u32, Demoted>,
}

impl BatchClassifier {
    pub fn new(params: BatchParams) -> Self {
        BatchClassifier {
            params,
            prev: HashMap::new(),
            prev_at: None,
            heavy_since: HashMap::new(),
            demoted: HashMap::new(),
        }
    }

    pub fn set_params(&mut self, params: BatchParams) {
        self.params = params;
    }

    /// Roots of the trees currently demoted.
    pub fn demoted_roots(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.demoted.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Every process in a demoted tree.
    pub fn demoted_members(&self) -> HashSet<u32> {
        self.demoted
            .values()
            .flat_map(|d| d.members.iter().copied())
            .collect()
    }

    /// The demoted tree `pid` belongs to, if any.
    pub fn tree_of(&self, pid: u32) -> Option<u32> {
        self.demoted
            .iter()
            .find(|(_, d)| d.members.contains(&pid))
            .map(|(&root, _)| root)
    }

    /// The actuator could not demote (or promote) a tree: forget it.
    pub fn forget(&mut self, root: u32) {
        self.demoted.remove(&root);
        self.heavy_since.remove(&root);
    }

    /// One scan. `last_request(pid)` is when any thread of `pid` last received a request;
    /// `forced(p)` is the class a rule gives `p`.
    pub fn on_scan(
        &mut self,
        now: Nanos,
        procs: &[ProcSample],
        last_request: impl Fn(u32) -> Option<Nanos>,
        forced: impl Fn(&ProcSample) -> Option<Class>,
    ) -> Vec<BatchDecision> {
        let prev_at = self.prev_at.unwrap_or(now);
        let rate = self.demand(now, procs);
        let scan = Scan {
            now,
            prev_at,
            by_pid: procs.iter().map(|p| (p.pid, p)).collect(),
            children: crate::tree::Children::new(procs.iter().map(|p| (p.pid, p.ppid))),
            rate,
            last_request: &last_request,
            forced: &forced,
        };
        let mut out = self.follow_demoted(&scan);
        let roots = self.heavy_roots(&scan, procs);
        out.extend(self.demote_lasting(&scan, roots));
        out
    }

    /// The CPU demand of each process since the last scan, in CPUs (None on the first
    /// scan, or one at the same instant: nothing to compare with). A process's threads'
    /// waits for a CPU count, except for a process that read responses meanwhile: a
    /// client's threads queue each time the server's answers wake them, and on a busy
    /// host a load generator's hundreds of threads add up to far more CPUs than the host
    /// has (256 `sysbench` threads showed 162 on 2) while it uses a fraction of one.
    fn demand(&mut self, now: Nanos, procs: &[ProcSample]) -> Option<HashMap<u32, f64>> {
        let since = self.prev_at.filter(|&at| at < now);
        let rate = since.map(|at| {
            let dt = (now - at) as f64;
            procs
                .iter()
                .map(|p| {
                    let (cpu, wait) = match self.prev.get(&p.pid) {
                        Some(&(start, cpu, wait)) if start == p.start => {
                            (p.cpu_ns.saturating_sub(cpu), p.wait_ns.saturating_sub(wait))
                        }
                        _ => (p.cpu_ns, p.wait_ns), // born since the last scan
                    };
                    let used = if p.read_response_since(at) {
                        cpu
                    } else {
                        cpu + wait
                    };
                    (p.pid, used as f64 / dt)
                })
                .collect()
        });
        self.prev = procs
            .iter()
            .map(|p| (p.pid, (p.start, p.cpu_ns, p.wait_ns)))
            .collect();
        self.prev_at = Some(now);
        rate
    }

    /// Keeps each demoted tree's membership current (processes forked in it since, to
    /// follow it, gone ones out, exempted ones released once) and promotes the trees in
    /// which a process received a request or started listening since (or that have no
    /// member left).
    fn follow_demoted(&mut self, scan: &Scan) -> Vec<BatchDecision> {
        let mut out = Vec::new();
        let mut promote = Vec::new();
        for (&root, d) in &mut self.demoted {
            let mut fresh = Vec::new();
            if scan.by_pid.get(&root).is_some_and(|p| p.start == d.start) {
                for pid in scan.subtree(root) {
                    if !d.released.contains(&pid) && d.members.insert(pid) {
                        fresh.push(pid);
                    }
                }
            }
            d.members.retain(|pid| scan.by_pid.contains_key(pid));
            d.released.retain(|pid| scan.by_pid.contains_key(pid));
            // Members the config exempts (a reload made them a service, a role, an
            // exception; one forked in the tree) leave it, once; the rest stays demoted.
            let exempted: Vec<u32> = d
                .members
                .iter()
                .copied()
                .filter(|pid| scan.exempt(scan.by_pid[pid]))
                .collect();
            for pid in exempted {
                d.members.remove(&pid);
                if d.released.insert(pid) {
                    out.push(BatchDecision::Release { root, pid });
                }
            }
            let asked = d
                .members
                .iter()
                .any(|&pid| (scan.last_request)(pid).is_some_and(|t| t > d.at));
            // A member that started listening since is a server (one still starting when
            // the tree was judged, beside its supervisor's soaker): judged again at once,
            // before its first request waits behind the idle class.
            let listens = d.members.iter().any(|pid| {
                !d.listening.contains(pid) && scan.by_pid.get(pid).is_some_and(|p| p.listens)
            });
            if asked || listens || d.members.is_empty() {
                promote.push(root);
                continue;
            }
            fresh.retain(|pid| d.members.contains(pid));
            if !fresh.is_empty() {
                fresh.sort_unstable();
                out.push(BatchDecision::Follow {
                    root,
                    members: fresh,
                });
            }
        }
        for root in promote {
            let d = self.demoted.remove(&root).expect("present");
            if !d.members.is_empty() {
                let mut members: Vec<u32> = d.members.into_iter().collect();
                members.sort_unstable();
                out.push(BatchDecision::Promote { root, members });
            }
        }
        out
    }

    /// The roots of heavy trees, not yet demoted, with their demand and why: from each
    /// busy process, climbed to its highest eligible ancestor; a root inside another
    /// root's tree belongs to that tree.
    fn heavy_roots(&self, scan: &Scan, procs: &[ProcSample]) -> Vec<(u32, f64, &'static str)> {
        let in_batch = self.demoted_members();
        let memory = self.params.request_memory.as_nanos() as u64;
        let recently_asked = |pid: u32| {
            (scan.last_request)(pid).is_some_and(|t| scan.now.saturating_sub(t) < memory)
        };
        let tree_asked = |root: u32| scan.subtree(root).into_iter().any(recently_asked);
        let mut roots: HashMap<u32, (f64, &'static str)> = HashMap::new();
        for p in procs {
            if in_batch.contains(&p.pid) || scan.exempt(p) {
                continue;
            }
            if (scan.forced)(p) == Some(Class::Batch) {
                roots.insert(p.pid, (scan.tree_rate(p.pid), "rule"));
                continue;
            }
            // Only climb from processes that are busy themselves: a mostly idle parent
            // that ran a little this scan must not move the tree's root around.
            let busy = scan
                .rate
                .as_ref()
                .map(|r| r.get(&p.pid).copied().unwrap_or(0.0));
            if busy.is_none_or(|cpus| cpus < BUSY_CPUS) || tree_asked(p.pid) {
                continue;
            }
            let mut root = p.pid;
            while let Some(parent) = scan.by_pid.get(&scan.by_pid[&root].ppid) {
                if parent.pid == root
                    || scan.exempt(parent)
                    || in_batch.contains(&parent.pid)
                    || tree_asked(parent.pid)
                    || scan.supervises_servers(parent.pid, root)
                {
                    break;
                }
                root = parent.pid;
            }
            let r = scan.tree_rate(root);
            if r >= self.params.min_cpus {
                roots.insert(root, (r, "cpu-soaker"));
            }
        }
        let nested: HashSet<u32> = roots
            .keys()
            .flat_map(|&r| scan.subtree(r).into_iter().skip(1))
            .filter(|pid| roots.contains_key(pid))
            .collect();
        let mut sorted: Vec<_> = roots
            .into_iter()
            .filter(|(r, _)| !nested.contains(r))
            .map(|(r, (cpus, why))| (r, cpus, why))
            .collect();
        sorted.sort_by_key(|&(r, _, _)| r);
        sorted
    }

    /// Demotes the heavy trees that have soaked for `after` (or that a rule makes batch);
    /// the others are remembered with the time they started soaking.
    fn demote_lasting(
        &mut self,
        scan: &Scan,
        roots: Vec<(u32, f64, &'static str)>,
    ) -> Vec<BatchDecision> {
        let after = self.params.after.as_nanos() as u64;
        let mut out = Vec::new();
        let mut still_heavy = HashMap::new();
        for (root, cpus, why) in roots {
            let start = scan.by_pid[&root].start;
            // The tree may have been found under another root before (a parent that
            // came or went): its soaking started at the earliest of them.
            let tree = scan.subtree(root);
            let before: Vec<Heavy> = self
                .heavy_since
                .iter()
                .filter(|(&r, h)| {
                    let same = scan.by_pid.get(&r).is_some_and(|p| p.start == h.start);
                    same && (tree.contains(&r) || scan.subtree(r).contains(&root))
                })
                .map(|(_, &h)| h)
                .collect();
            let since = before.iter().map(|h| h.since).min().unwrap_or(scan.now);
            // Reads since the previous scan count on the tree's first heavy scan too.
            let feeds = before.iter().any(|h| h.feeds)
                || tree
                    .iter()
                    .any(|pid| scan.by_pid[pid].read_response_since(since.min(scan.prev_at)));
            if why != "rule" && scan.now.saturating_sub(since) < after {
                still_heavy.insert(
                    root,
                    Heavy {
                        start,
                        since,
                        feeds,
                    },
                );
                continue;
            }
            // What the config exempts stays where it is, inside a batch tree too.
            let (released, members): (Vec<u32>, Vec<u32>) = tree
                .into_iter()
                .partition(|pid| scan.by_pid.get(pid).is_some_and(|p| scan.exempt(p)));
            self.demoted.insert(
                root,
                Demoted {
                    start,
                    at: scan.now,
                    listening: members
                        .iter()
                        .copied()
                        .filter(|pid| scan.by_pid.get(pid).is_some_and(|p| p.listens))
                        .collect(),
                    members: members.iter().copied().collect(),
                    released: released.into_iter().collect(),
                },
            );
            out.push(BatchDecision::Demote {
                root,
                members,
                cpus,
                why,
                feeds,
            });
        }
        self.heavy_since = still_heavy;
        out
    }
}

/// One scan's view of the process table.
struct Scan<'a> {
    now: Nanos,
    /// The previous scan's time (this one's on the first).
    prev_at: Nanos,
    by_pid: HashMap<u32, &'a ProcSample>,
    children: crate::tree::Children,
    /// Each process's CPU demand since the last scan, in CPUs (None: nothing to compare
    /// with, the first scan or one at the same instant).
    rate: Option<HashMap<u32, f64>>,
    last_request: &'a dyn Fn(u32) -> Option<Nanos>,
    forced: &'a dyn Fn(&ProcSample) -> Option<Class>,
}

impl Scan<'_> {
    fn subtree(&self, root: u32) -> Vec<u32> {
        self.children.subtree(root)
    }

    /// The demand of `root` and everything below it, in CPUs.
    fn tree_rate(&self, root: u32) -> f64 {
        let Some(rate) = &self.rate else {
            return 0.0;
        };
        self.subtree(root)
            .iter()
            .map(|p| rate.get(p).unwrap_or(&0.0))
            .sum()
    }

    /// Never batch: protected, or made latency or normal by a rule.
    fn exempt(&self, p: &ProcSample) -> bool {
        protected(p) || matches!((self.forced)(p), Some(Class::Latency | Class::Normal))
    }

    /// Whether a child of `parent` other than `branch` (or that child's tree) serves: has
    /// received requests or listens for connections. The batch tree then ends below the
    /// parent. A child that is merely idle (a script's `sleep`, `tee` or `tail -f`, a
    /// make's compiler just started) serves nothing: the script and all its children are
    /// one batch tree.
    fn supervises_servers(&self, parent: u32, branch: u32) -> bool {
        let serves = |pid: u32| {
            (self.last_request)(pid).is_some() || self.by_pid.get(&pid).is_some_and(|p| p.listens)
        };
        self.children
            .of(parent)
            .iter()
            .any(|&k| k != branch && self.subtree(k).into_iter().any(serves))
    }
}

#[cfg(test)]
mod tests;
