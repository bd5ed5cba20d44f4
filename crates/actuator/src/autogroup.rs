//! Serving sessions raised at the top of the CPU hierarchy. Where the kernel makes
//! autogroups (`sched_autogroup_enabled = 1`), a process in the root CPU cgroup is
//! scheduled in its session's autogroup: one entity at the top, beside the idle group,
//! weighted by the autogroup's nice. Beside an idle group that holds batch, a request
//! still waits a whole tick at times: when the server's autogroup has run ahead of the
//! idle group in virtual time, EEVDF does not pick it (traced with `scripts/idle-tick.bt`;
//! a thread's own nice does not change that). A heavier autogroup runs ahead more slowly.
//!
//! Each change is journaled first; the nice goes back when the session serves no more,
//! when the caller says there is nothing to serve beside, and when appease stops. An
//! autogroup someone else reniced since is left as they set it, and one already at or
//! above the nice asked for is not touched. The kernel takes one autogroup write per
//! 100 ms host-wide (EAGAIN otherwise): one write per call at most, the rest at the next.

use std::collections::{HashMap, HashSet};
use std::io;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::journal::{PendingAutogroup, Record, TaskKey};
use crate::restore::FromJournal;
use crate::sys::{self, Kernel};
use crate::trail::{audit, Change};
use crate::{KernelActuator, RestoreReport};

/// How many calls a process's autogroup, as read, is trusted before it is read again
/// (a process may change session or cgroup, rarely).
const RECHECK_AFTER_CALLS: u64 = 16;
/// The kernel's spacing of autogroup writes, with a margin.
const WRITE_SPACING: Duration = Duration::from_millis(110);
/// Tries of a put-back refused with EAGAIN when appease stops or restores a journal.
const TRIES_WHEN_STOPPING: u32 = 10;

pub(crate) struct Raised {
    /// The process the nice was set through.
    key: TaskKey,
    /// The session's leader: usually outlives the servers, and is in the autogroup.
    leader: u32,
    orig: i32,
    nice: i32,
    /// The serving processes of the session, as the last call gave them.
    pids: Vec<u32>,
    why: String,
    since: u64,
}

/// A raised autogroup, for `appease status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutogroupView {
    pub autogroup: u64,
    pub pids: Vec<u32>,
    pub nice: i32,
    pub original_nice: i32,
    pub why: String,
    pub since: u64,
}

/// A serving process's autogroup as read: its id (None: the process is not scheduled
/// in one) and its session's leader, and the call it was read at.
#[derive(Clone, Copy)]
struct Known {
    id: Option<u64>,
    leader: u32,
    at: u64,
}

#[derive(Default)]
pub(crate) struct Autogroups {
    raised: HashMap<u64, Raised>,
    /// Autogroups someone else reniced after appease did: never taken again (an id is
    /// never reused while the host runs).
    left_alone: HashSet<u64>,
    known: HashMap<(u32, u64), Known>,
    calls: u64,
}

/// A process in `id`: the one `key` names if it is still that process, one of `others`,
/// the session's leader, or (a last resort, a walk of the process table) any.
fn member_of(k: &dyn Kernel, id: u64, key: &TaskKey, others: &[u32], leader: u32) -> Option<u32> {
    let in_it = |pid: u32| k.autogroup(pid).is_some_and(|a| a.id == id);
    let same = k
        .task_stat(key.pid, key.pid)
        .is_ok_and(|s| s.start == key.start);
    if same && in_it(key.pid) {
        return Some(key.pid);
    }
    if let Some(pid) = others.iter().copied().chain([leader]).find(|&p| in_it(p)) {
        return Some(pid);
    }
    k.processes().into_iter().find(|&pid| in_it(pid))
}

/// What putting an autogroup's nice back came to.
enum PutBack {
    Done,
    Gone,
    ChangedByOther(i32),
    /// The kernel's 100 ms spacing: try again later.
    Busy,
    Failed(io::Error),
}

fn is_busy(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EAGAIN)
}

