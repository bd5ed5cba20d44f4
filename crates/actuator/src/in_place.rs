//! Batch demotion in place: a tree whose cgroup must not be left (a limit binds the
//! whole cgroup, a container, a cgroup tree systemd owns) keeps its cgroup and has each
//! of its threads put in SCHED_IDLE instead. The kernel then runs them only when
//! nothing else in their own cgroup wants the CPU; the cgroup as a whole keeps its
//! weight and its limits. Each thread is journaled before it changes, like every other
//! change. Children and threads born later inherit SCHED_IDLE: they have no record of
//! their own and go back to the original state of their nearest recorded ancestor.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::journal::{Record, TaskKey};
use crate::restore::FromJournal;
use crate::sys::{self, Kernel, Sched};
use crate::systemd::{self, UnitControl, WEIGHT_IDLE};
use crate::trail::{audit, Change};
use crate::{groups::MovedView, now_secs, ActError, KernelActuator, RestoreReport};

/// A thread appease put in SCHED_IDLE where it is.
pub(crate) struct Idled {
    pub key: TaskKey,
    pub orig: Sched,
    pub root: u32,
    pub group: String,
    pub reason: String,
    pub comm: String,
    pub why: String,
    pub since: u64,
    /// The idle branch that carries the thread's idle class meanwhile (`branch`): the
    /// thread is back in its own class, and journaled so, until the branch is given back.
    pub carried_by: Option<String>,
}

/// A systemd unit appease made idle (CPUWeight=idle), with what it puts back.
pub(crate) struct IdleUnit {
    pub orig: u64,
    /// What appease set: WEIGHT_IDLE, or a server's branch's raised weight.
    pub weight: u64,
    pub transient: bool,
    pub dropin: Option<String>,
    pub cgroup: String,
    pub root: u32,
    pub pids: Vec<u32>,
    pub why: String,
    pub since: u64,
}

/// A process of a demoted tree that stays in its cgroup, and why it may not leave it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct InPlace {
    pub pid: u32,
    pub group: String,
    pub reason: String,
}

#[cfg(test)]
impl InPlace {
    pub fn new(pid: u32, group: &str, reason: &str) -> InPlace {
        InPlace {
            pid,
            group: group.to_string(),
            reason: reason.to_string(),
        }
    }
}

/// The tree a demotion is for: its root, its processes, and why.
pub(crate) struct Demoting<'a> {
    pub root: u32,
    pub members: &'a [u32],
    pub why: &'a str,
}

/// Offers the processes of `procs` to `whole` group by group (`key` names a process's
/// group): the processes of a group it takes leave `procs`; returns how many it took.
pub(crate) fn take_whole(
    procs: &mut Vec<InPlace>,
    key: impl Fn(&InPlace) -> String,
    mut whole: impl FnMut(&str, &[u32]) -> bool,
) -> usize {
    let mut by_group: BTreeMap<String, Vec<InPlace>> = BTreeMap::new();
    for p in procs.drain(..) {
        by_group.entry(key(&p)).or_default().push(p);
    }
    let mut done = 0;
    for (group, members) in by_group {
        let pids: Vec<u32> = members.iter().map(|p| p.pid).collect();
        if whole(&group, &pids) {
            done += pids.len();
        } else {
            procs.extend(members);
        }
    }
    done
}

/// A CPUWeight as `systemctl show` says it.
pub(crate) fn weight_text(weight: u64) -> String {
    match weight {
        WEIGHT_IDLE => "CPUWeight=idle".into(),
        systemd::WEIGHT_UNSET => "CPUWeight unset".into(),
        w => format!("CPUWeight={w}"),
    }
}

pub(crate) fn process_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// What a thread of `pid` that is in SCHED_IDLE without a record of its own inherited
/// from appease: the original state of the nearest process up its ancestry (itself
/// first) that has a recorded thread, if any.
fn inherited(k: &dyn Kernel, pid: u32, orig_of: impl Fn(u32) -> Option<Sched>) -> Option<Sched> {
    let mut cur = pid;
    for _ in 0..64 {
        if let Some(o) = orig_of(cur) {
            return Some(o);
        }
        match k.ppid(cur) {
            Some(p) if p > 1 && p != cur => cur = p,
            _ => return None,
        }
    }
    None
}

