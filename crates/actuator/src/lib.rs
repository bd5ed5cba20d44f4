//! The only code that changes the kernel's scheduling state. Every change is journaled
//! before it is made; nothing is touched that appease must leave alone (real-time and
//! idle-class tasks, kernel threads, appease itself, configured exceptions, threads whose
//! priority someone else changed after appease did), and a recycled tid is never touched.

mod autogroup;
mod branch;
mod group_idle;
pub mod groups;
mod identity;
mod in_place;
pub mod journal;
pub mod private;
mod restore;
mod server_weight;
mod spread;
pub mod sys;
pub mod systemd;
mod threads;
pub mod trail;
mod unit_restore;
mod unit_weight;

use std::collections::HashMap;
use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

pub use autogroup::AutogroupView;
pub use branch::ProcFacts;
pub use groups::{BatchGroup, Groups, MovedView};
pub use identity::{Identity, Seen, ThreadLookup, ThreadNow};
pub use journal::{Journal, JournalState, Pending, PendingMove, Record, TaskKey};
pub use restore::restore_journal;
use threads::Managed;
use trail::Trail;

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
    #[error(transparent)]
    Unit(#[from] systemd::UnitError),
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
    pub counters: ActCounters,
    /// The budgets of the audit trail (one line per change, storms held back).
    pub trail: Trail,
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

/// Seconds since the epoch: what `since` and `started` in appease's status count in.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod testing;

/// The actuator over a fake kernel: what it changes, what it refuses to touch, and that
/// the journal alone can always undo it.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::Sched;
    use crate::sys::{SCHED_BATCH, SCHED_FIFO, SCHED_IDLE};
    use crate::testing::{
        fair, journaled_actuator as actuator, FakeKernel, TempDir, BASE_SLICE_NS,
    };
    use std::time::Duration;

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
        a.elevate(100, 101, 3, slice, "unix-request", None).unwrap();
        assert_eq!(
            k.sched(101),
            Sched {
                nice: 2,
                slice_ns: MS,
                ..custom(5, 4 * MS)
            }
        );
        // A deeper elevation, then the same one again: the second is no change at all.
        a.elevate(100, 101, 6, slice, "unix-request", None).unwrap();
        let before = k.changes();
        a.elevate(100, 101, 6, slice, "unix-request", None).unwrap();
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
        a.restore(101, "faded").unwrap();
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
        a.elevate(
            100,
            100,
            4,
            Some(Duration::from_millis(1)),
            "inet-request",
            None,
        )
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
        a.elevate(100, 100, 5, None, "unix-request", None).unwrap();
        k.renice_by_other(100, 10);
        let err = a.restore(100, "faded").unwrap_err();
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
        let again = a
            .elevate(100, 100, 5, None, "unix-request", None)
            .unwrap_err();
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
        a.elevate(100, 100, 5, None, "unix-request", None).unwrap();
        // The thread ends and its id goes to a new thread at nice -5 by its own choice.
        k.exit(100);
        k.spawn(100, 100, "other", fair(-5));
        let before = k.changes();
        assert!(matches!(
            a.restore(100, "faded"),
            Err(ActError::Gone { tid: 100 })
        ));
        assert_eq!(a.audit(), Vec::<u32>::new());
        let report = a.restore_all();
        assert_eq!(k.changes(), before, "the new thread was not touched");
        assert_eq!(k.sched(100), fair(-5));
        assert_eq!((report.restored, report.failed), (0, 0));
        assert_eq!(a.counters.gone, 1);
    }

    #[test]
    fn a_process_that_has_exited_and_not_been_reaped_is_never_taken() {
        // The real kernel: a zombie is still in /proc and takes a nice, but will never
        // run; a rule that matches its name must not make it a managed thread.
        let dir = TempDir::new("zombie");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let zombie = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.rsplit(") ").next().is_some_and(|r| r.starts_with('Z')))
        };
        let t = std::time::Instant::now();
        while !zombie() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(zombie(), "the child exited and is not reaped yet");
        let before = sys::sched_getattr(pid).unwrap();
        let journal = journal::Journal::open(&dir.0).unwrap();
        let mut a = KernelActuator::new(Some(journal), vec![]).unwrap();
        let err = a.fix_nice(pid, pid, before.nice + 5, "role").unwrap_err();
        assert!(matches!(err, ActError::Gone { .. }), "{err:?}");
        assert_eq!(sys::sched_getattr(pid).unwrap(), before, "not changed");
        assert!(a.managed().is_empty());
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
        child.wait().unwrap();
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
            why(a.elevate(10, 10, 5, None, "r", None)),
            HandsOff::Policy { policy: SCHED_FIFO }
        );
        assert_eq!(
            why(a.elevate(11, 11, 5, None, "r", None)),
            HandsOff::Policy { policy: SCHED_IDLE }
        );
        assert_eq!(
            why(a.elevate(12, 12, 5, None, "r", None)),
            HandsOff::KernelThread
        );
        // The exception names the process: its threads of other names are spared too.
        let backup = HandsOff::Exception {
            comm: "backup".into(),
        };
        assert_eq!(why(a.elevate(13, 14, 5, None, "r", None)), backup);
        assert_eq!(why(a.fix_nice(13, 13, 10, "role")), backup);
        assert_eq!(why(a.elevate(me, me, 5, None, "r", None)), HandsOff::Itself);
        assert_eq!(k.changes(), 0);
        assert_eq!(a.counters.hands_off, 6);
    }

    #[test]
    fn a_refused_change_is_counted_by_errno_and_leaves_nothing_to_undo_wrongly() {
        let (k, dir) = (FakeKernel::new(), TempDir::new("refused"));
        k.spawn(100, 100, "srv", fair(0));
        k.refuse(100, libc::EPERM);
        let mut a = actuator(&k, &dir, &[]);
        let err = a
            .elevate(100, 100, 5, None, "unix-request", None)
            .unwrap_err();
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
        let report = crate::restore::restore_journal_on(&dir.0, &k).unwrap();
        assert_eq!(report.failed, 0);
        assert_eq!(k.sched(100), fair(0));
        assert!(journal::read_pending(&dir.0).unwrap().is_empty());
    }

    #[test]
    fn dry_run_decides_but_changes_nothing() {
        let k = FakeKernel::new();
        k.spawn(100, 100, "srv", fair(0));
        let mut a = KernelActuator::with_kernel(Box::new(k.clone()), None, vec![]).unwrap();
        a.elevate(100, 100, 5, None, "unix-request", None).unwrap();
        a.fix_nice(100, 100, 10, "role").unwrap();
        assert_eq!(
            a.managed()[0].nice,
            10,
            "what it would have done is reported"
        );
        a.idle_in_place(
            100,
            &[crate::in_place::InPlace::new(100, "/", "cpu-bound")],
            "cpu-bound",
        );
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
        a.elevate(100, 100, 5, Some(Duration::from_millis(1)), "r", None)
            .unwrap();
        a.elevate(100, 101, 2, None, "r", None).unwrap();
        a.fix_nice(200, 200, 10, "role").unwrap();
        let procs = [crate::in_place::InPlace::new(300, "/", "cpu-bound")];
        assert_eq!(a.idle_in_place(300, &procs, "cpu-bound"), 1);
        assert_eq!(k.sched(301).policy, SCHED_IDLE);
        // A child born idle from the demoted tree, and an admin's renice meanwhile.
        k.spawn_child(300, 310, 310, "cc1", idle(custom(2, BASE_SLICE_NS)));
        k.renice_by_other(200, 15);
        assert_eq!(k.unjournaled(), Vec::<String>::new());
        // The daemon dies: nothing is put back by it.
        std::mem::forget(a);
        let report = crate::restore::restore_journal_on(&dir.0, &k).unwrap();
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
        let procs = [crate::in_place::InPlace::new(300, "/", "cpu-bound")];
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
        // After a scan, its facts give every parent: no walk at all.
        let plan = [(520, 520, 0), (530, 530, 1)];
        a.spread(&plan, &CPUS);
        let facts: HashMap<u32, ProcFacts> = [520, 530]
            .map(|pid| {
                (
                    pid,
                    ProcFacts {
                        ppid: 1,
                        ..ProcFacts::default()
                    },
                )
            })
            .into();
        let before = k.process_table_walks();
        assert_eq!(a.spread_after_scan(&plan[..1], &CPUS, &facts), 1);
        assert_eq!(k.cpus(530), CPUS.to_vec());
        assert_eq!(a.unspread_after_scan("quiet", &facts), 1);
        assert_eq!(k.cpus(520), CPUS.to_vec());
        assert_eq!(k.process_table_walks(), before);
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
        let report = crate::restore::restore_journal_on(&dir.0, &k).unwrap();
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
