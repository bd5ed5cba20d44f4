//! Pinning the idle group's busy threads, one CPU each, as the policy's `spread` plans
//! it: the kernel's balancer herds an idle group's tasks, and cannot move a pinned one.
//! Each pin is journaled with the thread's CPUs before it and undone when the thread is
//! no longer busy, when the group stops being idle, on exit and after a crash. A thread
//! whose CPUs someone else chose (its own affinity, a cpuset) is never touched. Only busy
//! threads are pinned: a shell or a `make` waiting on its children keeps every CPU, so
//! what it starts sizes itself to the machine. A child a pinned thread starts inherits its
//! CPU; it is adopted at the next scan if busy, and given its CPUs back with its parent.

use std::collections::{HashMap, HashSet};

use appease_policy::tree;

use crate::journal::{Record, TaskKey};
use crate::restore::FromJournal;
use crate::sys::{self, Kernel};
use crate::trail::{audit, Change};
use crate::{KernelActuator, RestoreReport};

/// A thread appease pinned.
pub(crate) struct Pinned {
    key: TaskKey,
    /// The CPUs it had: what goes back.
    orig: Vec<usize>,
    cpu: usize,
    /// Every CPU it was given: a thread or child it started may sit on any of them.
    held: Vec<usize>,
}

/// What the spreading holds: the pinned threads and those whose CPUs are not ours to
/// change (tid -> start).
#[derive(Default)]
pub(crate) struct Spread {
    pinned: HashMap<u32, Pinned>,
    /// tid -> (pid, start).
    foreign: HashMap<u32, (u32, u64)>,
}

impl KernelActuator {
    /// The CPUs the spreading shares out (the host's online CPUs): read once per scan
    /// and handed to `may_spread`, `pinned_at` and `spread`.
    pub fn spread_cpus(&self) -> Vec<usize> {
        self.kernel.online_cpus()
    }

    /// Whether a thread may be spread over `online`: pinned already, or free to run on
    /// every CPU (or on one it inherited from a thread appease pinned). A thread that
    /// chose its CPUs, or sits in a cpuset, is not: the plan leaves it out.
    pub fn may_spread(&self, pid: u32, tid: u32, online: &[usize]) -> bool {
        if self.spread.pinned.contains_key(&tid) {
            return true;
        }
        if self
            .spread
            .foreign
            .get(&tid)
            .is_some_and(|&(p, _)| p == pid)
        {
            return false;
        }
        match self.kernel.affinity(tid) {
            Ok(now) => now == online || self.inherited_pin(pid, &now).is_some(),
            Err(_) => false,
        }
    }

    /// Pins each `(pid, tid, cpu)` of `plan` (`cpu` indexes `online`) to its CPU, and
    /// gives every thread pinned before and not in the plan its CPUs back. Returns how
    /// many threads are pinned now.
    pub fn spread(&mut self, plan: &[(u32, u32, usize)], online: &[usize]) -> usize {
        self.spread_knowing(plan, online, Children::default())
    }

    /// As `spread`, every process's parent known from the scan that made the plan
    /// (`facts`): an unpin finds the children that inherited a pin without walking the
    /// process table (at each scan whose busiest threads changed: a read of every
    /// process's stat, on the event loop).
    pub fn spread_after_scan(
        &mut self,
        plan: &[(u32, u32, usize)],
        online: &[usize],
        facts: &HashMap<u32, crate::ProcFacts>,
    ) -> usize {
        self.spread_knowing(plan, online, Children::of_scan(facts))
    }

    fn spread_knowing(
        &mut self,
        plan: &[(u32, u32, usize)],
        online: &[usize],
        mut children: Children<'_>,
    ) -> usize {
        if online.len() < 2 || self.dry_run {
            self.unspread("nothing to spread over");
            return 0;
        }
        let wanted: HashSet<u32> = plan.iter().map(|&(_, tid, _)| tid).collect();
        let stale: Vec<u32> = self
            .spread
            .pinned
            .keys()
            .filter(|t| !wanted.contains(t))
            .copied()
            .collect();
        for tid in stale {
            self.unpin(tid, "no longer busy in the idle group", &mut children);
        }
        let kernel = &self.kernel;
        self.spread.foreign.retain(|&tid, &mut (pid, start)| {
            kernel.task_stat(pid, tid).is_ok_and(|s| s.start == start)
        });
        for &(pid, tid, idx) in plan {
            if pid == self.self_pid {
                continue;
            }
            self.pin(pid, tid, online[idx % online.len()], online);
        }
        self.spread.pinned.len()
    }

