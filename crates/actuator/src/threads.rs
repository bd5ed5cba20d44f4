//! Threads elevated by requests, sunk by long ones or set to a role's nice: what each
//! had, what it has now, and putting it back.

use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;

use appease_policy::elevated_nice;

use crate::journal::{Record, TaskKey};
use crate::restore::FromJournal;
use crate::sys::{self, Sched};
use crate::trail::{audit, Change};
use crate::{
    now_secs, sched_text, ActError, HandsOff, KernelActuator, ManagedView, RestoreReport, Seen,
};

pub(crate) struct Managed {
    /// Its `manage` record is not written yet: it goes with the first `apply`, in one
    /// write (a first contact is on the request's path).
    unjournaled: bool,
    key: TaskKey,
    comm: String,
    orig: Sched,
    applied_nice: i32,
    applied_slice_ns: u64,
    /// Becomes readable when the thread exits; None if pidfds are unavailable.
    pidfd: Option<OwnedFd>,
    why: String,
    since: u64,
    /// Set to a role's fixed nice (not elevated by requests).
    role: bool,
    /// Set below its own nice (a long request).
    sunk: bool,
}

/// A call about thread `tid` that failed: the thread is gone (ESRCH), or `op` failed.
fn gone_or_failed(tid: u32, op: &'static str, e: io::Error) -> ActError {
    if sys::is_esrch(&e) {
        ActError::Gone { tid }
    } else {
        ActError::Sys { op, tid, source: e }
    }
}

impl KernelActuator {
    pub(crate) fn leave_alone(&mut self, tid: u32, start: u64, why: HandsOff) -> ActError {
        tracing::info!(tid, ?why, "leaving thread alone");
        self.counters.hands_off += 1;
        self.left_alone.insert(tid, (start, why.clone()));
        ActError::HandsOff { tid, why }
    }

    /// First contact with a thread: check it may be touched, record its original state.
    pub(crate) fn take_charge(
        &mut self,
        pid: u32,
        tid: u32,
        why: &str,
        seen: Option<Seen<'_>>,
    ) -> Result<Managed, ActError> {
        let gone = |e, op| gone_or_failed(tid, op, e);
        // Open the pidfd first: what is read of the id after it then describes the same
        // thread (a thread alive at the pidfd's opening keeps its id), and the pidfd,
        // checked alive after each change, shows the change reached that thread.
        let pidfd = self.kernel.pidfd_open_thread(tid);
        // A thread that has exited and not been reaped (a zombie) is still in /proc and
        // takes a nice, but will never run again: nothing to change, nothing to put back.
        if pidfd.as_ref().is_some_and(|fd| !sys::pidfd_alive(fd)) {
            return Err(ActError::Gone { tid });
        }
        let (start, kernel_thread, comm, proc_comm) = self.identify(pid, tid, seen)?;
        if let Some((was, why)) = self.left_alone.get(&tid) {
            if *was == start {
                return Err(ActError::HandsOff {
                    tid,
                    why: why.clone(),
                });
            }
            self.left_alone.remove(&tid);
        }
        let orig = self
            .kernel
            .sched_getattr(tid)
            .map_err(|e| gone(e, "sched_getattr"))?;
        // The process's name, for the exceptions: a thread's own is in its stat, and the
        // main thread's is the process's.
        let proc_comm = match proc_comm {
            Some(c) => c,
            None if pid == tid || self.exceptions.is_empty() => comm.clone(),
            None => self.kernel.comm(pid).unwrap_or_default(),
        };
        let refusal = if kernel_thread {
            Some(HandsOff::KernelThread)
        } else if pid == self.self_pid {
            Some(HandsOff::Itself)
        } else if orig.policy != sys::SCHED_NORMAL && orig.policy != sys::SCHED_BATCH {
            Some(HandsOff::Policy {
                policy: orig.policy,
            })
        } else {
            self.exceptions
                .iter()
                .find(|c| **c == comm || **c == proc_comm)
                .map(|c| HandsOff::Exception { comm: c.clone() })
        };
        if let Some(r) = refusal {
            return Err(self.leave_alone(tid, start, r));
        }
        let key = TaskKey { pid, tid, start };
        Ok(Managed {
            unjournaled: true,
            key,
            comm,
            orig,
            applied_nice: orig.nice,
            applied_slice_ns: orig.slice_ns,
            pidfd,
            why: why.to_string(),
            since: now_secs(),
            role: false,
            sunk: false,
        })
    }

