//! BPF probe: reports requests (socket receives returning data), the exits of threads
//! that received them, and execs while wanted; and lists every thread for the scan
//! ([`TaskIter`]).
//!
//! The kernel side filters to one request event per thread per quiet period
//! (`min_gap`), so a busy server costs the daemon a few events a second per thread;
//! a host's other forks, execs and exits never reach it.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, RingBuffer, RingBufferBuilder};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/probe.skel.rs"));
}
use skel::types::appease_event as RawEvent;
use skel::types::appease_task as RawTask;

pub use appease_cgroup::CgroupIds;
use skel::{ProbeSkel, ProbeSkelBuilder};

/// Storage the loaded BPF object lives in; the caller owns it so the probe can borrow it.
pub type ProbeStorage = MaybeUninit<libbpf_rs::OpenObject>;

const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("the kernel exposes no BTF ({KERNEL_BTF} is missing): appease needs a kernel built with CONFIG_DEBUG_INFO_BTF")]
    NoBtf,
    #[error("could not {stage} the BPF probe: {source} (appease needs root, or CAP_BPF and CAP_PERFMON, and a kernel with BPF tracepoints and task storage)")]
    Bpf {
        stage: &'static str,
        #[source]
        source: libbpf_rs::Error,
    },
}

/// Socket family of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    Unix,
    Inet,
    Inet6,
    Other(u16),
}

impl Family {
    pub fn from_raw(af: u32) -> Self {
        match af as i32 {
            libc::AF_UNIX => Family::Unix,
            libc::AF_INET => Family::Inet,
            libc::AF_INET6 => Family::Inet6,
            other => Family::Other(other as u16),
        }
    }

    /// Local customers (UNIX sockets) are told apart from network ones.
    pub fn is_local(self) -> bool {
        self == Family::Unix
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Request {
        ts_ns: u64,
        cpu_ns: u64,
        pid: u32,
        tid: u32,
        family: Family,
        bytes: u32,
        /// Delivered at once (first request after a quiet spell) rather than at the
        /// reader's next poll (a thread already busy with requests).
        woke: bool,
        /// The thread's start, ns after boot: /proc's starttime is this in clock ticks.
        /// With the tid, the thread's identity, so a first contact reads nothing from /proc.
        start_ns: u64,
        /// Its process's start: with the pid, the process's identity.
        proc_start_ns: u64,
        comm: Comm,
        /// Its process's name.
        proc_comm: Comm,
        /// Its process's application: the server whose fork made it, or itself.
        app: u32,
        /// The thread's effective uid.
        uid: u32,
        /// Its process leads its session and is scheduled in that session's autogroup
        /// (in the root CPU cgroup, autogroups on): a top-level entity of its own.
        own_autogroup: bool,
    },
    /// A thread serving a request of `app`, which has sunk threads, blocked on a lock
    /// (futex or semaphore), the first of that application's to do so.
    Wait { ts_ns: u64, app: u32 },
    /// The last such wait of `app` ended.
    WaitEnd { ts_ns: u64, app: u32 },
    /// Only while wanted (`Probe::set_exec_events`), and read at the next wakeup.
    Exec { ts_ns: u64, pid: u32, comm: String },
    /// A thread that received a request exited.
    Exit {
        ts_ns: u64,
        pid: u32,
        tid: u32,
        /// Its start, ns after boot: an exit read after a new thread's request with the
        /// same id is told from it.
        start_ns: u64,
    },
}

/// One thread as the task iterator saw it. The process's own fields (`ppid`, `comm`,
/// `start_boot_ns`, `age_ns`, `has_tty`, `gone_cpu_ns`, `listens`) are set on its leader only
/// (`pid == tid`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskRecord {
    pub pid: u32,
    pub tid: u32,
    pub ppid: u32,
    /// The thread's CPU time, ns.
    pub cpu_ns: u64,
    /// Its time runnable but waiting for a CPU (schedstat run_delay), ns.
    pub wait_ns: u64,
    /// Start, ns after boot: /proc's starttime is this in clock ticks.
    pub start_boot_ns: u64,
    pub age_ns: u64,
    /// CPU time of exited threads and of reaped children, ns.
    pub gone_cpu_ns: u64,
    pub kernel_thread: bool,
    /// Running or waiting for a CPU right now.
    pub running: bool,
    pub has_tty: bool,
    /// A thread of the process listened on a TCP socket since the probe was loaded.
    pub listens: bool,
    /// Running or waiting, in a cgroup with `cpu.idle` set or below one (read only for
    /// running threads).
    pub idle_group: bool,
    /// Of the `SCHED_IDLE` policy.
    pub sched_idle: bool,
    /// When it last read a response on a socket its process connected (CLOCK_MONOTONIC
    /// ns, as `monotonic_ns`; 0: never). Per thread.
    pub response_ns: u64,
    /// Its application: the server whose fork made it, or itself (leader only).
    pub app: u32,
    pub comm: String,
    /// Its cgroups (leader only).
    pub cgroup_ids: CgroupIds,
}

