//! Spreading the idle group's busy threads over the CPUs.
//!
//! While the batch group is idle, the kernel's balancer sees its tasks as almost
//! weightless (their hierarchical load is the idle weight split among them) and moves
//! them between CPUs in herds: most of them share one CPU while a few have the other to
//! themselves (the CFS group-scheduling slides' herd migration). A task the balancer
//! cannot move stays where it is put, and the kernel is fair among the tasks of one group
//! on one CPU. So each scan gives every busy thread one CPU, every CPU the same weight,
//! moving as few as it can, and swaps one pair at each scan, so that CPUs that the servers
//! leave with less room (or an odd count) even out over time.

use std::collections::HashMap;

/// A busy thread of a demoted tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BusyThread {
    /// The demoted tree (its root's pid): threads of one job go to different CPUs first.
    pub job: u32,
    pub pid: u32,
    pub tid: u32,
}

/// Where each thread goes this round: (thread, index into the CPUs the caller spreads
/// over). `round` counts the scans; `cpus` is how many CPUs there are (none: nothing);
/// `current` says where a thread is pinned now, if it is.
///
/// Each job has a group of its own in the idle group, of equal weight, which the kernel
/// splits among the job's threads by where they run: a thread weighs one over its job's
/// busy threads. Every CPU should carry the same weight, so that every job gets the same
/// share. Moving a thread costs (a migration, a cold cache), so a thread stays where it is
/// unless the balance needs it elsewhere: new threads go, heaviest first, to the lightest
/// CPU (of equal CPUs, one without a thread of their job), then threads move from the
/// heaviest CPU to the lightest while a move narrows the gap. Last, one thread, each in its
/// turn, swaps places with one of equal weight on the next CPU: over time no thread stays
/// on a CPU that the servers crowd, or alone where the rest share.
pub fn plan(
    threads: &[BusyThread],
    cpus: usize,
    round: u64,
    current: impl Fn(u32) -> Option<usize>,
) -> Vec<(BusyThread, usize)> {
    if cpus == 0 || threads.is_empty() {
        return Vec::new();
    }
    let mut order = threads.to_vec();
    order.sort_unstable();
    order.dedup();
    let n = order.len();
    let mut per_job: HashMap<u32, usize> = HashMap::new();
    for t in &order {
        *per_job.entry(t.job).or_default() += 1;
    }
    let w: Vec<f64> = order.iter().map(|t| 1.0 / per_job[&t.job] as f64).collect();
    let mut at: Vec<Option<usize>> = order
        .iter()
        .map(|t| current(t.tid).filter(|&c| c < cpus))
        .collect();
    let mut load = vec![0.0f64; cpus];
    for (i, c) in at.iter().enumerate() {
        if let Some(c) = c {
            load[*c] += w[i];
        }
    }
    // New threads, heaviest first (stable: in thread order among equals).
    let mut new: Vec<usize> = (0..n).filter(|&i| at[i].is_none()).collect();
    new.sort_by(|&a, &b| w[b].total_cmp(&w[a]));
    for i in new {
        let least = load.iter().copied().fold(f64::INFINITY, f64::min);
        let tied = |c: &usize| load[*c] - least < 1e-9;
        let has_job = |c: usize| (0..n).any(|j| at[j] == Some(c) && order[j].job == order[i].job);
        let cpu = (0..cpus)
            .filter(tied)
            .find(|&c| !has_job(c))
            .or_else(|| (0..cpus).find(tied))
            .unwrap_or(0);
        at[i] = Some(cpu);
        load[cpu] += w[i];
    }
    // Rebalance: from the heaviest CPU to the lightest, the move that narrows the gap most.
    for _ in 0..n {
        let hi = (0..cpus)
            .max_by(|&a, &b| load[a].total_cmp(&load[b]))
            .unwrap_or(0);
        let lo = (0..cpus)
            .min_by(|&a, &b| load[a].total_cmp(&load[b]))
            .unwrap_or(0);
        let gap = load[hi] - load[lo];
        let best = (0..n)
            .filter(|&i| at[i] == Some(hi) && w[i] < gap - 1e-9)
            .min_by(|&a, &b| {
                (gap - 2.0 * w[a])
                    .abs()
                    .total_cmp(&(gap - 2.0 * w[b]).abs())
            });
        let Some(i) = best else {
            break;
        };
        at[i] = Some(lo);
        load[hi] -= w[i];
        load[lo] += w[i];
    }
    // Turn: one thread (each in its turn) swaps with one of equal weight on the next CPU.
    if cpus >= 2 {
        let x = (round % n as u64) as usize;
        if let Some(a) = at[x] {
            let b = (a + 1) % cpus;
            let same: Vec<usize> = (0..n)
                .filter(|&j| at[j] == Some(b) && (w[j] - w[x]).abs() < 1e-9)
                .collect();
            if !same.is_empty() {
                let y = same[(round / n as u64) as usize % same.len()];
                at[x] = Some(b);
                at[y] = Some(a);
            }
        }
    }
    order
        .into_iter()
        .zip(at)
        .map(|(t, c)| (t, c.unwrap_or(0)))
        .collect()
}

/// Whether the busy threads are worth pinning: only while they outnumber the CPUs.
/// Then the balancer's herds make the split unfair (some threads share a CPU while
/// others have one each, for seconds). At one busy thread per CPU or fewer the balancer
/// gives each a CPU of its own but for brief herds, and a herd leaves a CPU to the
/// servers alone, which a pinned thread never does: at one soaker per CPU beside a
/// server, pinning cost the server's p99 about 15 % against the hand-made idle group
/// (docs/RESULTS.md, the batch-level sweep).
pub fn worth_spreading(threads: usize, cpus: usize) -> bool {
    cpus >= 2 && threads > cpus
}

