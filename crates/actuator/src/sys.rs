//! Thin, checked wrappers around the scheduling syscalls and /proc parsing.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

pub const SCHED_NORMAL: u32 = 0;
pub const SCHED_FIFO: u32 = 1;
pub const SCHED_RR: u32 = 2;
pub const SCHED_BATCH: u32 = 3;
pub const SCHED_IDLE: u32 = 5;
pub const SCHED_DEADLINE: u32 = 6;

const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;
const SCHED_FLAG_KEEP_POLICY: u64 = 0x08;
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

/// The kernel's `struct sched_attr` (include/uapi/linux/sched/types.h), size VER1.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
    sched_util_min: u32,
    sched_util_max: u32,
}

/// What appease reads and writes of a thread's scheduling state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sched {
    pub policy: u32,
    pub nice: i32,
    /// EEVDF slice (sched_runtime) as the kernel reports it.
    pub slice_ns: u64,
    pub reset_on_fork: bool,
}

pub fn sched_getattr(tid: u32) -> io::Result<Sched> {
    let mut a = SchedAttr::default();
    // SAFETY: `a` is a valid, writable sched_attr of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid as libc::pid_t,
            &mut a as *mut SchedAttr,
            std::mem::size_of::<SchedAttr>() as libc::c_uint,
            0 as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Sched {
        policy: a.sched_policy,
        nice: a.sched_nice,
        slice_ns: a.sched_runtime,
        reset_on_fork: a.sched_flags & SCHED_FLAG_RESET_ON_FORK != 0,
    })
}

/// Sets nice and slice of a fair-class thread in one call, keeping its policy.
/// `slice_ns == 0` gives the kernel's default slice back.
pub fn sched_set_fair(tid: u32, nice: i32, slice_ns: u64, reset_on_fork: bool) -> io::Result<()> {
    sched_setattr(
        tid,
        &SchedAttr {
            size: std::mem::size_of::<SchedAttr>() as u32,
            sched_flags: SCHED_FLAG_KEEP_POLICY | rof_flag(reset_on_fork),
            sched_nice: nice,
            sched_runtime: slice_ns,
            ..Default::default()
        },
    )
}

fn rof_flag(reset_on_fork: bool) -> u64 {
    if reset_on_fork {
        SCHED_FLAG_RESET_ON_FORK
    } else {
        0
    }
}

fn sched_setattr(tid: u32, a: &SchedAttr) -> io::Result<()> {
    // SAFETY: `a` is a valid sched_attr whose size field matches.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            tid as libc::pid_t,
            a as *const SchedAttr,
            0 as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets a thread's policy (SCHED_NORMAL, SCHED_BATCH or SCHED_IDLE) with its nice and
/// slice; `slice_ns == 0` is the kernel's default slice.
pub fn sched_set_policy(tid: u32, to: Sched) -> io::Result<()> {
    sched_setattr(
        tid,
        &SchedAttr {
            size: std::mem::size_of::<SchedAttr>() as u32,
            sched_policy: to.policy,
            sched_flags: rof_flag(to.reset_on_fork),
            sched_nice: to.nice,
            sched_runtime: to.slice_ns,
            ..Default::default()
        },
    )
}

/// The threads of a process (empty once it is gone).
pub fn threads_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A pidfd for one thread; it becomes readable when the thread exits.
pub fn pidfd_open_thread(tid: u32) -> io::Result<OwnedFd> {
    pidfd_open(tid, PIDFD_THREAD)
}

/// A pidfd for a process: signals sent through it never reach another process that got
/// its pid after it ended.
pub fn pidfd_open_process(pid: u32) -> io::Result<OwnedFd> {
    pidfd_open(pid, 0)
}

fn pidfd_open(id: u32, flags: libc::c_uint) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; a non-negative result is a new fd we own.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, id as libc::pid_t, flags) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// True while the thread behind the pidfd has not exited.
pub fn pidfd_alive(fd: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r == 0
}

