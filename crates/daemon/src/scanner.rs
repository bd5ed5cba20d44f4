//! The process scan, off the event loop: a thread of its own, in the idle class unless
//! that starves it (`STALL_NS`), reads
//! the process table (from the probe's task iterator, else /proc) when the loop asks,
//! classifies it (batch trees, rules, services, roles, the idle group's share) and hands
//! back what to do; the loop, which must stay free for elevations, only acts on it.
//! An eventfd wakes the loop when a scan is done.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use appease_actuator::ProcFacts;
use appease_config::{Config, ProcessFacts};
use appease_policy::batch::{BatchClassifier, BatchDecision, Class, ProcSample};
use appease_policy::spread::BusyThread;
use appease_probe::{TaskIter, TaskRecord};
use serde::{Deserialize, Serialize};

use crate::host;

/// What the loop asks of a scan.
#[derive(Clone, Debug)]
pub struct ScanRequest {
    pub cfg: Arc<Config>,
    /// The idle group, if there is one: the scan reads its members.
    pub batch_group: Option<appease_actuator::BatchGroup>,
    /// pid -> (its start, when any of its threads last received a request).
    pub last_request: HashMap<u32, (u64, u64)>,
    /// Trees the loop could not demote or promote, or found gone: forgotten.
    pub forget: Vec<u32>,
    /// The idle group was removed (it was empty): every demoted tree is forgotten, and
    /// one still soaking is demoted again like a new one.
    pub forget_demoted: bool,
}

/// What a scan found to do, and what it cost.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Monotonic ns when the reading began.
    pub taken_at: u64,
    /// Trees to move to the idle group: (pid, start) of each member as the scan saw it.
    pub demotions: Vec<Demotion>,
    /// Processes found in demoted trees since, to move where their tree went: (pid,
    /// start) as the scan saw them.
    pub follows: Vec<Follow>,
    /// Demoted trees to move back.
    pub promotions: Vec<Promotion>,
    /// Processes of demoted trees the config now exempts.
    pub releases: Vec<Release>,
    /// Each configured service's processes.
    pub services: Vec<ServiceProcess>,
    /// Role processes by pid.
    pub roles: HashMap<u32, RoleProcess>,
    /// The idle group since the last scan (none on the first, or while it is empty).
    pub floor: Option<FloorSample>,
    /// Every process in a demoted tree after this scan.
    pub demoted: HashSet<u32>,
    /// The applications (servers) with a process in a demoted tree: their serving
    /// threads' lock waits may wait on the idle group.
    pub demoted_apps: HashSet<u32>,
    /// Of the processes asked about (`last_request`), those that are gone: (pid, start).
    pub gone: Vec<(u32, u64)>,
    /// The idle group's busy threads (`[batch] spread`), to be spread over the CPUs.
    pub busy_batch: Vec<BusyThread>,
    /// Threads running or waiting for a CPU in an idle cgroup at the scan: no competition
    /// for a server, so the load signal leaves them out.
    pub idle_group_runnable: u32,
    /// Threads of the `SCHED_IDLE` policy running or waiting outside idle cgroups: the
    /// kernel counts them as idle, but in a group of their own they compete at its full
    /// weight, so the load signal counts them.
    pub sched_idle_runnable: u32,
    /// Every process as this scan read it, for the loop's rules that would otherwise read
    /// /proc again at `SCHED_FIFO` (the batch's branch). Empty when demotion is off.
    pub facts: HashMap<u32, ProcFacts>,
    pub cost: ScanCost,
}

/// A demoted tree to move back: its root and its members.
#[derive(Debug, PartialEq)]
pub struct Promotion {
    pub root: u32,
    pub members: Vec<u32>,
}

/// Processes found in the demoted tree under `root` since the last scan.
#[derive(Debug, PartialEq)]
pub struct Follow {
    pub root: u32,
    pub members: Vec<(u32, u64)>,
}

