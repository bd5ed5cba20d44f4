//! The only code that changes the kernel's scheduling state. Every change is journaled
//! before it is made; nothing is touched that appease must leave alone (real-time and
//! idle-class tasks, kernel threads, appease itself, configured exceptions, threads whose
//! priority someone else changed after appease did), and a recycled tid is never touched.

mod autogroup;
mod branch;
mod group_idle;
pub mod groups;
mod in_place;
pub mod journal;
mod spread;
pub mod sys;
pub mod systemd;
pub mod trail;

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use appease_policy::elevated_nice;
use serde::Serialize;

pub use autogroup::AutogroupView;
pub use groups::{BatchGroup, Groups, MovedView};
pub use journal::{Journal, JournalState, Pending, PendingMove, Record, TaskKey};
use sys::Sched;
use trail::{audit, Change, Trail};

/// Why appease leaves a thread alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum HandsOff {
    KernelThread,
    Itself,
    /// Real-time, deadline, idle or another non-fair policy.
    Policy {
        policy: u32,
    },
    Exception {
        comm: String,
    },
    /// Someone else changed the nice after appease did.
    ChangedByOther {
        expected: i32,
        found: i32,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ActError {
    #[error("thread {tid} is gone")]
    Gone { tid: u32 },
    #[error("thread {tid} is left alone: {why:?}")]
    HandsOff { tid: u32, why: HandsOff },
    #[error("no CPU cgroup hierarchy to move processes in")]
    NoCgroups,
    #[error(transparent)]
    Cgroup(#[from] appease_cgroup::CgroupError),
    #[error("{op} on thread {tid} failed: {source}")]
    Sys {
        op: &'static str,
        tid: u32,
        #[source]
        source: io::Error,
    },
}

/// A thread appease has changed, for `appease status`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ManagedView {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub class: &'static str,
    pub nice: i32,
    pub original_nice: i32,
    pub slice_ns: u64,
    pub why: String,
    /// Seconds since the epoch when appease first changed the thread.
    pub since: u64,
}

/// A thread's fair-class settings as the audit trail says them (slice 0: the kernel's
/// default).
fn sched_text(nice: i32, slice_ns: u64, base_slice_ns: u64) -> String {
    if slice_ns == 0 || slice_ns == base_slice_ns {
        format!("nice {nice}")
    } else {
        format!("nice {nice}, slice {} us", slice_ns / 1000)
    }
}

/// What putting threads back achieved.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RestoreReport {
    pub restored: u32,
    pub gone: u32,
    pub left_alone: u32,
    pub failed: u32,
}

/// The interface the daemon drives; tests and the simulator use fakes.
pub trait Actuator {
    /// Sets `tid` `levels` nice levels above its original nice (recorded on first use),
    /// with the given EEVDF slice (None: the thread's original slice).
    fn elevate(
        &mut self,
        pid: u32,
        tid: u32,
        levels: u32,
        slice: Option<Duration>,
        why: &str,
    ) -> Result<(), ActError>;
    /// Puts `tid` back to its original nice and slice.
    fn restore(&mut self, tid: u32, why: &str) -> Result<(), ActError>;
    /// The thread exited: drop what is known of it.
    fn forget(&mut self, tid: u32);
    /// Puts every managed thread back (daemon exit).
    fn restore_all(&mut self) -> RestoreReport;
    /// Re-checks every managed thread; returns those no longer managed (gone, or
    /// changed by someone else and now left alone).
    fn audit(&mut self) -> Vec<u32>;
    fn managed(&self) -> Vec<ManagedView>;
    /// Moves a process tree into the idle group; returns how many processes moved.
    /// `members` are (PID, start time) as the caller saw them.
    fn demote(&mut self, root: u32, members: &[(u32, u64)], why: &str) -> Result<usize, ActError>;
    /// Moves a demoted tree back; returns how many processes moved.
    fn promote(&mut self, root: u32, members: &[u32]) -> Result<usize, ActError>;
}

struct Managed {
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

#[derive(Clone, Debug, Default, Serialize)]
pub struct ActCounters {
    pub changes: u64,
    pub restores: u64,
    pub gone: u64,
    pub hands_off: u64,
    pub failures: u64,
    /// The failures by what refused: the errno name (EPERM, EBUSY, ...), or "journal"
    /// and "systemd" for failures that are not a system call's.
    pub failures_by_cause: std::collections::BTreeMap<String, u64>,
    pub demotions: u64,
    pub promotions: u64,
}

impl ActCounters {
    fn fail(&mut self, cause: &str) {
        self.failures += 1;
        *self.failures_by_cause.entry(cause.to_string()).or_default() += 1;
    }

