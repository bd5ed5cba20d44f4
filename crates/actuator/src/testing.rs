//! A kernel for the actuator's unit tests: threads with a scheduling state that the
//! tests create, end, recycle and change behind the actuator's back, and that check,
//! at each change, that the journal already says how to undo it.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::journal;
use crate::sys::{Autogroup, Kernel, Sched, TaskStat, SCHED_IDLE, SCHED_NORMAL};
use crate::systemd::{Unit, UnitControl, UnitError};

/// An actuator over `k` whose journal is in `dir`, which `k` reads at each change to
/// check the undo was journaled first.
pub fn journaled_actuator(
    k: &FakeKernel,
    dir: &TempDir,
    exceptions: &[&str],
) -> crate::KernelActuator {
    k.watch_journal(&dir.0);
    let journal = journal::Journal::open(&dir.0).unwrap();
    let ex = exceptions.iter().map(|s| s.to_string()).collect();
    crate::KernelActuator::with_kernel(Box::new(k.clone()), Some(journal), ex).unwrap()
}

/// The kernel's default slice in the fake (this host's value does not matter).
pub const BASE_SLICE_NS: u64 = 2_800_000;
/// The fake host's CPUs.
pub const CPUS: [usize; 4] = [0, 1, 2, 3];

#[derive(Clone, Debug)]
pub struct Task {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    pub start: u64,
    pub kernel_thread: bool,
    pub sched: Sched,
    /// Its session's leader (itself unless `lead` says otherwise).
    pub session: u32,
    /// The CPUs it may run on.
    pub cpus: Vec<usize>,
}

#[derive(Default)]
struct State {
    tasks: BTreeMap<u32, Task>,
    next_start: u64,
    /// Threads whose every change is refused with this errno.
    refuse: BTreeMap<u32, i32>,
    /// Where the actuator's journal is: each change is checked against it.
    journal: Option<PathBuf>,
    /// Changes the journal did not record before they were made.
    unjournaled: Vec<String>,
    changes: u64,
    /// Walks of the process table (each reads every process's stat on a real host).
    process_table_walks: u64,
    /// Reads of a thread's stat file.
    stat_reads: u64,
    /// Process -> its session's autogroup (none: autogroups off for it).
    session_of: BTreeMap<u32, u64>,
    /// Autogroup -> its nice.
    autogroup_nice: BTreeMap<u64, i32>,
    /// `sched_autogroup_enabled` is 0.
    autogroups_off: bool,
    /// The next this many autogroup writes are refused with EAGAIN (the kernel's limit).
    autogroup_busy: u32,
}

/// Shared: the test keeps a handle while the actuator owns another.
#[derive(Clone, Default)]
pub struct FakeKernel(Arc<Mutex<State>>);

pub fn fair(nice: i32) -> Sched {
    Sched {
        policy: SCHED_NORMAL,
        nice,
        slice_ns: BASE_SLICE_NS,
        reset_on_fork: false,
    }
}

impl FakeKernel {
    pub fn new() -> Self {
        let k = FakeKernel::default();
        k.state().next_start = 1000;
        // The caller's own thread (`sched_getattr(0)`): the default slice.
        k.spawn(0, 0, "self", fair(0));
        k
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().expect("no test panicked holding it")
    }

    /// Checks every later change against the journal in `dir`.
    pub fn watch_journal(&self, dir: &Path) {
        self.state().journal = Some(dir.to_path_buf());
    }

    /// A new thread `tid` of process `pid` (its main thread if equal), child of PID 1.
    pub fn spawn(&self, pid: u32, tid: u32, comm: &str, sched: Sched) -> u64 {
        self.spawn_child(1, pid, tid, comm, sched)
    }

    pub fn spawn_child(&self, ppid: u32, pid: u32, tid: u32, comm: &str, sched: Sched) -> u64 {
        let mut s = self.state();
        s.next_start += 1;
        let start = s.next_start;
        s.tasks.insert(
            tid,
            Task {
                pid,
                ppid,
                comm: comm.to_string(),
                start,
                kernel_thread: false,
                sched,
                session: pid,
                cpus: CPUS.to_vec(),
            },
        );
        start
    }

    pub fn kernel_thread(&self, tid: u32, comm: &str) {
        self.spawn(tid, tid, comm, fair(0));
        self.state()
            .tasks
            .get_mut(&tid)
            .expect("just made")
            .kernel_thread = true;
    }