/// Whether a thread that wanted a CPU (ran, or was runnable and waited) for `wanted_ns`
/// of the `interval_ns` since the last scan, and was seen at that scan, counts as busy:
/// half the time or more. Beside many others in an idle group, a CPU-bound thread gets
/// little CPU but waits the rest; a shell waiting on its children does neither. The
/// scanner spreads a thread only once it was busy over two intervals in a row: short
/// processes (a compiler run, a shell command) are over by then, and pinning them would
/// only keep them off a free CPU and cost the daemon a system call each.
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

    /// Rounds one after the other, each starting where the last left the threads.
    fn rounds(threads: &[BusyThread], cpus: usize, n: u64) -> Vec<Vec<(BusyThread, usize)>> {
        let mut at: HashMap<u32, usize> = HashMap::new();
        (0..n)
            .map(|round| {
                let p = plan(threads, cpus, round, |tid| at.get(&tid).copied());
                at = p.iter().map(|(t, c)| (t.tid, *c)).collect();
                p
            })
            .collect()
    }

    /// Each job's share of a CPU in one round: its threads' weights over their CPUs'.
    fn shares(p: &[(BusyThread, usize)], cpus: usize) -> HashMap<u32, f64> {
        let size = |job| p.iter().filter(|(x, _)| x.job == job).count() as f64;
        let mut load = vec![0.0; cpus];
        for (th, c) in p {
            load[*c] += 1.0 / size(th.job);
        }
        let mut share = HashMap::new();
        for (th, c) in p {
            *share.entry(th.job).or_insert(0.0) += 1.0 / size(th.job) / load[*c];
        }
        share
    }

    #[test]
    fn threads_are_shared_out_evenly_and_only_a_pair_moves_per_round() {
        let threads: Vec<_> = (0..48).map(|i| t(i, 100 + i)).collect();
        let all = rounds(&threads, 2, 6);
        for p in &all {
            assert_eq!(per_cpu(p, 2), vec![24, 24]);
        }
        for w in all.windows(2) {
            let moved = w[0].iter().zip(&w[1]).filter(|(a, b)| a.1 != b.1).count();
            assert_eq!(moved, 2, "one swap a round");
        }
        let seven: Vec<_> = (0..7).map(|i| t(i, i)).collect();
        assert_eq!(per_cpu(&plan(&seven, 3, 0, |_| None), 3), vec![3, 2, 2]);
    }

    #[test]
    fn one_jobs_threads_go_to_different_cpus_first() {
        let threads = [t(1, 10), t(1, 11), t(2, 20), t(2, 21)];
        let p = plan(&threads, 2, 1, |_| None);
        let cpu_of = |tid| p.iter().find(|(x, _)| x.tid == tid).unwrap().1;
        assert_ne!(cpu_of(10), cpu_of(11));
        assert_ne!(cpu_of(20), cpu_of(21));
    }

    #[test]
    fn threads_stay_where_they_are_unless_the_balance_needs_them_elsewhere() {
        // All four were on CPU 0: two move, two stay (then one pair swaps).
        let threads = [t(1, 1), t(2, 2), t(3, 3), t(4, 4)];
        let p = plan(&threads, 2, 0, |_| Some(0));
        assert_eq!(per_cpu(&p, 2), vec![2, 2]);
    }

    /// Three threads on two CPUs: whoever is alone on a CPU gets twice what the others
    /// get. The swaps make each of them alone in turn.
    #[test]
    fn swapping_a_pair_each_round_gives_each_thread_the_lone_place_in_turn() {
        let threads = [t(1, 1), t(2, 2), t(3, 3)];
        let mut total: HashMap<u32, f64> = HashMap::new();
        for p in rounds(&threads, 2, 60) {
            for (job, s) in shares(&p, 2) {
                *total.entry(job).or_default() += s;
            }
        }
        let mean = total.values().sum::<f64>() / 3.0;
        for (job, s) in total {
            assert!(
                (s / mean - 1.0).abs() < 0.15,
                "job {job}: {s} against {mean}"
            );
        }
    }

    /// Jobs of 1, 2 and 4 threads on 2 CPUs, each job's group of equal weight split among
    /// its threads: every CPU carries the same weight, so every job gets 2/3 of a CPU.
    #[test]
    fn jobs_of_different_sizes_get_the_same_share() {
        let threads = [
            t(1, 10),
            t(2, 20),
            t(2, 21),
            t(3, 30),
            t(3, 31),
            t(3, 32),
            t(3, 33),
        ];
        for (round, p) in rounds(&threads, 2, 8).iter().enumerate() {
            for (job, s) in shares(p, 2) {
                assert!(
                    (s - 2.0 / 3.0).abs() < 1e-9,
                    "round {round}: job {job} gets {s}"
                );
            }
        }
    }

    #[test]
    fn no_cpus_or_no_threads_plan_nothing() {
        assert!(plan(&[t(1, 1)], 0, 0, |_| None).is_empty());
        assert!(plan(&[], 2, 0, |_| None).is_empty());
    }

    #[test]
    fn only_more_busy_threads_than_cpus_are_worth_spreading() {
        assert!(!worth_spreading(2, 2), "one each: the balancer does it");
        assert!(!worth_spreading(1, 2));
        assert!(worth_spreading(3, 2));
        assert!(worth_spreading(48, 2));
        assert!(!worth_spreading(4, 1), "nothing to spread over");
    }

    #[test]
    fn busy_means_wanting_a_cpu_half_the_time() {
        assert!(busy(500_000_000, 1_000_000_000));
        assert!(!busy(499_999_999, 1_000_000_000));
        assert!(!busy(5, 0));
    }
}
