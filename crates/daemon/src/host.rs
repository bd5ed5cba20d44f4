//! Readings of the host: CPU count, runnable tasks, CPU pressure, privileges.

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use appease_policy::batch::ProcSample;

/// What the daemon keeps once its probe is loaded: other processes' nice, slice and policy
/// (and its own real-time priority), and the idle group in a v1 hierarchy, whose root
/// directory is read-only (0555) even to root without CAP_DAC_OVERRIDE. Moves, journal,
/// status and systemd's bus need only uid 0.
pub const KEPT_CAPABILITIES: [caps::Capability; 2] = [
    caps::Capability::CAP_DAC_OVERRIDE,
    caps::Capability::CAP_SYS_NICE,
];

/// Drops every capability but `KEPT_CAPABILITIES` from this thread (threads started
/// later inherit that): effective, permitted, inheritable and ambient sets, and the
/// bounding set where the daemon may change it (CAP_SETPCAP). Returns what is kept.
pub fn drop_capabilities() -> Result<caps::CapsHashSet, caps::errors::CapsError> {
    use caps::CapSet;
    let kept: caps::CapsHashSet = KEPT_CAPABILITIES.into_iter().collect();
    if caps::has_cap(None, CapSet::Effective, caps::Capability::CAP_SETPCAP)? {
        for c in caps::read(None, CapSet::Bounding)? {
            if !kept.contains(&c) {
                caps::drop(None, CapSet::Bounding, c)?;
            }
        }
    }
    caps::clear(None, CapSet::Ambient)?;
    caps::clear(None, CapSet::Inheritable)?;
    let have = caps::read(None, CapSet::Permitted)?;
    let keep: caps::CapsHashSet = kept.intersection(&have).copied().collect();
    caps::set(None, CapSet::Effective, &keep)?;
    caps::set(None, CapSet::Permitted, &keep)?;
    Ok(keep)
}

/// Online CPUs.
pub fn cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        1
    }
}

/// Runnable tasks right now, not counting the caller (which is running while it reads).
pub fn runnable() -> Option<u32> {
    parse_loadavg_running(&fs::read_to_string("/proc/loadavg").ok()?)
}

/// The load files, kept open: read again from offset 0, each costs one system call
/// instead of a path walk, an open and a close (the loop reads them ten times a second).
pub struct LoadFiles {
    loadavg: Option<fs::File>,
    psi: Option<fs::File>,
    buf: Vec<u8>,
}

impl LoadFiles {
    pub fn open() -> Self {
        LoadFiles {
            loadavg: fs::File::open("/proc/loadavg").ok(),
            psi: fs::File::open("/proc/pressure/cpu").ok(),
            buf: vec![0; 512],
        }
    }

    /// Runnable tasks but the caller, from /proc/loadavg.
    pub fn runnable(&mut self) -> Option<u32> {
        read_from_start(self.loadavg.as_ref(), &mut self.buf).and_then(parse_loadavg_running)
    }

    /// The CPU pressure total (µs), as `psi_cpu_some_total_us` gives it.
    pub fn psi(&mut self) -> Option<u64> {
        read_from_start(self.psi.as_ref(), &mut self.buf).and_then(parse_psi_some_total)
    }
}

fn read_from_start<'b>(file: Option<&fs::File>, buf: &'b mut [u8]) -> Option<&'b str> {
    use std::os::unix::fs::FileExt;
    let n = file?.read_at(buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()
}

pub fn parse_loadavg_running(text: &str) -> Option<u32> {
    let field = text.split_whitespace().nth(3)?;
    let running: u32 = field.split('/').next()?.parse().ok()?;
    Some(running.saturating_sub(1))
}

/// Cumulative µs during which some task waited for a CPU (None without PSI).
pub fn psi_cpu_some_total_us() -> Option<u64> {
    parse_psi_some_total(&fs::read_to_string("/proc/pressure/cpu").ok()?)
}

pub fn parse_psi_some_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix("total="))?
        .parse()
        .ok()
}