/// The slice argument that gives back `orig`'s slice (0: the kernel's default).
fn slice_arg(orig: &Sched, base_slice_ns: u64) -> u64 {
    if orig.slice_ns == base_slice_ns {
        0
    } else {
        orig.slice_ns
    }
}

/// A scheduling policy as the audit trail says it.
fn policy_text(policy: u32) -> &'static str {
    match policy {
        sys::SCHED_NORMAL => "SCHED_OTHER",
        sys::SCHED_BATCH => "SCHED_BATCH",
        sys::SCHED_IDLE => "SCHED_IDLE",
        _ => "another policy",
    }
}

/// Puts a thread back from SCHED_IDLE to `orig`, if it is still in SCHED_IDLE (else
/// someone changed it since: left alone).
fn put_back(
    k: &dyn Kernel,
    pid: u32,
    tid: u32,
    orig: &Sched,
    base_slice_ns: u64,
    report: &mut RestoreReport,
) -> bool {
    match k.task_stat(pid, tid) {
        Err(_) => {
            report.gone += 1;
            return true;
        }
        Ok(s) if s.policy != sys::SCHED_IDLE => {
            tracing::info!(
                tid,
                policy = s.policy,
                "policy changed by someone else since; left alone"
            );
            report.left_alone += 1;
            return true;
        }
        Ok(_) => {}
    }
    let slice_ns = slice_arg(orig, base_slice_ns);
    match k.sched_set_policy(tid, Sched { slice_ns, ..*orig }) {
        Ok(()) => {
            report.restored += 1;
            true
        }
        Err(e) if sys::is_esrch(&e) => {
            report.gone += 1;
            true
        }
        Err(e) => {
            tracing::warn!(tid, error = %e, "could not take the thread out of SCHED_IDLE");
            report.failed += 1;
            false
        }
    }
}

/// Threads in SCHED_IDLE that hold no record but inherited it from a recorded ancestor
/// (`orig_of`), put back to that ancestor's original state. `only` limits the walk to
/// these processes (a tree's current members: one whose recorded ancestor has exited and
/// left it to PID 1 gets `fallback`, the tree's original); None walks every process.
pub(crate) fn put_back_inherited(
    k: &dyn Kernel,
    only: Option<&[u32]>,
    fallback: Option<Sched>,
    orig_of: impl Fn(u32) -> Option<Sched>,
    recorded: impl Fn(u32) -> bool,
    base_slice_ns: u64,
    report: &mut RestoreReport,
) {
    let all: Vec<u32>;
    let pids = match only {
        Some(p) => p,
        None => {
            all = k.processes();
            &all
        }
    };
    for &pid in pids {
        let threads: Vec<u32> = k
            .threads_of(pid)
            .into_iter()
            .filter(|&tid| !recorded(tid))
            .filter(|&tid| {
                k.task_stat(pid, tid)
                    .is_ok_and(|s| s.policy == sys::SCHED_IDLE)
            })
            .collect();
        if threads.is_empty() {
            continue;
        }
        let Some(orig) = inherited(k, pid, &orig_of).or(fallback) else {
            continue; // idle by someone else's choice
        };
        for tid in threads {
            put_back(k, pid, tid, &orig, base_slice_ns, report);
        }
    }
}

impl KernelActuator {
    /// The original state recorded for a thread of `pid` (its main thread's if recorded).
    fn idled_orig(&self, pid: u32) -> Option<Sched> {
        self.idled
            .get(&pid)
            .filter(|i| i.key.pid == pid)
            .or_else(|| self.idled.values().find(|i| i.key.pid == pid))
            .filter(|i| {
                self.kernel
                    .task_stat(pid, i.key.tid)
                    .is_ok_and(|s| s.start == i.key.start)
            })
            .map(|i| i.orig)
    }

    /// Puts every thread of each process in SCHED_IDLE where it is.
    /// Returns how many processes had a thread changed. Failures are counted and logged,
    /// never fatal: the tree is then simply less demoted.
    pub(crate) fn idle_in_place(&mut self, root: u32, procs: &[InPlace], why: &str) -> usize {
        let mut done = 0;
        for InPlace { pid, group, reason } in procs {
            let n = self.idle_process(root, *pid, group, reason, why);
            if n > 0 {
                done += 1;
                tracing::info!(
                    root,
                    pid,
                    threads = n,
                    group,
                    reason,
                    why,
                    dry_run = self.dry_run,
                    "demoted in place (SCHED_IDLE)"
                );
            }
        }
        done
    }