/// A thread's CPU time as the kernel counts it (`Probe::threads_cpu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadCpuTime {
    /// Its thread group.
    pub pid: u32,
    /// Its start, ns after boot: a thread that later holds its ID is told from it.
    pub start_boot_ns: u64,
    /// Its CPU time so far, ns.
    pub cpu_ns: u64,
    /// Its CPU time at its latest request the probe saw, reported or not (0: none).
    pub request_cpu_ns: u64,
    /// That request's time, ns of CLOCK_MONOTONIC as events' (0: none seen).
    pub request_ns: u64,
    /// A kernel thread (PF_KTHREAD).
    pub kernel_thread: bool,
}

/// Threads read in one call of the kernel by `Probe::threads_cpu` (the BPF side's
/// CPU_READ_MAX).
pub const CPU_READ_MAX: usize = 1024;

/// Lists every thread on the host from the kernel's task list: what a scan of /proc
/// reads with three system calls a process, in one read. Sendable to a scanner thread.
pub struct TaskIter {
    link: libbpf_rs::Link,
    buf: Vec<u8>,
}

impl TaskIter {
    /// Every thread now.
    pub fn read(&mut self) -> std::io::Result<Vec<TaskRecord>> {
        use std::io::Read;
        let mut it = libbpf_rs::Iter::new(&self.link).map_err(std::io::Error::other)?;
        self.buf.clear();
        // A page at a time: the kernel hands over whole records only, and walks the task
        // list for as many as fit without a preemption point (on a kernel built without
        // preemption, a real-time thread waking on this CPU waits for the read to end):
        // a page is some fifty threads, 64 KiB took a millisecond.
        let mut chunk = vec![0u8; 4096];
        loop {
            let n = it.read(&mut chunk)?;
            if n == 0 {
                break;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
        let size = std::mem::size_of::<RawTask>();
        Ok(self
            .buf
            .chunks_exact(size)
            .filter_map(decode_task)
            .collect())
    }
}

/// A task record from the iterator's bytes (None: not a whole record).
fn decode_task(data: &[u8]) -> Option<TaskRecord> {
    let mut r = RawTask::default();
    plain::copy_from_bytes(&mut r, data).ok()?;
    Some(TaskRecord {
        pid: r.pid,
        tid: r.tid,
        ppid: r.ppid,
        cpu_ns: r.cpu_ns,
        wait_ns: r.wait_ns,
        start_boot_ns: r.start_boot_ns,
        age_ns: r.age_ns,
        gone_cpu_ns: r.gone_cpu_ns,
        kernel_thread: r.kernel_thread != 0,
        running: r.running != 0,
        has_tty: r.has_tty != 0,
        listens: r.listens != 0,
        idle_group: r.idle_group != 0,
        sched_idle: r.sched_idle != 0,
        response_ns: r.response_ns,
        app: r.app,
        comm: comm(&r.comm),
        cgroup_ids: CgroupIds {
            v1_cpu: r.cpu_cgroup_id,
            v2: r.dfl_cgroup_id,
        },
    })
}

/// Kernel-side counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Socket receives that returned data.
    pub socket_reads: u64,
    /// Of those, reported as request events (the rest fell within `min_gap`).
    pub requests: u64,
    /// Events dropped because the ring buffer was full.
    pub lost: u64,
    /// Reads on the side of a stream connection that connected (a client's): responses,
    /// never reported; counted once per thread and socket per quiet period.
    pub responses: u64,
    /// Requests of unprivileged users beyond their events' bound, not reported.
    pub throttled: u64,
    /// Requests after a quiet spell of a held thread (`set_held`): reported without
    /// waking the daemon.
    pub held: u64,
    /// Requests that woke the daemon (after a quiet spell, of a thread not held).
    pub woke: u64,
}

#[derive(Clone, Debug)]
pub struct ProbeConfig {
    /// At most one request event per thread per this period. The first request after
    /// twice this much quiet wakes the reader at once; later ones wait for its next poll.
    pub min_gap: Duration,
    /// Requests received by this process are not reported (the daemon's own sockets).
    pub ignore_pid: Option<u32>,
    /// The ring buffer's size: a power of two, at least a page.
    pub ring_bytes: u32,
    /// Lock waits of threads whose last reported request is younger than this are reported
    /// for applications marked with [`Probe::set_sunk_app`]; None reports none. The hook
    /// that sees them (on every context switch of the host) is attached by the first mark
    /// and detached by [`Probe::detach_lock_waits`].
    pub serving_window: Option<Duration>,
    /// Users from this uid on are unprivileged: their request events are bounded.
    pub uid_min: u32,
    /// A thread the daemon holds (`set_held`) has its requests reported at most this
    /// often (never more often than `min_gap`; `set_held_gap` changes it); the time and
    /// CPU time of its latest are kept for `threads_cpu`.
    pub held_gap: Duration,
    /// Request events a second each unprivileged user may cause, and all of them together
    /// (0: no bound).
    pub user_events_per_s: u32,
    pub users_events_per_s: u32,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            min_gap: Duration::from_millis(20),
            ignore_pid: Some(std::process::id()),
            ring_bytes: 1 << 20,
            serving_window: None,
            uid_min: 1000,
            held_gap: Duration::from_millis(40),
            user_events_per_s: 0,
            users_events_per_s: 0,
        }
    }
}