/// Whether this process lives in a PID namespace other than the initial one (a container
/// without the host's PIDs).
pub fn in_nested_pid_namespace() -> bool {
    appease_probe::nested_pid_namespace().is_some()
}

/// Whether PID 1 of this process's PID namespace is systemd, booted as the service manager
/// (`/run/systemd/system`, what `sd_booted(3)` checks): in a namespace of its own, a
/// system container's.
pub fn pid1_is_systemd() -> bool {
    fs::read_to_string("/proc/1/comm").is_ok_and(|c| c.trim_end() == "systemd")
        && Path::new("/run/systemd/system").is_dir()
}

/// Whether this process has a cgroup namespace of its own: its cgroup paths are then
/// relative to a root the rest of the host does not share, and the kernel refuses moves
/// outside it. The initial namespace has a fixed inode number (CGROUP_NS_INIT_INO).
pub fn in_nested_cgroup_namespace() -> bool {
    fs::read_link("/proc/self/ns/cgroup")
        .is_ok_and(|l| l.to_string_lossy() != format!("cgroup:[{}]", 0xEFFF_FFFBu64))
}

/// Joins the host's cgroup namespace, kthreadd's (PID 2 in the host's PID namespace: the
/// kernel's threads live in the initial namespaces, and PID 1 may be a process whose
/// namespaces even root cannot open). In a container that shares the host's PIDs (a pod with
/// `hostPID: true`, `docker run --pid=host`), cgroup paths then read as the host names them,
/// and on cgroup v2 mounted with `nsdelegate` (systemd's default) the kernel allows moves
/// between any two of the host's cgroups. Only this thread joins: the caller has started no
/// thread that reads or writes cgroups. Needs CAP_SYS_PTRACE (to open another process's
/// namespace) and CAP_SYS_ADMIN (to join it), both dropped with the rest later.
pub fn join_host_cgroup_namespace() -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    if fs::read_to_string("/proc/2/comm").map_or(true, |c| c.trim_end() != "kthreadd") {
        return Err(std::io::Error::other("PID 2 is not the kernel's kthreadd"));
    }
    let ns = fs::File::open("/proc/2/ns/cgroup")?;
    // SAFETY: setns on an fd this function holds open; it changes only this thread's
    // cgroup namespace.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWCGROUP) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Raises the soft open-file limit to the hard one: one pidfd per managed thread.
pub fn raise_nofile_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid rlimit pointers.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                tracing::debug!("could not raise RLIMIT_NOFILE");
            }
        }
    }
}

/// Whether the daemon runs in the real-time class (see `prioritize_self`).
static REALTIME: AtomicBool = AtomicBool::new(false);

/// The daemon's own scheduling: SCHED_FIFO priority 1 where the kernel allows it, else
/// nice -20. Its work is tiny, and a decision delayed by the very load it manages would
/// come too late to help a request. In the real-time class it is also no entity of the
/// fair class: at nice -20 its wake-ups, though they cost 0.2 % of a core, measurably
/// lengthened the tail of a server beside idle-class batch (docs/RESULTS.md). Children
/// never inherit it (SCHED_RESET_ON_FORK), and the scan, which can take long, runs on a
/// thread of its own in the fair class (`scanner`). Call after the actuator has read the default slice
/// from this thread. Returns how the daemon runs, for the log.
pub fn prioritize_self() -> &'static str {
    if set_realtime() {
        REALTIME.store(true, Ordering::Relaxed);
        return "SCHED_FIFO 1";
    }
    tracing::info!(error = %std::io::Error::last_os_error(), "no real-time priority for the daemon; it runs at nice -20");
    set_normal();
    "nice -20"
}

fn set_realtime() -> bool {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: plain syscall on the calling thread with a valid param.
    unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param) == 0
    }
}

fn set_normal() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain syscalls on the calling thread with a valid param.
    unsafe {
        if libc::sched_setscheduler(0, libc::SCHED_OTHER | libc::SCHED_RESET_ON_FORK, &param) != 0
            || libc::setpriority(libc::PRIO_PROCESS, 0, -20) != 0
        {
            tracing::warn!(error = %std::io::Error::last_os_error(), "could not set the daemon's own priority");
        }
    }
}