fn put_back(k: &dyn Kernel, id: u64, a: &PendingAutogroup, others: &[u32], leader: u32) -> PutBack {
    let Some(pid) = member_of(k, id, &a.key, others, leader) else {
        return PutBack::Gone;
    };
    let now = k.autogroup(pid).map_or(a.nice, |g| g.nice);
    if now == a.orig {
        return PutBack::Done; // the daemon died before its write, or someone set it so
    }
    if now != a.nice && now != a.prev {
        return PutBack::ChangedByOther(now);
    }
    match k.set_autogroup_nice(pid, a.orig) {
        Ok(()) => PutBack::Done,
        Err(e) if is_busy(&e) => PutBack::Busy,
        Err(e) if sys::is_esrch(&e) || e.kind() == io::ErrorKind::NotFound => PutBack::Gone,
        Err(e) => PutBack::Failed(e),
    }
}

/// `put_back`, tried again while the kernel says it is too soon (appease stops).
fn put_back_waiting(
    k: &dyn Kernel,
    id: u64,
    a: &PendingAutogroup,
    others: &[u32],
    leader: u32,
) -> PutBack {
    for _ in 1..TRIES_WHEN_STOPPING {
        match put_back(k, id, a, others, leader) {
            PutBack::Busy => std::thread::sleep(WRITE_SPACING),
            other => return other,
        }
    }
    put_back(k, id, a, others, leader)
}

impl KernelActuator {
    /// Whether `pid` is scheduled in its session's autogroup: it is in the root CPU
    /// cgroup (every task is, without a CPU hierarchy).
    fn in_root_cpu_group(&self, pid: u32) -> bool {
        match &self.groups {
            None => true,
            Some(g) => g.cgroups().group_of(pid).is_ok_and(|p| p == "/"),
        }
    }

    /// The autogroup `(pid, start)` is scheduled in, read again every
    /// `RECHECK_AFTER_CALLS` calls; None for a process that is gone or not that process.
    fn serving_autogroup(&mut self, pid: u32, start: u64) -> Option<(u64, u32)> {
        let calls = self.autogroups.calls;
        let known = match self.autogroups.known.get(&(pid, start)) {
            Some(k) if calls - k.at < RECHECK_AFTER_CALLS => *k,
            _ => {
                let stat = self.kernel.task_stat(pid, pid).ok()?;
                if stat.start != start {
                    return None; // the pid is another process's now
                }
                let id = if pid != self.self_pid && self.in_root_cpu_group(pid) {
                    self.kernel.autogroup(pid).map(|a| a.id)
                } else {
                    None
                };
                let k = Known {
                    id,
                    leader: stat.session,
                    at: calls,
                };
                self.autogroups.known.insert((pid, start), k);
                k
            }
        };
        Some((known.id?, known.leader))
    }

