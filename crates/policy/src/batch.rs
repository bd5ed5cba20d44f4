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
#[derive(Clone, Debug, PartialEq)]
pub struct ProcSample {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    /// Start time (clock ticks after boot): with the pid, the process's identity.
    pub start: u64,
    /// CPU time of the process and of its reaped children (utime+stime+cutime+cstime), ns.
    pub cpu_ns: u64,
    /// Time its threads spent runnable but waiting for a CPU (schedstat run_delay), ns.
    /// With `cpu_ns` this is the process's demand: a soaker that gets a quarter of a CPU
    /// on a crowded machine still wants a whole one.
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
    },
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
}

pub struct BatchClassifier {
    params: BatchParams,
    /// pid -> (start, cpu_ns + wait_ns) at the previous scan.
    prev: HashMap<u32, (u64, u64)>,
    prev_at: Option<Nanos>,
    /// Candidate roots -> (start, since when heavy).
    heavy_since: HashMap<u32, (u64, Nanos)>,
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
        let by_pid: HashMap<u32, &ProcSample> = procs.iter().map(|p| (p.pid, p)).collect();
        let children = crate::tree::Children::new(procs.iter().map(|p| (p.pid, p.ppid)));
        let subtree = |root: u32| children.subtree(root);

        // CPU demand of each process since the last scan, in CPUs.
        let dt = self.prev_at.map(|t| now.saturating_sub(t) as f64);
        let mut rate: HashMap<u32, f64> = HashMap::new();
        if let Some(dt) = dt.filter(|&d| d > 0.0) {
            for p in procs {
                let busy = p.cpu_ns + p.wait_ns;
                let used = match self.prev.get(&p.pid) {
                    Some(&(start, before)) if start == p.start => busy.saturating_sub(before),
                    _ => busy, // born since the last scan
                };
                rate.insert(p.pid, used as f64 / dt);
            }
        }
        self.prev = procs
            .iter()
            .map(|p| (p.pid, (p.start, p.cpu_ns + p.wait_ns)))
            .collect();
        self.prev_at = Some(now);

        let memory = self.params.request_memory.as_nanos() as u64;
        let recently_asked =
            |pid: u32| last_request(pid).is_some_and(|t| now.saturating_sub(t) < memory);
        let tree_rate = |root: u32| {
            subtree(root)
                .iter()
                .map(|p| rate.get(p).unwrap_or(&0.0))
                .sum::<f64>()
        };
        let tree_asked = |root: u32| subtree(root).into_iter().any(&recently_asked);
        // A parent supervises mixed work when another child of it (or that child's
        // tree) serves: it has received requests or listens for connections. The batch
        // tree then ends below the parent. A child that is merely idle (a script's
        // `sleep`, `tee` or `tail -f`, a make's compiler just started) serves nothing:
        // the script and all its children are one batch tree.
        let serves =
            |pid: u32| last_request(pid).is_some() || by_pid.get(&pid).is_some_and(|p| p.listens);
        let supervises_servers = |parent: u32, branch: u32| {
            children
                .of(parent)
                .iter()
                .any(|&k| k != branch && subtree(k).into_iter().any(serves))
        };

