//! Spreading the idle group's busy threads over the CPUs.
//!
//! While the batch group is idle, the kernel's balancer sees its tasks as almost
//! weightless (their hierarchical load is the idle weight split among them) and moves
//! them between CPUs in herds: most of them share one CPU while a few have the other to
//! themselves (the CFS group-scheduling slides' herd migration). A task the balancer
//! cannot move stays where it is put, and the kernel is fair among the tasks of one group
//! on one CPU. So each scan gives every busy thread one CPU, the same number of threads
//! on each, and turns the order one place further at each scan: over as many scans as
//! there are threads, each thread holds every position once, so CPUs that the servers
//! leave with less room (or an odd count) even out over time.

/// A busy thread of a demoted tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BusyThread {
    /// The demoted tree (its root's pid): threads of one job go to different CPUs first.
    pub job: u32,
    pub pid: u32,
    pub tid: u32,
}

/// Where each thread goes this round: (thread, index into the CPUs the caller spreads
/// over). `round` counts the scans; `cpus` is how many CPUs there are (none: nothing).
pub fn plan(threads: &[BusyThread], cpus: usize, round: u64) -> Vec<(BusyThread, usize)> {
    if cpus == 0 || threads.is_empty() {
        return Vec::new();
    }
    let mut order = threads.to_vec();
    order.sort_unstable();
    order.dedup();
    let n = order.len();
    let turn = (round % n as u64) as usize;
    order
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, ((i + turn) % n) % cpus))
        .collect()
}

/// Whether a thread that wanted a CPU (ran, or was runnable and waited) for `wanted_ns`
/// of the `interval_ns` since the last scan, and was seen at that scan, counts as busy:
/// half the time or more. Beside many others in an idle group, a CPU-bound thread gets
/// little CPU but waits the rest; a shell waiting on its children does neither. A thread
/// born since is left to the kernel until the next scan: most short processes (a
/// compiler run, a shell command) are over by then, and pinning them would only keep them
/// off a free CPU.
pub fn busy(wanted_ns: u64, interval_ns: u64) -> bool {
    interval_ns > 0 && wanted_ns.saturating_mul(2) >= interval_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(job: u32, tid: u32) -> BusyThread {
        BusyThread { job, pid: tid, tid }
    }

    fn per_cpu(p: &[(BusyThread, usize)], cpus: usize) -> Vec<usize> {
        let mut n = vec![0; cpus];
        for &(_, c) in p {
            n[c] += 1;
        }
        n
    }

    #[test]
    fn threads_are_shared_out_evenly_over_the_cpus() {
        let threads: Vec<_> = (0..48).map(|i| t(i, 100 + i)).collect();
        for round in 0..5 {
            assert_eq!(per_cpu(&plan(&threads, 2, round), 2), vec![24, 24]);
        }
        let seven: Vec<_> = (0..7).map(|i| t(i, i)).collect();
        assert_eq!(per_cpu(&plan(&seven, 3, 0), 3), vec![3, 2, 2]);
    }

    #[test]
    fn one_jobs_threads_go_to_different_cpus_first() {
        let threads = [t(1, 10), t(1, 11), t(2, 20), t(2, 21)];
        let p = plan(&threads, 2, 0);
        let cpu_of = |tid| p.iter().find(|(x, _)| x.tid == tid).unwrap().1;
        assert_ne!(cpu_of(10), cpu_of(11));
        assert_ne!(cpu_of(20), cpu_of(21));
    }

    /// Three threads on two CPUs: whoever is alone on a CPU gets twice what the others
    /// get. Over three rounds each thread is alone once.
    #[test]
    fn turning_the_order_gives_each_thread_every_place_in_turn() {
        let threads = [t(1, 1), t(2, 2), t(3, 3)];
        let mut share = [0.0f64; 3];
        for round in 0..3 {
            let p = plan(&threads, 2, round);
            let counts = per_cpu(&p, 2);
            for (th, c) in p {
                share[th.tid as usize - 1] += 1.0 / counts[c] as f64;
            }
        }
        for s in share {
            assert!((s - 2.0).abs() < 1e-9, "{share:?}");
        }
    }

    #[test]
    fn no_cpus_or_no_threads_plan_nothing() {
        assert!(plan(&[t(1, 1)], 0, 0).is_empty());
        assert!(plan(&[], 2, 0).is_empty());
    }

    #[test]
    fn busy_means_wanting_a_cpu_half_the_time() {
        assert!(busy(500_000_000, 1_000_000_000));
        assert!(!busy(499_999_999, 1_000_000_000));
        assert!(!busy(5, 0));
    }
}