    fn fail_errno(&mut self, e: Option<&io::Error>) {
        let name = e.and_then(io::Error::raw_os_error).map_or_else(
            || "other".to_string(),
            |n| format!("{:?}", nix::errno::Errno::from_raw(n)),
        );
        self.fail(&name);
    }
}

/// Changes the real kernel's state (or, in dry-run mode, only says what it would do).
pub struct KernelActuator {
    /// The kernel it changes (the real one but in this crate's unit tests).
    kernel: Box<dyn sys::Kernel>,
    journal: Option<Journal>,
    managed: HashMap<u32, Managed>,
    left_alone: HashMap<u32, (u64, HandsOff)>,
    exceptions: Vec<String>,
    /// The kernel's default slice, to tell a default slice from a custom one.
    base_slice_ns: u64,
    self_pid: u32,
    dry_run: bool,
    groups: Option<Groups>,
    /// Threads put in SCHED_IDLE in place (tid -> record): see `in_place`.
    idled: HashMap<u32, in_place::Idled>,
    /// systemd units made idle (unit -> record): see `systemd`.
    idle_units: HashMap<String, in_place::IdleUnit>,
    /// Other programs' cgroups made idle in place (path -> record): see `group_idle`.
    idle_groups: HashMap<String, group_idle::IdleGroup>,
    /// The idle group's busy threads pinned one CPU each: see `spread`.
    spread: spread::Spread,
    /// Serving processes' autogroups given a nice: see `autogroup`.
    autogroups: autogroup::Autogroups,
    /// The batch's branches made idle: see `branch`.
    branches: branch::Branches,
    /// The next first contact's thread as the probe saw it (`expect`).
    expected: Option<Identity>,
    pub counters: ActCounters,
    /// The budgets of the audit trail (one line per change, storms held back).
    pub trail: Trail,
}

/// A thread as the probe's event describes it: what a first contact would otherwise
/// read from /proc (a few system calls on the request's path).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub tid: u32,
    /// Start in clock ticks after boot, as /proc counts it.
    pub start: u64,
    pub comm: String,
    /// Its process's name.
    pub proc_comm: String,
}

impl KernelActuator {
    /// `journal` is None in dry-run mode.
    pub fn new(journal: Option<Journal>, exceptions: Vec<String>) -> io::Result<Self> {
        Self::with_kernel(Box::new(sys::Host), journal, exceptions)
    }

    /// The same over another kernel (the unit tests' fake).
    fn with_kernel(
        kernel: Box<dyn sys::Kernel>,
        journal: Option<Journal>,
        exceptions: Vec<String>,
    ) -> io::Result<Self> {
        // This thread's slice was never set by anyone: it is the kernel's default.
        let base_slice_ns = kernel.sched_getattr(0)?.slice_ns;
        Ok(KernelActuator {
            kernel,
            dry_run: journal.is_none(),
            journal,
            managed: HashMap::new(),
            left_alone: HashMap::new(),
            exceptions,
            base_slice_ns,
            self_pid: std::process::id(),
            groups: None,
            idled: HashMap::new(),
            idle_units: HashMap::new(),
            idle_groups: HashMap::new(),
            spread: spread::Spread::default(),
            autogroups: autogroup::Autogroups::default(),
            branches: branch::Branches::default(),
            expected: None,
            counters: ActCounters::default(),
            trail: Trail::default(),
        })
    }

    /// Enables moving processes into appease's groups (idle group, services).
    pub fn with_groups(mut self, groups: Groups) -> Self {
        self.groups = Some(groups);
        self
    }

    pub fn set_exceptions(&mut self, exceptions: Vec<String>) {
        self.exceptions = exceptions;
    }

    /// The next decision about `who.tid`, if it is a first contact, concerns this thread
    /// (from the event that caused it): its identity is not read again from /proc.
    /// Kernel threads never reach here (the probe ignores them). None once that decision
    /// is made, so the identity serves no later one.
    pub fn expect(&mut self, who: Option<Identity>) {
        self.expected = who;
    }

    fn journal(&mut self, rec: Record) -> Result<(), ActError> {
        self.journal_all(std::slice::from_ref(&rec))
    }

    /// Several records in one write.
    fn journal_all(&mut self, recs: &[Record]) -> Result<(), ActError> {
        if let Some(j) = self.journal.as_mut() {
            j.append_all(recs).map_err(|source| ActError::Sys {
                op: "journal write",
                tid: 0,
                source,
            })?;
        }
        Ok(())
    }

