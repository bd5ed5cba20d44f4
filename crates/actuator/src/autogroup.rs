//! Serving sessions raised at the top of the CPU hierarchy. Where the kernel makes
//! autogroups (`sched_autogroup_enabled = 1`), a process in the root CPU cgroup is
//! scheduled in its session's autogroup: one entity at the top, beside the idle group,
//! weighted by the autogroup's nice. Beside an idle group that holds batch, a request
//! still waits a whole tick at times: when the server's autogroup has run ahead of the
//! idle group in virtual time, EEVDF does not pick it (traced with `scripts/idle-tick.bt`;
//! a thread's own nice does not change that). A heavier autogroup runs ahead more slowly.
//!
//! Each change is journaled first; the nice goes back when the session serves no more,
//! when the idle group holds nothing, and when appease stops. An autogroup someone else
//! reniced since is left as they set it, and one already at or above the nice asked for
//! is not touched.

use std::collections::{HashMap, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::journal::{JournalState, PendingAutogroup, Record, TaskKey};
use crate::sys::{self, Kernel};
use crate::trail::{audit, Change};
use crate::{KernelActuator, RestoreReport};

pub(crate) struct Raised {
    /// The process the nice was set through.
    key: TaskKey,
    orig: i32,
    nice: i32,
    /// The serving processes of the session, as the last call gave them.
    pids: Vec<u32>,
    why: String,
    since: u64,
}

/// A raised autogroup, for `appease status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionView {
    pub autogroup: u64,
    pub pids: Vec<u32>,
    pub nice: i32,
    pub original_nice: i32,
    pub why: String,
    pub since: u64,
}

#[derive(Default)]
pub(crate) struct Sessions {
    raised: HashMap<u64, Raised>,
    /// Autogroups someone else reniced after appease did: never taken again.
    left_alone: HashSet<u64>,
}

/// A process in `id` that is still the process `key` names, or else any process in it.
fn member_of(k: &dyn Kernel, id: u64, key: &TaskKey, others: &[u32]) -> Option<u32> {
    let in_it = |pid: u32| k.autogroup(pid).is_some_and(|a| a.id == id);
    let same = k
        .task_stat(key.pid, key.pid)
        .is_ok_and(|s| s.start == key.start);
    if same && in_it(key.pid) {
        return Some(key.pid);
    }
    others
        .iter()
        .copied()
        .chain(k.processes())
        .find(|&pid| in_it(pid))
}

/// What putting an autogroup's nice back came to.
enum PutBack {
    Done,
    Gone,
    ChangedByOther(i32),
    Failed(std::io::Error),
}

