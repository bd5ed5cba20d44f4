//! What the peers change, seen from outside: every thread's scheduling settings and
//! cgroup, read before, during and after a peer daemon runs, and compared.

use super::*;

/// One thread's scheduling state, as a peer may change it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ThreadState {
    pub(super) pid: u32,
    pub(super) ppid: u32,
    pub(super) comm: String,
    pub(super) start: u64,
    pub(super) nice: i32,
    pub(super) policy: u32,
    pub(super) rt_priority: i32,
    pub(super) ioprio: i32,
    /// Its group in the cpu controller's hierarchy.
    pub(super) cgroup: Option<String>,
    /// The process's OOM score adjustment.
    pub(super) oom_score_adj: Option<i32>,
}

impl ThreadState {
    /// What a thread starts with when nobody changed it.
    pub(super) fn default_for(pid: u32, comm: &str, start: u64) -> Self {
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
pub(super) struct Snapshot {
    pub(super) threads: BTreeMap<u32, ThreadState>,
    pub(super) groups: BTreeSet<String>,
    pub(super) settings: Vec<(PathBuf, String)>,
    pub(super) cgroups: Option<Cgroups>,
}

impl Snapshot {
    pub(super) fn take() -> Self {
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
    pub(super) fn restore(&self) -> Vec<String> {
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

/// The scheduler settings a peer may write machine-wide (system76-scheduler's CFS
/// profiles, autogroup).
pub(super) const SETTINGS: &[&str] = &[
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

pub(super) const IOPRIO_WHO_PROCESS: libc::c_int = 1;

pub(super) fn ioprio_get(tid: u32) -> i32 {
    // SAFETY: ioprio_get only reads.
    unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, tid as libc::c_int) as i32 }
}

pub(super) fn rt_priority(tid: u32) -> i32 {
    let mut p = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_getparam fills the param it is given.
    if unsafe { libc::sched_getparam(tid as libc::pid_t, &mut p) } == 0 {
        p.sched_priority
    } else {
        0
    }
}

/// The value to write back: a choice file ("none voluntary (full)") takes the chosen word.
pub(super) fn setting_value(was: &str) -> String {
    match (was.find('('), was.find(')')) {
        (Some(a), Some(b)) if a < b => was[a + 1..b].to_string(),
        _ => was.trim().to_string(),
    }
}

/// Makes the kernel look up the task group of each of the bench's own threads again (an
/// autogroup switched on or off applies to a running task only once it moves): through
/// a group of the bench's and back into its own.
pub(super) fn reseat_own_threads() {
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
pub(super) fn threads_of(pid: u32) -> Vec<u32> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Moves one thread back (cgroup v1 moves threads; v2 moves the whole process).
pub(super) fn move_thread(cg: &Cgroups, pid: u32, tid: u32, group: &str) -> std::io::Result<()> {
    let dir = cg.root().join(group.trim_start_matches('/'));
    match cg.version() {
        Version::V1 => fs::write(dir.join("tasks"), tid.to_string()),
        Version::V2 => fs::write(dir.join("cgroup.procs"), pid.to_string()),
    }
}

/// Every group in the cpu controller's hierarchy, as "/a/b".
pub(super) fn all_groups(cg: &Cgroups) -> BTreeSet<String> {
    pub(super) fn walk(dir: &Path, name: &str, out: &mut BTreeSet<String>) {
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
pub(super) fn summarize(threads: Counts, before: &Snapshot, after: &Snapshot) -> Vec<String> {
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
pub(super) fn count_changes(before: &Snapshot, after: &Snapshot) -> Counts {
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
pub(super) fn lines(counts: Counts) -> Vec<String> {
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
pub(super) fn ancestors(s: &Snapshot, pid: u32) -> impl Iterator<Item = u32> + '_ {
    std::iter::successors(Some(pid), |&p| {
        s.threads.get(&p).map(|t| t.ppid).filter(|&pp| pp > 1)
    })
    .take(64)
}

/// Whether process `pid` is `root` or below it.
pub(super) fn descends_from(s: &Snapshot, pid: u32, root: u32) -> bool {
    ancestors(s, pid).any(|p| p == root)
}

/// What a thread born while the peer ran would have had without it: what it inherited,
/// its process's first thread's or its nearest ancestor's state from before (a build
/// started at nice 19 is not the peer's doing); a fresh thread's when nothing is known.
pub(super) fn inherited(before: &Snapshot, after: &Snapshot, t: &ThreadState) -> ThreadState {
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

pub(super) fn policy_name(p: u32) -> String {
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

pub(super) fn ioprio_name(v: i32) -> String {
    let (class, level) = (v >> 13, v & 0x1fff);
    match class {
        0 => "none".into(),
        1 => format!("realtime {level}"),
        2 => format!("best-effort {level}"),
        3 => "idle".into(),
        c => format!("class {c}"),
    }
}

pub(super) fn differences(was: &ThreadState, is: &ThreadState) -> Vec<String> {
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