    fn leave_alone(&mut self, tid: u32, start: u64, why: HandsOff) -> ActError {
        tracing::info!(tid, ?why, "leaving thread alone");
        self.counters.hands_off += 1;
        self.left_alone.insert(tid, (start, why.clone()));
        ActError::HandsOff { tid, why }
    }

    /// First contact with a thread: check it may be touched, record its original state.
    fn take_charge(&mut self, pid: u32, tid: u32, why: &str) -> Result<Managed, ActError> {
        let gone = |e: io::Error, op| {
            if sys::is_esrch(&e) {
                ActError::Gone { tid }
            } else {
                ActError::Sys { op, tid, source: e }
            }
        };
        // Open the pidfd first: the stat read after it then describes the same thread.
        let pidfd = self.kernel.pidfd_open_thread(tid);
        let expected = self.expected.take().filter(|e| e.tid == tid);
        let (start, comm, proc_comm, kernel_thread) = match expected {
            Some(e) => (e.start, e.comm, Some(e.proc_comm), false),
            None => {
                let stat = self
                    .kernel
                    .task_stat(pid, tid)
                    .map_err(|e| gone(e, "read /proc stat"))?;
                (stat.start, stat.comm, None, stat.kernel_thread)
            }
        };
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

    /// The slice value that gives a thread back its original slice.
    fn original_slice_arg(&self, orig: &Sched) -> u64 {
        if orig.slice_ns == self.base_slice_ns {
            0
        } else {
            orig.slice_ns
        }
    }

    /// Checks the managed thread is alive and still has what appease gave it.
    fn verify(&mut self, tid: u32) -> Result<(), ActError> {
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
        let now = match self.kernel.sched_getattr(tid) {
            Ok(s) => s,
            Err(e) if sys::is_esrch(&e) => return Err(ActError::Gone { tid }),
            Err(source) => {
                return Err(ActError::Sys {
                    op: "sched_getattr",
                    tid,
                    source,
                })
            }
        };
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

    fn drop_gone(&mut self, tid: u32) -> ActError {
        if let Some(m) = self.managed.remove(&tid) {
            let _ignored_on_purpose = self.journal(Record::Release { key: m.key });
        }
        self.counters.gone += 1;
        ActError::Gone { tid }
    }

    fn set(&mut self, tid: u32, nice: i32, slice_ns: u64) -> Result<(), ActError> {
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
            if let Err(e) = self.kernel.sched_set_fair(tid, nice, slice_ns, rof) {
                if sys::is_esrch(&e) {
                    return Err(self.drop_gone(tid));
                }
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
enum Target {
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

    fn restore_each(&mut self, tids: &[u32], why: &str) -> Vec<u32> {
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
        self.apply_nice(pid, tid, Target::Fixed(nice), None, why)
    }

    /// Sets a thread `levels` nice levels below its original nice with its original
    /// slice (a long request), recorded and restored like an elevation.
    pub fn sink(&mut self, pid: u32, tid: u32, levels: u32, why: &str) -> Result<(), ActError> {
        self.apply_nice(pid, tid, Target::Below(levels), None, why)
    }

    fn apply_nice(
        &mut self,
        pid: u32,
        tid: u32,
        target: Target,
        slice: Option<Duration>,
        why: &str,
    ) -> Result<(), ActError> {
        if !self.managed.contains_key(&tid) {
            let m = self.take_charge(pid, tid, why)?;
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

impl Actuator for KernelActuator {
    fn elevate(
        &mut self,
        pid: u32,
        tid: u32,
        levels: u32,
        slice: Option<Duration>,
        why: &str,
    ) -> Result<(), ActError> {
        self.apply_nice(pid, tid, Target::Levels(levels), slice, why)
    }

    fn restore(&mut self, tid: u32, why: &str) -> Result<(), ActError> {
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

    fn forget(&mut self, tid: u32) {
        if let Some(m) = self.managed.remove(&tid) {
            let _ignored_on_purpose = self.journal(Record::Release { key: m.key });
        }
        self.left_alone.remove(&tid);
    }

    fn restore_all(&mut self) -> RestoreReport {
        let mut report = RestoreReport::default();
        // Autogroups first: nothing demoted is back in a raised one meanwhile.
        self.restore_autogroups(&mut report);
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
        // Pins first: the threads are still where unpinning looks for their children.
        self.restore_pins();
        self.restore_groups(&mut report);
        self.restore_in_place(&mut report);
        self.restore_units(&mut report);
        self.restore_idle_groups(&mut report);
        if report.failed == 0 {
            if let Some(j) = self.journal.take() {
                if let Err(e) = j.remove_if_empty() {
                    tracing::warn!(error = %e, "could not remove the journal");
                }
            }
        }
        report
    }

    fn audit(&mut self) -> Vec<u32> {
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

    fn demote(&mut self, root: u32, members: &[(u32, u64)], why: &str) -> Result<usize, ActError> {
        KernelActuator::demote(self, root, members, why)
    }

    fn promote(&mut self, root: u32, members: &[u32]) -> Result<usize, ActError> {
        KernelActuator::promote(self, root, members)
    }

    fn managed(&self) -> Vec<ManagedView> {
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

/// Where the chaos harness may end the daemon as `kill -9` would: a test build's
/// failpoint `name` (feature `failpoints`, configured by the FAILPOINTS environment
/// variable, e.g. `journal-written=5*off->return`) that fires. Nothing in other builds.
#[inline]
pub fn crash_point(name: &str) {
    #[cfg(feature = "failpoints")]
    if fail::eval(name, |_| ()).is_some() {
        // SAFETY: raising a signal at this process.
        unsafe { libc::raise(libc::SIGKILL) };
    }
    let _unused_without_failpoints = name;
}

/// The keys of `map` whose record passes `keep` (to act on while the map changes).
fn keys_where<V>(map: &HashMap<String, V>, keep: impl Fn(&V) -> bool) -> Vec<String> {
    map.iter()
        .filter(|(_, v)| keep(v))
        .map(|(k, _)| k.clone())
        .collect()
}

/// Undoes what a journal in `dir` records (after a crash): each thread that is still the
/// same thread and still has a nice appease gave it goes back to its original state.
pub fn restore_journal(dir: &Path) -> io::Result<RestoreReport> {
    restore_journal_with(dir, &sys::Host)
}

fn restore_journal_with(dir: &Path, k: &dyn sys::Kernel) -> io::Result<RestoreReport> {
    let corrupt = journal::read_pending(dir)?.corrupt;
    if !corrupt.is_empty() {
        // What those lines recorded is lost: the journal is kept as it was for a look,
        // and each counts as a failure. Everything else is still undone.
        let kept = journal::keep_a_copy(dir)?;
        tracing::error!(lines = ?corrupt, kept = %kept.display(), "journal lines could not be read: what they recorded cannot be undone; the journal is kept");
    }
    let mut journal = Journal::open(dir)?;
    let base_slice_ns = k.sched_getattr(0)?.slice_ns;
    let mut report = RestoreReport::default();
    let pending: Vec<Pending> = journal.state().threads.values().cloned().collect();
    for p in pending {
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
                let slice = if p.orig.slice_ns == base_slice_ns {
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
        journal.append(&Record::Release { key: p.key })?;
    }
    let state = journal.state().clone();
    // Autogroups first: nothing demoted is back in a raised one meanwhile.
    for rec in autogroup::restore_journal_autogroups(k, &state, &mut report) {
        journal.append(&rec)?;
    }
    for rec in groups::restore_journal_groups(&state, &mut report) {
        journal.append(&rec)?;
    }
    for rec in in_place::restore_journal_in_place(k, &state, base_slice_ns, &mut report) {
        journal.append(&rec)?;
    }
    for rec in in_place::restore_journal_units(&state, &mut report) {
        journal.append(&rec)?;
    }
    for rec in group_idle::restore_journal_idle_groups(&state, &mut report) {
        journal.append(&rec)?;
    }
    for rec in spread::restore_journal_pins(k, &state, &mut report) {
        journal.append(&rec)?;
    }
    journal.remove_if_empty()?;
    report.failed += corrupt.len() as u32;
    Ok(report)
}

/// Seconds since the epoch, for the `since` appease status shows.
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod testing;

/// The actuator over a fake kernel: what it changes, what it refuses to touch, and that
/// the journal alone can always undo it.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{SCHED_BATCH, SCHED_FIFO, SCHED_IDLE};
    use crate::testing::{
        fair, journaled_actuator as actuator, FakeKernel, TempDir, BASE_SLICE_NS,
    };

    const MS: u64 = 1_000_000;

    /// `s` in SCHED_IDLE (born so, or chosen).
    fn idle(s: Sched) -> Sched {
        Sched {
            policy: SCHED_IDLE,
            ..s
        }
    }

    fn custom(nice: i32, slice_ns: u64) -> Sched {
        Sched {
            policy: SCHED_BATCH,
            nice,
            slice_ns,
            reset_on_fork: true,
        }
    }

    #[test]
    fn an_elevation_is_journaled_first_and_restore_gives_back_nice_slice_policy_and_flags() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("elevate"));
        k.spawn(100, 101, "worker", custom(5, 4 * MS));
        let mut a = actuator(&k, &dir, &[]);
        let slice = Some(Duration::from_millis(1));
        a.elevate(100, 101, 3, slice, "unix-request").unwrap();
        assert_eq!(
            k.sched(101),
            Sched {
                nice: 2,
                slice_ns: MS,
                ..custom(5, 4 * MS)
            }
        );
        // A deeper elevation, then the same one again: the second is no change at all.
        a.elevate(100, 101, 6, slice, "unix-request").unwrap();
        let before = k.changes();
        a.elevate(100, 101, 6, slice, "unix-request").unwrap();
        assert_eq!(
            k.changes(),
            before,
            "an unchanged target makes no system call"
        );
        assert_eq!(k.sched(101).nice, -1);
        let pending = journal::read_pending(&dir.0).unwrap();
        assert_eq!(pending.threads.len(), 1);
        assert_eq!(
            pending.threads.values().next().unwrap().orig,
            custom(5, 4 * MS)
        );
        Actuator::restore(&mut a, 101, "faded").unwrap();
        assert_eq!(k.sched(101), custom(5, 4 * MS));
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
        assert_eq!(k.unjournaled(), Vec::<String>::new());
        assert_eq!((a.counters.changes, a.counters.restores), (2, 1));
    }

    #[test]
    fn a_default_slice_goes_back_as_the_default_not_as_a_number() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("slice"));
        k.spawn(100, 100, "srv", fair(0));
        let mut a = actuator(&k, &dir, &[]);
        a.elevate(100, 100, 4, Some(Duration::from_millis(1)), "inet-request")
            .unwrap();
        assert_eq!(a.managed()[0].slice_ns, MS);
        a.restore_all();
        assert_eq!(k.sched(100), fair(0));
        assert_eq!(k.sched(100).slice_ns, BASE_SLICE_NS);
    }

    #[test]
    fn a_thread_someone_else_reniced_is_left_as_they_set_it_and_not_taken_again() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("other"));
        k.spawn(100, 100, "srv", fair(0));
        let mut a = actuator(&k, &dir, &[]);
        a.elevate(100, 100, 5, None, "unix-request").unwrap();
        k.renice_by_other(100, 10);
        let err = Actuator::restore(&mut a, 100, "faded").unwrap_err();
        assert!(
            matches!(
                err,
                ActError::HandsOff {
                    why: HandsOff::ChangedByOther {
                        expected: -5,
                        found: 10
                    },
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(k.sched(100).nice, 10, "their choice stands");
        let again = a.elevate(100, 100, 5, None, "unix-request").unwrap_err();
        assert!(matches!(again, ActError::HandsOff { .. }), "{again:?}");
        assert_eq!(k.sched(100).nice, 10);
        assert!(a.managed().is_empty());
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
    }

    #[test]
    fn a_recycled_tid_is_never_touched() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("recycled"));
        k.spawn(100, 100, "srv", fair(0));
        let mut a = actuator(&k, &dir, &[]);
        a.elevate(100, 100, 5, None, "unix-request").unwrap();
        // The thread ends and its id goes to a new thread at nice -5 by its own choice.
        k.exit(100);
        k.spawn(100, 100, "other", fair(-5));
        let before = k.changes();
        assert!(matches!(
            Actuator::restore(&mut a, 100, "faded"),
            Err(ActError::Gone { tid: 100 })
        ));
        assert_eq!(Actuator::audit(&mut a), Vec::<u32>::new());
        let report = a.restore_all();
        assert_eq!(k.changes(), before, "the new thread was not touched");
        assert_eq!(k.sched(100), fair(-5));
        assert_eq!((report.restored, report.failed), (0, 0));
        assert_eq!(a.counters.gone, 1);
    }

    #[test]
    fn real_time_idle_kernel_threads_itself_and_exceptions_are_left_alone() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("handsoff"));
        let rt = Sched {
            policy: SCHED_FIFO,
            ..fair(0)
        };
        k.spawn(10, 10, "audio", rt);
        k.spawn(11, 11, "indexer", idle(fair(0)));
        k.kernel_thread(12, "kworker/0:1");
        k.spawn(13, 13, "backup", fair(0));
        k.spawn(13, 14, "gzip-worker", fair(0));
        let me = std::process::id();
        k.spawn(me, me, "appease", fair(0));
        let mut a = actuator(&k, &dir, &["backup"]);
        let why = |r: Result<(), ActError>| match r {
            Err(ActError::HandsOff { why, .. }) => why,
            other => panic!("expected hands off, got {other:?}"),
        };
        assert_eq!(
            why(a.elevate(10, 10, 5, None, "r")),
            HandsOff::Policy { policy: SCHED_FIFO }
        );
        assert_eq!(
            why(a.elevate(11, 11, 5, None, "r")),
            HandsOff::Policy { policy: SCHED_IDLE }
        );
        assert_eq!(why(a.elevate(12, 12, 5, None, "r")), HandsOff::KernelThread);
        // The exception names the process: its threads of other names are spared too.
        let backup = HandsOff::Exception {
            comm: "backup".into(),
        };
        assert_eq!(why(a.elevate(13, 14, 5, None, "r")), backup);
        assert_eq!(why(a.fix_nice(13, 13, 10, "role")), backup);
        assert_eq!(why(a.elevate(me, me, 5, None, "r")), HandsOff::Itself);
        assert_eq!(k.changes(), 0);
        assert_eq!(a.counters.hands_off, 6);
    }

    #[test]
    fn a_refused_change_is_counted_by_errno_and_leaves_nothing_to_undo_wrongly() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("refused"));
        k.spawn(100, 100, "srv", fair(0));
        k.refuse(100, libc::EPERM);
        let mut a = actuator(&k, &dir, &[]);
        let err = a.elevate(100, 100, 5, None, "unix-request").unwrap_err();
        assert!(
            matches!(
                err,
                ActError::Sys {
                    op: "sched_setattr",
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(a.counters.failures_by_cause.get("EPERM"), Some(&1));
        assert_eq!(k.sched(100), fair(0));
        // The journal says it was about to change: a restore from it leaves it as it is.
        std::mem::forget(a);
        k.allow(100);
        let report = restore_journal_with(&dir.0, &k).unwrap();
        assert_eq!(report.failed, 0);
        assert_eq!(k.sched(100), fair(0));
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
    }

    #[test]
    fn dry_run_decides_but_changes_nothing() {
        let k = FakeKernel::new();
        k.spawn(100, 100, "srv", fair(0));
        let mut a = KernelActuator::with_kernel(Box::new(k.clone()), None, vec![]).unwrap();
        a.elevate(100, 100, 5, None, "unix-request").unwrap();
        a.fix_nice(100, 100, 10, "role").unwrap();
        assert_eq!(
            a.managed()[0].nice,
            10,
            "what it would have done is reported"
        );
        a.idle_in_place(100, &[(100, "/".into(), "cpu-bound".into())], "cpu-bound");
        assert!(
            a.managed().is_empty(),
            "demoted: its priority went back first"
        );
        a.restore_all();
        assert_eq!(k.changes(), 0);
        assert_eq!(k.sched(100), fair(0));
    }

    #[test]
    fn after_a_crash_the_journal_alone_puts_back_what_appease_changed_and_nothing_else() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("crash"));
        k.spawn(100, 100, "srv", fair(0));
        k.spawn(100, 101, "srv-worker", custom(3, 5 * MS));
        k.spawn(200, 200, "encoder", fair(0));
        k.spawn(300, 300, "make", custom(2, BASE_SLICE_NS));
        k.spawn(300, 301, "make", custom(2, BASE_SLICE_NS));
        let mut a = actuator(&k, &dir, &[]);
        a.elevate(100, 100, 5, Some(Duration::from_millis(1)), "r")
            .unwrap();
        a.elevate(100, 101, 2, None, "r").unwrap();
        a.fix_nice(200, 200, 10, "role").unwrap();
        let procs = [(300, "/".to_string(), "cpu-bound".to_string())];
        assert_eq!(a.idle_in_place(300, &procs, "cpu-bound"), 1);
        assert_eq!(k.sched(301).policy, SCHED_IDLE);
        // A child born idle from the demoted tree, and an admin's renice meanwhile.
        k.spawn_child(300, 310, 310, "cc1", idle(custom(2, BASE_SLICE_NS)));
        k.renice_by_other(200, 15);
        assert_eq!(k.unjournaled(), Vec::<String>::new());
        // The daemon dies: nothing is put back by it.
        std::mem::forget(a);
        let report = restore_journal_with(&dir.0, &k).unwrap();
        assert_eq!(k.sched(100), fair(0));
        assert_eq!(k.sched(101), custom(3, 5 * MS));
        assert_eq!(k.sched(200).nice, 15, "the admin's choice stands");
        assert_eq!(k.sched(300), custom(2, BASE_SLICE_NS));
        assert_eq!(k.sched(301), custom(2, BASE_SLICE_NS));
        assert_eq!(
            k.sched(310),
            custom(2, BASE_SLICE_NS),
            "the child goes back as its parent"
        );
        assert_eq!(
            (report.restored, report.left_alone, report.failed),
            (5, 1, 0)
        );
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
    }

    #[test]
    fn a_tree_idled_in_place_goes_back_at_exit_with_the_children_born_idle_since() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("inplace"));
        k.spawn(300, 300, "make", custom(2, BASE_SLICE_NS));
        let mut a = actuator(&k, &dir, &[]);
        let procs = [(300, "/".to_string(), "cpu-bound".to_string())];
        a.idle_in_place(300, &procs, "cpu-bound");
        k.spawn_child(300, 310, 310, "cc1", idle(custom(2, BASE_SLICE_NS)));
        k.spawn_child(1, 400, 400, "chosen-idle", idle(fair(0)));
        let report = a.restore_all();
        assert_eq!(k.sched(300), custom(2, BASE_SLICE_NS));
        assert_eq!(k.sched(310), custom(2, BASE_SLICE_NS));
        assert_eq!(
            k.sched(400).policy,
            SCHED_IDLE,
            "idle by its own choice: not ours"
        );
        assert_eq!((report.restored, report.failed), (2, 0));
        assert_eq!(k.unjournaled(), Vec::<String>::new());
    }

    #[test]
    fn busy_threads_are_pinned_journaled_first_moved_and_unpinned_when_no_longer_busy() {
        use crate::testing::CPUS;
        let (k, dir) = (FakeKernel::new(), TempDir::new("spread"));
        for pid in [500, 510] {
            k.spawn(pid, pid, "soak", fair(0));
        }
        let mut a = actuator(&k, &dir, &[]);
        assert_eq!(a.spread_cpus(), CPUS.to_vec());
        assert_eq!(a.spread(&[(500, 500, 0), (510, 510, 1)], &CPUS), 2);
        assert_eq!((k.cpus(500), k.cpus(510)), (vec![0], vec![1]));
        let pinned = journal::read_pending(&dir.0).unwrap().pinned;
        assert_eq!(pinned.len(), 2);
        assert!(pinned.values().all(|orig| orig == &CPUS));
        // The next round turns the order: each moves, nothing new is journaled.
        assert_eq!(a.spread(&[(500, 500, 1), (510, 510, 0)], &CPUS), 2);
        assert_eq!((k.cpus(500), k.cpus(510)), (vec![1], vec![0]));
        // 510 is no longer busy: every CPU back, and its record closed.
        assert_eq!(a.spread(&[(500, 500, 1)], &CPUS), 1);
        assert_eq!(k.cpus(510), CPUS.to_vec());
        assert_eq!(journal::read_pending(&dir.0).unwrap().pinned.len(), 1);
        assert_eq!(a.unspread("quiet"), 1);
        assert_eq!(k.cpus(500), CPUS.to_vec());
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
        assert_eq!(k.unjournaled(), Vec::<String>::new());
    }

    #[test]
    fn the_unpins_of_a_round_walk_the_process_table_once() {
        use crate::testing::CPUS;
        let (k, dir) = (FakeKernel::new(), TempDir::new("spread-walks"));
        for pid in [520, 530, 540, 550] {
            k.spawn(pid, pid, "soak", fair(0));
        }
        let mut a = actuator(&k, &dir, &[]);
        a.spread(
            &[(520, 520, 0), (530, 530, 1), (540, 540, 2), (550, 550, 3)],
            &CPUS,
        );
        let before = k.process_table_walks();
        // None busy any more: four unpins, each looking for the children that inherited
        // its CPU, from one reading of the process table.
        assert_eq!(a.spread(&[], &CPUS), 0);
        assert_eq!(k.process_table_walks() - before, 1);
        for pid in [520, 530, 540, 550] {
            assert_eq!(k.cpus(pid), CPUS.to_vec());
        }
    }

    #[test]
    fn a_pinned_process_that_ended_is_unpinned_without_walking_the_process_table() {
        use crate::testing::CPUS;
        let (k, dir) = (FakeKernel::new(), TempDir::new("spread-ended"));
        for pid in [560, 570] {
            k.spawn(pid, pid, "cc1", fair(0));
        }
        let mut a = actuator(&k, &dir, &[]);
        assert_eq!(a.spread(&[(560, 560, 0), (570, 570, 1)], &CPUS), 2);
        k.exit(560);
        let before = k.process_table_walks();
        assert_eq!(a.spread(&[(570, 570, 1)], &CPUS), 1);
        assert_eq!(
            k.process_table_walks(),
            before,
            "the ended one has no children to find"
        );
        assert_eq!(journal::read_pending(&dir.0).unwrap().pinned.len(), 1);
        // One that lives still gives back what its children inherited.
        assert_eq!(a.spread(&[], &CPUS), 0);
        assert_eq!(k.process_table_walks() - before, 1);
        assert_eq!(k.cpus(570), CPUS.to_vec());
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
    }

    #[test]
    fn a_thread_with_cpus_of_its_own_is_never_pinned_nor_one_repinned_by_someone_else() {
        use crate::testing::CPUS;
        let (k, dir) = (FakeKernel::new(), TempDir::new("spread-own"));
        k.spawn(600, 600, "own-cpus", fair(0));
        k.pin_by_other(600, &[2, 3]);
        k.spawn(610, 610, "soak", fair(0));
        let mut a = actuator(&k, &dir, &[]);
        assert_eq!(a.spread(&[(600, 600, 0), (610, 610, 1)], &CPUS), 1);
        assert_eq!(k.cpus(600), vec![2, 3], "its own choice stays");
        assert_eq!(k.cpus(610), vec![1]);
        // The owner pins 610 elsewhere: from then on it is theirs, also at exit.
        k.pin_by_other(610, &[3]);
        assert_eq!(a.spread(&[(600, 600, 1), (610, 610, 0)], &CPUS), 0);
        assert_eq!((k.cpus(600), k.cpus(610)), (vec![2, 3], vec![3]));
        a.restore_all();
        assert_eq!((k.cpus(600), k.cpus(610)), (vec![2, 3], vec![3]));
        assert!(journal::read_pending(&dir.0).unwrap().pinned.is_empty());
        let _all = CPUS;
    }

    #[test]
    fn a_child_born_on_a_pinned_threads_cpu_gets_every_cpu_back_with_it() {
        use crate::testing::CPUS;
        let (k, dir) = (FakeKernel::new(), TempDir::new("spread-child"));
        k.spawn(700, 700, "sh-loop", fair(0));
        let mut a = actuator(&k, &dir, &[]);
        a.spread(&[(700, 700, 2)], &CPUS);
        // It forks: the child and a new thread inherit its one CPU.
        k.spawn_child(700, 710, 710, "child", fair(0));
        k.pin_by_other(710, &[2]);
        k.spawn(700, 701, "sh-loop", fair(0));
        k.pin_by_other(701, &[2]);
        // A busy child is adopted (its CPUs before are its parent's), not taken as its own.
        assert_eq!(a.spread(&[(700, 700, 0), (710, 710, 1)], &CPUS), 2);
        assert_eq!(k.cpus(710), vec![1]);
        let report = a.restore_all();
        assert_eq!(report.failed, 0);
        for tid in [700, 701, 710] {
            assert_eq!(k.cpus(tid), CPUS.to_vec(), "tid {tid}");
        }
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
    }

    #[test]
    fn after_a_crash_the_journal_gives_pinned_threads_their_cpus_back() {
        use crate::testing::CPUS;
        let (k, dir) = (FakeKernel::new(), TempDir::new("spread-crash"));
        k.spawn(800, 800, "soak", fair(0));
        k.spawn(810, 810, "soak", fair(0));
        k.spawn(820, 820, "soak", fair(0));
        let mut a = actuator(&k, &dir, &[]);
        a.spread(&[(800, 800, 0), (810, 810, 1), (820, 820, 2)], &CPUS);
        std::mem::forget(a); // the daemon dies: nothing put back
        k.pin_by_other(810, &[0, 1]); // changed by someone else since
        k.exit(820);
        let report = restore_journal_with(&dir.0, &k).unwrap();
        assert_eq!(k.cpus(800), CPUS.to_vec());
        assert_eq!(k.cpus(810), vec![0, 1], "someone else's now");
        assert_eq!(
            (
                report.restored,
                report.left_alone,
                report.gone,
                report.failed
            ),
            (1, 1, 1, 0)
        );
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
    }
}