/// What the actuator asks of the kernel: `Host` is the real one; the actuator's unit
/// tests drive a fake through the same calls.
pub trait Kernel: Send {
    fn sched_getattr(&self, tid: u32) -> io::Result<Sched>;
    /// Sets a thread's nice, slice and reset-on-fork; it keeps its policy.
    fn sched_set_fair(&self, tid: u32, nice: i32, slice_ns: u64, rof: bool) -> io::Result<()>;
    fn sched_set_policy(&self, tid: u32, to: Sched) -> io::Result<()>;
    fn task_stat(&self, pid: u32, tid: u32) -> io::Result<TaskStat>;
    fn threads_of(&self, pid: u32) -> Vec<u32>;
    /// None where pidfds are unavailable: liveness then comes from `task_stat`.
    fn pidfd_open_thread(&self, tid: u32) -> Option<OwnedFd>;
    /// A process's name (its main thread's), None once it is gone.
    fn comm(&self, pid: u32) -> Option<String>;
    fn ppid(&self, pid: u32) -> Option<u32>;
    /// Every process on the host.
    fn processes(&self) -> Vec<u32>;
    /// The CPUs a thread may run on, in order.
    fn affinity(&self, tid: u32) -> io::Result<Vec<usize>>;
    fn set_affinity(&self, tid: u32, cpus: &[usize]) -> io::Result<()>;
    /// The CPUs the host has online, in order.
    fn online_cpus(&self) -> Vec<usize>;
    /// Whether the kernel schedules processes in their session's autogroup now
    /// (`sched_autogroup_enabled`; only those in the root CPU cgroup: the caller checks).
    fn autogroups_enabled(&self) -> bool;
    /// The autogroup of a process's session and its nice (readable, and writable, whether
    /// or not autogroups are enabled); None once it is gone.
    fn autogroup(&self, pid: u32) -> Option<Autogroup>;
    /// Sets the nice of the autogroup `pid` is in (its session's, as the kernel sees it
    /// at the write). The kernel takes one such write per 100 ms host-wide from a writer
    /// without CAP_SYS_ADMIN and refuses the others with EAGAIN.
    fn set_autogroup_nice(&self, pid: u32, nice: i32) -> io::Result<()>;
    /// systemd's D-Bus API, connected now (only a restore of units made idle needs it).
    fn system_bus(&self)
        -> Result<Box<dyn crate::systemd::UnitControl>, crate::systemd::UnitError>;
}

/// A session's autogroup: the kernel's task group for it, at the top of the CPU
/// hierarchy. Its id is never reused while the host runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Autogroup {
    pub id: u64,
    pub nice: i32,
}

/// "/autogroup-12 nice 0" (/proc/PID/autogroup).
pub fn parse_autogroup(text: &str) -> Option<Autogroup> {
    let (group, nice) = text.trim().split_once(" nice ")?;
    Some(Autogroup {
        id: group.strip_prefix("/autogroup-")?.parse().ok()?,
        nice: nice.trim().parse().ok()?,
    })
}

/// The running kernel: system calls and /proc.
pub struct Host;

impl Kernel for Host {
    fn sched_getattr(&self, tid: u32) -> io::Result<Sched> {
        sched_getattr(tid)
    }
    fn sched_set_fair(&self, tid: u32, nice: i32, slice_ns: u64, rof: bool) -> io::Result<()> {
        sched_set_fair(tid, nice, slice_ns, rof)
    }
    fn sched_set_policy(&self, tid: u32, to: Sched) -> io::Result<()> {
        sched_set_policy(tid, to)
    }
    fn task_stat(&self, pid: u32, tid: u32) -> io::Result<TaskStat> {
        task_stat(pid, tid)
    }
    fn threads_of(&self, pid: u32) -> Vec<u32> {
        threads_of(pid)
    }
    fn pidfd_open_thread(&self, tid: u32) -> Option<OwnedFd> {
        pidfd_open_thread(tid).ok()
    }
    fn comm(&self, pid: u32) -> Option<String> {
        let c = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
        Some(appease_cgroup::names::escaped(
            c.strip_suffix(b"\n").unwrap_or(&c),
        ))
    }
    fn ppid(&self, pid: u32) -> Option<u32> {
        appease_cgroup::read_ppid(pid)
    }
    fn affinity(&self, tid: u32) -> io::Result<Vec<usize>> {
        affinity(tid)
    }
    fn set_affinity(&self, tid: u32, cpus: &[usize]) -> io::Result<()> {
        set_affinity(tid, cpus)
    }
    fn online_cpus(&self) -> Vec<usize> {
        std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|t| parse_cpu_list(&t))
            .unwrap_or_else(|| (0..affinity(0).map_or(1, |c| c.len())).collect())
    }
    fn autogroups_enabled(&self) -> bool {
        std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled")
            .is_ok_and(|t| t.trim() == "1")
    }
    fn autogroup(&self, pid: u32) -> Option<Autogroup> {
        parse_autogroup(&std::fs::read_to_string(format!("/proc/{pid}/autogroup")).ok()?)
    }
    fn set_autogroup_nice(&self, pid: u32, nice: i32) -> io::Result<()> {
        std::fs::write(format!("/proc/{pid}/autogroup"), nice.to_string())
    }
    fn processes(&self) -> Vec<u32> {
        std::fs::read_dir("/proc")
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn system_bus(
        &self,
    ) -> Result<Box<dyn crate::systemd::UnitControl>, crate::systemd::UnitError> {
        Ok(Box::new(crate::systemd::SystemBus::connect()?))
    }
}