    pub fn exit(&self, tid: u32) {
        self.state().tasks.remove(&tid);
    }

    pub fn sched(&self, tid: u32) -> Sched {
        self.state().tasks[&tid].sched
    }

    /// Someone else (the owner, an admin) sets the thread's nice.
    pub fn renice_by_other(&self, tid: u32, nice: i32) {
        self.state().tasks.get_mut(&tid).expect("exists").sched.nice = nice;
    }

    pub fn cpus(&self, tid: u32) -> Vec<usize> {
        self.state().tasks[&tid].cpus.clone()
    }

    /// Someone else (the owner, a cpuset) sets the thread's CPUs.
    pub fn pin_by_other(&self, tid: u32, cpus: &[usize]) {
        self.state().tasks.get_mut(&tid).expect("exists").cpus = cpus.to_vec();
    }

    /// Process `pid` is in autogroup `id` (made at nice 0 if new).
    pub fn join_autogroup(&self, pid: u32, id: u64) {
        let mut s = self.state();
        s.session_of.insert(pid, id);
        s.autogroup_nice.entry(id).or_insert(0);
    }

    /// `leader` leads the session of each of `members`.
    pub fn lead(&self, leader: u32, members: &[u32]) {
        let mut s = self.state();
        for m in members {
            for t in s.tasks.values_mut().filter(|t| t.pid == *m) {
                t.session = leader;
            }
        }
    }

    /// `sched_autogroup_enabled` set to 0 (or back to 1).
    pub fn autogroups_off(&self, off: bool) {
        self.state().autogroups_off = off;
    }

    /// The next `n` autogroup writes are refused with EAGAIN, as the kernel refuses a
    /// second write within 100 ms.
    pub fn autogroup_busy(&self, n: u32) {
        self.state().autogroup_busy = n;
    }

    pub fn autogroup_nice(&self, id: u64) -> i32 {
        self.state().autogroup_nice[&id]
    }

    /// Someone else (the session's owner) sets the autogroup's nice.
    pub fn renice_autogroup_by_other(&self, id: u64, nice: i32) {
        self.state().autogroup_nice.insert(id, nice);
    }

    pub fn refuse(&self, tid: u32, errno: i32) {
        self.state().refuse.insert(tid, errno);
    }

    pub fn allow(&self, tid: u32) {
        self.state().refuse.remove(&tid);
    }

    /// Changes made that the journal did not hold first.
    pub fn unjournaled(&self) -> Vec<String> {
        self.state().unjournaled.clone()
    }

    /// How often the process table was walked.
    pub fn stat_reads(&self) -> u64 {
        self.state().stat_reads
    }

    pub fn process_table_walks(&self) -> u64 {
        self.state().process_table_walks
    }

    /// How many changes the kernel accepted.
    pub fn changes(&self) -> u64 {
        self.state().changes
    }

    /// Applies `to` to `tid` as the kernel would, after checking the journal.
    fn change(&self, tid: u32, to: impl FnOnce(&mut Sched)) -> io::Result<()> {
        let mut s = self.state();
        if let Some(&errno) = s.refuse.get(&tid) {
            return Err(io::Error::from_raw_os_error(errno));
        }
        let Some(task) = s.tasks.get(&tid).cloned() else {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        };
        let mut next = task.sched;
        to(&mut next);
        if next.slice_ns == 0 {
            next.slice_ns = BASE_SLICE_NS;
        }
        if let Some(dir) = s.journal.clone() {
            if !journal_covers(&dir, tid, &task, &next) {
                s.unjournaled
                    .push(format!("tid {tid}: {:?} -> {next:?}", task.sched));
            }
        }
        s.tasks.get_mut(&tid).expect("checked").sched = next;
        s.changes += 1;
        Ok(())
    }
}

/// Whether the journal in `dir` says how to undo `task` going to `next`: a change that
/// takes a thread away from its original needs the original recorded first (and, for a
/// nice, that nice among appease's); taking a thread out of SCHED_IDLE (putting back
/// what was idled, recorded or inherited) needs nothing.
fn journal_covers(dir: &Path, tid: u32, task: &Task, next: &Sched) -> bool {
    let Ok(state) = journal::read_pending(dir) else {
        return false;
    };
    let key = |k: &journal::TaskKey| k.tid == tid && k.start == task.start;
    if next.policy == SCHED_IDLE {
        return state.idled.keys().any(key);
    }
    match state.threads.values().find(|p| key(&p.key)) {
        Some(p) => next.nice == p.orig.nice || p.ours.contains(&next.nice),
        None => task.sched.policy == SCHED_IDLE,
    }
}