    /// Gives the autogroups of `servers` (pid, start) nice `nice` and puts back every
    /// other one it raised (all of them when `servers` is empty, `nice` is not negative
    /// or the kernel makes no autogroups now). One write per call at most (the kernel's
    /// spacing): the rest at the next. Returns how many autogroups changed.
    pub fn sync_serving_autogroups(
        &mut self,
        servers: &[(u32, u64)],
        nice: i32,
        why: &str,
    ) -> usize {
        self.autogroups.calls += 1;
        let on = nice < 0 && !servers.is_empty() && self.kernel.autogroups_enabled();
        let servers = if on { servers } else { &[] };
        let mut wanted: HashMap<u64, (TaskKey, u32, Vec<u32>)> = HashMap::new();
        for &(pid, start) in servers {
            let Some((id, leader)) = self.serving_autogroup(pid, start) else {
                continue;
            };
            let key = TaskKey {
                pid,
                tid: pid,
                start,
            };
            wanted
                .entry(id)
                .or_insert_with(|| (key, leader, Vec::new()))
                .2
                .push(pid);
        }
        let serving: HashSet<(u32, u64)> = servers.iter().copied().collect();
        self.autogroups.known.retain(|k, _| serving.contains(k));

        // Put back first; one write this call.
        let mut ids: Vec<u64> = self.autogroups.raised.keys().copied().collect();
        ids.sort_unstable();
        for id in ids.into_iter().filter(|id| !wanted.contains_key(id)) {
            let why = "no serving process left in it, or no batch to serve beside";
            if let Some(done) = self.lower_autogroup(id, why) {
                return usize::from(done);
            }
        }
        let mut ids: Vec<u64> = wanted.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let (key, leader, pids) = wanted.remove(&id).expect("listed");
            let now = match self.kernel.autogroup(key.pid) {
                Some(a) if a.id == id => a.nice,
                _ => continue, // left the session since it was read
            };
            let mut orig = now;
            if let Some(r) = self.autogroups.raised.get_mut(&id) {
                r.pids = pids.clone();
                if self.dry_run || (now == r.nice && r.nice == nice) {
                    continue;
                }
                if now != r.nice {
                    self.autogroups.raised.remove(&id);
                    tracing::info!(autogroup = id, expected = nice, found = now, "the session's autogroup was reniced by someone else since: left as they set it");
                    let _logged = self.journal(Record::AutogroupRestored { id });
                    self.autogroups.left_alone.insert(id);
                    continue;
                }
                orig = r.orig; // a new nice asked for (a reload)
            } else if now <= nice || self.autogroups.left_alone.contains(&id) {
                continue; // as high already, by its owner's choice, or theirs to keep
            }
            return usize::from(self.set_autogroup(id, key, leader, orig, now, nice, pids, why));
        }
        0
    }

    /// Journals, then sets, autogroup `id` from nice `prev` to `nice` through `key`'s
    /// process, and records it raised; true once set.
    #[allow(clippy::too_many_arguments)]
    fn set_autogroup(
        &mut self,
        id: u64,
        key: TaskKey,
        leader: u32,
        orig: i32,
        prev: i32,
        nice: i32,
        pids: Vec<u32>,
        why: &str,
    ) -> bool {
        if !self.dry_run {
            let rec = Record::AutogroupNice {
                id,
                key,
                orig,
                prev,
                next: nice,
            };
            if let Err(e) = self.journal(rec) {
                tracing::warn!(autogroup = id, error = %e, "could not journal an autogroup's raise: not raised");
                return false;
            }
            if let Err(e) = self.kernel.set_autogroup_nice(key.pid, nice) {
                // Still at `prev`: the journal's record stays open while that is ours.
                if prev == orig {
                    let _logged = self.journal(Record::AutogroupRestored { id });
                }
                if !is_busy(&e) && !sys::is_esrch(&e) {
                    self.counters.fail_errno(Some(&e));
                    tracing::warn!(autogroup = id, pid = key.pid, error = %e, "could not raise the session's autogroup");
                }
                return false;
            }
        }
        audit!(
            self.trail,
            Change::Autogroup,
            pid = key.pid,
            autogroup = id,
            from = format!("autogroup nice {prev}"),
            to = format!("autogroup nice {nice}"),
            why,
            dry_run = self.dry_run.then_some(true)
        );
        self.counters.changes += 1;
        let since = match self.autogroups.raised.get(&id) {
            Some(r) => r.since,
            None => crate::now_secs(),
        };
        self.autogroups.raised.insert(
            id,
            Raised {
                key,
                leader,
                orig,
                nice,
                pids,
                why: why.to_string(),
                since,
            },
        );
        true
    }

    /// Puts autogroup `id` back to its original nice: Some(true) if it did, Some(false)
    /// if the kernel refused the write (it stays raised, to be tried again), None if no
    /// write was tried (gone, reniced by someone else, a dry run).
    fn lower_autogroup(&mut self, id: u64, why: &str) -> Option<bool> {
        self.lower_autogroup_with(id, why, put_back)
    }

    fn lower_autogroup_with(
        &mut self,
        id: u64,
        why: &str,
        how: fn(&dyn Kernel, u64, &PendingAutogroup, &[u32], u32) -> PutBack,
    ) -> Option<bool> {
        let r = self.autogroups.raised.remove(&id)?;
        if self.dry_run {
            return None;
        }
        let pending = PendingAutogroup {
            key: r.key,
            orig: r.orig,
            prev: r.nice,
            nice: r.nice,
        };
        match how(self.kernel.as_ref(), id, &pending, &r.pids, r.leader) {
            PutBack::Done => {
                self.counters.restores += 1;
                audit!(
                    self.trail,
                    Change::Autogroup,
                    pid = r.key.pid,
                    autogroup = id,
                    from = format!("autogroup nice {}", r.nice),
                    to = format!("autogroup nice {}", r.orig),
                    why
                );
                let _logged = self.journal(Record::AutogroupRestored { id });
                Some(true)
            }
            PutBack::Gone => {
                let _logged = self.journal(Record::AutogroupRestored { id });
                None
            }
            PutBack::ChangedByOther(found) => {
                tracing::info!(autogroup = id, expected = r.nice, found, "the session's autogroup was reniced by someone else since: left as they set it");
                let _logged = self.journal(Record::AutogroupRestored { id });
                None
            }
            PutBack::Busy => {
                self.autogroups.raised.insert(id, r);
                Some(false)
            }
            PutBack::Failed(e) => {
                self.counters.fail_errno(Some(&e));
                tracing::warn!(autogroup = id, error = %e, "could not put the session's autogroup nice back");
                self.autogroups.raised.insert(id, r);
                Some(false)
            }
        }
    }

    /// Puts every raised autogroup back (appease stops), waiting out the kernel's
    /// spacing between writes.
    pub(crate) fn restore_autogroups(&mut self, report: &mut RestoreReport) {
        let mut ids: Vec<u64> = self.autogroups.raised.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            match self.lower_autogroup_with(id, "shutdown", put_back_waiting) {
                Some(true) => report.restored += 1,
                Some(false) => {
                    // Refused: the journal keeps it for `appease restore`.
                    self.autogroups.raised.remove(&id);
                    report.failed += 1;
                }
                None => {}
            }
        }
    }

    /// The nice of the highest autogroup raised now, if any.
    pub fn raised_autogroup_nice(&self) -> Option<i32> {
        self.autogroups.raised.values().map(|r| r.nice).min()
    }

    /// The raised autogroups, for `appease status`.
    pub fn autogroups(&self) -> Vec<AutogroupView> {
        let mut v: Vec<AutogroupView> = self
            .autogroups
            .raised
            .iter()
            .map(|(&id, r)| AutogroupView {
                autogroup: id,
                pids: r.pids.clone(),
                nice: r.nice,
                original_nice: r.orig,
                why: r.why.clone(),
                since: r.since,
            })
            .collect();
        v.sort_by_key(|s| s.autogroup);
        v
    }
}