    /// The thread the id names once its pidfd is open, if it is the one `seen` (its
    /// start, whether a kernel thread, its name and its process's name when an event gave
    /// it): through the lookup where one answers, or the thread's stat file.
    fn identify(
        &mut self,
        pid: u32,
        tid: u32,
        seen: Option<Seen<'_>>,
    ) -> Result<(u64, bool, String, Option<String>), ActError> {
        let gone = |e, op| gone_or_failed(tid, op, e);
        let (identity, lookup) = match seen.filter(|s| s.identity.tid == tid) {
            Some(s) => (Some(s.identity), s.lookup),
            None => (None, None),
        };
        let now = lookup.and_then(|l| l.thread_now(tid));
        Ok(match (identity, now) {
            (Some(i), Some(now)) => {
                // The event's thread exited and its id went to another (or to none).
                if !now.is_some_and(|t| t.pid == pid && t.start == i.start) {
                    return Err(ActError::Gone { tid });
                }
                let kernel_thread = now.is_some_and(|t| t.kernel_thread);
                // The names as the event saw them (the process's name costs no other read).
                (i.start, kernel_thread, i.comm, Some(i.proc_comm))
            }
            (identity, _) => {
                let stat = self
                    .kernel
                    .task_stat(pid, tid)
                    .map_err(|e| gone(e, "read /proc stat"))?;
                match identity {
                    Some(i) if i.start != stat.start => return Err(ActError::Gone { tid }),
                    Some(i) => (i.start, stat.kernel_thread, i.comm, Some(i.proc_comm)),
                    None => (stat.start, stat.kernel_thread, stat.comm, None),
                }
            }
        })
    }

    /// The slice value that gives a thread back its original slice.
    pub(crate) fn original_slice_arg(&self, orig: &Sched) -> u64 {
        if orig.slice_ns == self.base_slice_ns {
            0
        } else {
            orig.slice_ns
        }
    }

    /// Checks the managed thread is alive and still has what appease gave it.
    pub(crate) fn verify(&mut self, tid: u32) -> Result<(), ActError> {
        let m = self.managed.get(&tid).expect("caller checked");
        let alive = match &m.pidfd {
            Some(fd) => sys::pidfd_alive(fd),
            None => self
                .kernel
                .task_stat(m.key.pid, tid)
                .is_ok_and(|s| s.start == m.key.start),
        };
        if !alive {
            return Err(ActError::Gone { tid });
        }
        let now = self
            .kernel
            .sched_getattr(tid)
            .map_err(|e| gone_or_failed(tid, "sched_getattr", e))?;
        if self.dry_run {
            return Ok(());
        }
        if now.nice != m.applied_nice || now.policy != m.orig.policy {
            let (key, expected) = (m.key, m.applied_nice);
            self.managed.remove(&tid);
            self.journal(Record::Release { key })?;
            return Err(self.leave_alone(
                tid,
                key.start,
                HandsOff::ChangedByOther {
                    expected,
                    found: now.nice,
                },
            ));
        }
        Ok(())
    }

    pub(crate) fn drop_gone(&mut self, tid: u32) -> ActError {
        if let Some(m) = self.managed.remove(&tid) {
            let _ignored_on_purpose = self.journal(Record::Release { key: m.key });
        }
        self.counters.gone += 1;
        ActError::Gone { tid }
    }