/// Every process, from /proc/PID/stat.
pub fn scan_processes() -> Vec<ProcSample> {
    let tick_ns = appease_cgroup::clock_tick_ns();
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let uptime_ns = uptime_ns();
    dir.filter_map(|e| {
        let name = e.ok()?.file_name();
        let pid: u32 = name.to_str()?.parse().ok()?;
        read_process(pid, tick_ns, uptime_ns)
    })
    .collect()
}

/// The processes (pid, start in clock ticks) that hold a listening socket now: TCP
/// sockets in the LISTEN state and UNIX sockets accepting connections, of every network
/// namespace. Read once at start, before capabilities are dropped (a process's open
/// files are readable only with CAP_SYS_PTRACE); the probe sees every later listen()
/// and accept().
pub fn listening_processes() -> std::collections::HashSet<(u32, u64)> {
    use std::collections::{HashMap, HashSet};
    let mut by_netns: HashMap<String, HashSet<u64>> = HashMap::new();
    let mut out = HashSet::new();
    let Ok(dir) = fs::read_dir("/proc") else {
        return out;
    };
    for pid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        let Ok(ns) = fs::read_link(format!("/proc/{pid}/ns/net")) else {
            continue; // a kernel thread, or gone
        };
        let inodes = by_netns
            .entry(ns.to_string_lossy().into_owned())
            .or_insert_with(|| {
                let read = |f: &str| fs::read_to_string(format!("/proc/{pid}/net/{f}"));
                let mut set = HashSet::new();
                for f in ["tcp", "tcp6"] {
                    set.extend(read(f).map_or_else(|_| Vec::new(), |t| tcp_listening(&t)));
                }
                set.extend(read("unix").map_or_else(|_| Vec::new(), |t| unix_listening(&t)));
                set
            });
        if inodes.is_empty() {
            continue;
        }
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        let listens = fds
            .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
            .any(|l| socket_inode(&l.to_string_lossy()).is_some_and(|i| inodes.contains(&i)));
        if listens {
            if let Some(p) = scan_process(pid) {
                out.insert((pid, p.start));
            }
        }
    }
    out
}

/// The processes that servers in `listening` forked before the daemon started, each
/// with the application the probe's fork hook would have given it: its parent's, or its
/// parent itself if the parent listens (a child of the service manager is an application
/// of its own, as the hook has it). Without this, a database's connection made before
/// appease started is an application of its own, not a connection of its server.
pub fn older_workers(
    procs: &[ProcSample],
    listening: &std::collections::HashSet<(u32, u64)>,
) -> Vec<(u32, u32)> {
    use std::collections::HashMap;
    let by_pid: HashMap<u32, &ProcSample> = procs.iter().map(|p| (p.pid, p)).collect();
    let listens = |pid: u32| {
        by_pid
            .get(&pid)
            .is_some_and(|p| listening.contains(&(pid, p.start)))
    };
    // The hook passes a server's application down its tree, so a process's is its
    // highest listening ancestor below the service manager. The walk is bounded: /proc
    // read at two moments could show a parent that is its own ancestor.
    let app = |p: &ProcSample| {
        let (mut app, mut at) = (None, p.ppid);
        for _ in 0..64 {
            if at <= 1 {
                break;
            }
            if listens(at) {
                app = Some(at);
            }
            at = by_pid.get(&at).map_or(0, |q| q.ppid);
        }
        app
    };
    let mut out: Vec<(u32, u32)> = procs
        .iter()
        .filter(|p| !p.kernel_thread)
        .filter_map(|p| app(p).map(|a| (p.pid, a)))
        .collect();
    out.sort_unstable();
    out
}

/// Inodes of the listening sockets in a /proc/net/tcp or tcp6 table (state 0A).
pub fn tcp_listening(text: &str) -> Vec<u64> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(3) == Some(&"0A")).then(|| f.get(9)?.parse().ok())?
        })
        .collect()
}