/// Fields of /proc/PID/task/TID/stat that decide whether and how appease may touch a thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskStat {
    pub comm: String,
    pub kernel_thread: bool,
    pub nice: i32,
    /// Start time in clock ticks after boot: with the tid, a thread's identity.
    pub start: u64,
    pub policy: u32,
    /// Its session's id (the leader's pid).
    pub session: u32,
}

pub fn parse_stat(text: &[u8]) -> Option<TaskStat> {
    let s = appease_cgroup::ProcStat::parse(text)?;
    Some(TaskStat {
        kernel_thread: s.kernel_thread(),
        comm: s.comm,
        nice: s.nice,
        start: s.start,
        policy: s.policy,
        session: s.session,
    })
}

pub fn task_stat(pid: u32, tid: u32) -> io::Result<TaskStat> {
    let text = std::fs::read(format!("/proc/{pid}/task/{tid}/stat"))?;
    parse_stat(&text)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable /proc stat"))
}

/// Total CPU time of a thread in ns (first field of schedstat).
pub fn thread_cpu_ns(pid: u32, tid: u32) -> Option<u64> {
    thread_run_wait_ns(pid, tid).map(|(run, _)| run)
}

/// A thread's time on a CPU and time runnable but waiting for one, ns (the first two
/// fields of schedstat): together, how much it wanted to run.
pub fn thread_run_wait_ns(pid: u32, tid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
    parse_schedstat(&text)
}

/// The first two numbers of a schedstat line.
fn parse_schedstat(text: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(text).ok()?;
    let mut f = text.split_whitespace().map(|x| x.parse::<u64>().ok());
    Some((f.next()??, f.next()??))
}

/// Threads' CPU times read through their schedstat files kept open. A watched thread's
/// CPU time is read every 100 ms by the real-time loop; each open walks
/// `/proc/PID/task/TID`, and with a process of 10,000 threads beside it the opens and
/// closes took half the loop's time, in bursts a server waited behind. An open file
/// stays bound to its thread: once the thread ends it reads ESRCH, never the thread
/// that gets its id next.
#[derive(Default)]
pub struct ThreadCpu {
    open: std::collections::HashMap<(u32, u32), (std::fs::File, std::time::Instant)>,
}

/// Files kept open at most: the rest are read by path, as without the cache.
const THREAD_CPU_OPEN_MAX: usize = 512;

impl ThreadCpu {
    /// The thread's total CPU time, ns; None once it is gone.
    pub fn read(&mut self, pid: u32, tid: u32) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let now = std::time::Instant::now();
        if let Some((file, used)) = self.open.get_mut(&(pid, tid)) {
            *used = now;
            let mut buf = [0u8; 128];
            let read = file
                .read_at(&mut buf, 0)
                .ok()
                .and_then(|n| parse_schedstat(&buf[..n]));
            if read.is_none() {
                self.open.remove(&(pid, tid)); // ended: its id is not looked up again
            }
            return read.map(|(run, _)| run);
        }
        if self.open.len() >= THREAD_CPU_OPEN_MAX {
            return thread_cpu_ns(pid, tid);
        }
        let file = std::fs::File::open(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
        self.open.insert((pid, tid), (file, now));
        self.read(pid, tid)
    }

    /// Closes the files of threads not read for `idle`.
    pub fn close_unread(&mut self, idle: std::time::Duration) {
        self.open.retain(|_, (_, used)| used.elapsed() < idle);
    }

    /// Files open now.
    pub fn open_files(&self) -> usize {
        self.open.len()
    }
}