    pub(crate) fn idle_process(
        &mut self,
        root: u32,
        pid: u32,
        group: &str,
        reason: &str,
        why: &str,
    ) -> usize {
        if pid == self.self_pid {
            return 0;
        }
        let comm = self.kernel.comm(pid).unwrap_or_default();
        if self.exceptions.contains(&comm) {
            return 0;
        }
        let k = &*self.kernel;
        let inherited_orig = self.idled_orig(pid).or_else(|| {
            k.ppid(pid)
                .and_then(|pp| inherited(k, pp, |p| self.idled_orig(p)))
        });
        let mut n = 0;
        for tid in self.kernel.threads_of(pid) {
            let Ok(stat) = self.kernel.task_stat(pid, tid) else {
                continue;
            };
            if stat.kernel_thread
                || self
                    .idled
                    .get(&tid)
                    .is_some_and(|i| i.key.start == stat.start)
            {
                continue;
            }
            // An elevation still on the thread is undone first: one record per change.
            if self.managed.contains_key(&tid) {
                let _reported_by_restore = self.restore(tid, "demoted in place");
            }
            let Ok(now) = self.kernel.sched_getattr(tid) else {
                continue;
            };
            let orig = match now.policy {
                sys::SCHED_NORMAL | sys::SCHED_BATCH => now,
                // Born idle from a thread appease idled: put back as its parent would be.
                sys::SCHED_IDLE => match inherited_orig {
                    Some(o) => o,
                    None => continue, // idle by someone else's choice
                },
                _ => continue, // real-time or deadline: hands off
            };
            let key = TaskKey {
                pid,
                tid,
                start: stat.start,
            };
            if !self.dry_run && !self.set_idle_journaled(key, orig, now) {
                continue;
            }
            if now.policy != sys::SCHED_IDLE {
                audit!(
                    self.trail,
                    Change::Idle,
                    pid,
                    tid,
                    comm = stat.comm.as_str(),
                    tree = root,
                    from = policy_text(now.policy),
                    to = "SCHED_IDLE",
                    why,
                    dry_run = self.dry_run.then_some(true)
                );
            }
            self.idled.insert(
                tid,
                Idled {
                    key,
                    orig,
                    root,
                    group: group.to_string(),
                    reason: reason.to_string(),
                    comm: stat.comm.clone(),
                    why: why.to_string(),
                    since: now_secs(),
                    carried_by: None,
                },
            );
            n += 1;
        }
        n
    }

    /// Puts thread `key` in SCHED_IDLE, journaled first (one idle by inheritance is only
    /// journaled, so that status and a crash restore see it); false if it was not.
    fn set_idle_journaled(&mut self, key: TaskKey, orig: Sched, now: Sched) -> bool {
        let tid = key.tid;
        if now.policy == sys::SCHED_IDLE {
            return self.journal(Record::Idle { key, orig }).is_ok();
        }
        if self.journal(Record::Idle { key, orig }).is_err() {
            self.counters.fail("journal");
            tracing::warn!(tid, "journal write failed: thread not demoted");
            return false;
        }
        let idle = Sched {
            policy: sys::SCHED_IDLE,
            slice_ns: 0,
            ..now
        };
        let set = self.kernel.sched_set_policy(tid, idle);
        if let Err(e) = set {
            let _logged_by_journal = self.journal(Record::Unidle { key });
            if !sys::is_esrch(&e) {
                self.counters.fail_errno(Some(&e));
                tracing::warn!(tid, error = %e, "could not put the thread in SCHED_IDLE");
            }
            return false;
        }
        true
    }

    fn unidle(&mut self, tid: u32, why: &str, report: &mut RestoreReport) {
        let _record_dropped = self.put_back_idled(tid, why, report);
    }