/// Inodes of the UNIX sockets accepting connections in /proc/net/unix (flag
/// __SO_ACCEPTCON, 0x10000).
pub fn unix_listening(text: &str) -> Vec<u64> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let flags = u32::from_str_radix(f.get(3)?, 16).ok()?;
            (flags & 0x10000 != 0).then(|| f.get(6)?.parse().ok())?
        })
        .collect()
}

/// The inode of a `socket:[N]` file descriptor link.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// One process, from /proc/PID/stat.
pub fn scan_process(pid: u32) -> Option<ProcSample> {
    read_process(pid, appease_cgroup::clock_tick_ns(), uptime_ns())
}

fn read_process(pid: u32, tick_ns: u64, uptime_ns: u64) -> Option<ProcSample> {
    let text = fs::read(format!("/proc/{pid}/stat")).ok()?;
    let mut p = parse_proc_stat(&text, tick_ns)?;
    p.age_ns = uptime_ns.saturating_sub(p.start * tick_ns);
    Some(p)
}

fn uptime_ns() -> u64 {
    fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0, |s| (s * 1e9) as u64)
}

/// A process's sample from its /proc/PID/stat text, its times in ticks of `tick_ns`.
pub fn parse_proc_stat(text: &[u8], tick_ns: u64) -> Option<ProcSample> {
    let s = appease_cgroup::ProcStat::parse(text)?;
    Some(ProcSample {
        pid: s.pid,
        ppid: s.ppid,
        kernel_thread: s.kernel_thread(),
        has_tty: s.tty_nr != 0,
        // Not in /proc's stat: the probe's task iterator tells it.
        listens: false,
        comm: s.comm,
        start: s.start,
        cpu_ns: s.cpu_ticks * tick_ns,
        wait_ns: 0,
        age_ns: 0,
        sched_idle: s.policy == libc::SCHED_IDLE as u32,
        // Nor this: the probe's task iterator tells it.
        last_response: None,
    })
}

/// The process's path in the CPU cgroup hierarchy (v1 cpu controller, else v2).
pub fn cpu_cgroup_of(pid: u32) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    appease_cgroup::parse_proc_cgroup(&text, appease_cgroup::Version::V1)
        .or_else(|| appease_cgroup::parse_proc_cgroup(&text, appease_cgroup::Version::V2))
}