    /// Pins `tid` to `cpu`, journaled first; a thread whose CPUs someone else chose is
    /// left alone.
    fn pin(&mut self, pid: u32, tid: u32, cpu: usize, online: &[usize]) {
        // A pinned thread costs one system call a scan: its CPUs, which say whether
        // someone else changed them (a thread that ended and whose tid was reused is
        // caught by its start time when it is unpinned).
        if self.spread.pinned.contains_key(&tid) {
            self.keep_pinned(pid, tid, cpu);
            return;
        }
        let Ok(stat) = self.kernel.task_stat(pid, tid) else {
            return; // gone
        };
        if self.spread.foreign.get(&tid) == Some(&(pid, stat.start)) {
            return;
        }
        let Ok(now) = self.kernel.affinity(tid) else {
            return;
        };
        let orig = if now == online {
            now
        } else if let Some(orig) = self.inherited_pin(pid, &now) {
            orig // a thread or child a pinned thread started
        } else {
            self.spread.foreign.insert(tid, (pid, stat.start));
            tracing::debug!(pid, tid, cpus = ?now, "chose its own CPUs: left alone");
            return;
        };
        if !self.spread.pinned.values().any(|p| p.key.pid == pid) {
            // The first of its process: the threads it has with CPUs of their own stay
            // theirs (at the end, threads on one CPU of ours count as inherited).
            for t in self.kernel.threads_of(pid) {
                if t != tid && self.kernel.affinity(t).is_ok_and(|c| c != online) {
                    if let Ok(s) = self.kernel.task_stat(pid, t) {
                        self.spread.foreign.insert(t, (pid, s.start));
                    }
                }
            }
        }
        let key = TaskKey {
            pid,
            tid,
            start: stat.start,
        };
        if self
            .journal(Record::Pin {
                key,
                orig: orig.clone(),
            })
            .is_err()
        {
            return;
        }
        match self.kernel.set_affinity(tid, &[cpu]) {
            Ok(()) => {
                audit!(
                    self.trail,
                    Change::Pin,
                    pid,
                    tid,
                    comm = stat.comm.as_str(),
                    from = format!("cpus {}", cpu_list(&orig)),
                    to = format!("cpu {cpu}"),
                    why = "a busy thread of the idle group: spread over the CPUs"
                );
                self.spread.pinned.insert(
                    tid,
                    Pinned {
                        key,
                        orig,
                        cpu,
                        held: vec![cpu],
                    },
                );
            }
            Err(e) => {
                let _logged_by_journal = self.journal(Record::Unpin { key });
                if !sys::is_esrch(&e) {
                    self.counters.fail_errno(Some(&e));
                    tracing::warn!(pid, tid, error = %e, "could not pin a thread");
                }
            }
        }
    }

    /// A thread pinned already: moved to `cpu`, or given up if someone else set its CPUs
    /// since or it is gone.
    fn keep_pinned(&mut self, pid: u32, tid: u32, cpu: usize) {
        let Some(p) = self.spread.pinned.get(&tid) else {
            return;
        };
        let key = p.key;
        match self.kernel.affinity(tid) {
            Ok(now) if now == [p.cpu] && p.cpu == cpu => {}
            Ok(now) if now == [p.cpu] => match self.kernel.set_affinity(tid, &[cpu]) {
                Ok(()) => {
                    if let Some(p) = self.spread.pinned.get_mut(&tid) {
                        p.cpu = cpu;
                        if !p.held.contains(&cpu) {
                            p.held.push(cpu);
                        }
                    }
                }
                Err(e) => tracing::debug!(tid, error = %e, "could not move a pinned thread"),
            },
            Ok(_) => {
                // Someone else set its CPUs since: theirs from now on.
                self.spread.pinned.remove(&tid);
                self.spread.foreign.insert(tid, (pid, key.start));
                let _logged_by_journal = self.journal(Record::Unpin { key });
                tracing::info!(pid, tid, "its CPUs were set by someone else: left alone");
            }
            Err(_) => {
                // Gone: nothing of ours is left.
                self.spread.pinned.remove(&tid);
                let _logged_by_journal = self.journal(Record::Unpin { key });
            }
        }
    }