/// Runnable tasks, from the run queues (`Probe::runnable`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Runnable {
    /// Every runnable task, of every class, the reader included.
    pub all: u32,
    /// Of them, those of the idle class: in an idle cgroup, or `SCHED_IDLE`.
    pub idle_class: u32,
    /// CPUs whose run queues were read: those the task iterator has met a task on. The
    /// counts are the host's once this is every online CPU.
    pub cpus: u32,
}

pub struct Probe<'obj> {
    skel: ProbeSkel<'obj>,
    ring: RingBuffer<'obj>,
    queue: Rc<RefCell<VecDeque<Event>>>,
    min_gap: Duration,
    /// Applications marked sunk now: the context-switch hook is wanted while any is.
    marked_apps: usize,
}

impl<'obj> Probe<'obj> {
    /// Loads and attaches the BPF programs. Nothing is attached on error.
    pub fn load(cfg: &ProbeConfig, storage: &'obj mut ProbeStorage) -> Result<Self, ProbeError> {
        if !Path::new(KERNEL_BTF).exists() {
            return Err(ProbeError::NoBtf);
        }
        route_libbpf_logs();
        let bpf = |stage| move |source| ProbeError::Bpf { stage, source };
        let mut open = ProbeSkelBuilder::default()
            .open(storage)
            .map_err(bpf("open"))?;
        let rodata = open
            .maps
            .rodata_data
            .as_deref_mut()
            .expect("probe has rodata");
        rodata.min_gap_ns = cfg.min_gap.as_nanos().min(u64::MAX as u128) as u64;
        rodata.wake_after_ns = 2 * rodata.min_gap_ns;
        rodata.self_tgid = cfg.ignore_pid.unwrap_or(0);
        rodata.pid_ns_inum = nested_pid_namespace().unwrap_or(0);
        rodata.uid_min = cfg.uid_min;
        // Each bound on its own; 0: none.
        let cost = |per_s: u32| match per_s {
            0 => 0,
            n => 1_000_000_000 / u64::from(n),
        };
        rodata.user_event_cost_ns = cost(cfg.user_events_per_s);
        rodata.users_event_cost_ns = cost(cfg.users_events_per_s);
        rodata.serving_window_ns = cfg
            .serving_window
            .map_or(0, |w| w.as_nanos().clamp(1, u64::MAX as u128) as u64);
        // Without lock waits to report, the context-switch hook is not even loaded; with
        // them, it is attached only while an application is marked (it costs every
        // switch on the host a program call: 100-150 ns here).
        if cfg.serving_window.is_none() {
            open.progs.on_switch.set_autoload(false);
        }
        open.progs.on_switch.set_autoattach(false);
        open.maps
            .events
            .set_max_entries(cfg.ring_bytes)
            .map_err(bpf("size the ring buffer of"))?;
        let mut skel = open.load().map_err(bpf("load"))?;
        skel.attach().map_err(bpf("attach"))?;
        let min_gap = cfg.min_gap;

        let queue = Rc::new(RefCell::new(VecDeque::new()));
        let sink = Rc::clone(&queue);
        let mut builder = RingBufferBuilder::new();
        builder
            .add(&skel.maps.events, move |data: &[u8]| {
                if let Some(ev) = decode(data) {
                    sink.borrow_mut().push_back(ev);
                }
                0
            })
            .map_err(bpf("set up the ring buffer of"))?;
        let ring = builder.build().map_err(bpf("set up the ring buffer of"))?;
        let mut probe = Probe {
            skel,
            ring,
            queue,
            min_gap,
            marked_apps: 0,
        };
        probe.set_held_gap(cfg.held_gap);
        Ok(probe)
    }

