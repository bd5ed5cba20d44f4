//! What the tests read from /proc (and set on their own threads).

/// A task's /proc stat: `/proc/PID/stat`, or a thread's `/proc/PID/task/TID/stat`.
pub(crate) fn stat_of(path: &str) -> Option<appease_cgroup::ProcStat> {
    appease_cgroup::ProcStat::parse(&std::fs::read_to_string(path).ok()?)
}

/// The nice of a thread of this test process.
pub(crate) fn nice_of(tid: u32) -> i32 {
    let path = format!("/proc/{}/task/{tid}/stat", std::process::id());
    stat_of(&path).expect("a thread of ours").nice
}

pub(crate) fn set_nice(tid: u32, nice: i32) {
    // SAFETY: plain syscall on a thread of ours.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) };
    assert_eq!(r, 0, "setpriority");
}

/// Fails unless this test runs in the root CPU cgroup, where the kernel schedules each
/// session in its autogroup (the servers it starts are there too).
pub(crate) fn assert_in_root_cpu_group() {
    assert_eq!(
        cpu_cgroup(std::process::id()).as_deref(),
        Some("/"),
        "the servers (started by this test) must run in the root CPU cgroup, where a session is an autogroup"
    );
}

pub(crate) fn cpu_cgroup(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    appease_cgroup::parse_proc_cgroup(&text, appease_cgroup::Version::V1)
        .or_else(|| appease_cgroup::parse_proc_cgroup(&text, appease_cgroup::Version::V2))
}

/// Whether a process is in the idle group `top`: in the group of its job inside it.
pub(crate) fn in_idle_group(pid: u32, top: &str) -> bool {
    cpu_cgroup(pid).is_some_and(|g| g.strip_prefix(top).is_some_and(|r| r.starts_with("/job-")))
}

/// The processes whose parent is `ppid`.
pub(crate) fn children_of(ppid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| stat_of(&format!("/proc/{pid}/stat")).is_some_and(|s| s.ppid == ppid))
        .collect()
}

/// The daemon's thread named `name`.
pub(crate) fn thread_named(pid: u32, name: &str) -> Option<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|tid| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                .is_ok_and(|c| c.trim() == name)
        })
}

/// The nice of `pid`'s session autogroup.
pub(crate) fn autogroup_nice(pid: u32) -> i32 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/autogroup")).unwrap();
    appease_actuator::sys::parse_autogroup(&text)
        .unwrap_or_else(|| panic!("pid {pid} is in no autogroup: {text:?}"))
        .nice
}

/// The host's processes running or waiting for a CPU now, (pid, name): what else
/// competed with a test's soaker when it was not found soaking.
pub(crate) fn running_processes() -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let (name, fields) = appease_cgroup::stat_fields(stat.as_bytes())?;
            (fields.first() == Some(&"R")).then(|| (pid, name.to_string()))
        })
        .collect()
}

/// The CPUs a thread may run on (none once it is gone).
pub(crate) fn cpus_of(tid: u32) -> Vec<usize> {
    appease_actuator::sys::affinity(tid).unwrap_or_default()
}

/// The nice of a process (its main thread).
pub(crate) fn nice_of_process(pid: u32) -> i32 {
    stat_of(&format!("/proc/{pid}/stat"))
        .expect("a live process")
        .nice
}

/// A thread's scheduling policy (0 normal, 5 SCHED_IDLE).
pub(crate) fn policy_of(pid: u32, tid: u32) -> u32 {
    stat_of(&format!("/proc/{pid}/task/{tid}/stat"))
        .expect("a live thread")
        .policy
}

/// CPU time of all of a process's threads, ns (schedstat).
pub(crate) fn cpu_ns_of(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let t = std::fs::read_to_string(e.path().join("schedstat")).ok()?;
                    t.split_whitespace().next()?.parse::<u64>().ok()
                })
                .sum()
        })
        .unwrap_or(0)
}