/// A process of a demoted tree (`root`) that the config now exempts.
#[derive(Debug, PartialEq)]
pub struct Release {
    pub root: u32,
    pub pid: u32,
}

/// A configured service's main process, its group, and the processes placed with it
/// (the pid and its children).
#[derive(Debug, PartialEq)]
pub struct ServiceProcess {
    pub pid: u32,
    pub group: String,
    pub members: Vec<u32>,
}

/// A process a role applies to: its fixed nice, the role's label, its start time.
#[derive(Debug, PartialEq)]
pub struct RoleProcess {
    pub nice: i32,
    pub label: String,
    pub start: u64,
}

#[derive(Debug)]
pub struct Demotion {
    pub root: u32,
    pub members: Vec<(u32, u64)>,
    pub why: String,
    /// It read responses while it soaked (see `BatchDecision::Demote`).
    pub feeds: bool,
}

/// The idle group's use since the last scan.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FloorSample {
    /// Share of all CPUs, percent.
    pub share_pct: f64,
    /// Its processes have runnable work: they waited more than a tenth of the time, or
    /// one is runnable now (a thread starved all scan long adds nothing to its waiting
    /// until it next gets the CPU).
    pub waiting: bool,
    pub processes: usize,
}

/// The process table at one moment.
#[derive(Debug, Default)]
struct Reading {
    procs: Vec<ProcSample>,
    /// Processes with a thread running or waiting for a CPU now (with /proc: of those
    /// in the idle group only).
    runnable: HashSet<u32>,
    cgroups: HashMap<u32, String>,
    uids: HashMap<u32, u32>,
    /// Executables (/proc/PID/exe), read only when a matcher names one.
    exes: HashMap<u32, PathBuf>,
    /// Processes that belong to another's application (a server's forks): pid -> app.
    apps: HashMap<u32, u32>,
    /// Each process's cgroups by kernfs id (none known when reading /proc).
    cgroup_ids: HashMap<u32, appease_cgroup::CgroupIds>,
    /// Threads running or waiting in an idle cgroup (none counted when reading /proc).
    idle_group_runnable: u32,
    /// `SCHED_IDLE` threads running or waiting outside idle cgroups (as above).
    sched_idle_runnable: u32,
    cost: ScanCost,
}

/// What one scan cost the scanner thread.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ScanCost {
    /// "task iterator" or "/proc".
    pub source: String,
    pub processes: usize,
    pub threads: usize,
    /// CPU time of the scanner thread for this scan, reading and classifying, µs
    /// (kernel time included).
    pub cpu_us: u64,
    pub wall_us: u64,
}

/// A scan not done this long after it was asked for is starved in the idle class:
/// work of the normal class keeps every CPU busy, which is when a scan must not wait
/// (a soaker not demoted yet). The scan is raised to the normal class for its rest.
pub const STALL_NS: u64 = 50_000_000;

pub struct Scanner {
    requests: Option<Sender<ScanRequest>>,
    snapshots: Receiver<Snapshot>,
    wake: OwnedFd,
    pending: bool,
    thread: Option<JoinHandle<()>>,
    /// The scanner thread's id (0 until it has started).
    tid: Arc<AtomicU32>,
    /// Scans may wait in the idle class: cleared when a raise is refused, since an idle
    /// scan that cannot be raised could wait for seconds.
    idle_class: Arc<AtomicBool>,
    /// When the scan under way was asked for, and whether it has been raised.
    asked_at: u64,
    raised: bool,
    /// Scans raised to the normal class because they stalled.
    pub raised_scans: u64,
}