/// The probe's answer, as the daemon's lookup gives it: the fake's threads as they are.
impl crate::ThreadLookup for FakeKernel {
    fn thread_now(&mut self, tid: u32) -> Option<Option<crate::ThreadNow>> {
        Some(self.state().tasks.get(&tid).map(|t| crate::ThreadNow {
            pid: t.pid,
            start: t.start,
            kernel_thread: t.kernel_thread,
        }))
    }
}

fn stat_of(t: &Task) -> TaskStat {
    TaskStat {
        comm: t.comm.clone(),
        kernel_thread: t.kernel_thread,
        nice: t.sched.nice,
        start: t.start,
        policy: t.sched.policy,
        session: t.session,
    }
}

fn gone() -> io::Error {
    io::Error::from_raw_os_error(libc::ESRCH)
}

impl Kernel for FakeKernel {
    fn sched_getattr(&self, tid: u32) -> io::Result<Sched> {
        self.state()
            .tasks
            .get(&tid)
            .map(|t| t.sched)
            .ok_or_else(gone)
    }

    fn sched_set_fair(&self, tid: u32, nice: i32, slice_ns: u64, rof: bool) -> io::Result<()> {
        self.change(tid, |s| {
            *s = Sched {
                nice,
                slice_ns,
                reset_on_fork: rof,
                ..*s
            }
        })
    }

    fn sched_set_policy(&self, tid: u32, to: Sched) -> io::Result<()> {
        self.change(tid, |s| *s = to)
    }

    fn task_stat(&self, pid: u32, tid: u32) -> io::Result<TaskStat> {
        let mut s = self.state();
        s.stat_reads += 1;
        let t = s
            .tasks
            .get(&tid)
            .filter(|t| t.pid == pid)
            .ok_or_else(gone)?;
        Ok(stat_of(t))
    }

    fn threads_of(&self, pid: u32) -> Vec<u32> {
        let s = self.state();
        s.tasks
            .iter()
            .filter(|(_, t)| t.pid == pid)
            .map(|(&tid, _)| tid)
            .collect()
    }

    fn pidfd_open_thread(&self, _tid: u32) -> Option<OwnedFd> {
        None // liveness then comes from the start time, which the fake controls
    }

    fn comm(&self, pid: u32) -> Option<String> {
        self.state().tasks.get(&pid).map(|t| t.comm.clone())
    }

    fn ppid(&self, pid: u32) -> Option<u32> {
        self.state().tasks.get(&pid).map(|t| t.ppid)
    }