    /// A held thread's requests are reported at most every `gap` from now on (never more
    /// often than the probe's `min_gap`).
    pub fn set_held_gap(&mut self, gap: Duration) {
        let ns = gap.max(self.min_gap).as_nanos().min(u64::MAX as u128) as u64;
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            bss.held_gap_ns = ns;
        }
    }

    /// Waits up to `timeout` for events and hands each to `f`.
    pub fn poll(&mut self, timeout: Duration, f: impl FnMut(Event)) -> Result<(), ProbeError> {
        match self.ring.poll(timeout) {
            Ok(()) => {}
            // A signal woke us: the caller checks its flags and polls again.
            Err(e) if e.kind() == libbpf_rs::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(ProbeError::Bpf {
                    stage: "poll",
                    source,
                })
            }
        }
        // Events submitted without a wakeup are not reported by epoll: drain them too.
        self.drain(f)
    }

    /// Hands each event already in the ring to `f`, without waiting or a system call
    /// (the ring is memory shared with the kernel): cheap enough to call between two
    /// pieces of other work, so a request need not wait for all of it.
    pub fn drain(&mut self, mut f: impl FnMut(Event)) -> Result<(), ProbeError> {
        self.ring.consume().map_err(|source| ProbeError::Bpf {
            stage: "consume the events of",
            source,
        })?;
        let mut q = self.queue.borrow_mut();
        while let Some(ev) = q.pop_front() {
            f(ev);
        }
        Ok(())
    }

    /// The task iterator, for a scanner thread (once; None after).
    pub fn take_task_iter(&mut self) -> Option<TaskIter> {
        let link = self.skel.links.dump_task.take()?;
        Some(TaskIter {
            link,
            buf: Vec::new(),
        })
    }

    /// Tasks runnable on every CPU now (running or waiting; the caller counts too), and
    /// how many of them are of the idle class (in an idle group, or `SCHED_IDLE`), read
    /// from the kernel's run queues: one system call, as cheap as a read of
    /// /proc/loadavg. Before the first scan no run queue is known (`cpus` 0); None if
    /// the kernel refused to run the program.
    pub fn runnable(&self) -> Option<Runnable> {
        let out = self
            .skel
            .progs
            .count_runnable
            .test_run(libbpf_rs::ProgramInput::default())
            .ok()?;
        if out.return_value != 0 {
            return None;
        }
        let bss = self.skel.maps.bss_data.as_deref()?;
        Some(Runnable {
            all: bss.runnable_all,
            idle_class: bss.runnable_idle,
            cpus: bss.runnable_cpus,
        })
    }

    /// The CPU times of threads `tids` (IDs as this process's PID namespace numbers
    /// them), each handed to `f` with its index: read in the kernel, one system call per
    /// `CPU_READ_MAX` threads. A thread gone answers None. Err when the kernel cannot run
    /// the reader (before 6.11, without `bpf_task_from_vpid`): the caller reads /proc.
    pub fn threads_cpu(
        &mut self,
        tids: &[u32],
        mut f: impl FnMut(usize, Option<ThreadCpuTime>),
    ) -> Result<(), ProbeError> {
        let refused = |source| ProbeError::Bpf {
            stage: "read threads' CPU times with",
            source,
        };
        for (chunk_at, chunk) in tids.chunks(CPU_READ_MAX).enumerate() {
            let bss = self
                .skel
                .maps
                .bss_data
                .as_deref_mut()
                .expect("probe has bss");
            bss.cpu_n = chunk.len() as u32;
            bss.cpu_tids[..chunk.len()].copy_from_slice(chunk);
            let out = self
                .skel
                .progs
                .read_cpu
                .test_run(libbpf_rs::ProgramInput::default())
                .map_err(refused)?;
            if out.return_value != 0 {
                return Err(refused(libbpf_rs::Error::from_raw_os_error(libc::ENOSYS)));
            }
            let bss = self.skel.maps.bss_data.as_deref().expect("probe has bss");
            for (i, a) in bss.cpu_answers[..chunk.len()].iter().enumerate() {
                let answer = (a.tgid != 0).then_some(ThreadCpuTime {
                    pid: a.tgid,
                    start_boot_ns: a.start_boot_ns,
                    cpu_ns: a.cpu_ns,
                    request_cpu_ns: a.request_cpu_ns,
                    request_ns: a.request_ns,
                    kernel_thread: a.kernel_thread != 0,
                });
                f(chunk_at * CPU_READ_MAX + i, answer);
            }
        }
        Ok(())
    }

    /// Whether exec events are reported (off at start).
    pub fn set_exec_events(&mut self, on: bool) {
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            bss.want_exec = on as u32;
        }
    }

    /// Marks `app` as having sunk threads (its serving threads' lock waits are then
    /// reported, the context-switch hook attached if it was not), or clears the mark.
    /// Marking an application already marked, or clearing one that is not, changes
    /// nothing.
    pub fn set_sunk_app(&mut self, app: u32, sunk: bool) -> Result<(), ProbeError> {
        let key = app.to_ne_bytes();
        let map = &self.skel.maps.sunk_apps;
        let result = if sunk {
            // Only if absent: an update would overwrite the kernel's count of waiters.
            match map.update(&key, &app_waits(0), MapFlags::NO_EXIST) {
                Ok(()) => Ok(1),
                Err(e) if e.kind() == libbpf_rs::ErrorKind::AlreadyExists => Ok(0),
                Err(e) => Err(e),
            }
        } else {
            match map.delete(&key) {
                Ok(()) => Ok(-1),
                Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(0),
                Err(e) => Err(e),
            }
        };
        let change = result.map_err(|source| ProbeError::Bpf {
            stage: "mark an application in",
            source,
        })?;
        self.marked_apps = self.marked_apps.saturating_add_signed(change);
        if sunk {
            self.attach_lock_waits()?;
        }
        Ok(())
    }

    /// Attaches the context-switch hook, if it is loaded and not attached.
    fn attach_lock_waits(&mut self) -> Result<(), ProbeError> {
        if self.skel.links.on_switch.is_some() || !self.skel.progs.on_switch.autoload() {
            return Ok(());
        }
        let link = self
            .skel
            .progs
            .on_switch
            .attach()
            .map_err(|source| ProbeError::Bpf {
                stage: "attach the lock-wait hook of",
                source,
            })?;
        self.skel.links.on_switch = Some(link);
        Ok(())
    }

    /// Detaches the context-switch hook if no application is marked: switches cost the
    /// host nothing again. True if it was attached and is no longer. Attaching and
    /// detaching patch the kernel's code on every CPU: the caller waits a while after the
    /// last mark goes before it calls this.
    pub fn detach_lock_waits(&mut self) -> bool {
        if self.marked_apps > 0 {
            return false;
        }
        self.skel.links.on_switch.take().is_some()
    }

    /// Whether the context-switch hook is attached now.
    pub fn lock_waits_attached(&self) -> bool {
        self.skel.links.on_switch.is_some()
    }

    /// Marks a process as a server, as its listen() would have had the probe been loaded
    /// then (the daemon reads which processes listened before it started): the processes
    /// it forks from now on belong to its application. A process gone meanwhile is skipped.
    pub fn mark_listener(&mut self, pid: u32) -> Result<(), ProbeError> {
        let map = &self.skel.maps.listeners;
        set_process_storage(map, pid, 1, "mark a listening process in")
    }

    /// Gives process `pid` to application `app`, as the probe's fork hook would have had
    /// it been loaded when a server forked it: a worker older than the daemon (a
    /// database's connection made before appease started) is its server's, not an
    /// application of its own. A process gone meanwhile is skipped.
    pub fn set_app(&mut self, pid: u32, app: u32) -> Result<(), ProbeError> {
        let map = &self.skel.maps.apps;
        set_process_storage(map, pid, app, "give a process its application in")
    }

    /// Marks thread `tid` as held by the daemon (elevated, or its budget spent), or clears
    /// the mark: a held thread's requests wait for the daemon's next tick instead of waking it. A thread
    /// gone meanwhile is skipped (the kernel drops its mark with it).
    pub fn set_held(&mut self, tid: u32, held: bool) -> Result<(), ProbeError> {
        use std::os::fd::AsRawFd;
        // PIDFD_THREAD (O_EXCL): this thread's storage, not its process leader's.
        let Some(pidfd) = pidfd_open(tid, libc::O_EXCL as u32) else {
            return Ok(());
        };
        let key = pidfd.as_raw_fd().to_ne_bytes();
        let map = &self.skel.maps.held;
        let result = if held {
            map.update(&key, &1u32.to_ne_bytes(), MapFlags::ANY)
        } else {
            map.delete(&key)
        };
        match result {
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            other => other.map_err(|source| ProbeError::Bpf {
                stage: "mark a thread held in",
                source,
            }),
        }
    }

    /// Forgets the waiters counted for `app` (one that ended without running again, a
    /// thread killed in its wait, would otherwise keep the count above zero and mute the
    /// application's next wait).
    pub fn reset_waits(&mut self, app: u32) -> Result<(), ProbeError> {
        let key = app.to_ne_bytes();
        match self
            .skel
            .maps
            .sunk_apps
            .update(&key, &app_waits(0), MapFlags::EXIST)
        {
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            other => other.map_err(|source| ProbeError::Bpf {
                stage: "reset the waits in",
                source,
            }),
        }
    }

    /// The socket-read program's own run time and run count so far, as the kernel keeps
    /// them while `kernel.bpf_stats_enabled` is 1 (both 0 otherwise): what the probe costs
    /// a read, without the read's own noise (the `read_cost` bench).
    pub fn read_program_stats(&self) -> Option<(u64, u64)> {
        use std::os::fd::AsFd;
        let id = libbpf_rs::Program::id_from_fd(self.skel.progs.on_sock_recv.as_fd()).ok()?;
        libbpf_rs::query::ProgInfoIter::default()
            .find(|p| p.id == id)
            .map(|p| (p.run_time_ns, p.run_cnt))
    }

    /// The ring buffer's epoll fd, for callers that multiplex.
    pub fn epoll_fd(&self) -> i32 {
        self.ring.epoll_fd()
    }

    pub fn counters(&self) -> Counters {
        let mut c = Counters::default();
        for (idx, slot) in [
            (0u32, &mut c.socket_reads),
            (1, &mut c.requests),
            (2, &mut c.lost),
            (3, &mut c.responses),
            (4, &mut c.throttled),
            (5, &mut c.held),
            (6, &mut c.woke),
        ] {
            if let Ok(Some(per_cpu)) = self
                .skel
                .maps
                .counters
                .lookup_percpu(&idx.to_ne_bytes(), MapFlags::ANY)
            {
                *slot = per_cpu
                    .iter()
                    .map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap_or([0; 8])))
                    .sum();
            }
        }
        c
    }
}