    /// Takes thread `tid` out of SCHED_IDLE, back to its recorded original, audited and
    /// journaled. Returns its record once it is no longer idle by appease's doing (None:
    /// no record, or the change failed and the record stays).
    pub(crate) fn put_back_idled(
        &mut self,
        tid: u32,
        why: &str,
        report: &mut RestoreReport,
    ) -> Option<Idled> {
        let i = self.idled.remove(&tid)?;
        if i.carried_by.is_some() {
            // In its own class already, and journaled so, while its branch carried the class.
            self.left_alone.remove(&tid);
            return Some(i);
        }
        let same = self
            .kernel
            .task_stat(i.key.pid, tid)
            .is_ok_and(|s| s.start == i.key.start);
        let restored = report.restored;
        let done = if self.dry_run {
            true
        } else if same {
            put_back(
                &*self.kernel,
                i.key.pid,
                tid,
                &i.orig,
                self.base_slice_ns,
                report,
            )
        } else {
            report.gone += 1;
            true
        };
        if report.restored > restored || (self.dry_run && same) {
            audit!(
                self.trail,
                Change::Unidle,
                pid = i.key.pid,
                tid,
                comm = i.comm.as_str(),
                from = "SCHED_IDLE",
                to = policy_text(i.orig.policy),
                why,
                dry_run = self.dry_run.then_some(true)
            );
        }
        if done {
            // The thread may be elevated again from now on.
            self.left_alone.remove(&tid);
            let _logged_by_journal = self.journal(Record::Unidle { key: i.key });
            Some(i)
        } else {
            self.idled.insert(tid, i);
            None
        }
    }

    /// pid -> a record of a thread demoted in place in that process (its main thread's
    /// when it has one).
    pub(crate) fn records_by_process(&self) -> HashMap<u32, &Idled> {
        let mut by_pid: HashMap<u32, &Idled> = HashMap::new();
        for i in self.idled.values() {
            let e = by_pid.entry(i.key.pid).or_insert(i);
            if i.key.tid == i.key.pid {
                *e = i;
            }
        }
        by_pid
    }

    /// One process's threads out of SCHED_IDLE (the config now exempts it).
    pub(crate) fn unidle_process(&mut self, pid: u32) -> usize {
        let mut report = RestoreReport::default();
        let tids: Vec<u32> = self
            .idled
            .iter()
            .filter(|(_, i)| i.key.pid == pid)
            .map(|(&t, _)| t)
            .collect();
        for tid in tids {
            self.unidle(tid, "exempted by the config (hands_off)", &mut report);
        }
        report.restored as usize
    }

    /// A demoted tree is promoted: every thread of it that was idled in place goes back,
    /// and so do the threads of `members` that inherited SCHED_IDLE from it. Returns how
    /// many threads went back.
    pub(crate) fn unidle_tree(&mut self, root: u32, members: &[u32]) -> usize {
        let mut report = RestoreReport::default();
        let origs: HashMap<u32, Sched> = self
            .idled
            .values()
            .filter(|i| i.root == root)
            .map(|i| (i.key.pid, i.orig))
            .collect();
        if origs.is_empty() {
            return 0;
        }
        let tids: Vec<u32> = self
            .idled
            .iter()
            .filter(|(_, i)| i.root == root)
            .map(|(&t, _)| t)
            .collect();
        for tid in tids {
            self.unidle(tid, "promoted out of the idle class", &mut report);
        }
        if !self.dry_run {
            let idled = &self.idled;
            let fallback = origs.get(&root).or_else(|| origs.values().next()).copied();
            put_back_inherited(
                &*self.kernel,
                Some(members),
                fallback,
                |p| origs.get(&p).copied(),
                |t| idled.contains_key(&t),
                self.base_slice_ns,
                &mut report,
            );
        }
        report.restored as usize
    }

    /// Daemon exit: every thread idled in place goes back, with those born since.
    pub(crate) fn restore_in_place(&mut self, report: &mut RestoreReport) {
        if self.idled.is_empty() {
            return;
        }
        let origs: HashMap<u32, Sched> = self
            .idled
            .values()
            .filter(|i| {
                self.kernel
                    .task_stat(i.key.pid, i.key.tid)
                    .is_ok_and(|s| s.start == i.key.start)
            })
            .map(|i| (i.key.pid, i.orig))
            .collect();
        let tids: Vec<u32> = self.idled.keys().copied().collect();
        for tid in tids {
            self.unidle(tid, "appease stops", report);
        }
        if !self.dry_run {
            let idled = &self.idled;
            put_back_inherited(
                &*self.kernel,
                None,
                None,
                |p| origs.get(&p).copied(),
                |t| idled.contains_key(&t),
                self.base_slice_ns,
                report,
            );
        }
    }