/// Sum over a process's threads of the time spent runnable but waiting (schedstat run_delay).
pub fn wait_ns_of(pid: u32) -> Option<u64> {
    let dir = fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0u64;
    for e in dir.flatten() {
        let path = e.path().join("schedstat");
        if let Ok(text) = fs::read_to_string(path) {
            total += text
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Some(total)
}

/// Whether any of a process's threads is running or waiting for a CPU right now (state R).
/// schedstat's run_delay grows only when a thread gets the CPU, so a thread starved for a
/// whole scan shows no new wait there; its state still says it wants to run.
pub fn runnable_now(pid: u32) -> bool {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    dir.flatten().any(|e| {
        fs::read(e.path().join("stat"))
            .ok()
            .and_then(|t| Some(appease_cgroup::stat_fields(&t)?.1.first()? == &"R"))
            .unwrap_or(false)
    })
}

/// The user a process runs as (its effective uid, what `ps` shows), from
/// /proc/PID/status. Not from a /proc file's owner: the files of a process that is not
/// dumpable (one that changed its uid) are root's; only the directory keeps the euid.
pub fn uid_of_process(pid: u32) -> Option<u32> {
    parse_status_uid(&fs::read(format!("/proc/{pid}/status")).ok()?)
}

/// The effective uid from /proc/PID/status bytes ("Uid:\treal\teffective\tsaved\tfs").
pub fn parse_status_uid(text: &[u8]) -> Option<u32> {
    appease_cgroup::status_value(text, "Uid")?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Puts a thread of this process (0: the calling one) in the idle class (`SCHED_IDLE`),
/// or back in the normal class at nice 0.
pub fn set_thread_idle_class(tid: u32, idle: bool) -> std::io::Result<()> {
    let policy = if idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler with a valid param; tid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(tid as libc::pid_t, policy, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_servers_older_workers_are_given_to_it_as_its_forks_would_be() {
        let p = |pid, ppid, start| ProcSample {
            pid,
            ppid,
            start,
            ..ProcSample::default()
        };
        let procs = [
            p(1, 0, 1),
            // A database started by the service manager, listening; a connection of it
            // and that connection's own child; its checkpointer.
            p(100, 1, 10),
            p(101, 100, 11),
            p(102, 101, 12),
            p(103, 100, 13),
            // A shell and what it started: nobody's application.
            p(200, 1, 20),
            p(201, 200, 21),
            // A listening child of the database: its forks stay the database's.
            p(300, 100, 30),
            p(301, 300, 31),
            // A process that listened under this pid before, not this one.
            p(400, 1, 40),
            p(401, 400, 41),
        ];
        let listening = [(100, 10), (300, 30), (400, 39)].into_iter().collect();
        assert_eq!(
            older_workers(&procs, &listening),
            [(101, 100), (102, 100), (103, 100), (300, 100), (301, 100)]
        );
    }

    #[test]
    fn listening_sockets_are_read_from_the_net_tables() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1";
        assert_eq!(tcp_listening(tcp), vec![4242]);
        let unix = "Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 777 /run/app.sock
0000000000000000: 00000003 00000000 00000000 0001 03 778 /run/app.sock
0000000000000000: 00000002 00000000 00000000 0002 01 779";
        assert_eq!(unix_listening(unix), vec![777]);
        assert_eq!(socket_inode("socket:[777]"), Some(777));
        assert_eq!(socket_inode("pipe:[777]"), None);
        assert_eq!(tcp_listening("garbage\n0: x y 0A"), Vec::<u64>::new());
    }

    #[test]
    #[ignore = "needs root (reads every process's open files): make test runs it, or as root cargo test -- --include-ignored"]
    fn a_process_listening_now_is_found_and_one_that_does_not_is_not() {
        let _listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let me = std::process::id();
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let found = listening_processes();
        let other = sleeper.id();
        let other_start = scan_process(other).unwrap().start;
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        assert!(found.contains(&(me, scan_process(me).unwrap().start)));
        assert!(!found.contains(&(other, other_start)));
    }

    use super::*;

    #[test]
    fn the_real_uid_is_read_from_status() {
        let status = "Name:\tsshd-session\nUmask:\t0022\nUid:\t0\t1000\t0\t1000\n";
        assert_eq!(
            parse_status_uid(status.as_bytes()),
            Some(1000),
            "the effective uid"
        );
        assert_eq!(parse_status_uid(b"Name:\tx\n"), None);
    }

    #[test]
    #[ignore = "needs root (changes a child's uid): make test runs it, or as root cargo test -- --include-ignored"]
    fn a_process_that_is_not_dumpable_is_owned_by_its_uid_though_its_proc_files_are_roots() {
        let mut ready = [0i32; 2];
        // SAFETY: pipe fills the two fds.
        assert_eq!(unsafe { libc::pipe(ready.as_mut_ptr()) }, 0);
        // SAFETY: the child only calls async-signal-safe functions, then is killed.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: as above. A process that changed its uid is not dumpable where
            // fs.suid_dumpable is 0 or 2; it says so itself here, whatever the sysctl.
            unsafe {
                libc::setresuid(65534, 65534, 65534);
                libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
                libc::write(ready[1], b"r".as_ptr().cast(), 1);
                loop {
                    libc::pause();
                }
            }
        }
        let pid = child as u32;
        let mut byte = [0u8; 1];
        // SAFETY: reading one byte into a one-byte buffer; the child writes it when ready.
        assert_eq!(
            unsafe { libc::read(ready[0], byte.as_mut_ptr().cast(), 1) },
            1
        );
        use std::os::unix::fs::MetadataExt;
        let proc_owner = fs::metadata(format!("/proc/{pid}/status")).unwrap().uid();
        let owner = uid_of_process(pid);
        // SAFETY: ending and reaping our own child.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
        assert_eq!(
            proc_owner, 0,
            "the /proc files of a non-dumpable process are root's"
        );
        assert_eq!(owner, Some(65534), "its owner is still the uid it runs as");
    }

    #[test]
    fn parses_a_process_line() {
        let line = "4242 (cc1 (x)) R 4200 4200 4100 34816 4242 4194304 100 0 0 0 150 50 10 20 20 0 1 0 98765 1000 200 \
                    18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let p = parse_proc_stat(line.as_bytes(), 10_000_000).unwrap();
        assert_eq!(
            (p.pid, p.ppid, p.comm.as_str(), p.start),
            (4242, 4200, "cc1 (x)", 98765)
        );
        assert_eq!(p.cpu_ns, 230 * 10_000_000);
        assert!(!p.kernel_thread && p.has_tty);
        let me = scan_processes();
        assert!(me.iter().any(|p| p.pid == std::process::id()));
        assert!(me.iter().any(|p| p.pid == 1));
    }

    #[test]
    fn proc_entries_vanishing_mid_read_are_skipped_never_fatal() {
        // Short-lived processes come and go while the /proc readers run: an entry listed
        // by the directory read is gone by the file read, a task dir empties mid-walk.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let storm = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(mut c) = std::process::Command::new("true").spawn() {
                        let _ = c.wait();
                        n += 1;
                    }
                }
                n
            })
        };
        let mut looked = 0;
        let end = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while std::time::Instant::now() < end {
            let procs = scan_processes();
            assert!(procs.iter().any(|p| p.pid == std::process::id()));
            for p in procs.iter().filter(|p| p.pid > std::process::id()) {
                let _ = wait_ns_of(p.pid);
                let _ = runnable_now(p.pid);
                let _ = cpu_cgroup_of(p.pid);
                let _ = uid_of_process(p.pid);
                let _ = scan_process(p.pid);
                looked += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        let spawned = storm.join().unwrap();
        assert!(spawned > 20, "the storm ran ({spawned} processes)");
        assert!(looked > 0, "some came and went while being read");
        assert_eq!(
            wait_ns_of(u32::MAX),
            None,
            "a process that is gone reads as none"
        );
        assert_eq!(scan_process(u32::MAX), None);
        assert_eq!(cpu_cgroup_of(u32::MAX), None);
    }

    #[test]
    fn parses_kernel_formats() {
        assert_eq!(
            parse_loadavg_running("0.52 0.30 0.10 5/312 4242\n"),
            Some(4)
        );
        assert_eq!(parse_loadavg_running("garbage"), None);
        let psi = "some avg10=2.01 avg60=1.89 avg300=0.55 total=2048070\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_psi_some_total(psi), Some(2_048_070));
        assert!(runnable().is_some());
        assert!(cpus() >= 1);
        let mut files = LoadFiles::open();
        for _ in 0..2 {
            assert!(files.runnable().is_some(), "read again from the start");
            assert_eq!(files.psi().is_some(), psi_cpu_some_total_us().is_some());
        }
    }

    #[test]
    fn a_spinning_thread_is_runnable_and_a_sleeping_process_is_not() {
        // This thread runs while it reads its own state.
        assert!(runnable_now(std::process::id()));
        let mut sleeper = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = sleeper.id();
        // Until it has gone to sleep it may still be runnable.
        let asleep = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            !runnable_now(pid)
        });
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        assert!(asleep, "`sleep 5` never left state R");
        assert!(!runnable_now(u32::MAX), "no such process");
    }
}

/// What the daemon reads from /proc fed damaged text: a value or none, never a panic.
#[cfg(test)]
mod fuzz_tests {
    use super::*;
    use appease_fuzz::{fuzz, seed_from, text};

    #[test]
    fn the_proc_parsers_never_panic_on_damaged_proc_text() {
        fuzz("/proc/PID/stat (scan)", seed_from("/proc/self/stat"), |b| {
            let _ = parse_proc_stat(b, 10_000_000);
        });
        fuzz("/proc/pressure/cpu", seed_from("/proc/pressure/cpu"), |b| {
            let _ = parse_psi_some_total(&text(b));
        });
        fuzz("/proc/loadavg", seed_from("/proc/loadavg"), |b| {
            let _ = parse_loadavg_running(&text(b));
        });
    }
}