/// Sets a process's value in a task-storage map (keyed by a pidfd from user space). A
/// process gone meanwhile is skipped.
fn set_process_storage(
    map: &impl MapCore,
    pid: u32,
    value: u32,
    stage: &'static str,
) -> Result<(), ProbeError> {
    use std::os::fd::AsRawFd;
    let Some(pidfd) = pidfd_open(pid, 0) else {
        return Ok(());
    };
    let key = pidfd.as_raw_fd().to_ne_bytes();
    match map.update(&key, &value.to_ne_bytes(), MapFlags::ANY) {
        Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
        other => other.map_err(|source| ProbeError::Bpf { stage, source }),
    }
}

/// The value of `sunk_apps`: {sunk = 1, waiting}.
fn app_waits(waiting: u32) -> [u8; 8] {
    let mut v = [0u8; 8];
    v[..4].copy_from_slice(&1u32.to_ne_bytes());
    v[4..].copy_from_slice(&waiting.to_ne_bytes());
    v
}

/// A task's name from the kernel's bytes, escaped (any process names itself what it likes).
fn comm(raw: &[i8; 16]) -> String {
    Comm::from_raw(raw).escaped()
}

/// A thread's name as the kernel keeps it: up to 15 bytes, any but NUL, kept raw so
/// that an event costs no allocation; made text (escaped) only where it is shown or
/// stored.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Comm {
    bytes: [u8; 16],
    len: u8,
}