    /// On a systemd host: each cgroup of `procs` that is a unit's own and holds nothing
    /// but processes of this tree (`members`) makes that unit idle through systemd.
    /// Returns how many processes were demoted so, and the processes left for `idle_in_place`.
    pub(crate) fn idle_whole_units(&mut self, tree: &Demoting, procs: &mut Vec<InPlace>) -> usize {
        let members: HashSet<u32> = tree.members.iter().copied().collect();
        self.with_units(0, |a, units| {
            take_whole(
                procs,
                |p| p.group.clone(),
                |cgroup, pids| a.idle_unit(units, tree.root, cgroup, pids, &members, tree.why),
            )
        })
    }

    fn idle_unit(
        &mut self,
        units: &dyn UnitControl,
        root: u32,
        cgroup: &str,
        pids: &[u32],
        tree: &HashSet<u32>,
        why: &str,
    ) -> bool {
        let Some(g) = self.groups.as_ref() else {
            return false;
        };
        let Ok(all) = g.cgroups().processes_below(cgroup) else {
            return false;
        };
        if !all.iter().all(|p| tree.contains(p)) {
            return false; // the unit holds other work too: per thread
        }
        let (unit, transient) = match units.unit_of(pids[0]) {
            Ok(u) if u.cgroup == cgroup => (u.id, u.transient),
            Ok(_) => return false, // a sub-cgroup of a unit (delegated): per thread
            Err(e) => {
                tracing::debug!(pid = pids[0], error = %e, "no unit for the process");
                return false;
            }
        };
        if self.idle_units.get(&unit).is_some_and(|u| u.root == 0) {
            // Set for a branch rule (its own value journaled): the tree stays per thread.
            return false;
        }
        if let Some(u) = self.idle_units.get_mut(&unit) {
            // Already idle, for a tree that has ended or re-rooted: it is this tree's now,
            // so that this tree's promotion gives the unit back.
            u.root = root;
            u.pids = pids.to_vec();
            return true;
        }
        let orig = match units.cpu_weight(&unit) {
            // Idle already, by someone else's choice (or left so by an earlier daemon whose
            // restore failed): not ours to record as the original.
            Ok(WEIGHT_IDLE) => return false,
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(unit, error = %e, "could not read the unit's CPUWeight");
                return false;
            }
        };
        let dropin = systemd::read_dropin(&unit, transient);
        if !self.dry_run {
            let was = (orig, transient, dropin.clone());
            match self.set_unit_journaled(units, &unit, was, WEIGHT_IDLE) {
                Ok(()) => {}
                Err(ActError::Unit(e)) => {
                    tracing::warn!(unit, error = %e, "systemd refused CPUWeight=idle");
                    return false;
                }
                Err(_) => {
                    self.counters.fail("journal");
                    return false;
                }
            }
        }
        audit!(
            self.trail,
            Change::Unit,
            tree = root,
            unit,
            cgroup,
            from = weight_text(orig),
            to = "CPUWeight=idle",
            why,
            dry_run = self.dry_run.then_some(true)
        );
        self.idle_units.insert(
            unit,
            IdleUnit {
                orig,
                weight: WEIGHT_IDLE,
                transient,
                dropin,
                cgroup: cgroup.to_string(),
                root,
                pids: pids.to_vec(),
                why: why.to_string(),
                since: now_secs(),
            },
        );
        true
    }

    /// Units made idle for the tree `root` get their CPUWeight back. Returns how many.
    pub(crate) fn unidle_units_of(&mut self, root: u32) -> usize {
        let units: Vec<String> = crate::keys_where(&self.idle_units, |u| u.root == root);
        let mut report = RestoreReport::default();
        for unit in &units {
            self.unidle_unit(unit, "promoted out of the idle class", &mut report);
        }
        (report.restored + report.gone) as usize
    }

    /// What was demoted in place for trees that have ended goes back: a unit none of whose
    /// recorded processes is alive gets its CPUWeight back (a restarted service or the
    /// next run of a timer job must not start idle), and records of exited threads are
    /// closed. Called on every scan; the classifier sends no promotion for a tree that
    /// ended.
    pub fn release_ended_in_place(&mut self) {
        // A unit set for a branch (no tree of its own, no pids) goes back by its rule.
        let ended: Vec<String> = crate::keys_where(&self.idle_units, |u| {
            !u.pids.is_empty() && !u.pids.iter().any(|&p| process_alive(p))
        });
        let mut report = RestoreReport::default();
        for unit in ended {
            self.unidle_unit(&unit, "the demoted tree ended", &mut report);
        }
        let gone: Vec<u32> = self
            .idled
            .iter()
            .filter(|(&tid, i)| {
                self.kernel
                    .task_stat(i.key.pid, tid)
                    .map_or(true, |s| s.start != i.key.start)
            })
            .map(|(&t, _)| t)
            .collect();
        for tid in gone {
            if let Some(i) = self.idled.remove(&tid).filter(|i| i.carried_by.is_none()) {
                let _logged_by_journal = self.journal(Record::Unidle { key: i.key });
            }
        }
        self.release_ended_groups();
    }

    /// Daemon exit: every unit made idle gets its CPUWeight back.
    pub(crate) fn restore_units(&mut self, report: &mut RestoreReport) {
        let units: Vec<String> = crate::keys_where(&self.idle_units, |_| true);
        for unit in units {
            self.unidle_unit(&unit, "appease stops", report);
        }
    }

    /// Processes demoted in place, one line each, for `appease status`.
    pub(crate) fn idled_views(&self) -> Vec<MovedView> {
        self.records_by_process()
            .into_iter()
            .map(|(pid, i)| MovedView {
                pid,
                comm: i.comm.clone(),
                class: "batch".into(),
                group: i.group.clone(),
                original_group: i.group.clone(),
                tree: i.root,
                why: i.why.clone(),
                since: i.since,
                placement: match &i.carried_by {
                    None => format!("in place: {}", i.reason),
                    Some(b) => format!(
                        "in place: {}; its branch {b} idle carries the class (threads in their own)",
                        i.reason
                    ),
                },
            })
            .chain(self.idle_units.iter().flat_map(|(unit, u)| {
                u.pids.iter().map(move |&pid| MovedView {
                    pid,
                    comm: std::fs::read_to_string(format!("/proc/{pid}/comm"))
                        .map(|c| c.trim_end().to_string())
                        .unwrap_or_default(),
                    class: "batch".into(),
                    group: u.cgroup.clone(),
                    original_group: u.cgroup.clone(),
                    tree: u.root,
                    why: u.why.clone(),
                    since: u.since,
                    placement: format!(
                        "in place: unit {unit} idle (CPUWeight=idle through systemd)"
                    ),
                })
            }))
            .collect()
    }
}