    pub(crate) fn set(&mut self, tid: u32, nice: i32, slice_ns: u64) -> Result<(), ActError> {
        let m = self.managed.get(&tid).expect("caller checked");
        let (key, prev, orig) = (m.key, m.applied_nice, m.orig);
        let rof = orig.reset_on_fork;
        if !self.dry_run {
            let apply = Record::Apply {
                key,
                prev,
                next: nice,
                slice_ns,
                orig: Some(orig),
            };
            if m.unjournaled {
                let manage = Record::Manage {
                    key,
                    comm: m.comm.clone(),
                    orig,
                };
                self.journal_all(&[manage, apply])?;
            } else {
                self.journal(apply)?;
            }
            if let Some(m) = self.managed.get_mut(&tid) {
                m.unjournaled = false;
            }
            // Its identity was checked just before (verify or take_charge); an exit since
            // shows as ESRCH: the kernel hands an id out again only after every other.
            let changed = self.kernel.sched_set_fair(tid, nice, slice_ns, rof);
            if changed.as_ref().is_err_and(sys::is_esrch) {
                return Err(self.drop_gone(tid));
            }
            if let Err(e) = changed {
                self.counters.fail_errno(Some(&e));
                return Err(ActError::Sys {
                    op: "sched_setattr",
                    tid,
                    source: e,
                });
            }
        }
        let m = self.managed.get_mut(&tid).expect("caller checked");
        m.applied_nice = nice;
        m.applied_slice_ns = slice_ns;
        Ok(())
    }
}

/// What nice a managed thread should have.
#[derive(Clone, Copy)]
pub(crate) enum Target {
    /// This many levels above its original nice (request elevation).
    Levels(u32),
    /// Exactly this nice (a role's fixed priority).
    Fixed(i32),
    /// This many levels below its original nice (a long request).
    Below(u32),
}

impl KernelActuator {
    /// Threads whose name (or their process's) is now an exception get their priority
    /// back; returns them (the policy forgets them).
    pub fn release_excepted_threads(&mut self) -> Vec<u32> {
        let excepted = |m: &Managed| {
            let proc_comm = || self.kernel.comm(m.key.pid).unwrap_or_default();
            self.exceptions
                .iter()
                .any(|c| *c == m.comm || *c == proc_comm())
        };
        let tids: Vec<u32> = self
            .managed
            .values()
            .filter(|m| excepted(m))
            .map(|m| m.key.tid)
            .collect();
        self.restore_each(&tids, "now an exception (hands_off)")
    }

    /// Threads with a role whose process `keep` no longer gives one (a role removed or
    /// changed by a reload, an exception) get their priority back; returns them.
    pub fn release_roles(&mut self, keep: impl Fn(u32) -> bool) -> Vec<u32> {
        let tids: Vec<u32> = self
            .managed
            .values()
            .filter(|m| m.role && !keep(m.key.pid))
            .map(|m| m.key.tid)
            .collect();
        self.restore_each(&tids, "its role is no longer configured")
    }

    pub(crate) fn restore_each(&mut self, tids: &[u32], why: &str) -> Vec<u32> {
        for &tid in tids {
            match self.restore(tid, why) {
                Ok(()) | Err(ActError::Gone { .. }) | Err(ActError::HandsOff { .. }) => {}
                Err(e) => tracing::warn!(tid, error = %e, "could not put the thread back"),
            }
        }
        tids.to_vec()
    }

    /// Sets a thread to a fixed nice (a role), recorded and restored like an elevation.
    pub fn fix_nice(&mut self, pid: u32, tid: u32, nice: i32, why: &str) -> Result<(), ActError> {
        self.apply_nice(pid, tid, Target::Fixed(nice), None, why, None)
    }

    /// Sets a thread `levels` nice levels below its original nice, with `slice` or its
    /// original slice (a long request), recorded and restored like an elevation.
    pub fn sink(
        &mut self,
        pid: u32,
        tid: u32,
        levels: u32,
        slice: Option<Duration>,
        why: &str,
    ) -> Result<(), ActError> {
        self.apply_nice(pid, tid, Target::Below(levels), slice, why, None)
    }

