//! The batch's branch made idle where it meets the servers' branch.
//!
//! The kernel chooses between two tasks at the level of the cgroup tree where their
//! branches meet: a server in `system.slice/redis.service` and a build in
//! `user.slice/user-0.slice/session-1.scope` meet at the root, as `system.slice` against
//! `user.slice`. What is done inside the build's scope (its threads in `SCHED_IDLE`, the
//! scope itself idle) acts only among the scope's or the user's own tasks: at the root,
//! `user.slice` still competes at full weight (measured: per-thread `SCHED_IDLE` in the
//! scope left the server slower than doing nothing). So while a tree demoted in place runs
//! beside servers outside its branch, the highest group of its branch that holds no
//! server is made idle, as long as everything busy in it is demoted batch; it is given
//! back at the first exec or busy process of anything else there (someone typing in a
//! shell of the same session), when the servers stop serving, and when the batch ends.
//! Nothing moves: the branch's limits bind as before.
//!
//! While the branch is idle it carries the class: the batch's threads below it go back to
//! their own class (measured: the build's threads also in `SCHED_IDLE` under the idle
//! branch left the server's p99 at 6.51 ms against 5.53 with the branch alone), and
//! return to `SCHED_IDLE` when the branch is given back. The batch below an idle branch is
//! then known by its ancestry: a process is batch when it, or a process above it, holds a
//! record of a thread demoted in place.

use std::collections::{BTreeSet, HashMap};

use appease_cgroup::Cgroups;

use crate::group_idle::is_below;
use crate::in_place::{put_back_inherited, Idled};
use crate::sys;
use crate::systemd::WEIGHT_IDLE;
use crate::{KernelActuator, RestoreReport};

/// Why a branch is idle.
pub(crate) const ONLY_BATCH_BUSY: &str =
    "everything busy in it is demoted batch, beside servers outside it";

/// CPU over one scan above which a process counts as busy, ns.
const BUSY_NS: u64 = 50_000_000;
/// A process first seen is judged by its CPU over its life once it has lived this long, ns
/// (younger ones are busy until a scan has measured them) ...
const SETTLED_NS: u64 = 2_000_000_000;
/// ... and is busy from 1/LIFE_SHARE_DEN of a CPU on average (BUSY_NS over a 1 s scan).
const LIFE_SHARE_DEN: u64 = 20;

/// A process as a scan read it: what the branch rule needs to tell batch from other work.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcFacts {
    pub ppid: u32,
    /// Start time, clock ticks after boot: with the pid, the process's identity.
    pub start: u64,
    /// CPU time of the process and of its reaped children, ns.
    pub cpu_ns: u64,
    /// Its main thread is of the `SCHED_IDLE` policy.
    pub sched_idle: bool,
    /// How long it has lived, ns (0: not known).
    pub age_ns: u64,
    /// Its cgroups by id (0: not known): a server's group is read once per group.
    pub cgroup_ids: appease_cgroup::CgroupIds,
}

impl ProcFacts {
    /// Read from /proc: for a process the last scan did not see.
    fn read(pid: u32) -> Option<Self> {
        let s = appease_cgroup::read_stat(format!("/proc/{pid}/stat"))?;
        Some(ProcFacts {
            ppid: s.ppid,
            start: s.start,
            cpu_ns: s.cpu_ticks * appease_cgroup::clock_tick_ns(),
            sched_idle: s.policy == libc::SCHED_IDLE as u32,
            age_ns: 0,
            cgroup_ids: Default::default(),
        })
    }

    /// Whether a process the rule has not measured yet counts as busy: by its CPU over its
    /// life once it has lived a few scans, so that a sleeping shell beside the batch does
    /// not hold the branch back for the scan that demotes the batch (its threads would sit
    /// in `SCHED_IDLE` inside the branch meanwhile, worse for the server than no change);
    /// always while young, or of unknown age.
    fn busy_at_first_sight(&self) -> bool {
        self.age_ns < SETTLED_NS || self.cpu_ns.saturating_mul(LIFE_SHARE_DEN) >= self.age_ns
    }
}