fn put_back(k: &dyn Kernel, id: u64, a: &PendingAutogroup, others: &[u32]) -> PutBack {
    let Some(pid) = member_of(k, id, &a.key, others) else {
        return PutBack::Gone;
    };
    let now = k.autogroup(pid).map_or(a.nice, |g| g.nice);
    if now != a.nice && now != a.prev {
        return PutBack::ChangedByOther(now);
    }
    match k.set_autogroup_nice(pid, a.orig) {
        Ok(()) => PutBack::Done,
        Err(e) if sys::is_esrch(&e) || e.kind() == std::io::ErrorKind::NotFound => PutBack::Gone,
        Err(e) => PutBack::Failed(e),
    }
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

    /// Gives the autogroups of `servers` (pid, start) nice `nice` and puts back every
    /// other one it raised (all of them when `servers` is empty or `nice` is not
    /// negative). Returns how many autogroups changed.
    pub fn raise_sessions(&mut self, servers: &[(u32, u64)], nice: i32, why: &str) -> usize {
        // Only a raise is asked for: 0 (or above) puts everything back.
        let servers = if nice < 0 { servers } else { &[] };
        let mut wanted: HashMap<u64, (TaskKey, Vec<u32>, i32)> = HashMap::new();
        for &(pid, start) in servers {
            if pid == self.self_pid || !self.in_root_cpu_group(pid) {
                continue;
            }
            let Some(g) = self.kernel.autogroup(pid) else {
                continue;
            };
            let e = wanted.entry(g.id).or_insert_with(|| {
                let key = TaskKey {
                    pid,
                    tid: pid,
                    start,
                };
                (key, Vec::new(), g.nice)
            });
            e.1.push(pid);
        }
        let mut changed = 0;
        let ids: Vec<u64> = self.sessions.raised.keys().copied().collect();
        for id in ids {
            if !wanted.contains_key(&id) {
                changed += usize::from(self.lower_session(
                    id,
                    "no serving process left in it, or no batch to serve beside",
                ));
            }
        }
        for (id, (key, pids, now)) in wanted {
            let mut orig = now;
            if let Some(r) = self.sessions.raised.get_mut(&id) {
                r.pids = pids.clone();
                if self.dry_run || (now == r.nice && r.nice == nice) {
                    continue;
                }
                let r = self.sessions.raised.remove(&id).expect("present");
                if now != r.nice {
                    tracing::info!(autogroup = id, expected = r.nice, found = now, "the session's autogroup was reniced by someone else since: left as they set it");
                    let _logged = self.journal(Record::AutogroupRestored { id });
                    self.sessions.left_alone.insert(id);
                    continue;
                }
                orig = r.orig; // a new nice asked for (a reload)
            } else if now <= nice || self.sessions.left_alone.contains(&id) {
                continue; // as high already, by its owner's choice, or theirs to keep
            }
            if self.set_session(id, key, orig, now, nice, why) {
                changed += 1;
                self.sessions.raised.insert(
                    id,
                    Raised {
                        key,
                        orig,
                        nice,
                        pids,
                        why: why.to_string(),
                        since: SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .map_or(0, |d| d.as_secs()),
                    },
                );
            }
        }
        changed
    }

    /// Journals, then sets, autogroup `id` from nice `prev` to `nice` through `key`'s
    /// process; true once set.
    fn set_session(
        &mut self,
        id: u64,
        key: TaskKey,
        orig: i32,
        prev: i32,
        nice: i32,
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
                tracing::warn!(autogroup = id, error = %e, "could not journal a session's raise: not raised");
                return false;
            }
            if let Err(e) = self.kernel.set_autogroup_nice(key.pid, nice) {
                // Still `prev`: the journal closes it only if that is its original.
                if prev == orig {
                    let _logged = self.journal(Record::AutogroupRestored { id });
                }
                if !sys::is_esrch(&e) {
                    self.counters.fail_errno(Some(&e));
                    tracing::warn!(autogroup = id, pid = key.pid, error = %e, "could not raise the session's autogroup");
                }
                return false;
            }
        }
        audit!(
            self.trail,
            Change::Session,
            pid = key.pid,
            autogroup = id,
            from = format!("autogroup nice {prev}"),
            to = format!("autogroup nice {nice}"),
            why,
            dry_run = self.dry_run.then_some(true)
        );
        self.counters.changes += 1;
        true
    }

    /// Puts autogroup `id` back to its original nice; true if it changed.
    fn lower_session(&mut self, id: u64, why: &str) -> bool {
        let Some(r) = self.sessions.raised.remove(&id) else {
            return false;
        };
        if self.dry_run {
            return false;
        }
        let pending = PendingAutogroup {
            key: r.key,
            orig: r.orig,
            prev: r.nice,
            nice: r.nice,
        };
        let outcome = put_back(self.kernel.as_ref(), id, &pending, &r.pids);
        let done = match outcome {
            PutBack::Done => {
                self.counters.restores += 1;
                audit!(
                    self.trail,
                    Change::Session,
                    pid = r.key.pid,
                    autogroup = id,
                    from = format!("autogroup nice {}", r.nice),
                    to = format!("autogroup nice {}", r.orig),
                    why
                );
                true
            }
            PutBack::Gone => false,
            PutBack::ChangedByOther(found) => {
                tracing::info!(autogroup = id, expected = r.nice, found, "the session's autogroup was reniced by someone else since: left as they set it");
                false
            }
            PutBack::Failed(e) => {
                self.counters.fail_errno(Some(&e));
                tracing::warn!(autogroup = id, error = %e, "could not put the session's autogroup nice back");
                // Kept in the journal: `appease restore` tries again.
                return false;
            }
        };
        let _logged = self.journal(Record::AutogroupRestored { id });
        done
    }

    /// Puts every raised autogroup back (appease stops).
    pub(crate) fn restore_sessions(&mut self, report: &mut RestoreReport) {
        let ids: Vec<u64> = self.sessions.raised.keys().copied().collect();
        for id in ids {
            let before = self.counters.failures;
            if self.lower_session(id, "shutdown") {
                report.restored += 1;
            } else if self.counters.failures > before {
                report.failed += 1;
            }
        }
    }

    /// The raised autogroups, for `appease status`.
    pub fn sessions(&self) -> Vec<SessionView> {
        let mut v: Vec<SessionView> = self
            .sessions
            .raised
            .iter()
            .map(|(&id, r)| SessionView {
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
pub(crate) fn restore_journal_autogroups(
    k: &dyn Kernel,
    state: &JournalState,
    report: &mut RestoreReport,
) -> Vec<Record> {
    let mut closed = Vec::new();
    for (&id, a) in &state.autogroups {
        match put_back(k, id, a, &[]) {
            PutBack::Done => report.restored += 1,
            PutBack::Gone => report.gone += 1,
            PutBack::ChangedByOther(found) => {
                tracing::info!(
                    autogroup = id,
                    found,
                    "changed by someone else since; left alone"
                );
                report.left_alone += 1;
            }
            PutBack::Failed(e) => {
                tracing::warn!(autogroup = id, error = %e, "restore failed");
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
    use crate::journal::{self, Journal};
    use crate::testing::{fair, FakeKernel, TempDir};
    use crate::Actuator;

    fn actuator(k: &FakeKernel, dir: &TempDir) -> KernelActuator {
        k.watch_journal(&dir.0);
        let journal = Journal::open(&dir.0).unwrap();
        KernelActuator::with_kernel(Box::new(k.clone()), Some(journal), Vec::new()).unwrap()
    }

    /// Two servers in session 7, one in session 8, a shell in 7 beside them.
    fn host() -> (FakeKernel, [(u32, u64); 3]) {
        let k = FakeKernel::new();
        let a = k.spawn(100, 100, "web", fair(0));
        let b = k.spawn(200, 200, "db", fair(0));
        let c = k.spawn(300, 300, "cache", fair(0));
        k.spawn(50, 50, "sh", fair(0));
        for (pid, id) in [(100, 7), (200, 7), (50, 7), (300, 8)] {
            k.join_autogroup(pid, id);
        }
        (k, [(100, a), (200, b), (300, c)])
    }

    #[test]
    fn a_serving_session_is_raised_once_journaled_first_and_put_back_when_it_serves_no_more() {
        let ((k, servers), dir) = (host(), TempDir::new("ag-raise"));
        let mut a = actuator(&k, &dir);
        assert_eq!(a.raise_sessions(&servers, -10, "serving beside batch"), 2);
        assert_eq!((k.autogroup_nice(7), k.autogroup_nice(8)), (-10, -10));
        assert_eq!(k.unjournaled(), Vec::<String>::new());
        assert_eq!(journal::read_pending(&dir.0).unwrap().autogroups.len(), 2);
        // The same again: nothing to do.
        let before = k.changes();
        assert_eq!(a.raise_sessions(&servers, -10, "serving beside batch"), 0);
        assert_eq!(k.changes(), before);
        // Session 8's server stops serving; session 7 keeps one server.
        assert_eq!(a.raise_sessions(&servers[1..2], -10, "serving"), 1);
        assert_eq!((k.autogroup_nice(7), k.autogroup_nice(8)), (-10, 0));
        // Both servers of 7 exit: the shell still holds the session, and gets it back.
        k.exit(100);
        k.exit(200);
        assert_eq!(a.raise_sessions(&[], -10, "serving"), 1);
        assert_eq!(k.autogroup_nice(7), 0);
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
        assert_eq!(k.unjournaled(), Vec::<String>::new());
    }

    #[test]
    fn a_new_nice_asked_for_is_applied_and_the_first_original_is_what_goes_back() {
        let ((k, servers), dir) = (host(), TempDir::new("ag-reload"));
        let mut a = actuator(&k, &dir);
        a.raise_sessions(&servers[..1], -10, "serving");
        assert_eq!(a.raise_sessions(&servers[..1], -5, "serving"), 1);
        assert_eq!(k.autogroup_nice(7), -5);
        assert_eq!(a.sessions()[0].original_nice, 0);
        assert_eq!(a.raise_sessions(&servers[..1], 0, "off"), 1, "0: put back");
        assert_eq!(k.autogroup_nice(7), 0);
        assert_eq!(k.unjournaled(), Vec::<String>::new());
    }

    #[test]
    fn an_autogroup_its_owner_set_is_left_as_set_and_not_taken_again() {
        let (k, servers) = host();
        let dir = TempDir::new("ag-other");
        k.renice_autogroup_by_other(8, -15);
        let mut a = actuator(&k, &dir);
        assert_eq!(
            a.raise_sessions(&servers, -10, "serving"),
            1,
            "8 is higher already"
        );
        assert_eq!(k.autogroup_nice(8), -15);
        k.renice_autogroup_by_other(7, 5);
        assert_eq!(a.raise_sessions(&servers, -10, "serving"), 0);
        assert_eq!(k.autogroup_nice(7), 5, "their choice stands");
        assert_eq!(
            a.raise_sessions(&servers, -10, "serving"),
            0,
            "not taken again"
        );
        assert_eq!(k.autogroup_nice(7), 5);
        assert!(a.sessions().is_empty());
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
    }

    #[test]
    fn stopping_puts_every_session_back_and_the_journal_alone_does_after_a_crash() {
        let (k, servers) = host();
        let dir = TempDir::new("ag-crash");
        let mut a = actuator(&k, &dir);
        a.raise_sessions(&servers, -10, "serving");
        let report = a.restore_all();
        assert_eq!((report.restored, report.failed), (2, 0));
        assert_eq!((k.autogroup_nice(7), k.autogroup_nice(8)), (0, 0));

        let mut a = actuator(&k, &dir);
        a.raise_sessions(&servers, -10, "serving");
        std::mem::forget(a); // a crash: nothing put back
                             // The process the raise went through is gone; the shell still holds session 7.
        k.exit(100);
        let report = crate::restore_journal_with(&dir.0, &k).unwrap();
        assert_eq!((report.restored, report.failed), (2, 0));
        assert_eq!((k.autogroup_nice(7), k.autogroup_nice(8)), (0, 0));
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
        assert_eq!(k.unjournaled(), Vec::<String>::new());
    }

    #[test]
    fn a_session_without_autogroups_or_with_only_appease_is_not_touched() {
        let k = FakeKernel::new();
        let dir = TempDir::new("ag-none");
        let s = k.spawn(100, 100, "web", fair(0));
        let me = std::process::id();
        let m = k.spawn(me, me, "appease", fair(0));
        k.join_autogroup(me, 9);
        let mut a = actuator(&k, &dir);
        assert_eq!(a.raise_sessions(&[(100, s), (me, m)], -10, "serving"), 0);
        assert_eq!(k.autogroup_nice(9), 0);
        assert_eq!(k.changes(), 0);
    }
}