/// Puts back the autogroups a journal records (after a crash); returns the records that
/// close them.
pub(crate) fn restore_journaled(c: &FromJournal, report: &mut RestoreReport) -> Vec<Record> {
    let (k, state) = (c.k, c.state);
    let mut closed = Vec::new();
    for (&id, a) in &state.autogroups {
        let leader = k.task_stat(a.key.pid, a.key.pid).map_or(0, |s| s.session);
        match put_back_waiting(k, id, a, &[], leader) {
            PutBack::Done => report.restored += 1,
            PutBack::Gone => report.gone += 1,
            PutBack::ChangedByOther(found) => {
                tracing::info!(
                    autogroup = id,
                    found,
                    "the session's autogroup was reniced by someone else since: left as they set it"
                );
                report.left_alone += 1;
            }
            PutBack::Busy | PutBack::Failed(_) => {
                tracing::warn!(autogroup = id, "restore failed");
                report.failed += 1;
                continue;
            }
        }
        closed.push(Record::AutogroupRestored { id });
    }
    closed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal;
    use crate::testing::{fair, journaled_actuator, FakeKernel, TempDir};

    fn actuator(k: &FakeKernel, dir: &TempDir) -> KernelActuator {
        journaled_actuator(k, dir, &[])
    }

    /// Two servers in autogroup 7 (a shell leads their session), one in autogroup 8.
    fn host() -> (FakeKernel, [(u32, u64); 3]) {
        let k = FakeKernel::new();
        let a = k.spawn(100, 100, "web", fair(0));
        let b = k.spawn(200, 200, "db", fair(0));
        let c = k.spawn(300, 300, "cache", fair(0));
        k.spawn(50, 50, "sh", fair(0));
        for (pid, id) in [(100, 7), (200, 7), (50, 7), (300, 8)] {
            k.join_autogroup(pid, id);
        }
        k.lead(50, &[100, 200]);
        (k, [(100, a), (200, b), (300, c)])
    }

    /// Calls until nothing more changes (one write per call); returns the changes.
    fn settle(a: &mut KernelActuator, servers: &[(u32, u64)], nice: i32) -> usize {
        let mut total = 0;
        loop {
            match a.sync_serving_autogroups(servers, nice, "serving beside batch") {
                0 => return total,
                n => total += n,
            }
        }
    }

    #[test]
    fn a_serving_session_is_raised_once_journaled_first_and_put_back_when_it_serves_no_more() {
        let ((k, servers), dir) = (host(), TempDir::new("ag-raise"));
        let mut a = actuator(&k, &dir);
        assert_eq!(
            a.sync_serving_autogroups(&servers, -10, "serving"),
            1,
            "one write a call"
        );
        assert_eq!(settle(&mut a, &servers, -10), 1);
        assert_eq!((k.autogroup_nice(7), k.autogroup_nice(8)), (-10, -10));
        assert_eq!(k.unjournaled(), Vec::<String>::new());
        assert_eq!(journal::read_pending(&dir.0).unwrap().autogroups.len(), 2);
        // The same again: nothing to do.
        let before = k.changes();
        assert_eq!(settle(&mut a, &servers, -10), 0);
        assert_eq!(k.changes(), before);
        // Autogroup 8's server stops serving; autogroup 7 keeps one server.
        assert_eq!(settle(&mut a, &servers[1..2], -10), 1);
        assert_eq!((k.autogroup_nice(7), k.autogroup_nice(8)), (-10, 0));
        // Both servers of 7 exit: the shell leads the session still, and gets it back
        // without a walk of the process table.
        k.exit(100);
        k.exit(200);
        let walks = k.process_table_walks();
        assert_eq!(settle(&mut a, &[], -10), 1);
        assert_eq!(k.autogroup_nice(7), 0);
        assert_eq!(k.process_table_walks(), walks);
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
        assert_eq!(k.unjournaled(), Vec::<String>::new());
    }

    #[test]
    fn a_write_the_kernel_refuses_as_too_soon_is_made_at_the_next_call_and_when_stopping() {
        let ((k, servers), dir) = (host(), TempDir::new("ag-busy"));
        let mut a = actuator(&k, &dir);
        k.autogroup_busy(1);
        assert_eq!(a.sync_serving_autogroups(&servers[..1], -10, "serving"), 0);
        assert_eq!(k.autogroup_nice(7), 0);
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
        assert_eq!(a.sync_serving_autogroups(&servers[..1], -10, "serving"), 1);
        assert_eq!(k.autogroup_nice(7), -10);
        // Refused while putting back: kept, and put back at the next call.
        k.autogroup_busy(1);
        assert_eq!(a.sync_serving_autogroups(&[], -10, "serving"), 0);
        assert_eq!((k.autogroup_nice(7), a.autogroups().len()), (-10, 1));
        assert_eq!(a.sync_serving_autogroups(&[], -10, "serving"), 1);
        assert_eq!(k.autogroup_nice(7), 0);
        // Stopping waits out the spacing.
        settle(&mut a, &servers, -10);
        k.autogroup_busy(2);
        let report = a.restore_all();
        assert_eq!((report.restored, report.failed), (2, 0));
        assert_eq!((k.autogroup_nice(7), k.autogroup_nice(8)), (0, 0));
        assert_eq!(a.counters.failures, 0, "too soon is no failure");
        assert_eq!(k.unjournaled(), Vec::<String>::new());
    }

    #[test]
    fn autogroups_turned_off_meanwhile_still_get_their_nice_back() {
        let ((k, servers), dir) = (host(), TempDir::new("ag-off"));
        let mut a = actuator(&k, &dir);
        settle(&mut a, &servers, -10);
        k.autogroups_off(true);
        assert_eq!(
            settle(&mut a, &servers, -10),
            2,
            "none raised while off: put back"
        );
        assert_eq!((k.autogroup_nice(7), k.autogroup_nice(8)), (0, 0));
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
    }

    #[test]
    fn a_new_nice_asked_for_is_applied_and_the_first_original_is_what_goes_back() {
        let ((k, servers), dir) = (host(), TempDir::new("ag-reload"));
        let mut a = actuator(&k, &dir);
        settle(&mut a, &servers[..1], -10);
        assert_eq!(settle(&mut a, &servers[..1], -5), 1);
        assert_eq!(k.autogroup_nice(7), -5);
        assert_eq!(a.autogroups()[0].original_nice, 0);
        assert_eq!(settle(&mut a, &servers[..1], 0), 1, "0: put back");
        assert_eq!(k.autogroup_nice(7), 0);
        assert_eq!(k.unjournaled(), Vec::<String>::new());
    }

    #[test]
    fn an_autogroup_its_owner_set_is_left_as_set_and_not_taken_again() {
        let (k, servers) = host();
        let dir = TempDir::new("ag-other");
        k.renice_autogroup_by_other(8, -15);
        let mut a = actuator(&k, &dir);
        assert_eq!(settle(&mut a, &servers, -10), 1, "8 is higher already");
        assert_eq!(k.autogroup_nice(8), -15);
        k.renice_autogroup_by_other(7, 5);
        assert_eq!(settle(&mut a, &servers, -10), 0);
        assert_eq!(k.autogroup_nice(7), 5, "their choice stands");
        assert_eq!(settle(&mut a, &servers, -10), 0, "not taken again");
        assert_eq!(k.autogroup_nice(7), 5);
        assert!(a.autogroups().is_empty());
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
    }

    #[test]
    fn stopping_puts_every_session_back_and_the_journal_alone_does_after_a_crash() {
        let (k, servers) = host();
        let dir = TempDir::new("ag-crash");
        let mut a = actuator(&k, &dir);
        settle(&mut a, &servers, -10);
        let report = a.restore_all();
        assert_eq!((report.restored, report.failed), (2, 0));
        assert_eq!((k.autogroup_nice(7), k.autogroup_nice(8)), (0, 0));

        let mut a = actuator(&k, &dir);
        settle(&mut a, &servers, -10);
        std::mem::forget(a); // a crash: nothing put back
                             // The process the raise went through is gone; the shell still holds autogroup 7.
        k.exit(100);
        let report = crate::restore::restore_journal_on(&dir.0, &k).unwrap();
        assert_eq!((report.restored, report.failed), (2, 0));
        assert_eq!((k.autogroup_nice(7), k.autogroup_nice(8)), (0, 0));
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
        assert_eq!(k.unjournaled(), Vec::<String>::new());
    }

    #[test]
    fn a_reused_pid_and_appease_itself_are_never_raised() {
        let k = FakeKernel::new();
        let dir = TempDir::new("ag-none");
        let old = k.spawn(100, 100, "web", fair(0));
        k.exit(100);
        k.spawn(100, 100, "make", fair(0)); // the pid, now another process's
        k.join_autogroup(100, 5);
        let me = std::process::id();
        let m = k.spawn(me, me, "appease", fair(0));
        k.join_autogroup(me, 9);
        let mut a = actuator(&k, &dir);
        assert_eq!(settle(&mut a, &[(100, old), (me, m)], -10), 0);
        assert_eq!((k.autogroup_nice(5), k.autogroup_nice(9)), (0, 0));
        assert_eq!(k.changes(), 0);
    }
}
