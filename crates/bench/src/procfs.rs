//! What the bench reads from /proc: CPU time of processes and trees, and of the host.

/// CPU time of the processes `roots` and everything below them, with what their reaped
/// children used (a build's compilers come and go), ns.
pub(crate) fn tree_cpu_ns(roots: &[u32]) -> u64 {
    let mut pids = roots.to_vec();
    pids.extend(crate::descendants(roots));
    let ticks: u64 = pids
        .iter()
        .filter_map(|p| appease_cgroup::read_stat(format!("/proc/{p}/stat")))
        .map(|s| s.cpu_ticks)
        .sum();
    ticks * appease_cgroup::clock_tick_ns()
}

/// Every process below `roots`, parents before children (so none can fork anew once
/// its parent is gone).
pub(crate) fn descendants(roots: &[u32]) -> Vec<u32> {
    let mut pairs = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read(e.path().join("stat")).unwrap_or_default();
        if let Some(ppid) = appease_cgroup::stat_ppid(&stat) {
            pairs.push((pid, ppid));
        }
    }
    appease_policy::tree::Children::new(pairs).below(roots)
}

/// CPU time of a process by its own stat line, exited threads included, ns at the clock
/// tick's resolution (0 once it is gone): a check on [`process_cpu_ns`].
pub(crate) fn process_stat_cpu_ns(pid: u32) -> u64 {
    appease_cgroup::procstat::read_stat(format!("/proc/{pid}/stat")).map_or(0, |s| {
        s.run_ticks * appease_cgroup::procstat::clock_tick_ns()
    })
}

/// CPU time of a process's live threads, ns (0 once it is gone).
pub(crate) fn process_cpu_ns(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.filter_map(|e| {
        let text = std::fs::read_to_string(e.ok()?.path().join("schedstat")).ok()?;
        text.split_whitespace().next()?.parse::<u64>().ok()
    })
    .sum()
}

/// Busy and total jiffies from the first line of /proc/stat.
pub(crate) fn cpu_jiffies() -> (u64, u64) {
    let v = host_jiffies();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// Jiffies the hypervisor gave to others while this machine's CPUs wanted to run
/// ("steal"), and all jiffies, from the first line of /proc/stat.
pub(crate) fn steal_jiffies() -> (u64, u64) {
    let v = host_jiffies();
    (v.get(7).copied().unwrap_or(0), v.iter().take(8).sum())
}

/// The host's jiffies by kind: user, nice, system, idle, iowait, irq, softirq, steal, ….
fn host_jiffies() -> Vec<u64> {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    text.lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect()
}