    pub(crate) fn apply_nice(
        &mut self,
        pid: u32,
        tid: u32,
        target: Target,
        slice: Option<Duration>,
        why: &str,
        seen: Option<Seen<'_>>,
    ) -> Result<(), ActError> {
        if !self.managed.contains_key(&tid) {
            let m = self.take_charge(pid, tid, why, seen)?;
            self.managed.insert(tid, m);
        } else if let Err(e) = self.verify(tid) {
            return Err(match e {
                ActError::Gone { tid } => self.drop_gone(tid),
                other => other,
            });
        }
        let m = &self.managed[&tid];
        let nice = match target {
            Target::Levels(levels) => elevated_nice(m.orig.nice, levels),
            Target::Fixed(nice) => nice.clamp(appease_policy::NICE_MIN, appease_policy::NICE_MAX),
            Target::Below(levels) => appease_policy::sunk_nice(m.orig.nice, levels),
        };
        let slice_ns = match slice {
            Some(s) => s.as_nanos() as u64,
            None => self.original_slice_arg(&m.orig),
        };
        if nice == m.applied_nice && slice_ns == m.applied_slice_ns {
            return Ok(());
        }
        let base = self.base_slice_ns;
        // Formatted only if the trail admits the line (most are held back in a storm).
        let (from_nice, from_slice_ns) = (m.applied_nice, m.applied_slice_ns);
        self.set(tid, nice, slice_ns)?;
        self.counters.changes += 1;
        let m = self.managed.get_mut(&tid).expect("present");
        if m.why != why {
            m.why = why.to_string();
        }
        m.role = matches!(target, Target::Fixed(_));
        m.sunk = matches!(target, Target::Below(_));
        let change = match target {
            Target::Fixed(_) => Change::Role,
            Target::Below(_) => Change::Sink,
            Target::Levels(_) => Change::Elevate,
        };
        audit!(
            self.trail,
            change,
            pid,
            tid,
            comm = m.comm.as_str(),
            from = sched_text(from_nice, from_slice_ns, base),
            to = sched_text(nice, slice_ns, base),
            why,
            dry_run = self.dry_run.then_some(true)
        );
        Ok(())
    }
}

/// What the daemon asks of a thread: elevate it, put it back, forget it, check it.
impl KernelActuator {
    /// Sets `tid` `levels` nice levels above its original nice (recorded on first
    /// contact), with the given EEVDF slice (None: the thread's original slice). `seen`
    /// is the thread as the request's event described it: a thread that has its id now
    /// but started at another time is not the one to change (`Gone`).
    pub fn elevate(
        &mut self,
        pid: u32,
        tid: u32,
        levels: u32,
        slice: Option<Duration>,
        why: &str,
        seen: Option<Seen<'_>>,
    ) -> Result<(), ActError> {
        self.apply_nice(pid, tid, Target::Levels(levels), slice, why, seen)
    }

    pub fn restore(&mut self, tid: u32, why: &str) -> Result<(), ActError> {
        if !self.managed.contains_key(&tid) {
            return Ok(());
        }
        if let Err(e) = self.verify(tid) {
            return Err(match e {
                ActError::Gone { tid } => self.drop_gone(tid),
                other => other,
            });
        }
        let m = &self.managed[&tid];
        let (orig, key) = (m.orig, m.key);
        let base = self.base_slice_ns;
        // What it has now, for the audit line (`set` records the new state).
        let (from_nice, from_slice_ns) = (m.applied_nice, m.applied_slice_ns);
        let slice = self.original_slice_arg(&orig);
        self.set(tid, orig.nice, slice)?;
        let m = self.managed.remove(&tid).expect("present");
        self.journal(Record::Release { key })?;
        self.counters.restores += 1;
        audit!(
            self.trail,
            Change::Restore,
            pid = key.pid,
            tid,
            comm = m.comm.as_str(),
            from = sched_text(from_nice, from_slice_ns, base),
            to = sched_text(orig.nice, slice, base),
            why,
            dry_run = self.dry_run.then_some(true)
        );
        Ok(())
    }