    /// The CPUs a thread on one CPU had before it inherited that CPU from a thread appease
    /// pinned: one of its own process's, or of its parent's, that held that CPU.
    fn inherited_pin(&self, pid: u32, now: &[usize]) -> Option<Vec<usize>> {
        let [cpu] = now else {
            return None;
        };
        let parent = self.kernel.ppid(pid);
        self.spread
            .pinned
            .values()
            .find(|p| p.held.contains(cpu) && (p.key.pid == pid || Some(p.key.pid) == parent))
            .map(|p| p.orig.clone())
    }

    /// Gives a pinned thread its CPUs back (and the threads and children it started
    /// since, which inherited its CPU).
    fn unpin(&mut self, tid: u32, why: &str, children: &mut Children<'_>) {
        let Some(p) = self.spread.pinned.remove(&tid) else {
            return;
        };
        let same = self
            .kernel
            .task_stat(p.key.pid, tid)
            .is_ok_and(|s| s.start == p.key.start);
        if same && self.kernel.affinity(tid).ok().as_deref() == Some(&[p.cpu][..]) {
            match self.kernel.set_affinity(tid, &p.orig) {
                Ok(()) => audit!(
                    self.trail,
                    Change::Unpin,
                    pid = p.key.pid,
                    tid,
                    from = format!("cpu {}", p.cpu),
                    to = format!("cpus {}", cpu_list(&p.orig)),
                    why
                ),
                Err(e) if sys::is_esrch(&e) => {}
                Err(e) => {
                    self.counters.fail_errno(Some(&e));
                    tracing::warn!(tid, error = %e, "could not give a pinned thread its CPUs back");
                }
            }
        }
        // A process that ended took its threads with it, and its children now have
        // another parent, which the look by parent cannot find: the look (every
        // process's stat, on the event loop: milliseconds beside a build whose compilers
        // end each second) is skipped. A leader younger than the pinned thread is
        // another process that got the pid.
        let process_lives = if tid == p.key.pid {
            same
        } else {
            self.kernel
                .task_stat(p.key.pid, p.key.pid)
                .is_ok_and(|s| s.start <= p.key.start)
        };
        if process_lives {
            let ours: HashSet<u32> = self
                .spread
                .pinned
                .keys()
                .chain(self.spread.foreign.keys())
                .copied()
                .collect();
            let kids = children.of(&*self.kernel, p.key.pid);
            put_back_inherited(&*self.kernel, p.key.pid, kids, &p.held, &p.orig, |t| {
                ours.contains(&t)
            });
        }
        let _logged_by_journal = self.journal(Record::Unpin { key: p.key });
    }

    /// Every pinned thread gets its CPUs back (the group is no longer idle, or appease
    /// stops). Returns how many were pinned.
    pub fn unspread(&mut self, why: &str) -> usize {
        self.unspread_knowing(why, Children::default())
    }

    /// As `unspread`, every process's parent known from a scan just made (`facts`).
    pub fn unspread_after_scan(
        &mut self,
        why: &str,
        facts: &HashMap<u32, crate::ProcFacts>,
    ) -> usize {
        self.unspread_knowing(why, Children::of_scan(facts))
    }

    fn unspread_knowing(&mut self, why: &str, mut children: Children<'_>) -> usize {
        let tids: Vec<u32> = self.spread.pinned.keys().copied().collect();
        for &tid in &tids {
            self.unpin(tid, why, &mut children);
        }
        tids.len()
    }

    /// Where each pinned thread is: tid -> index into `online`.
    pub fn pinned_at(&self, online: &[usize]) -> HashMap<u32, usize> {
        self.spread
            .pinned
            .iter()
            .filter_map(|(&tid, p)| Some((tid, online.iter().position(|&c| c == p.cpu)?)))
            .collect()
    }