/// After a crash: every thread the journal says was idled in place, and those that
/// inherited it since, back to their original state. Returns the records that close
/// what was undone.
pub(crate) fn restore_journaled(c: &FromJournal, report: &mut RestoreReport) -> Vec<Record> {
    let (k, state, base_slice_ns) = (c.k, c.state, c.base_slice_ns);
    let mut done = Vec::new();
    if state.idled.is_empty() {
        return done;
    }
    let alive = |t: &TaskKey| k.task_stat(t.pid, t.tid).is_ok_and(|s| s.start == t.start);
    let origs: HashMap<u32, Sched> = state
        .idled
        .iter()
        .filter(|(k, _)| alive(k))
        .map(|(k, o)| (k.pid, *o))
        .collect();
    for (key, orig) in &state.idled {
        let ok = if alive(key) {
            put_back(k, key.pid, key.tid, orig, base_slice_ns, report)
        } else {
            report.gone += 1;
            true
        };
        if ok {
            done.push(Record::Unidle { key: *key });
        }
    }
    put_back_inherited(
        k,
        None,
        None,
        |p| origs.get(&p).copied(),
        |t| state.idled.keys().any(|k| k.tid == t),
        base_slice_ns,
        report,
    );
    done
}

#[cfg(test)]
mod tests;