    /// The thread `tid` that started at `start` (clock ticks after boot) exited: forgets
    /// it, unless the id is managed for a newer thread (the daemon handles a request that
    /// woke it before the events read with it, so an exit can come after the request of
    /// the thread that took its id). False when the exit is such a stale one.
    pub fn forget_exited(&mut self, tid: u32, start: u64) -> bool {
        if self.managed.get(&tid).is_some_and(|m| m.key.start != start) {
            return false;
        }
        self.forget(tid);
        true
    }

    pub fn forget(&mut self, tid: u32) {
        if let Some(m) = self.managed.remove(&tid) {
            let _ignored_on_purpose = self.journal(Record::Release { key: m.key });
        }
        self.left_alone.remove(&tid);
    }

    pub fn audit(&mut self) -> Vec<u32> {
        let tids: Vec<u32> = self.managed.keys().copied().collect();
        let mut dropped = Vec::new();
        for tid in tids {
            match self.verify(tid) {
                Ok(()) => {}
                Err(ActError::Gone { tid }) => {
                    self.drop_gone(tid);
                    dropped.push(tid);
                }
                Err(_) => dropped.push(tid),
            }
        }
        dropped
    }

    pub fn managed(&self) -> Vec<ManagedView> {
        let mut v: Vec<_> = self
            .managed
            .values()
            .map(|m| ManagedView {
                pid: m.key.pid,
                tid: m.key.tid,
                comm: m.comm.clone(),
                class: match (m.role, m.sunk) {
                    (true, _) => "role",
                    (false, true) => "sunk",
                    (false, false) => "latency",
                },
                nice: m.applied_nice,
                original_nice: m.orig.nice,
                slice_ns: m.applied_slice_ns,
                why: m.why.clone(),
                since: m.since,
            })
            .collect();
        v.sort_by_key(|m| (m.pid, m.tid));
        v
    }
}

impl KernelActuator {
    /// Puts every elevated, sunk or role thread back (a step of `restore_all`).
    pub(crate) fn restore_threads(&mut self, report: &mut RestoreReport) {
        let tids: Vec<u32> = self.managed.keys().copied().collect();
        for tid in tids {
            match self.restore(tid, "shutdown") {
                Ok(()) => report.restored += 1,
                Err(ActError::Gone { .. }) => report.gone += 1,
                Err(ActError::HandsOff { .. }) => report.left_alone += 1,
                Err(e) => {
                    tracing::warn!(error = %e, "could not restore thread");
                    report.failed += 1;
                }
            }
        }
    }
}

/// Puts back each thread the journal records (after a crash) that is still the same
/// thread and still has a nice appease gave it; one left as someone else set it since is
/// left alone.
pub(crate) fn restore_journaled(c: &FromJournal, report: &mut RestoreReport) -> Vec<Record> {
    let (k, state) = (c.k, c.state);
    let mut done = Vec::new();
    for p in state.threads.values() {
        let same = k
            .task_stat(p.key.pid, p.key.tid)
            .is_ok_and(|s| s.start == p.key.start);
        let now = if same {
            k.sched_getattr(p.key.tid).ok()
        } else {
            None
        };
        match now {
            None => report.gone += 1,
            Some(now) if !p.ours.contains(&now.nice) || now.policy != p.orig.policy => {
                tracing::info!(
                    tid = p.key.tid,
                    nice = now.nice,
                    "changed by someone else since; left alone"
                );
                report.left_alone += 1;
            }
            Some(_) => {
                let slice = if p.orig.slice_ns == c.base_slice_ns {
                    0
                } else {
                    p.orig.slice_ns
                };
                match k.sched_set_fair(p.key.tid, p.orig.nice, slice, p.orig.reset_on_fork) {
                    Ok(()) => report.restored += 1,
                    Err(e) if sys::is_esrch(&e) => report.gone += 1,
                    Err(e) => {
                        tracing::warn!(tid = p.key.tid, error = %e, "restore failed");
                        report.failed += 1;
                        continue;
                    }
                }
            }
        }
        done.push(Record::Release { key: p.key });
    }
    done
}