    /// How many threads are pinned now.
    pub fn pinned(&self) -> usize {
        self.spread.pinned.len()
    }

    /// Daemon exit. Not counted in the report: a pinned thread is one appease demoted,
    /// counted there.
    pub(crate) fn restore_pins(&mut self) {
        self.unspread("appease stops");
    }
}

/// A CPU list as the kernel writes one ("0-3,8").
fn cpu_list(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if j > i {
            format!("{}-{}", cpus[i], cpus[j])
        } else {
            cpus[i].to_string()
        });
        i = j + 1;
    }
    out.join(",")
}

/// Every process's children, found once, when first asked: one look serves all the
/// unpins of a scan (a walk per unpin read every process's stat once per pinned thread,
/// on the event loop: with 500 processes and 8 unpins, 45 ms a scan). The parents come
/// from a scan's facts when one was just made, else from a walk of the process table.
#[derive(Default)]
struct Children<'a> {
    tree: Option<tree::Children>,
    scan: Option<&'a HashMap<u32, crate::ProcFacts>>,
}

impl<'a> Children<'a> {
    fn of_scan(facts: &'a HashMap<u32, crate::ProcFacts>) -> Self {
        Children {
            tree: None,
            scan: Some(facts),
        }
    }

    fn of(&mut self, k: &dyn Kernel, pid: u32) -> &[u32] {
        let scan = self.scan;
        self.tree
            .get_or_insert_with(|| match scan {
                Some(facts) => tree::Children::new(facts.iter().map(|(&p, f)| (p, f.ppid))),
                None => tree::Children::new(
                    k.processes()
                        .into_iter()
                        .filter_map(|c| Some((c, k.ppid(c)?))),
                ),
            })
            .of(pid)
    }
}

/// The threads of `pid` and of its `children` that sit alone on one of the CPUs its
/// pinned thread `held`, with no pin of their own and not known as someone else's
/// (`skip`): they inherited it from the pinned thread, and get `orig`.
fn put_back_inherited(
    k: &dyn Kernel,
    pid: u32,
    children: &[u32],
    held: &[usize],
    orig: &[usize],
    skip: impl Fn(u32) -> bool,
) {
    for &p in std::iter::once(&pid).chain(children) {
        for t in k.threads_of(p) {
            let inherited = matches!(k.affinity(t).as_deref(), Ok([c]) if held.contains(c));
            if !skip(t) && inherited {
                let _best_effort = k.set_affinity(t, orig);
            }
        }
    }
}

/// After a crash: every thread the journal says was pinned, and still sits on one CPU,
/// gets its CPUs back. Returns the records that close what was undone.
pub(crate) fn restore_journaled(c: &FromJournal, report: &mut RestoreReport) -> Vec<Record> {
    let (k, state) = (c.k, c.state);
    let mut done = Vec::new();
    let mut children = Children::default();
    for (key, orig) in &state.pinned {
        let same = k
            .task_stat(key.pid, key.tid)
            .is_ok_and(|s| s.start == key.start);
        match k.affinity(key.tid) {
            Ok(now) if same && now.len() == 1 => match k.set_affinity(key.tid, orig) {
                Ok(()) => {
                    report.restored += 1;
                    let kids = children.of(k, key.pid);
                    put_back_inherited(k, key.pid, kids, &now, orig, |t| {
                        state.pinned.keys().any(|k| k.tid == t)
                    });
                }
                Err(e) if sys::is_esrch(&e) => report.gone += 1,
                Err(e) => {
                    tracing::warn!(tid = key.tid, error = %e, "could not give a pinned thread its CPUs back");
                    report.failed += 1;
                    continue;
                }
            },
            Ok(_) if same => report.left_alone += 1,
            _ => report.gone += 1,
        }
        done.push(Record::Unpin { key: *key });
    }
    done
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_lists_read_as_the_kernel_writes_them() {
        assert_eq!(super::cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(super::cpu_list(&[1]), "1");
        assert_eq!(super::cpu_list(&[]), "");
    }
}