/// The CPUs thread `tid` (0: the caller) may run on.
pub fn affinity(tid: u32) -> io::Result<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let r = unsafe {
        libc::sched_getaffinity(tid as i32, std::mem::size_of::<libc::cpu_set_t>(), &mut set)
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Lets thread `tid` run on `cpus` only.
pub fn set_affinity(tid: u32, cpus: &[usize]) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `cpu` is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let r = unsafe {
        libc::sched_setaffinity(tid as i32, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A kernel CPU list ("0-3,8,10-11"), as in /sys/devices/system/cpu/online.
pub fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if a > b || b >= libc::CPU_SETSIZE as usize {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    (!cpus.is_empty()).then_some(cpus)
}

pub fn is_esrch(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ESRCH) || e.kind() == io::ErrorKind::NotFound
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_spaces_and_parens_in_comm() {
        let line = "1234 (my (odd) srv) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 6 0 0 20 -5 3 0 98765 1000 200 \
                    18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 3 0 0 0";
        let s = parse_stat(line.as_bytes()).unwrap();
        assert_eq!(s.comm, "my (odd) srv");
        assert_eq!(s.nice, -5);
        assert_eq!(s.start, 98765);
        assert_eq!(s.policy, 3);
        assert!(!s.kernel_thread);
    }

    #[test]
    fn parses_autogroups_and_refuses_other_text() {
        assert_eq!(
            parse_autogroup("/autogroup-123 nice -10\n"),
            Some(Autogroup { id: 123, nice: -10 })
        );
        assert_eq!(parse_autogroup(""), None);
        assert_eq!(parse_autogroup("/autogroup-x nice 0"), None);
        assert_eq!(parse_autogroup("/other-1 nice 0"), None);
    }

    /// A child that starts a session of its own gets an autogroup of its own
    /// at nice 0, whatever session the test runs in (a process of the first
    /// session, as under some CI runners, has none to read).
    #[test]
    fn reads_the_autogroup_of_a_child_in_a_session_of_its_own() {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        // SAFETY: setsid is async-signal-safe and touches no memory of ours.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("sleep runs");
        let got = Host.autogroup(child.id());
        child.kill().ok();
        child.wait().ok();
        let got = got.expect("a kernel with autogroups (CONFIG_SCHED_AUTOGROUP)");
        assert_eq!(got.nice, 0, "{got:?}");
        assert!(got.id > 0, "{got:?}");
        assert_eq!(Host.autogroup(u32::MAX), None);
    }

    #[test]
    fn parses_cpu_lists() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(vec![0, 1]));
        assert_eq!(
            parse_cpu_list("0-3,8,10-11"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn reads_and_sets_a_threads_affinity() {
        let all = affinity(0).unwrap();
        assert!(!all.is_empty());
        // A thread of our own, pinned to one CPU and back.
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            // SAFETY: no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let last = *all.last().unwrap();
        set_affinity(tid, &[last]).unwrap();
        assert_eq!(affinity(tid).unwrap(), vec![last]);
        set_affinity(tid, &all).unwrap();
        assert_eq!(affinity(tid).unwrap(), all);
        done_tx.send(()).unwrap();
        h.join().unwrap();
    }

    #[test]
    fn reads_own_thread() {
        // SAFETY: no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let pid = std::process::id();
        let s = task_stat(pid, tid).unwrap();
        assert!(!s.kernel_thread);
        let a = sched_getattr(tid).unwrap();
        assert_eq!(a.nice, s.nice);
        assert_eq!(a.policy, s.policy);
        let before = thread_cpu_ns(pid, tid).unwrap();
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(5) {
            std::hint::spin_loop();
        }
        // A context switch (the read syscall itself) makes the kernel account the time.
        std::thread::yield_now();
        assert!(thread_cpu_ns(pid, tid).unwrap() > before);
        let fd = pidfd_open_thread(tid).unwrap();
        assert!(pidfd_alive(&fd));
    }

    #[test]
    fn a_threads_cpu_is_read_through_its_open_file_until_it_ends_then_never_again() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            // SAFETY: no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            let _ = go_rx.recv();
            let t = std::time::Instant::now();
            while t.elapsed() < std::time::Duration::from_millis(5) {
                std::hint::spin_loop();
            }
            tx.send(0).unwrap();
            let _ = done_rx.recv();
        });
        let (pid, tid) = (std::process::id(), rx.recv().unwrap());
        let mut cpu = ThreadCpu::default();
        let first = cpu.read(pid, tid).unwrap();
        assert_eq!(cpu.open_files(), 1);
        go_tx.send(()).unwrap();
        rx.recv().unwrap(); // it spun, and is now waiting (its time accounted)
        std::thread::sleep(std::time::Duration::from_millis(5));
        let later = cpu.read(pid, tid).unwrap();
        assert!(
            later > first,
            "read again through the same file: {first} -> {later}"
        );
        assert_eq!(cpu.open_files(), 1);
        done_tx.send(()).unwrap();
        h.join().unwrap();
        // join returns at the thread's exit (its clear_child_tid wake), a moment before the
        // kernel releases it: its file reads on until then, and never after.
        let ended = std::time::Instant::now();
        while cpu.read(pid, tid).is_some() {
            assert!(
                ended.elapsed() < std::time::Duration::from_secs(2),
                "its file still reads 2 s after the thread ended"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(cpu.read(pid, tid), None, "ended");
        assert_eq!(cpu.open_files(), 0, "its file closed");
        assert_eq!(cpu.read(pid, 0), None, "no such thread");
        // SAFETY: no preconditions.
        let own = unsafe { libc::gettid() } as u32;
        assert!(cpu.read(pid, own).is_some());
        cpu.close_unread(std::time::Duration::ZERO);
        assert_eq!(cpu.open_files(), 0, "closed once unread");
    }
}