/// What the branch rule remembers between scans.
#[derive(Default)]
pub(crate) struct Branches {
    /// pid -> (start, CPU ns at the last scan), for the processes in watched branches.
    cpu: HashMap<u32, (u64, u64)>,
    /// pid -> the idle branch it was in at the last scan (not the batch's own processes).
    members: HashMap<u32, String>,
    /// Cgroup paths by kernfs id, read once per group (an id is never another group's):
    /// hundreds of a server's connections each asked their group at every scan.
    paths: HashMap<u64, String>,
}

/// Group paths remembered at most (a host's groups; past it, read afresh).
const PATHS_MAX: usize = 4096;

/// The groups from the top of `group`'s path down to it: `/a`, `/a/b`, `/a/b/c`.
fn ancestry(group: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut path = String::new();
    for part in group.split('/').filter(|p| !p.is_empty()) {
        path.push('/');
        path.push_str(part);
        out.push(path.clone());
    }
    out
}

/// The highest group on `batch`'s path that holds none of `servers` nor `own` (appease's
/// own group): where the batch's branch meets theirs. None when the batch shares its very
/// group with a server (the batch would have to be isolated first) or sits at the root.
pub(crate) fn branch_of(batch: &str, servers: &BTreeSet<String>, own: &str) -> Option<String> {
    ancestry(batch)
        .into_iter()
        .find(|a| !is_below(own, a) && !servers.iter().any(|s| is_below(s, a)))
}