impl Comm {
    fn from_raw(raw: &[i8; 16]) -> Self {
        let mut bytes = [0u8; 16];
        let mut len = 0;
        for (b, &c) in bytes.iter_mut().zip(raw).take_while(|(_, &c)| c != 0) {
            *b = c as u8;
            len += 1;
        }
        Comm { bytes, len }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// The name as text, bytes that are not printable UTF-8 escaped.
    pub fn escaped(&self) -> String {
        appease_cgroup::names::escaped(self.as_bytes())
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.escaped())
    }
}

fn decode(data: &[u8]) -> Option<Event> {
    let mut raw = RawEvent::default();
    plain::copy_from_bytes(&mut raw, data).ok()?;
    let ev = match raw.kind {
        1 => Event::Request {
            ts_ns: raw.ts_ns,
            cpu_ns: raw.cpu_ns,
            pid: raw.pid,
            tid: raw.tid,
            family: Family::from_raw(raw.family),
            bytes: raw.bytes.max(0) as u32,
            woke: raw.woke != 0,
            start_ns: raw.start_ns,
            proc_start_ns: raw.proc_start_ns,
            comm: Comm::from_raw(&raw.comm),
            proc_comm: Comm::from_raw(&raw.proc_comm),
            app: raw.app,
            uid: raw.uid,
            own_autogroup: raw.own_autogroup != 0,
        },
        3 => Event::Exec {
            ts_ns: raw.ts_ns,
            pid: raw.pid,
            comm: comm(&raw.comm),
        },
        4 => Event::Exit {
            ts_ns: raw.ts_ns,
            pid: raw.pid,
            tid: raw.tid,
            start_ns: raw.start_ns,
        },
        5 => Event::Wait {
            ts_ns: raw.ts_ns,
            app: raw.app,
        },
        6 => Event::WaitEnd {
            ts_ns: raw.ts_ns,
            app: raw.app,
        },
        _ => return None,
    };
    Some(ev)
}