        let mut out = Vec::new();
        let exempt = |p: &ProcSample| {
            protected(p) || matches!(forced(p), Some(Class::Latency | Class::Normal))
        };
        // Promotion: a demoted tree in which a process received a request since.
        let mut promote = Vec::new();
        for (&root, d) in &mut self.demoted {
            // Keep membership current: processes forked in the tree since.
            if by_pid.get(&root).is_some_and(|p| p.start == d.start) {
                d.members.extend(subtree(root));
            }
            d.members.retain(|pid| by_pid.contains_key(pid));
            d.released.retain(|pid| by_pid.contains_key(pid));
            // Members the config exempts (a reload made them a service, a role, an
            // exception; one forked in the tree) leave it, once; the rest stays demoted.
            let exempted: Vec<u32> = d
                .members
                .iter()
                .copied()
                .filter(|pid| exempt(by_pid[pid]))
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
                .any(|&pid| last_request(pid).is_some_and(|t| t > d.at));
            if asked || d.members.is_empty() {
                promote.push(root);
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
        let in_batch: HashSet<u32> = self
            .demoted
            .values()
            .flat_map(|d| d.members.iter().copied())
            .collect();

        // Roots of heavy trees: climb from each heavy process to its highest eligible ancestor.
        let mut roots: HashMap<u32, (f64, &'static str)> = HashMap::new();
        for p in procs {
            if in_batch.contains(&p.pid) || exempt(p) {
                continue;
            }
            if forced(p) == Some(Class::Batch) {
                roots.insert(p.pid, (tree_rate(p.pid), "rule"));
                continue;
            }
            // Only climb from processes that are busy themselves: a mostly idle parent
            // that ran a little this scan must not move the tree's root around.
            if dt.is_none() || rate.get(&p.pid).copied().unwrap_or(0.0) < BUSY_CPUS {
                continue;
            }
            let mut root = p.pid;
            if tree_asked(root) {
                continue;
            }
            while let Some(parent) = by_pid.get(&by_pid[&root].ppid) {
                if parent.pid == root
                    || exempt(parent)
                    || in_batch.contains(&parent.pid)
                    || tree_asked(parent.pid)
                    || supervises_servers(parent.pid, root)
                {
                    break;
                }
                root = parent.pid;
            }
            let r = tree_rate(root);
            if r >= self.params.min_cpus {
                roots.insert(root, (r, "cpu-soaker"));
            }
        }
        // A root inside another root's tree belongs to that tree.
        let nested: HashSet<u32> = roots
            .keys()
            .flat_map(|&r| subtree(r).into_iter().skip(1))
            .filter(|pid| roots.contains_key(pid))
            .collect();

        let after = self.params.after.as_nanos() as u64;
        let mut still_heavy = HashMap::new();
        let mut sorted: Vec<_> = roots
            .into_iter()
            .filter(|(r, _)| !nested.contains(r))
            .collect();
        sorted.sort_by_key(|(r, _)| *r);
        for (root, (cpus, why)) in sorted {
            let start = by_pid[&root].start;
            // The tree may have been found under another root before (a parent that
            // came or went): its soaking started at the earliest of them.
            let tree = subtree(root);
            let since = self
                .heavy_since
                .iter()
                .filter(|(&r, &(s, _))| {
                    let same = by_pid.get(&r).is_some_and(|p| p.start == s);
                    same && (tree.contains(&r) || subtree(r).contains(&root))
                })
                .map(|(_, &(_, t))| t)
                .min()
                .unwrap_or(now);
            if why == "rule" || now.saturating_sub(since) >= after {
                // What the config exempts stays where it is, inside a batch tree too.
                let (released, members): (Vec<u32>, Vec<u32>) = subtree(root)
                    .into_iter()
                    .partition(|pid| by_pid.get(pid).is_some_and(|p| exempt(p)));
                self.demoted.insert(
                    root,
                    Demoted {
                        start,
                        at: now,
                        members: members.iter().copied().collect(),
                        released: released.into_iter().collect(),
                    },
                );
                out.push(BatchDecision::Demote {
                    root,
                    members,
                    cpus,
                    why,
                });
            } else {
                still_heavy.insert(root, (start, since));
            }
        }
        self.heavy_since = still_heavy;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn p(pid: u32, ppid: u32, comm: &str, cpu_s: f64) -> ProcSample {
        ProcSample {
            pid,
            ppid,
            comm: comm.into(),
            start: pid as u64,
            cpu_ns: (cpu_s * 1e9) as u64,
            wait_ns: 0,
            kernel_thread: false,
            has_tty: false,
            listens: false,
            age_ns: 3600 * S,
        }
    }

    fn params() -> BatchParams {
        BatchParams {
            min_cpus: 0.8,
            after: Duration::from_secs(3),
            request_memory: Duration::from_secs(60),
        }
    }

    fn listening(p: ProcSample) -> ProcSample {
        ProcSample { listens: true, ..p }
    }

    fn interactive_shell(pid: u32, ppid: u32) -> ProcSample {
        ProcSample {
            has_tty: true,
            ..p(pid, ppid, "bash", 0.0)
        }
    }

    /// Runs scans once a second; `cpu(t, pid)` gives each process's cumulative CPU seconds.
    fn run(
        c: &mut BatchClassifier,
        secs: u64,
        procs: impl Fn(u64) -> Vec<ProcSample>,
        asked: impl Fn(u32) -> Option<Nanos> + Copy,
    ) -> Vec<(u64, BatchDecision)> {
        let mut out = vec![];
        for t in 0..=secs {
            for d in c.on_scan(t * S, &procs(t), asked, |_| None) {
                out.push((t, d));
            }
        }
        out
    }

    fn none(_: u32) -> Option<Nanos> {
        None
    }

    #[test]
    fn make_and_its_compilers_are_one_tree_under_the_shell() {
        let mut c = BatchClassifier::new(params());
        // shell 10 -> make 20 -> cc 21, cc 22 (each a CPU); make itself idle.
        let procs = |t: u64| {
            let t = t as f64;
            vec![
                p(1, 0, "systemd", 0.0),
                interactive_shell(10, 1),
                p(20, 10, "make", 0.01 * t),
                p(21, 20, "cc1", 0.9 * t),
                p(22, 20, "cc1", 0.9 * t),
            ]
        };
        let d = run(&mut c, 5, procs, none);
        assert_eq!(d.len(), 1, "{d:?}");
        let (
            t,
            BatchDecision::Demote {
                root,
                members,
                cpus,
                ..
            },
        ) = &d[0]
        else {
            panic!("{d:?}")
        };
        assert_eq!(
            (*t, *root),
            (4, 20),
            "demoted after 3 s of soaking, counted from the first rate"
        );
        assert_eq!(members, &vec![20, 21, 22]);
        assert!((cpus - 1.81).abs() < 0.01);
        assert_eq!(c.tree_of(21), Some(20));
    }

    #[test]
    fn a_server_answering_requests_is_never_demoted() {
        let mut c = BatchClassifier::new(params());
        let procs = |t: u64| {
            vec![
                p(1, 0, "systemd", 0.0),
                p(30, 1, "postgres", 1.0 * t as f64),
            ]
        };
        let asked = |pid: u32| (pid == 30).then_some(0);
        assert!(run(&mut c, 10, procs, asked).is_empty());
    }

    #[test]
    fn soakers_beside_a_server_in_one_process_tree_are_demoted_alone() {
        let mut c = BatchClassifier::new(params());
        // A test harness (40) that serves requests and spawned two plain soakers.
        let procs = |t: u64| {
            let t = t as f64;
            vec![
                p(1, 0, "systemd", 0.0),
                p(40, 1, "harness", 0.1 * t),
                p(41, 40, "sh", 1.0 * t),
                p(42, 40, "sh", 1.0 * t),
            ]
        };
        let asked = |pid: u32| (pid == 40).then_some(0);
        let d = run(&mut c, 4, procs, asked);
        let roots: Vec<u32> = d
            .iter()
            .filter_map(|(_, d)| match d {
                BatchDecision::Demote { root, .. } => Some(*root),
                _ => None,
            })
            .collect();
        assert_eq!(roots, vec![41, 42]);
    }

    #[test]
    fn light_or_short_bursts_are_not_batch() {
        let mut c = BatchClassifier::new(params());
        let light = |t: u64| vec![p(1, 0, "systemd", 0.0), p(50, 1, "indexer", 0.5 * t as f64)];
        assert!(
            run(&mut c, 10, light, none).is_empty(),
            "half a CPU is below min_cpus"
        );
        let mut c = BatchClassifier::new(params());
        // Two seconds of soaking, then idle: never sustained for 3 s.
        let burst = |t: u64| vec![p(1, 0, "systemd", 0.0), p(51, 1, "x", t.min(2) as f64)];
        assert!(run(&mut c, 10, burst, none).is_empty());
    }

    #[test]
    fn interactive_shells_and_the_service_manager_are_never_roots() {
        let mut c = BatchClassifier::new(params());
        // The soaking loop runs in the interactive shell itself.
        let procs = |t: u64| {
            vec![
                p(1, 0, "systemd", 0.0),
                ProcSample {
                    cpu_ns: t * S,
                    ..interactive_shell(10, 1)
                },
            ]
        };
        assert!(run(&mut c, 10, procs, none).is_empty());
    }

    #[test]
    fn a_demoted_tree_that_starts_answering_requests_is_promoted() {
        let mut c = BatchClassifier::new(params());
        let procs = |t: u64| {
            let t = t as f64;
            vec![
                p(1, 0, "systemd", 0.0),
                p(60, 1, "worker", t),
                p(61, 60, "child", t),
            ]
        };
        let d = run(&mut c, 4, procs, none);
        assert!(matches!(
            d[..],
            [(4, BatchDecision::Demote { root: 60, .. })]
        ));
        // At 6 s the child receives a request.
        let asked = |pid: u32| (pid == 61).then_some(6 * S);
        let d = c.on_scan(7 * S, &procs(7), asked, |_| None);
        assert_eq!(
            d,
            vec![BatchDecision::Promote {
                root: 60,
                members: vec![60, 61]
            }]
        );
        // It answered recently: not demoted again while request_memory lasts.
        for t in 8..20 {
            assert!(c.on_scan(t * S, &procs(t), asked, |_| None).is_empty());
        }
    }

    #[test]
    fn children_forked_after_demotion_join_the_tree() {
        let mut c = BatchClassifier::new(params());
        let procs = |t: u64| {
            let mut v = vec![p(1, 0, "systemd", 0.0), p(70, 1, "make", t as f64)];
            if t >= 6 {
                v.push(p(71, 70, "cc1", (t - 6) as f64));
            }
            v
        };
        let d = run(&mut c, 7, procs, none);
        assert_eq!(
            d.len(),
            1,
            "the child joins silently (born in the group): {d:?}"
        );
        assert_eq!(c.tree_of(71), Some(70));
    }

    #[test]
    fn rules_force_a_class() {
        let mut c = BatchClassifier::new(params());
        let procs = |t: u64| {
            vec![
                p(1, 0, "systemd", 0.0),
                p(80, 1, "ffmpeg", 0.1 * t as f64),
                p(81, 1, "postgres", 2.0 * t as f64),
            ]
        };
        let forced = |p: &ProcSample| match p.comm.as_str() {
            "ffmpeg" => Some(Class::Batch),
            "postgres" => Some(Class::Latency),
            _ => None,
        };
        let mut d = vec![];
        for t in 0..10 {
            d.extend(c.on_scan(t * S, &procs(t), none, forced));
        }
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(matches!(
            &d[0],
            BatchDecision::Demote {
                root: 80,
                why: "rule",
                ..
            }
        ));
    }

    #[test]
    fn a_member_the_config_exempts_later_leaves_its_tree_alone() {
        let mut c = BatchClassifier::new(params());
        // script 30 -> worker 31, worker 32, each a CPU.
        let procs = |t: u64| {
            let t = t as f64;
            vec![
                p(1, 0, "systemd", 0.0),
                p(30, 1, "script", 0.01 * t),
                p(31, 30, "worker", 0.9 * t),
                p(32, 30, "indexer", 0.9 * t),
            ]
        };
        let mut d = vec![];
        for t in 0..5 {
            d.extend(c.on_scan(t * S, &procs(t), none, |_| None));
        }
        assert!(
            matches!(&d[..], [BatchDecision::Demote { root: 30, members, .. }] if members == &[30, 31, 32]),
            "{d:?}"
        );
        // A reload makes the indexer an exception (or a service): it alone comes back,
        // once, and the tree stays demoted.
        let exempt = |p: &ProcSample| (p.comm == "indexer").then_some(Class::Normal);
        let mut d = vec![];
        for t in 5..10 {
            d.extend(c.on_scan(t * S, &procs(t), none, exempt));
        }
        assert!(
            matches!(&d[..], [BatchDecision::Release { root: 30, pid: 32 }]),
            "{d:?}"
        );
        assert_eq!(c.tree_of(31), Some(30));
        assert_eq!(c.tree_of(32), None);
    }

    #[test]
    fn protection_rules() {
        assert!(protected(&p(1, 0, "anything", 0.0)));
        assert!(protected(&p(300, 2, "kworker/0:1", 0.0)));
        assert!(protected(&p(300, 1, "sshd", 0.0)));
        assert!(
            protected(&p(300, 1, "sshd-session", 0.0)),
            "OpenSSH 9.8 and later"
        );
        assert!(protected(&interactive_shell(300, 1)));
        assert!(
            !protected(&p(300, 1, "sh", 0.0)),
            "a script's shell is an ordinary program"
        );
        assert!(!protected(&p(300, 1, "make", 0.0)));
    }

    #[test]
    fn demand_counts_waiting_so_crowded_soakers_still_qualify() {
        let mut c = BatchClassifier::new(params());
        // Eight soakers on two CPUs: each runs a quarter of the time, waits the rest.
        let procs = |t: u64| {
            let mut v = vec![p(1, 0, "systemd", 0.0)];
            for pid in 100..108 {
                v.push(ProcSample {
                    wait_ns: (0.75 * t as f64 * 1e9) as u64,
                    ..p(pid, 1, "soak", 0.25 * t as f64)
                });
            }
            v
        };
        let d = run(&mut c, 4, procs, none);
        assert_eq!(d.len(), 8, "{d:?}");
    }

    #[test]
    fn a_supervisor_of_an_idle_server_and_a_soaker_is_not_the_root() {
        let mut c = BatchClassifier::new(params());
        // An unattended supervisor (no terminal) runs a server that listens but has had
        // no traffic yet, and a soaker: only the soaker is batch.
        let procs = |t: u64| {
            vec![
                p(1, 0, "systemd", 0.0),
                p(90, 1, "supervisor", 0.0),
                listening(p(91, 90, "server", 0.0)),
                p(92, 90, "soak", t as f64),
            ]
        };
        let d = run(&mut c, 4, procs, none);
        assert!(
            matches!(&d[..], [(_, BatchDecision::Demote { root: 92, .. })]),
            "{d:?}"
        );
    }

    #[test]
    fn a_listening_child_charged_a_clock_tick_in_a_short_scan_still_splits_the_tree() {
        // Scans every 200 ms. The supervisor's idle server is charged one 10 ms tick every
        // other scan (it woke at a tick): it serves however little it runs.
        let mut c = BatchClassifier::new(params());
        let mut out = vec![];
        for i in 0..=25u64 {
            let t = i * S / 5;
            let procs = vec![
                p(1, 0, "systemd", 0.0),
                p(90, 1, "supervisor", 0.0),
                listening(p(91, 90, "server", (i / 2) as f64 * 0.010)),
                p(92, 90, "soak", t as f64 / S as f64),
            ];
            out.extend(c.on_scan(t, &procs, none, |_| None));
        }
        assert!(
            matches!(&out[..], [BatchDecision::Demote { root: 92, .. }]),
            "{out:?}"
        );
    }

    #[test]
    fn a_script_with_an_idle_helper_and_busy_children_is_one_tree() {
        let mut c = BatchClassifier::new(params());
        // A backup script: a `sleep` watchdog and a `tee` beside two compressors.
        let procs = |t: u64| {
            vec![
                p(1, 0, "systemd", 0.0),
                p(100, 1, "backup.sh", 0.0),
                p(101, 100, "sleep", 0.0),
                p(102, 100, "tee", 0.001 * t as f64),
                p(103, 100, "gzip", t as f64),
                p(104, 100, "xz", t as f64),
            ]
        };
        let d = run(&mut c, 4, procs, none);
        let [(_, BatchDecision::Demote { root, members, .. })] = &d[..] else {
            panic!("one tree: {d:?}")
        };
        assert_eq!((*root, members), (100, &vec![100, 101, 102, 103, 104]));
    }

    #[test]
    fn a_child_that_once_received_requests_still_makes_its_parent_a_supervisor() {
        let mut c = BatchClassifier::new(params());
        // The server's last request was long ago (beyond `request_memory`): it still serves.
        let procs = |t: u64| {
            vec![
                p(1, 0, "systemd", 0.0),
                p(90, 1, "supervisor", 0.0),
                p(91, 90, "server", 0.0),
                p(92, 90, "soak", t as f64),
            ]
        };
        let asked = |pid: u32| (pid == 91).then_some(0);
        let mut out = vec![];
        for t in 100..=105 {
            out.extend(c.on_scan(t * S, &procs(t), asked, |_| None));
        }
        assert!(
            matches!(&out[..], [BatchDecision::Demote { root: 92, .. }]),
            "{out:?}"
        );
    }

    #[test]
    fn young_idle_children_do_not_stop_the_climb() {
        let mut c = BatchClassifier::new(params());
        // make with a busy compiler and a compiler just started.
        let procs = |t: u64| {
            vec![
                p(1, 0, "systemd", 0.0),
                p(95, 1, "make", 0.0),
                p(96, 95, "cc1", t as f64),
                ProcSample {
                    age_ns: S / 10,
                    ..p(97, 95, "cc1", 0.0)
                },
            ]
        };
        let d = run(&mut c, 4, procs, none);
        assert!(
            matches!(&d[..], [(_, BatchDecision::Demote { root: 95, .. })]),
            "{d:?}"
        );
    }

    #[test]
    fn a_root_that_moves_between_scans_keeps_its_soaking_time() {
        let mut c = BatchClassifier::new(params());
        // A parent that is busy in some scans (the climb starts from it) and not in
        // others: the soaker's tree is found under the parent or alone, alternately.
        let procs = |t: u64| {
            let parent_cpu = 0.2 * (t / 2) as f64 + if t % 2 == 1 { 0.2 } else { 0.0 };
            vec![
                p(1, 0, "systemd", 0.0),
                p(110, 1, "runner", parent_cpu),
                p(111, 110, "soak", t as f64),
                // A listening child: the soaker's own climb stops below runner.
                listening(p(112, 110, "server", 0.0)),
            ]
        };
        let d = run(&mut c, 6, procs, none);
        assert!(!d.is_empty(), "demoted despite the root moving: {d:?}");
    }

    #[test]
    fn a_loop_whose_children_each_live_less_than_a_scan_is_judged_by_what_it_reaped() {
        let mut c = BatchClassifier::new(params());
        // `while :; do pg_dump | gzip; done`: every scan sees a new dump and compressor,
        // each just started; what the earlier ones used is the loop's reaped children's
        // CPU (its cutime). Their reads were responses, not requests.
        let procs = |t: u64| {
            let n = 1000 + 2 * t as u32;
            vec![
                p(1, 0, "systemd", 0.0),
                p(100, 1, "bash", 0.95 * t as f64),
                p(n, 100, "pg_dump", 0.01),
                p(n + 1, 100, "gzip", 0.02),
            ]
        };
        let d = run(&mut c, 5, procs, none);
        let [(at, BatchDecision::Demote { root, .. })] = &d[..] else {
            panic!("one tree: {d:?}")
        };
        assert_eq!(*root, 100, "the loop, not one of its short-lived children");
        assert!(*at <= 4, "after 3 s of soaking: {d:?}");
        // Had the dump's reads been requests, the loop would serve, and stay.
        let mut c = BatchClassifier::new(params());
        let served = |pid: u32| (pid >= 1000 && pid % 2 == 0).then_some(0);
        let d = run(&mut c, 5, procs, served);
        assert!(
            !d.iter()
                .any(|(_, x)| matches!(x, BatchDecision::Demote { root: 100, .. })),
            "{d:?}"
        );
    }
}