impl KernelActuator {
    /// Makes idle, keeps or gives back the branches of the trees demoted in place, given
    /// the processes that served requests lately (`servers`: pid and start; empty when the
    /// idle class is not in force) and every process as the scan read it (`facts`; one it
    /// did not see is read from /proc). Called on every scan. Returns how many branches
    /// changed.
    pub fn sync_idle_branches(
        &mut self,
        servers: &[(u32, u64)],
        facts: &HashMap<u32, ProcFacts>,
    ) -> usize {
        // On a systemd host the branch is a unit, set through the bus (`unit_weight`).
        let Some(cg) = self.groups.as_ref().map(|g| g.cgroups().clone()) else {
            return 0;
        };
        self.forget_vanished_idle_groups();
        let (server_groups, batch) = self.server_and_batch_groups(&cg, servers, facts);
        // appease's own group, read once a scan (only when something serves).
        let own = if server_groups.is_empty() {
            "/".to_string()
        } else {
            cg.group_of(self.self_pid).unwrap_or_else(|_| "/".into())
        };
        let wanted = self.wanted_branches(&cg, &server_groups, &batch, &own);
        let mut changed = 0;
        let mut seen = HashMap::new();
        let mut members = HashMap::new();
        for branch in &wanted {
            let ours = self.is_our_branch(branch);
            if self.only_batch_busy(&cg, branch, facts, &mut seen, &mut members) {
                let made = if self.via_units() {
                    self.set_branch_unit(branch, WEIGHT_IDLE, ONLY_BATCH_BUSY)
                } else {
                    self.idle_group_in_place(branch, None, &[], ONLY_BATCH_BUSY)
                };
                match made {
                    Ok(true) => changed += 1,
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(branch, error = %e, "could not make the batch's branch idle")
                    }
                }
                if self.is_our_branch(branch) {
                    self.carry_class(branch, &|| cg.processes_below(branch).unwrap_or_default());
                }
            } else if ours {
                self.unidle_branch(branch, "something else is busy in the batch's branch");
                changed += 1;
            }
        }
        for branch in self.our_branches() {
            if !wanted.contains(&branch) {
                let why = if servers.is_empty() {
                    "no server serves beside the batch"
                } else {
                    "no tree demoted in place below it"
                };
                self.unidle_branch(&branch, why);
                changed += 1;
            }
        }
        members.retain(|_, b: &mut String| self.is_our_branch(b));
        self.branches = Branches {
            cpu: seen,
            members,
            paths: std::mem::take(&mut self.branches.paths),
        };
        // Where the batch's branch could not be made idle, the servers' is weighted up.
        changed + self.sync_server_weights(&cg, &server_groups, &batch, &own)
    }

    /// The group of `pid`, whose cgroup the scan found by kernfs `id` (0: not known):
    /// remembered for the id, read from /proc the first time. Kept only if the directory
    /// is that id's (its inode): a process moved since the scan is not taken for its group.
    fn group_by_id(&mut self, cg: &Cgroups, pid: u32, id: u64) -> Option<String> {
        if let Some(path) = self.branches.paths.get(&id) {
            return Some(path.clone());
        }
        let path = cg.group_of(pid).ok()?;
        if id != 0 && cg.group_id(&path) == Some(id) {
            if self.branches.paths.len() >= PATHS_MAX {
                self.branches.paths.clear();
            }
            self.branches.paths.insert(id, path.clone());
        }
        Some(path)
    }

    /// The groups of the processes that served lately (still the same processes, as the
    /// scan's `facts` saw them, or /proc for one it did not), and of the trees demoted in
    /// place: per thread, or made idle as a whole. No batch groups when no server serves.
    fn server_and_batch_groups(
        &mut self,
        cg: &Cgroups,
        servers: &[(u32, u64)],
        facts: &HashMap<u32, ProcFacts>,
    ) -> (BTreeSet<String>, BTreeSet<String>) {
        let bus = self
            .groups
            .as_ref()
            .and_then(|g| g.units.as_deref())
            .and_then(|u| u.bus_daemon_pid());
        let server_groups: BTreeSet<String> = servers
            .iter()
            // The init process answering systemctl and the bus daemon passing appease's own
            // calls on: not what these rules serve (nor a reason to change them again).
            .filter(|&&(pid, _)| pid != 1 && Some(pid) != bus)
            .filter_map(|&(pid, start)| match facts.get(&pid) {
                Some(f) if f.start == start => {
                    self.group_by_id(cg, pid, f.cgroup_ids.of(cg.version()))
                }
                Some(_) => None,
                None => crate::sys::task_stat(pid, pid)
                    .is_ok_and(|s| s.start == start)
                    .then(|| cg.group_of(pid).ok())
                    .flatten(),
            })
            .collect();
        if server_groups.is_empty() {
            return (server_groups, BTreeSet::new());
        }
        let batch = self
            .idled
            .values()
            .map(|i| i.group.clone())
            .chain(
                self.idle_groups
                    .iter()
                    .filter(|(_, g)| g.root.is_some())
                    .map(|(p, _)| p.clone()),
            )
            .chain(
                self.idle_units
                    .values()
                    .filter(|u| u.root != 0)
                    .map(|u| u.cgroup.clone()),
            )
            .collect();
        (server_groups, batch)
    }

    /// The branches the trees demoted in place (in `batch`) would have made idle now,
    /// beside the servers in `server_groups`.
    fn wanted_branches(
        &self,
        cg: &Cgroups,
        server_groups: &BTreeSet<String>,
        batch: &BTreeSet<String>,
        own: &str,
    ) -> BTreeSet<String> {
        if server_groups.is_empty() {
            return BTreeSet::new();
        }
        batch
            .iter()
            .filter_map(|b| branch_of(b, server_groups, own).map(|br| (b, br)))
            // A group made idle for the tree as a whole is its own branch already.
            .filter(|(b, br)| !(br == *b && self.in_a_group_made_idle_for_a_tree(br)))
            .map(|(_, br)| br)
            .filter(|br| self.is_our_branch(br) || !self.group_reads_idle(cg, br))
            .collect()
    }

    fn is_our_branch(&self, group: &str) -> bool {
        self.idle_groups
            .get(group)
            .is_some_and(|g| g.why == ONLY_BATCH_BUSY)
            || self.branch_unit_at(group, ONLY_BATCH_BUSY).is_some()
    }

    /// The branches made idle by this rule: groups, or units under systemd.
    fn our_branches(&self) -> Vec<String> {
        let mut out = crate::keys_where(&self.idle_groups, |g| g.why == ONLY_BATCH_BUSY);
        out.extend(self.branch_units(ONLY_BATCH_BUSY));
        out
    }

    /// Whether every process below `branch` is demoted batch (in `SCHED_IDLE`, descended
    /// from a process demoted in place, or in a group made idle for a tree) or used less
    /// than `BUSY_NS` since the last scan; one seen for the first time, by its life
    /// (`ProcFacts::busy_at_first_sight`). Records the CPU of what it read in `seen`, and
    /// the processes that are not batch in `members`.
    fn only_batch_busy(
        &self,
        cg: &Cgroups,
        branch: &str,
        facts: &HashMap<u32, ProcFacts>,
        seen: &mut HashMap<u32, (u64, u64)>,
        members: &mut HashMap<u32, String>,
    ) -> bool {
        let Ok(pids) = cg.processes_below(branch) else {
            return false;
        };
        let mut only_batch = !pids.is_empty();
        // The scan's reading; /proc only for what it did not see (started since).
        let below: HashMap<u32, ProcFacts> = pids
            .into_iter()
            .filter_map(|pid| {
                Some((
                    pid,
                    facts.get(&pid).copied().or_else(|| ProcFacts::read(pid))?,
                ))
            })
            .collect();
        let recorded = self.records_by_process();
        let ppid_of = |p: u32| {
            below
                .get(&p)
                .or_else(|| facts.get(&p))
                .map(|f| f.ppid)
                .or_else(|| self.kernel.ppid(p))
        };
        let mut memo = HashMap::new();
        for (&pid, f) in &below {
            seen.insert(pid, (f.start, f.cpu_ns));
            let in_tree_group = || {
                cg.group_of(pid)
                    .is_ok_and(|g| self.in_a_group_made_idle_for_a_tree(&g))
            };
            if f.sched_idle
                || self
                    .batch_ancestor(pid, &recorded, &ppid_of, &mut memo)
                    .is_some()
                || in_tree_group()
            {
                continue;
            }
            members.insert(pid, branch.to_string());
            let busy = match self.branches.cpu.get(&pid) {
                Some(&(start, cpu)) if start == f.start => f.cpu_ns.saturating_sub(cpu) >= BUSY_NS,
                _ => f.busy_at_first_sight(),
            };
            if busy {
                tracing::debug!(pid, branch, "busy beside the batch in its branch");
                only_batch = false;
            }
        }
        only_batch
    }

    /// A process exec'd below an idle branch of ours, outside the batch: the branch goes
    /// back now, not at the next scan (a command typed in the session's shell).
    pub(crate) fn on_exec_in_branches(&mut self, pid: u32) {
        let branches = self.our_branches();
        if branches.is_empty() {
            return;
        }
        let Some(cg) = self.groups.as_ref().map(|g| g.cgroups().clone()) else {
            return;
        };
        let Ok(group) = cg.group_of(pid) else {
            return;
        };
        // SAFETY: sched_getscheduler only reads.
        let batch = unsafe { libc::sched_getscheduler(pid as i32) } == libc::SCHED_IDLE
            || self
                .batch_ancestor(
                    pid,
                    &self.records_by_process(),
                    &|p| self.kernel.ppid(p),
                    &mut HashMap::new(),
                )
                .is_some()
            || self.in_a_group_made_idle_for_a_tree(&group);
        if batch {
            return;
        }
        for b in branches.iter().filter(|b| is_below(&group, b)) {
            self.unidle_branch(b, "a program started in the batch's branch");
        }
    }

    /// A process of an idle branch that is not batch received a request: a server there
    /// the last scans did not know of. The branch goes back now.
    pub fn on_request_in_branches(&mut self, pid: u32) {
        if let Some(branch) = self.branches.members.remove(&pid) {
            if self.is_our_branch(&branch) {
                self.unidle_branch(
                    &branch,
                    "a process in the batch's branch received a request",
                );
            }
        }
    }

    fn unidle_branch(&mut self, branch: &str, why: &str) {
        let carries = self
            .idled
            .values()
            .any(|i| i.carried_by.as_deref() == Some(branch));
        if let Some(cg) = self.groups.as_ref().map(|g| g.cgroups().clone()) {
            if carries {
                let below: Vec<(u32, String)> = cg
                    .processes_below(branch)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|p| Some((p, cg.group_of(p).ok()?)))
                    .collect();
                self.uncarry_class(branch, &below);
            }
        }
        if !self.unset_branch_unit(branch, ONLY_BATCH_BUSY, why) {
            self.unidle_group(branch, why, &mut RestoreReport::default());
        }
        // Logged once done: a reader of the log (the e2e tests) sees the threads back.
        tracing::info!(branch, why, "the batch's branch given back");
    }

    /// The record of `pid`'s own demotion, or of its nearest demoted ancestor's: a
    /// compiler a carried build started since is batch by its parent. `ppid_of` gives a
    /// process's parent (from stats read already, or /proc); `memo` keeps the answer for
    /// every process the walk passed (siblings share their parents).
    fn batch_ancestor<'a>(
        &self,
        pid: u32,
        recorded: &HashMap<u32, &'a Idled>,
        ppid_of: &dyn Fn(u32) -> Option<u32>,
        memo: &mut HashMap<u32, Option<u32>>,
    ) -> Option<&'a Idled> {
        let mut chain = Vec::new();
        let mut cur = pid;
        let found = loop {
            if recorded.contains_key(&cur) {
                break Some(cur);
            }
            if let Some(&known) = memo.get(&cur) {
                break known;
            }
            chain.push(cur);
            match ppid_of(cur) {
                Some(p) if p > 1 && p != cur && chain.len() < 64 => cur = p,
                _ => break None,
            }
        };
        for c in chain {
            memo.insert(c, found);
        }
        found.and_then(|r| recorded.get(&r).copied())
    }

    /// `branch` is idle: the threads demoted in place below it go back to their own class,
    /// journaled so and recorded as carried, and so do the threads of the processes below
    /// the branch (`below`, read only when there is something to carry) that inherited
    /// `SCHED_IDLE` from them.
    fn carry_class(&mut self, branch: &str, below: &dyn Fn() -> Vec<u32>) {
        let tids: Vec<u32> = self
            .idled
            .iter()
            .filter(|(_, i)| i.carried_by.is_none() && is_below(&i.group, branch))
            .map(|(&t, _)| t)
            .collect();
        if tids.is_empty() {
            return;
        }
        let mut report = RestoreReport::default();
        let why = format!("the idle branch {branch} carries the class");
        for &tid in &tids {
            if let Some(mut i) = self.put_back_idled(tid, &why, &mut report) {
                i.carried_by = Some(branch.to_string());
                self.idled.insert(tid, i);
            }
        }
        if !self.dry_run {
            let origs: HashMap<u32, sys::Sched> =
                self.idled.values().map(|i| (i.key.pid, i.orig)).collect();
            let idled = &self.idled;
            put_back_inherited(
                &*self.kernel,
                Some(&below()),
                None,
                |p| origs.get(&p).copied(),
                |t| idled.contains_key(&t),
                self.base_slice_ns,
                &mut report,
            );
        }
        tracing::info!(
            branch,
            threads = tids.len(),
            inherited = report.restored.saturating_sub(tids.len() as u32),
            "the idle branch carries the batch's class: its threads back in their own"
        );
    }

    /// `branch` is given back: the processes of `below` (pid and cgroup, below the branch)
    /// that it carried, and those their trees started since, are demoted in place again
    /// (`idle_process`: each thread's state now recorded, then SCHED_IDLE).
    fn uncarry_class(&mut self, branch: &str, below: &[(u32, String)]) {
        let carried: Vec<u32> = self
            .idled
            .iter()
            .filter(|(_, i)| i.carried_by.as_deref() == Some(branch))
            .map(|(&t, _)| t)
            .collect();
        if carried.is_empty() {
            return;
        }
        let recorded = self.records_by_process();
        let mut memo = HashMap::new();
        let procs: Vec<(u32, String, u32, String, String)> = below
            .iter()
            .filter_map(|(p, group)| {
                let i = self.batch_ancestor(*p, &recorded, &|p| self.kernel.ppid(p), &mut memo)?;
                (i.carried_by.as_deref() == Some(branch))
                    .then(|| (*p, group.clone(), i.root, i.reason.clone(), i.why.clone()))
            })
            .collect();
        // Journaled back to their own class when carried: nothing to close.
        for tid in carried {
            self.idled.remove(&tid);
        }
        for (pid, group, root, reason, why) in procs {
            self.idle_process(root, pid, &group, &reason, &why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(groups: &[&str]) -> BTreeSet<String> {
        groups.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_branch_is_the_highest_group_on_the_batchs_path_that_holds_no_server() {
        let scope = "/user.slice/user-0.slice/session-1.scope";
        let redis = set(&["/system.slice/redis.service"]);
        assert_eq!(
            branch_of(scope, &redis, "/").as_deref(),
            Some("/user.slice")
        );
        // A server in the same user's slice: they meet lower down.
        let beside = set(&["/user.slice/user-0.slice/user@0.service/app.service"]);
        assert_eq!(
            branch_of(scope, &beside, "/").as_deref(),
            Some("/user.slice/user-0.slice/session-1.scope")
        );
        let other_user = set(&["/user.slice/user-1000.slice/session-2.scope"]);
        assert_eq!(
            branch_of(scope, &other_user, "/").as_deref(),
            Some("/user.slice/user-0.slice")
        );
    }

    #[test]
    fn no_branch_when_a_server_shares_the_batchs_group_or_appease_lives_in_it() {
        let unit = "/system.slice/ci-runner.service";
        assert_eq!(branch_of(unit, &set(&[unit]), "/"), None);
        assert_eq!(
            branch_of("/", &set(&["/system.slice/x.service"]), "/"),
            None
        );
        // appease's own group is never made idle.
        assert_eq!(
            branch_of(
                "/system.slice/backup.service",
                &set(&["/user.slice"]),
                "/system.slice/appease.service"
            )
            .as_deref(),
            Some("/system.slice/backup.service")
        );
    }

    use crate::sys::{Sched, SCHED_IDLE, SCHED_NORMAL};
    use crate::testing::{fair, journaled_actuator, FakeKernel, TempDir};

    const SCOPE: &str = "/user.slice/user-0.slice/session-1.scope";

    fn policy(k: &FakeKernel, tid: u32) -> u32 {
        k.sched(tid).policy
    }

    /// A build demoted in place in a session scope: make (two threads) and a compiler born
    /// idle from it.
    fn demoted_build(k: &FakeKernel, dir: &TempDir) -> KernelActuator {
        k.spawn(300, 300, "make", fair(2));
        k.spawn(300, 301, "make", fair(2));
        let mut a = journaled_actuator(k, dir, &[]);
        let procs = [crate::in_place::InPlace::new(300, SCOPE, "a limit binds")];
        assert_eq!(a.idle_in_place(300, &procs, "cpu-bound"), 1);
        let born_idle = Sched {
            policy: SCHED_IDLE,
            ..fair(2)
        };
        k.spawn_child(300, 310, 310, "cc1", born_idle);
        a
    }

    #[test]
    fn an_idle_branch_carries_the_class_and_gives_it_back_to_the_tree_and_what_it_started() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("carry"));
        let mut a = demoted_build(&k, &dir);
        a.carry_class("/user.slice", &|| vec![300, 310]);
        for tid in [300, 301, 310] {
            assert_eq!(k.sched(tid), fair(2), "tid {tid} in its own class");
        }
        let pending = crate::journal::read_pending(&dir.0).unwrap();
        assert!(pending.idled.is_empty(), "journaled back: {pending:?}");
        assert!(a.idled.values().all(|i| i.carried_by.is_some()));
        // Known as batch by its ancestry now: the compiler and one started since.
        k.spawn_child(310, 320, 320, "as", fair(2));
        let recorded = a.records_by_process();
        let ppid = |p| crate::sys::Kernel::ppid(&k, p);
        let mut memo = HashMap::new();
        let root = |pid, memo: &mut _| {
            a.batch_ancestor(pid, &recorded, &ppid, memo)
                .map(|i| i.root)
        };
        assert_eq!(root(320, &mut memo), Some(300));
        assert_eq!(memo.get(&310), Some(&Some(300)), "its parent's answer kept");
        k.spawn(400, 400, "bash", fair(0));
        assert_eq!(root(400, &mut memo), None);
        drop(recorded);

        // Given back: the carried threads and everything the tree started since go back
        // to SCHED_IDLE, journaled first; the shell stays as it is.
        let below: Vec<(u32, String)> = [300, 310, 320, 400]
            .iter()
            .map(|&p| (p, SCOPE.to_string()))
            .collect();
        a.uncarry_class("/user.slice", &below);
        for tid in [300, 301, 310, 320] {
            assert_eq!(policy(&k, tid), SCHED_IDLE, "tid {tid}");
        }
        assert_eq!(policy(&k, 400), SCHED_NORMAL);
        assert_eq!(k.unjournaled(), Vec::<String>::new());
        // And at exit, all back to where they were.
        a.restore_all();
        for tid in [300, 301, 310, 320] {
            assert_eq!(k.sched(tid), fair(2), "tid {tid}");
        }
        assert!(crate::journal::read_pending(&dir.0).unwrap().is_empty());
    }

    #[test]
    fn a_carried_tree_promoted_or_at_exit_changes_nothing_more() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("carry-promoted"));
        let mut a = demoted_build(&k, &dir);
        a.carry_class("/user.slice", &|| vec![300, 310]);
        let changes = k.changes();
        assert_eq!(a.unidle_tree(300, &[300, 310]), 0);
        assert!(a.idled.is_empty());
        assert_eq!(k.changes(), changes, "in their own class already");
        assert_eq!(k.sched(300), fair(2));

        let (k, dir) = (FakeKernel::new(), TempDir::new("carry-exit"));
        let mut a = demoted_build(&k, &dir);
        a.carry_class("/user.slice", &|| vec![300, 310]);
        let changes = k.changes();
        let report = a.restore_all();
        assert_eq!((report.failed, report.left_alone), (0, 0));
        assert_eq!(k.changes(), changes);
        assert!(crate::journal::read_pending(&dir.0).unwrap().is_empty());
    }

    #[test]
    fn a_process_first_seen_is_busy_when_young_or_busy_over_its_life() {
        let f = |age_s: f64, cpu_s: f64| ProcFacts {
            ppid: 1,
            start: 1,
            cpu_ns: (cpu_s * 1e9) as u64,
            age_ns: (age_s * 1e9) as u64,
            ..ProcFacts::default()
        };
        // The session's sleeping shell beside the soakers, and a command it runs.
        assert!(!f(8.0, 0.004).busy_at_first_sight());
        assert!(!f(3600.0, 60.0).busy_at_first_sight());
        assert!(f(8.0, 0.5).busy_at_first_sight());
        assert!(f(1.0, 0.0).busy_at_first_sight(), "too young to tell");
        assert!(f(0.0, 0.0).busy_at_first_sight(), "of unknown age");
    }

    #[test]
    fn ancestry_runs_from_the_top_down() {
        assert_eq!(ancestry("/a/b/c"), ["/a", "/a/b", "/a/b/c"]);
        assert!(ancestry("/").is_empty());
    }
}