// SAFETY: the event and task structs are plain old data generated from the program's BTF.
unsafe impl plain::Plain for RawEvent {}
// SAFETY: as above.
unsafe impl plain::Plain for RawTask {}

/// libbpf's own messages go through `tracing` instead of straight to stderr.
fn route_libbpf_logs() {
    libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, |level, msg| {
        let msg = msg.trim_end();
        match level {
            libbpf_rs::PrintLevel::Warn => tracing::warn!(target: "libbpf", "{msg}"),
            libbpf_rs::PrintLevel::Info => tracing::debug!(target: "libbpf", "{msg}"),
            libbpf_rs::PrintLevel::Debug => tracing::trace!(target: "libbpf", "{msg}"),
        }
    })));
}

/// Monotonic clock in ns, the same clock as the events' `ts_ns`.
/// The inode of this process's PID namespace when it is not the initial one: the probe
/// then names tasks as this namespace does (as /proc, `setpriority` and `cgroup.procs` here
/// do) and leaves out those it cannot see.
/// The initial namespace is known by its fixed inode (PROC_PID_INIT_INO): `/proc/self/status`'s
/// NSpid cannot tell, since a container's own `/proc` numbers only its own levels.
pub fn nested_pid_namespace() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    nested_pid_namespace_of(std::fs::metadata("/proc/self/ns/pid").ok()?.ino())
}