    fn processes(&self) -> Vec<u32> {
        let mut s = self.state();
        s.process_table_walks += 1;
        let mut pids: Vec<u32> = s.tasks.values().map(|t| t.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    fn affinity(&self, tid: u32) -> io::Result<Vec<usize>> {
        self.state()
            .tasks
            .get(&tid)
            .map(|t| t.cpus.clone())
            .ok_or_else(gone)
    }

    /// Checked like a scheduling change: narrowing a thread's CPUs needs its original
    /// set in the journal first; putting every CPU back needs nothing.
    fn set_affinity(&self, tid: u32, cpus: &[usize]) -> io::Result<()> {
        let mut s = self.state();
        if let Some(&errno) = s.refuse.get(&tid) {
            return Err(io::Error::from_raw_os_error(errno));
        }
        let Some(task) = s.tasks.get(&tid).cloned() else {
            return Err(gone());
        };
        if let Some(dir) = s.journal.clone() {
            let covered = cpus == CPUS
                || journal::read_pending(&dir).is_ok_and(|st| {
                    st.pinned
                        .keys()
                        .any(|k| k.tid == tid && k.start == task.start)
                });
            if !covered {
                s.unjournaled
                    .push(format!("tid {tid}: cpus {:?} -> {cpus:?}", task.cpus));
            }
        }
        s.tasks.get_mut(&tid).expect("checked").cpus = cpus.to_vec();
        s.changes += 1;
        Ok(())
    }

    fn online_cpus(&self) -> Vec<usize> {
        CPUS.to_vec()
    }

    fn autogroups_enabled(&self) -> bool {
        !self.state().autogroups_off
    }

    fn autogroup(&self, pid: u32) -> Option<Autogroup> {
        let s = self.state();
        s.tasks.get(&pid)?;
        let id = *s.session_of.get(&pid)?;
        Some(Autogroup {
            id,
            nice: s.autogroup_nice[&id],
        })
    }

    /// Checked like a scheduling change: a nice other than the autogroup's original
    /// needs the original in the journal first.
    fn set_autogroup_nice(&self, pid: u32, nice: i32) -> io::Result<()> {
        let mut s = self.state();
        if let Some(&errno) = s.refuse.get(&pid) {
            return Err(io::Error::from_raw_os_error(errno));
        }
        if !s.tasks.contains_key(&pid) {
            return Err(gone());
        }
        let Some(&id) = s.session_of.get(&pid) else {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        };
        if s.autogroup_busy > 0 {
            s.autogroup_busy -= 1;
            return Err(io::Error::from_raw_os_error(libc::EAGAIN));
        }
        let was = s.autogroup_nice[&id];
        if let Some(dir) = s.journal.clone() {
            let covered = journal::read_pending(&dir).is_ok_and(|st| {
                st.autogroups
                    .get(&id)
                    .is_some_and(|a| a.orig == nice || a.nice == nice)
            });
            if !covered {
                s.unjournaled
                    .push(format!("autogroup {id}: nice {was} -> {nice}"));
            }
        }
        s.autogroup_nice.insert(id, nice);
        s.changes += 1;
        Ok(())
    }

    fn system_bus(&self) -> Result<Box<dyn UnitControl>, UnitError> {
        Ok(Box::new(NoUnits))
    }
}

/// A system bus on which every unit is gone (the fake host runs no systemd units).
struct NoUnits;

impl UnitControl for NoUnits {
    fn unit_of(&self, pid: u32) -> Result<Unit, UnitError> {
        Err(no_unit(&format!("of pid {pid}")))
    }
    fn cpu_weight(&self, unit: &str) -> Result<u64, UnitError> {
        Err(no_unit(unit))
    }
    fn set_cpu_weight(&self, unit: &str, _weight: u64) -> Result<(), UnitError> {
        Err(no_unit(unit))
    }
    fn unit_gone(&self, _unit: &str) -> bool {
        true
    }
    fn unit_at(&self, cgroup: &str) -> Result<Unit, UnitError> {
        Err(no_unit(cgroup))
    }
}

fn no_unit(unit: &str) -> UnitError {
    UnitError::Unit {
        unit: unit.to_string(),
        what: "not loaded".into(),
    }
}

/// A fresh directory under the system's temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("appease-act-{tag}-{}", std::process::id()));
        let _fresh = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _best_effort = std::fs::remove_dir_all(&self.0);
    }
}

/// systemd as the actuator sees it through `UnitControl`: one unit owning the root of
/// the in-place tests' fake tree, which can refuse calls or go away.
#[derive(Default)]
pub struct FakeSystemd {
    pub weight: u64,
    pub refuse_set: bool,
    pub gone: bool,
    /// Every call, in order.
    pub calls: Vec<String>,
}

pub struct Bus(pub Arc<Mutex<FakeSystemd>>);

pub const UNIT: &str = "backup.service";

fn refused(what: &str) -> UnitError {
    UnitError::Unit {
        unit: UNIT.into(),
        what: what.into(),
    }
}

impl UnitControl for Bus {
    fn unit_of(&self, pid: u32) -> Result<Unit, UnitError> {
        let mut s = self.0.lock().unwrap();
        s.calls.push(format!("unit_of {pid}"));
        if s.gone {
            return Err(refused("not loaded"));
        }
        Ok(Unit {
            id: UNIT.into(),
            cgroup: "/".into(),
            transient: true,
        })
    }
    fn cpu_weight(&self, _: &str) -> Result<u64, UnitError> {
        let s = self.0.lock().unwrap();
        if s.gone {
            return Err(refused("not loaded"));
        }
        Ok(s.weight)
    }
    fn set_cpu_weight(&self, _: &str, weight: u64) -> Result<(), UnitError> {
        let mut s = self.0.lock().unwrap();
        s.calls.push(format!("set {weight}"));
        if s.refuse_set || s.gone {
            return Err(refused("access denied"));
        }
        s.weight = weight;
        Ok(())
    }
    fn unit_gone(&self, _: &str) -> bool {
        self.0.lock().unwrap().gone
    }
    fn unit_at(&self, cgroup: &str) -> Result<Unit, UnitError> {
        Err(refused(&format!("no unit owns {cgroup} here")))
    }
}