impl Scanner {
    /// Starts the scanner thread; `iter` is the probe's task iterator, if it has one;
    /// `listening` the processes (pid, start) that held a listening socket before the
    /// probe could see them listen.
    pub fn start(
        iter: Option<TaskIter>,
        cfg: &Config,
        listening: HashSet<(u32, u64)>,
    ) -> std::io::Result<Self> {
        // SAFETY: eventfd returns a new fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor owned by nobody else.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        let ping = wake.try_clone()?;
        let params = cfg.batch_params();
        let (req_tx, req_rx) = mpsc::channel::<ScanRequest>();
        let (snap_tx, snap_rx) = mpsc::channel::<Snapshot>();
        let tid = Arc::new(AtomicU32::new(0));
        let tid_of_thread = Arc::clone(&tid);
        let idle_class = Arc::new(AtomicBool::new(true));
        let idle_class_of_thread = Arc::clone(&idle_class);
        let thread = std::thread::Builder::new()
            .name("appease-scan".into())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                tid_of_thread.store(unsafe { libc::gettid() } as u32, Ordering::Relaxed);
                let mut worker = Worker::new(Source::new(iter), &params, listening);
                // Each scan waits in the idle class: the loop asks for it on the CPU
                // where a request was just read, and in the normal class the scan took
                // the CPU from that request for a millisecond (at nice -20, 16 ms with
                // 10,000 processes). In the idle class it waits for a moment no server
                // wants; `raise_if_stalled` ends the wait when there is no such moment.
                // The class is set between scans, never during one: set at its start, it
                // would undo a raise that came while the thread waited to run.
                let idle = || {
                    if !idle_class_of_thread.load(Ordering::Relaxed) {
                        return;
                    }
                    if let Err(e) = host::set_thread_idle_class(0, true) {
                        tracing::debug!(error = %e, "the scanner could not enter the idle class");
                    }
                };
                idle();
                while let Ok(req) = req_rx.recv() {
                    #[cfg(feature = "failpoints")]
                    fail::fail_point!("scan");
                    let snap = worker.scan(req);
                    // Before the loop hears of the snapshot: it raises only a scan it
                    // has asked for and not received.
                    idle();
                    if snap_tx.send(snap).is_err() {
                        break;
                    }
                    let one = 1u64.to_ne_bytes();
                    // SAFETY: writing 8 bytes to an eventfd; a full counter only means
                    // the loop has a wakeup pending already.
                    unsafe { libc::write(ping.as_raw_fd(), one.as_ptr().cast(), 8) };
                }
            })?;
        Ok(Scanner {
            requests: Some(req_tx),
            snapshots: snap_rx,
            wake,
            pending: false,
            thread: Some(thread),
            tid,
            idle_class,
            asked_at: 0,
            raised: false,
            raised_scans: 0,
        })
    }

    /// When the scan under way counts as stalled, if one is under way in the idle class
    /// and not raised yet.
    pub fn stall_due(&self) -> Option<u64> {
        (self.pending && !self.raised && self.idle_class.load(Ordering::Relaxed))
            .then_some(self.asked_at + STALL_NS)
    }

    /// Raises a stalled scan to the normal class (nice 0) for the rest of it.
    pub fn raise_if_stalled(&mut self, now: u64) {
        if self.stall_due().is_none_or(|due| now < due) {
            return;
        }
        self.raised = true;
        let tid = self.tid.load(Ordering::Relaxed);
        if tid == 0 {
            return;
        }
        match host::set_thread_idle_class(tid, false) {
            Ok(()) => self.raised_scans += 1,
            Err(e) => {
                self.idle_class.store(false, Ordering::Relaxed);
                tracing::warn!(error = %e, tid, "could not raise a stalled scan: scans stay in the normal class from now on");
            }
        }
    }

    /// Becomes readable when a snapshot is ready.
    pub fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Asks for a scan; false (and nothing asked) while one is under way.
    pub fn request(&mut self, req: ScanRequest) -> bool {
        if self.pending {
            return false;
        }
        let sent = self.requests.as_ref().is_some_and(|t| t.send(req).is_ok());
        self.pending = sent;
        self.asked_at = appease_probe::monotonic_ns();
        self.raised = false;
        sent
    }

    pub fn pending(&self) -> bool {
        self.pending
    }

    /// The snapshot, once ready.
    pub fn take(&mut self) -> Option<Snapshot> {
        let mut counter = [0u8; 8];
        // SAFETY: reading 8 bytes from a non-blocking eventfd into an 8-byte buffer.
        unsafe { libc::read(self.wake.as_raw_fd(), counter.as_mut_ptr().cast(), 8) };
        let snap = self.snapshots.try_recv().ok()?;
        self.pending = false;
        // A scan is a few milliseconds of CPU: one that took seconds delays every
        // demotion as long, and says the scanner waited (for a CPU, or for /proc).
        let took_ms = appease_probe::monotonic_ns().saturating_sub(self.asked_at) / 1_000_000;
        if took_ms >= SLOW_SCAN_MS {
            tracing::warn!(
                took_ms,
                raised = self.raised,
                processes = snap.cost.processes,
                "a scan took long"
            );
        }
        Some(snap)
    }
}