fn nested_pid_namespace_of(ino: u64) -> Option<u32> {
    const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;
    (ino != PROC_PID_INIT_INO).then(|| u32::try_from(ino).ok())?
}

/// A pidfd of process or thread `id` (`flags`: 0, or PIDFD_THREAD); None once it is gone.
/// Task storage is keyed by one from user space.
fn pidfd_open(id: u32, flags: u32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain system call; a non-negative result is a new fd we own.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, id as libc::pid_t, flags) };
    // SAFETY: the kernel just returned this fd to us.
    (r >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(r as i32) })
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The raw bytes of a plain-old-data record.
    fn bytes_of<T: plain::Plain>(v: &T) -> &'static [u8] {
        // SAFETY: T is plain old data; the bytes are copied out at once.
        let raw = unsafe {
            std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>())
        };
        Box::leak(raw.to_vec().into_boxed_slice())
    }

    #[test]
    fn the_event_and_task_decoders_answer_any_bytes() {
        let mut ev = RawEvent {
            kind: 1,
            pid: 10,
            tid: 11,
            family: 1,
            uid: 1000,
            ..RawEvent::default()
        };
        ev.comm[..4].copy_from_slice(&[-1, 27, 10, 65]);
        let seed = bytes_of(&ev);
        let Some(Event::Request { comm, uid, .. }) = decode(seed) else {
            panic!("a request event decodes");
        };
        assert_eq!((comm.escaped().as_str(), uid), ("\\xff\\x1b\\x0aA", 1000));
        assert_eq!(comm.as_bytes(), b"\xff\x1b\nA");
        appease_fuzz::fuzz("BPF event", seed, |b| {
            let _ = decode(b);
        });
        let task = RawTask {
            pid: 10,
            tid: 10,
            ..RawTask::default()
        };
        appease_fuzz::fuzz("BPF task record", bytes_of(&task), |b| {
            let _ = decode_task(b);
        });
    }

    #[test]
    fn the_initial_pid_namespace_is_known_by_its_fixed_inode() {
        assert_eq!(nested_pid_namespace_of(0xEFFF_FFFC), None);
        assert_eq!(nested_pid_namespace_of(4026532201), Some(4026532201));
    }
}