impl Drop for Scanner {
    fn drop(&mut self) {
        self.requests.take(); // ends the thread's loop
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A scan that takes this long is logged.
const SLOW_SCAN_MS: u64 = 1_000;

enum Source {
    Kernel(TaskIter),
    /// pid -> (start, cpu_ns, wait_ns) at the last scan: wait time is only re-read for
    /// processes that ran since (reading every thread of every process costs more).
    Proc(HashMap<u32, (u64, u64, u64)>),
}

impl Source {
    fn new(iter: Option<TaskIter>) -> Self {
        match iter {
            Some(i) => Source::Kernel(i),
            None => Source::Proc(HashMap::new()),
        }
    }

    fn read(&mut self, req: &ScanRequest, in_group: &[u32]) -> Reading {
        let mut reading = match self {
            Source::Kernel(iter) => match iter.read() {
                Ok(tasks) => from_tasks(&tasks, appease_cgroup::clock_tick_ns()),
                Err(e) => {
                    tracing::warn!(error = %e, "the task iterator failed; scanning /proc from now on");
                    *self = Source::Proc(HashMap::new());
                    return self.read(req, in_group);
                }
            },
            Source::Proc(seen) => from_proc(seen, in_group),
        };
        let needs = req.cfg.matching_needs();
        for p in reading.procs.iter().filter(|p| !p.kernel_thread) {
            if needs.cgroup {
                if let Some(c) = host::cpu_cgroup_of(p.pid) {
                    reading.cgroups.insert(p.pid, c);
                }
            }
            if needs.uid {
                if let Some(u) = host::uid_of_process(p.pid) {
                    reading.uids.insert(p.pid, u);
                }
            }
            if needs.exe {
                if let Ok(e) = std::fs::read_link(format!("/proc/{}/exe", p.pid)) {
                    reading.exes.insert(p.pid, e);
                }
            }
        }
        reading.cost.processes = reading.procs.len();
        reading
    }
}

/// The scanner thread's state: where it reads, and the classifier's memory.
struct Worker {
    source: Source,
    classifier: BatchClassifier,
    /// pid -> (start, cpu_ns, wait_ns) at the last scan: the idle group's use since.
    seen: HashMap<u32, (u64, u64, u64)>,
    last_scan: Option<u64>,
    /// Processes that listened before the probe was loaded (it sees the rest).
    listening: HashSet<(u32, u64)>,
    /// (pid, tid) -> ns running or runnable at the last scan, of the idle group's threads.
    /// With whether it was busy over the interval before that scan.
    thread_cpu: HashMap<(u32, u32), (u64, bool)>,
}

impl Worker {
    fn new(
        source: Source,
        params: &appease_policy::batch::BatchParams,
        listening: HashSet<(u32, u64)>,
    ) -> Self {
        Worker {
            source,
            classifier: BatchClassifier::new(params.clone()),
            seen: HashMap::new(),
            last_scan: None,
            listening,
            thread_cpu: HashMap::new(),
        }
    }

    fn scan(&mut self, req: ScanRequest) -> Snapshot {
        let taken_at = appease_probe::monotonic_ns();
        let cpu0 = thread_cpu_ns();
        let cfg = &req.cfg;
        self.classifier.set_params(cfg.batch_params());
        self.forget_as_asked(&req);
        let in_group_now = req
            .batch_group
            .as_ref()
            .map(|g| g.processes())
            .unwrap_or_default();
        let mut reading = self.source.read(&req, &in_group_now);
        if !self.listening.is_empty() {
            for p in &mut reading.procs {
                p.listens |= self.listening.contains(&(p.pid, p.start));
            }
        }
        let procs = &reading.procs;
        let in_group: HashSet<u32> = in_group_now.iter().copied().collect();
        let floor = self.floor_sample(taken_at, procs, &in_group, &reading.runnable);
        let busy_batch = if cfg.batch.spread {
            self.busy_threads(taken_at, &in_group_now)
        } else {
            self.thread_cpu.clear();
            Vec::new()
        };
        self.seen = procs
            .iter()
            .map(|p| (p.pid, (p.start, p.cpu_ns, p.wait_ns)))
            .collect();
        self.last_scan = Some(taken_at);

        let (mut forced, services, roles) =
            classify_by_config(cfg, procs, &reading.cgroups, &reading.uids, &reading.exes);
        // The processes this daemon runs under supervise it: never part of a batch tree
        // (else a soaker started by the script that started appease takes the script,
        // and everything else it runs, into the idle group). Nor is the daemon itself (its
        // start, loading the probe, reads as a young process busy over its life).
        for pid in itself_and_ancestors(std::process::id(), procs) {
            forced.entry(pid).or_insert(Class::Normal);
        }
        let children = appease_policy::tree::Children::new(procs.iter().map(|p| (p.pid, p.ppid)));
        let services = services
            .into_iter()
            .map(|(pid, group)| ServiceProcess {
                pid,
                group,
                members: children.subtree(pid),
            })
            .collect();
        // A request counts for the process that received it, not for a later one
        // that got its pid.
        let start_of: HashMap<u32, u64> = procs.iter().map(|p| (p.pid, p.start)).collect();
        let last = requests_of_live(&req.last_request, &start_of);
        let decisions = if cfg.batch.enabled {
            self.classifier.on_scan(
                taken_at,
                procs,
                |pid| last.get(&pid).copied(),
                |p| forced.get(&p.pid).copied(),
            )
        } else {
            Vec::new()
        };
        let roles = roles
            .into_iter()
            .filter_map(|(pid, (nice, label))| {
                let start = *start_of.get(&pid)?;
                Some((pid, RoleProcess { nice, label, start }))
            })
            .collect();
        let mut snap = Snapshot {
            taken_at,
            services,
            roles,
            floor,
            busy_batch,
            idle_group_runnable: reading.idle_group_runnable,
            sched_idle_runnable: reading.sched_idle_runnable,
            facts: facts_of(cfg.batch.enabled, procs, &reading.cgroup_ids),
            ..Default::default()
        };
        record_decisions(&mut snap, decisions, &start_of);
        snap.demoted = self.classifier.demoted_members();
        snap.demoted_apps = snap
            .demoted
            .iter()
            .filter_map(|pid| reading.apps.get(pid).copied())
            .collect();
        snap.gone = req
            .last_request
            .iter()
            .filter(|(pid, (start, _))| start_of.get(pid) != Some(start))
            .map(|(&pid, &(start, _))| (pid, start))
            .collect();
        snap.cost = reading.cost;
        snap.cost.cpu_us = thread_cpu_ns().saturating_sub(cpu0) / 1000;
        snap.cost.wall_us = appease_probe::monotonic_ns().saturating_sub(taken_at) / 1000;
        snap
    }

    /// Forgets the trees the daemon could not demote or promote (or, asked to, every
    /// demoted one).
    fn forget_as_asked(&mut self, req: &ScanRequest) {
        for root in &req.forget {
            self.classifier.forget(*root);
        }
        if req.forget_demoted {
            for root in self.classifier.demoted_roots() {
                self.classifier.forget(root);
            }
        }
    }

    /// The threads of the idle group's processes that wanted a CPU (ran, or waited to)
    /// at least half the time since the last scan (a thread not seen then waits for the
    /// next).
    fn busy_threads(&mut self, now: u64, in_group: &[u32]) -> Vec<BusyThread> {
        let interval = self.last_scan.map_or(0, |l| now.saturating_sub(l));
        let mut seen_now = HashMap::with_capacity(self.thread_cpu.len());
        let mut busy = Vec::new();
        for &pid in in_group {
            let job = self.classifier.tree_of(pid).unwrap_or(pid);
            for tid in appease_actuator::sys::threads_of(pid) {
                let Some((run, wait)) = appease_actuator::sys::thread_run_wait_ns(pid, tid) else {
                    continue;
                };
                let wanted = run + wait;
                // Busy over two intervals in a row: a compiler run that outlived one scan
                // (beside many others in the idle group, a third of a second of CPU takes
                // over a second) is over before the next, and pinning each one cost the
                // event loop about a millisecond a scan on the server's CPU.
                let (busy_now, busy_before) =
                    self.thread_cpu
                        .get(&(pid, tid))
                        .map_or((false, false), |&(before, was)| {
                            let now = wanted.saturating_sub(before);
                            (appease_policy::spread::busy(now, interval), was)
                        });
                if busy_now && busy_before {
                    busy.push(BusyThread { job, pid, tid });
                }
                seen_now.insert((pid, tid), (wanted, busy_now));
            }
        }
        self.thread_cpu = seen_now;
        busy
    }

    /// The idle group's CPU share and waiting since the last scan.
    fn floor_sample(
        &self,
        now: u64,
        procs: &[ProcSample],
        in_group: &HashSet<u32>,
        runnable: &HashSet<u32>,
    ) -> Option<FloorSample> {
        let last = self.last_scan?;
        let dt = now.saturating_sub(last) as f64;
        if in_group.is_empty() || dt <= 0.0 {
            return None;
        }
        let (mut cpu, mut wait) = (0u64, 0u64);
        for p in procs.iter().filter(|p| in_group.contains(&p.pid)) {
            if let Some(&(start, c, w)) = self.seen.get(&p.pid) {
                if start == p.start {
                    cpu += p.cpu_ns.saturating_sub(c);
                    wait += p.wait_ns.saturating_sub(w);
                }
            }
        }
        Some(FloorSample {
            share_pct: 100.0 * cpu as f64 / (dt * host::cpus() as f64),
            waiting: wait as f64 > 0.1 * dt || in_group.iter().any(|pid| runnable.contains(pid)),
            processes: in_group.len(),
        })
    }
}

/// When each live process last received a request: a remembered request whose pid now
/// names another process (its start differs) is not that process's.
fn requests_of_live(
    last_request: &HashMap<u32, (u64, u64)>,
    start_of: &HashMap<u32, u64>,
) -> HashMap<u32, u64> {
    last_request
        .iter()
        .filter(|(pid, (start, _))| start_of.get(pid) == Some(start))
        .map(|(&pid, &(_, at))| (pid, at))
        .collect()
}

type Roles = HashMap<u32, (i32, String)>;

/// Classes forced by the config's rules, services, roles and exceptions; each service's
/// processes (pid -> group); each role process's fixed nice and label.
fn classify_by_config(
    cfg: &Config,
    procs: &[ProcSample],
    cgroups: &HashMap<u32, String>,
    uids: &HashMap<u32, u32>,
    exes: &HashMap<u32, PathBuf>,
) -> (HashMap<u32, Class>, HashMap<u32, String>, Roles) {
    let (mut forced, mut services, mut roles) = (HashMap::new(), HashMap::new(), HashMap::new());
    if cfg.rules.is_empty()
        && cfg.services.is_empty()
        && cfg.role.is_empty()
        && cfg.hands_off.comms.is_empty()
    {
        return (forced, services, roles);
    }
    for p in procs.iter().filter(|p| !p.kernel_thread) {
        // hands_off: never batch, never placed, never given a role.
        if cfg.hands_off.comms.contains(&p.comm) {
            forced.insert(p.pid, Class::Normal);
            continue;
        }
        let facts = ProcessFacts {
            comm: &p.comm,
            exe: exes.get(&p.pid).map(PathBuf::as_path),
            cgroup: cgroups.get(&p.pid).map(String::as_str),
            uid: uids.get(&p.pid).copied(),
        };
        if let Some(c) = cfg.forced_class(&facts) {
            forced.insert(p.pid, c);
        }
        if let Some(svc) = cfg.service_of(&facts) {
            services.insert(p.pid, format!("/{}", svc.group_name()));
        }
        if let Some((role, nice)) = cfg.role_of(&facts) {
            roles.insert(
                p.pid,
                (nice, format!("role {} rank {}", role.app, role.rank)),
            );
        }
    }
    (forced, services, roles)
}

/// The parent, grandparent, ... of `pid` among `procs`, up to the first process whose
/// parent is unknown (or itself).
fn itself_and_ancestors(pid: u32, procs: &[ProcSample]) -> Vec<u32> {
    std::iter::once(pid)
        .chain(ancestors_of(pid, procs))
        .collect()
}

fn ancestors_of(pid: u32, procs: &[ProcSample]) -> Vec<u32> {
    let ppid: HashMap<u32, u32> = procs.iter().map(|p| (p.pid, p.ppid)).collect();
    let mut out = Vec::new();
    let mut at = pid;
    while let Some(&parent) = ppid.get(&at) {
        if parent == at || parent == 0 || out.contains(&parent) {
            break;
        }
        out.push(parent);
        at = parent;
    }
    out
}

/// Processes from the task iterator's threads: a process's CPU and waiting are its
/// threads' (and, for CPU, its exited threads' and reaped children's), its start in the
/// clock ticks /proc counts in (the actuator compares the two).
fn from_tasks(tasks: &[TaskRecord], tick_ns: u64) -> Reading {
    let mut by_pid: HashMap<u32, ProcSample> = HashMap::with_capacity(tasks.len());
    let mut runnable = HashSet::new();
    let mut apps = HashMap::new();
    let mut cgroup_ids = HashMap::with_capacity(tasks.len());
    for t in tasks.iter().filter(|t| t.pid == t.tid) {
        if t.app != t.pid {
            apps.insert(t.pid, t.app);
        }
        cgroup_ids.insert(t.pid, t.cgroup_ids);
        by_pid.insert(
            t.pid,
            ProcSample {
                pid: t.pid,
                ppid: t.ppid,
                comm: t.comm.clone(),
                start: t.start_boot_ns / tick_ns.max(1),
                cpu_ns: t.gone_cpu_ns,
                wait_ns: 0,
                kernel_thread: t.kernel_thread,
                has_tty: t.has_tty,
                listens: t.listens,
                age_ns: t.age_ns,
                sched_idle: t.sched_idle,
                last_response: None,
            },
        );
    }
    let (mut idle_group_runnable, mut sched_idle_runnable) = (0, 0);
    for t in tasks {
        if let Some(p) = by_pid.get_mut(&t.pid) {
            p.cpu_ns += t.cpu_ns;
            p.wait_ns += t.wait_ns;
            if t.response_ns > 0 {
                p.last_response = p.last_response.max(Some(t.response_ns));
            }
            if t.running {
                runnable.insert(t.pid);
                idle_group_runnable += u32::from(t.idle_group);
                // Not the scanner itself, SCHED_IDLE and running as it reads.
                let own = t.pid == std::process::id();
                sched_idle_runnable += u32::from(t.sched_idle && !t.idle_group && !own);
            }
        }
    }
    // This kernel's task iterator skips PID 1's thread group: read it from /proc.
    if let std::collections::hash_map::Entry::Vacant(e) = by_pid.entry(1) {
        if let Some(init) = host::scan_process(1) {
            e.insert(init);
        }
    }
    let mut procs: Vec<ProcSample> = by_pid.into_values().collect();
    procs.sort_unstable_by_key(|p| p.pid);
    Reading {
        procs,
        runnable,
        apps,
        cgroup_ids,
        idle_group_runnable,
        sched_idle_runnable,
        cost: ScanCost {
            source: "task iterator".into(),
            threads: tasks.len(),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn from_proc(seen: &mut HashMap<u32, (u64, u64, u64)>, in_group: &[u32]) -> Reading {
    let mut procs = host::scan_processes();
    // Starved processes in the idle group barely run, yet their waiting is exactly what
    // the floor must see: always re-read theirs.
    let runnable = in_group
        .iter()
        .copied()
        .filter(|&pid| host::runnable_now(pid))
        .collect();
    let in_group: HashSet<u32> = in_group.iter().copied().collect();
    for p in &mut procs {
        p.wait_ns = match seen.get(&p.pid) {
            Some(&(start, cpu, wait))
                if start == p.start && cpu == p.cpu_ns && !in_group.contains(&p.pid) =>
            {
                wait
            }
            _ => host::wait_ns_of(p.pid).unwrap_or(0),
        };
    }
    *seen = procs
        .iter()
        .map(|p| (p.pid, (p.start, p.cpu_ns, p.wait_ns)))
        .collect();
    Reading {
        procs,
        runnable,
        cost: ScanCost {
            source: "/proc".into(),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// CPU time of the calling thread, ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec; the thread CPU clock always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What the loop's rules need of each process, as this scan read it (nothing while
/// demotion is off: no branch is made idle then).
fn facts_of(
    batch_enabled: bool,
    procs: &[ProcSample],
    cgroup_ids: &HashMap<u32, appease_cgroup::CgroupIds>,
) -> HashMap<u32, ProcFacts> {
    procs
        .iter()
        .filter(|_| batch_enabled)
        .map(|p| {
            let facts = ProcFacts {
                ppid: p.ppid,
                start: p.start,
                cpu_ns: p.cpu_ns,
                sched_idle: p.sched_idle,
                age_ns: p.age_ns,
                cgroup_ids: cgroup_ids.get(&p.pid).copied().unwrap_or_default(),
            };
            (p.pid, facts)
        })
        .collect()
}

/// The classifier's decisions into the snapshot.
fn record_decisions(
    snap: &mut Snapshot,
    decisions: Vec<BatchDecision>,
    started: &HashMap<u32, u64>,
) {
    for d in decisions {
        match d {
            BatchDecision::Demote {
                root,
                members,
                cpus,
                why,
                feeds,
            } => snap.demotions.push(Demotion {
                root,
                // With the start time the scan saw: a PID reused since is not ours.
                members: members
                    .iter()
                    .filter_map(|pid| Some((*pid, started.get(pid).copied()?)))
                    .collect(),
                why: format!(
                    "{why}: {cpus:.2} CPUs, no requests{}",
                    if feeds { ", reads responses" } else { "" }
                ),
                feeds,
            }),
            BatchDecision::Follow { root, members } => snap.follows.push(Follow {
                root,
                members: members
                    .iter()
                    .filter_map(|pid| Some((*pid, started.get(pid).copied()?)))
                    .collect(),
            }),
            BatchDecision::Promote { root, members } => {
                snap.promotions.push(Promotion { root, members })
            }
            BatchDecision::Release { root, pid } => snap.releases.push(Release { root, pid }),
        }
    }
}

#[cfg(test)]
mod tests;
