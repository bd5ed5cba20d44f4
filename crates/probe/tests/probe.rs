//! Runs the probe on the real kernel. Needs root: ignored with the reason otherwise (make test runs it).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use appease_probe::{Event, Family, Probe, ProbeConfig, ProbeStorage};

mod cpu_times;
mod sessions;

/// Root-only tests are `#[ignore]`d with the reason; run without root anyway
/// (`--include-ignored`), they fail here saying so.
/// Also one test at a time: each test's probe sees the whole process (one application),
/// and another test's threads would wait on locks in the middle of its own.
pub(crate) fn assert_root() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "loading BPF programs needs root; run it as root (make test does)"
    );
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// Collects events for `dur` and returns them.
pub(crate) fn collect(probe: &mut Probe, dur: Duration) -> Vec<Event> {
    let mut out = Vec::new();
    let end = Instant::now() + dur;
    while Instant::now() < end {
        probe
            .poll(Duration::from_millis(20), |e| out.push(e))
            .unwrap();
    }
    out
}

fn requests_of(events: &[Event], want_tid: u32) -> Vec<(Family, u32)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Request {
                tid, family, bytes, ..
            } if *tid == want_tid => Some((*family, *bytes)),
            _ => None,
        })
        .collect()
}

#[test]
#[ignore = "needs root (BPF, priorities, cgroups): make test runs it, or as root cargo test -- --include-ignored"]
fn reports_socket_reads_with_family_filtered_per_thread_and_their_exits() {
    let _serial = assert_root();
    let mut storage = ProbeStorage::uninit();
    let cfg = ProbeConfig {
        min_gap: Duration::from_millis(200),
        ignore_pid: None,
        ..ProbeConfig::default()
    };
    let mut probe = Probe::load(&cfg, &mut storage).expect("probe loads as root");

    // A TCP server thread receiving 50 small requests in quick succession.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    let tcp_server = thread::spawn(move || {
        tx.send(gettid()).unwrap();
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 64];
        let (mut got, mut reads) = (0, 0);
        while got < 50 {
            let n = s.read(&mut buf).unwrap();
            reads += 1;
            if n == 0 {
                break;
            }
            got += n;
        }
        // Fewer than 50 when bytes arrive together while the thread is off CPU.
        reads
    });
    let tcp_tid = rx.recv().unwrap();
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    for _ in 0..50 {
        c.write_all(b"x").unwrap();
        thread::sleep(Duration::from_micros(200));
    }

    // A UNIX-socket server thread.
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let (tx, rx) = mpsc::channel();
    let unix_server = thread::spawn(move || {
        tx.send(gettid()).unwrap();
        let mut buf = [0u8; 16];
        let (mut got, mut reads) = (0, 0);
        while got < 4 {
            got += b.read(&mut buf[got..4]).unwrap();
            reads += 1;
        }
        reads
    });
    let unix_tid = rx.recv().unwrap();
    a.write_all(b"ping").unwrap();

    // A file read is not a request.
    let mut f = std::fs::File::open("/proc/self/stat").unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();

    // A short-lived child process that receives no request: fork, exec and exit.
    let child = std::process::Command::new("/bin/true").spawn().unwrap();
    let child_pid = child.id();
    let _ = { child }.wait().unwrap();

    let tcp_reads = tcp_server.join().unwrap();
    let unix_reads = unix_server.join().unwrap();
    let events = collect(&mut probe, Duration::from_millis(300));

    eprintln!("events: {events:?}\ncounters: {:?}", probe.counters());
    let tcp = requests_of(&events, tcp_tid);
    assert!(
        !tcp.is_empty(),
        "the TCP server thread's reads were reported"
    );
    assert!(
        tcp.iter().all(|(f, b)| *f == Family::Inet && *b > 0),
        "{tcp:?}"
    );
    assert!(
        tcp.len() <= 3,
        "50 reads within ~15 ms give one event per 200 ms quiet period, got {}",
        tcp.len()
    );

    let unix = requests_of(&events, unix_tid);
    assert_eq!(unix.len(), 1, "one UNIX request event: {unix:?}");
    assert_eq!(unix[0].0, Family::Unix);

    let me = gettid();
    assert!(
        requests_of(&events, me).is_empty(),
        "the file read made no request event"
    );

    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Exit { tid, .. } if *tid == tcp_tid)),
        "the exit of a thread that received requests is reported"
    );
    assert!(
        !events.iter().any(|e| matches!(e, Event::Exit { pid, .. } | Event::Exec { pid, .. } if *pid == child_pid)),
        "a process that received no request is not reported: a build's execs and exits never reach the daemon"
    );
    // Execs are reported while wanted.
    probe.set_exec_events(true);
    let child = std::process::Command::new("/bin/true").spawn().unwrap();
    let wanted_pid = child.id();
    let _ = { child }.wait().unwrap();
    let events = collect(&mut probe, Duration::from_millis(100));
    probe.set_exec_events(false);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Exec { pid, .. } if *pid == wanted_pid)),
        "exec reported while wanted: {events:?}"
    );

    let c = probe.counters();
    // Other processes' socket reads count too, hence at least.
    assert!(
        c.socket_reads >= tcp_reads + unix_reads,
        "every socket read is counted ({tcp_reads} TCP, {unix_reads} UNIX): {c:?}"
    );
    assert!(c.requests >= 2 && c.requests < c.socket_reads, "{c:?}");
    assert_eq!(c.lost, 0);
}

/// Reads 4 bytes from `s` on a thread of its own (which never read a socket before) once
/// the peer wrote them; the thread's id.
fn read_on_new_thread(mut s: impl Read + Send + 'static, mut peer: impl Write) -> u32 {
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        tx.send(gettid()).unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).unwrap();
    });
    let tid = rx.recv().unwrap();
    peer.write_all(b"ping").unwrap();
    h.join().unwrap();
    tid
}

/// A child process (`head -c 4`) reading `s` as its standard input once the peer wrote:
/// a server's forked worker reading the connection its parent accepted, or a client's.
fn read_in_child(s: std::os::fd::OwnedFd, mut peer: impl Write) -> u32 {
    let mut child = std::process::Command::new("head")
        .args(["-c", "4"])
        .stdin(s)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    thread::sleep(Duration::from_millis(20));
    peer.write_all(b"ping").unwrap();
    let pid = child.id();
    assert!(child.wait().unwrap().success());
    pid
}

#[test]
#[ignore = "needs root (BPF, priorities, cgroups): make test runs it, or as root cargo test -- --include-ignored"]
fn what_a_client_reads_on_a_socket_it_connected_is_a_response_not_a_request() {
    let _serial = assert_root();
    // A TCP connection made before the probe: which side is which is not known.
    let tl = TcpListener::bind("127.0.0.1:0").unwrap();
    let old_client = TcpStream::connect(tl.local_addr().unwrap()).unwrap();
    let (old_server, _) = tl.accept().unwrap();

    let mut storage = ProbeStorage::uninit();
    let cfg = ProbeConfig {
        ignore_pid: None,
        ..ProbeConfig::default()
    };
    let mut probe = Probe::load(&cfg, &mut storage).expect("probe loads as root");
    let dir = std::env::temp_dir().join(format!("appease-probe-sides-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ul = std::os::unix::net::UnixListener::bind(dir.join("s")).unwrap();

    let tcp_pair = || {
        let c = TcpStream::connect(tl.local_addr().unwrap()).unwrap();
        let (s, _) = tl.accept().unwrap();
        (c, s)
    };
    let unix_pair = || {
        let c = UnixStream::connect(dir.join("s")).unwrap();
        let (s, _) = ul.accept().unwrap();
        (c, s)
    };
    let mut sides: Vec<(&str, u32, bool)> = Vec::new();
    let (c, s) = tcp_pair();
    sides.push((
        "tcp accepted",
        read_on_new_thread(s.try_clone().unwrap(), c.try_clone().unwrap()),
        true,
    ));
    sides.push(("tcp connected", read_on_new_thread(c, s), false));
    let (c, s) = unix_pair();
    sides.push((
        "unix accepted",
        read_on_new_thread(s.try_clone().unwrap(), c.try_clone().unwrap()),
        true,
    ));
    sides.push(("unix connected", read_on_new_thread(c, s), false));
    let (a, b) = UnixStream::pair().unwrap();
    sides.push((
        "socketpair",
        read_on_new_thread(a.try_clone().unwrap(), b.try_clone().unwrap()),
        true,
    ));
    sides.push(("socketpair's other end", read_on_new_thread(b, a), true));
    sides.push((
        "tcp older than the probe, accepted",
        read_on_new_thread(
            old_server.try_clone().unwrap(),
            old_client.try_clone().unwrap(),
        ),
        true,
    ));
    sides.push((
        "tcp older than the probe, connected",
        read_on_new_thread(old_client, old_server),
        true,
    ));
    // Datagrams count wherever they arrive: on a server's bound socket, on a connected one.
    let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    client.connect(server.local_addr().unwrap()).unwrap();
    for (name, reader, writer, to) in [
        ("udp bound", &server, &client, server.local_addr().unwrap()),
        (
            "udp connected",
            &client,
            &server,
            client.local_addr().unwrap(),
        ),
    ] {
        let r = reader.try_clone().unwrap();
        let (tx, rx) = mpsc::channel();
        let h = thread::spawn(move || {
            tx.send(gettid()).unwrap();
            let mut buf = [0u8; 16];
            r.recv(&mut buf).unwrap();
        });
        let tid = rx.recv().unwrap();
        writer.send_to(b"ping", to).unwrap();
        h.join().unwrap();
        sides.push((name, tid, true));
    }
    // Children reading a connection as their input: the side is the socket's, whoever
    // reads it (a forking server's worker reads what its parent accepted).
    let (c, s) = tcp_pair();
    let accepted_child = read_in_child(s.into(), c);
    let (c, s) = tcp_pair();
    let connected_child = read_in_child(c.into(), s);
    let (c, s) = unix_pair();
    let unix_accepted_child = read_in_child(s.into(), c);

    let events = collect(&mut probe, Duration::from_millis(100));
    let counters = probe.counters();
    drop(probe);
    let _ = std::fs::remove_dir_all(&dir);
    let mut wrong = Vec::new();
    for (name, tid, request) in &sides {
        if requests_of(&events, *tid).is_empty() == *request {
            wrong.push(format!("{name}: request {}", !request));
        }
    }
    let asked = |pid: u32| {
        events
            .iter()
            .any(|e| matches!(e, Event::Request { pid: p, .. } if *p == pid))
    };
    for (name, pid, request) in [
        (
            "child reading an accepted tcp connection",
            accepted_child,
            true,
        ),
        (
            "child reading a connected tcp connection",
            connected_child,
            false,
        ),
        (
            "child reading an accepted unix connection",
            unix_accepted_child,
            true,
        ),
    ] {
        if asked(pid) != request {
            wrong.push(format!("{name}: request {}", !request));
        }
    }
    assert!(wrong.is_empty(), "{wrong:?}\nevents: {events:?}");
    assert!(
        counters.responses >= 3,
        "the clients' reads are counted as responses: {counters:?}"
    );
    // A client thread's exit is not reported: it never received a request.
    let client_tids: Vec<u32> = sides.iter().filter(|s| !s.2).map(|s| s.1).collect();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::Exit { tid, .. } if client_tids.contains(tid))),
        "{events:?}"
    );
}

#[test]
#[ignore = "needs root (BPF, priorities, cgroups): make test runs it, or as root cargo test -- --include-ignored"]
fn a_request_lost_to_a_full_ring_buffer_mutes_nobody() {
    let _serial = assert_root();
    let mut storage = ProbeStorage::uninit();
    // One page of ring and a long quiet period: a few dozen threads fill it, and a thread
    // muted by a lost event would stay muted for the whole test.
    let cfg = ProbeConfig {
        min_gap: Duration::from_secs(60),
        ignore_pid: None,
        ring_bytes: 4096,
        ..ProbeConfig::default()
    };
    let mut probe = Probe::load(&cfg, &mut storage).expect("probe loads as root");
    // Each reader thread receives one byte per signal on its own UNIX socket.
    let readers: Vec<(UnixStream, mpsc::Receiver<u32>, thread::JoinHandle<()>)> = (0..200)
        .map(|_| {
            let (a, mut b) = UnixStream::pair().unwrap();
            let (tx, rx) = mpsc::channel();
            let h = thread::spawn(move || {
                let mut buf = [0u8; 1];
                while b.read(&mut buf).map(|n| n == 1).unwrap_or(false) {
                    tx.send(gettid()).unwrap();
                }
            });
            (a, rx, h)
        })
        .collect();
    // Nobody consumes: the first requests fill the ring, the rest are lost.
    let mut tids = Vec::new();
    for (a, rx, _) in &readers {
        (&*a).write_all(b"x").unwrap();
        tids.push(rx.recv().unwrap());
    }
    let lost = probe.counters().lost;
    assert!(lost > 0, "200 events in one page of ring: some are lost");
    let first = collect(&mut probe, Duration::from_millis(50));
    let reported: std::collections::HashSet<u32> = first
        .iter()
        .filter_map(|e| match e {
            Event::Request { tid, .. } => Some(*tid),
            _ => None,
        })
        .collect();
    let unreported: Vec<usize> = (0..tids.len())
        .filter(|&i| !reported.contains(&tids[i]))
        .collect();
    assert!(!unreported.is_empty(), "some requests were lost");
    // The ring has room again: the next request of a thread whose event was lost is
    // reported, well within the quiet period (a few at a time, so the ring holds them).
    let mut again = Vec::new();
    for chunk in unreported.chunks(16) {
        for &i in chunk {
            (&readers[i].0).write_all(b"y").unwrap();
            readers[i].1.recv().unwrap();
        }
        let second = collect(&mut probe, Duration::from_millis(30));
        again.extend(
            chunk
                .iter()
                .filter(|&&i| {
                    !second
                        .iter()
                        .any(|e| matches!(e, Event::Request { tid, .. } if *tid == tids[i]))
                })
                .map(|&i| tids[i]),
        );
    }
    drop(
        readers
            .into_iter()
            .map(|(a, _, h)| (a, h))
            .collect::<Vec<_>>(),
    );
    assert!(
        again.is_empty(),
        "{} of {} threads whose request was lost stayed muted: {again:?}",
        again.len(),
        unreported.len()
    );
}

#[test]
#[ignore = "needs root (BPF, priorities, cgroups): make test runs it, or as root cargo test -- --include-ignored"]
fn the_task_iterator_sees_what_proc_shows() {
    let _serial = assert_root();
    let mut storage = ProbeStorage::uninit();
    let mut probe =
        Probe::load(&ProbeConfig::default(), &mut storage).expect("probe loads as root");
    let mut iter = probe
        .take_task_iter()
        .expect("the task iterator is attached");
    assert!(probe.take_task_iter().is_none(), "taken once");
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let spin = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (tx, rx) = mpsc::channel();
    let spinner = {
        let spin = spin.clone();
        thread::spawn(move || {
            tx.send(gettid()).unwrap();
            while spin.load(std::sync::atomic::Ordering::Relaxed) {}
        })
    };
    let spinner_tid = rx.recv().unwrap();
    // A thread that listens on TCP once the probe is loaded, then ends: its process is
    // marked, the sleeper not.
    let (ltx, lrx) = mpsc::channel();
    let listener_thread = thread::spawn(move || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        ltx.send(gettid()).unwrap();
        l
    });
    let listener_tid = lrx.recv().unwrap();
    let _listener = listener_thread.join().unwrap();
    thread::sleep(Duration::from_millis(100));
    let pids_in_proc = || -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .collect()
    };
    let before = pids_in_proc();
    let tasks = iter.read().unwrap();
    spin.store(false, std::sync::atomic::Ordering::Relaxed);
    spinner.join().unwrap();
    let tick_ns = 1_000_000_000 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    let stat = |pid: u32| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let (comm, rest) = text.rsplit_once(") ").unwrap();
        let f: Vec<String> = rest.split_whitespace().map(str::to_string).collect();
        // fields after the name: state ppid ... tty_nr(4) ... starttime(19)
        (comm.split_once(" (").unwrap().1.to_string(), f)
    };
    for pid in [std::process::id(), sleeper.id()] {
        let leader = tasks
            .iter()
            .find(|t| t.pid == pid && t.tid == pid)
            .unwrap_or_else(|| panic!("process {pid} listed"));
        let (comm, f) = stat(pid);
        assert_eq!(leader.comm, comm, "name of {pid}");
        assert_eq!(leader.ppid.to_string(), f[1], "parent of {pid}");
        assert_eq!(
            (leader.start_boot_ns / tick_ns).to_string(),
            f[19],
            "start of {pid}, in clock ticks as /proc counts it"
        );
        assert_eq!(leader.has_tty, f[4] != "0", "terminal of {pid}");
        assert!(!leader.kernel_thread);
    }
    // Threads are listed with their process (other tests' threads come and go meanwhile).
    let spun = tasks
        .iter()
        .find(|t| t.tid == spinner_tid)
        .expect("the spinning thread listed");
    assert_eq!(spun.pid, std::process::id());
    assert!(spun.cpu_ns > 0, "it ran");
    let me = tasks.iter().find(|t| t.tid == gettid()).unwrap();
    assert!(me.running, "the reading thread runs");
    assert!(tasks.iter().all(|t| t.tid != listener_tid), "it ended");
    let leader_of = |pid: u32| tasks.iter().find(|t| t.pid == pid && t.tid == pid).unwrap();
    assert!(
        leader_of(std::process::id()).listens,
        "this process listened"
    );
    assert!(!leader_of(sleeper.id()).listens, "sleep did not");
    let s = tasks.iter().find(|t| t.tid == sleeper.id()).unwrap();
    assert!(!s.running, "sleep sleeps");
    let kthreadd = tasks.iter().find(|t| t.pid == 2).unwrap();
    assert!(kthreadd.kernel_thread);
    // Every process /proc shows is listed but PID 1's thread group, which this kernel's
    // task iterator (6.18) skips: the scan reads PID 1 from /proc.
    let procs: std::collections::HashSet<u32> = tasks.iter().map(|t| t.pid).collect();
    // Those there before the read and still there after it (others come and go).
    let missing: Vec<u32> = before
        .into_iter()
        .filter(|pid| *pid != 1 && !procs.contains(pid))
        .filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "processes in /proc not listed: {missing:?}"
    );
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

/// A Perl process that listens on TCP (or not), then forks a sleeping child when told on
/// its standard input.
struct Forker {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Forker {
    fn start(listen: bool) -> Self {
        let script = format!(
            "use IO::Socket::INET; {} $| = 1; print \"ready\\n\"; my $go = <STDIN>; \
             my $p = fork; if (!$p) {{ sleep 30; exit }} print \"$p\\n\"; sleep 30",
            if listen {
                "my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, \
                 Listen => 1) or die;"
            } else {
                ""
            }
        );
        let mut child = std::process::Command::new("perl")
            .args(["-e", &script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("perl runs");
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        assert_eq!(Self::line(&mut out), "ready");
        Forker { child, out }
    }

    fn line(out: &mut impl std::io::BufRead) -> String {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        line.trim().to_string()
    }

    /// Forks its child; returns the child's pid.
    fn fork(&mut self) -> u32 {
        self.child
            .stdin
            .as_mut()
            .unwrap()
            .write_all(b"go\n")
            .unwrap();
        Self::line(&mut self.out).parse().expect("the child's pid")
    }
}

impl Drop for Forker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
#[ignore = "needs root (BPF, priorities, cgroups): make test runs it, or as root cargo test -- --include-ignored"]
fn a_process_a_server_forks_belongs_to_the_servers_application() {
    let _serial = assert_root();
    let mut storage = ProbeStorage::uninit();
    let mut probe =
        Probe::load(&ProbeConfig::default(), &mut storage).expect("probe loads as root");
    let mut iter = probe.take_task_iter().unwrap();
    // A server that listened before the probe was loaded, marked as the daemon does.
    let mut before = Forker::start(true);
    probe.mark_listener(before.child.id()).unwrap();
    let mut server = Forker::start(true);
    let mut script = Forker::start(false);
    let kids = [before.fork(), server.fork(), script.fork()];
    let tasks = iter.read().unwrap();
    let app = |pid: u32| {
        tasks
            .iter()
            .find(|t| t.pid == pid && t.tid == pid)
            .unwrap_or_else(|| panic!("process {pid} listed"))
            .app
    };
    let (before_pid, server_pid, script_pid) =
        (before.child.id(), server.child.id(), script.child.id());
    let seen = [
        app(before_pid),
        app(kids[0]),
        app(server_pid),
        app(kids[1]),
        app(script_pid),
        app(kids[2]),
    ];
    for pid in kids {
        // SAFETY: kill has no memory preconditions; these are the forkers' children.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    assert_eq!(
        seen,
        [before_pid, before_pid, server_pid, server_pid, script_pid, kids[2]],
        "a server's fork is its application's (also one that listened before the probe); \
         a script's child is its own"
    );
}

#[test]
#[ignore = "needs root (BPF, priorities, cgroups): make test runs it, or as root cargo test -- --include-ignored"]
fn a_serving_threads_lock_wait_in_a_sunk_application_is_reported_with_its_end() {
    use std::sync::{Arc, Mutex};
    let _serial = assert_root();
    let mut storage = ProbeStorage::uninit();
    let cfg = ProbeConfig {
        min_gap: Duration::from_millis(1),
        ignore_pid: None,
        serving_window: Some(Duration::from_millis(500)),
        ..ProbeConfig::default()
    };
    let mut probe = Probe::load(&cfg, &mut storage).expect("probe loads as root");
    let me = std::process::id();
    let lock = Arc::new(Mutex::new(()));
    let waits = |events: &[Event]| -> Vec<&'static str> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Wait { app, .. } if *app == me => Some("wait"),
                Event::WaitEnd { app, .. } if *app == me => Some("end"),
                _ => None,
            })
            .collect()
    };
    // A thread that blocks on the lock `held` ms after reading a byte on `sock` (if any).
    let blocker = |sock: Option<UnixStream>| {
        let lock = lock.clone();
        thread::spawn(move || {
            if let Some(mut s) = sock {
                let mut b = [0u8; 1];
                s.read_exact(&mut b).unwrap();
            }
            drop(lock.lock().unwrap());
        })
    };
    let hold = |f: &mut dyn FnMut()| {
        let g = lock.lock().unwrap();
        f();
        thread::sleep(Duration::from_millis(150));
        drop(g);
    };
    // A thread that just read a request waits on the lock: what the probe reports.
    let serve_and_wait = |probe: &mut Probe| {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut serving = None;
        hold(&mut || {
            serving = Some(blocker(Some(b.try_clone().unwrap())));
            a.write_all(b"r").unwrap();
        });
        serving.unwrap().join().unwrap();
        collect(probe, Duration::from_millis(100))
    };
    // No application marked: the context-switch hook is not attached.
    assert!(!probe.lock_waits_attached(), "attached before any mark");
    // Marked sunk; a thread that serves no request waits: nothing reported.
    probe.set_sunk_app(me, true).unwrap();
    assert!(probe.lock_waits_attached(), "a mark attaches the hook");
    assert!(
        !probe.detach_lock_waits(),
        "kept while an application is marked"
    );
    let mut quiet = None;
    hold(&mut || quiet = Some(blocker(None)));
    quiet.unwrap().join().unwrap();
    let events = collect(&mut probe, Duration::from_millis(100));
    assert_eq!(waits(&events), Vec::<&str>::new(), "not a serving thread");
    // A thread that just read a request waits: the wait and its end.
    let events = serve_and_wait(&mut probe);
    assert_eq!(waits(&events), ["wait", "end"], "{events:?}");
    // Unmarked: the same wait is not reported.
    probe.set_sunk_app(me, false).unwrap();
    let events = serve_and_wait(&mut probe);
    assert_eq!(waits(&events), Vec::<&str>::new(), "no sunk thread");
    // Detached with no application marked; a new mark attaches it again.
    assert!(probe.detach_lock_waits(), "detached once nothing is marked");
    assert!(!probe.lock_waits_attached());
    probe.set_sunk_app(me, true).unwrap();
    let events = serve_and_wait(&mut probe);
    assert_eq!(
        waits(&events),
        ["wait", "end"],
        "after attaching again: {events:?}"
    );
}

#[test]
#[ignore = "needs root (BPF, priorities, cgroups): make test runs it, or as root cargo test -- --include-ignored"]
fn a_stream_of_deferred_events_does_not_wake_the_reader() {
    let _serial = assert_root();
    let mut storage = ProbeStorage::uninit();
    // A read after 2 ms of quiet is an event; after 4 ms it wakes the reader.
    let cfg = ProbeConfig {
        min_gap: Duration::from_millis(2),
        ignore_pid: None,
        ..ProbeConfig::default()
    };
    let mut probe = Probe::load(&cfg, &mut storage).expect("probe loads as root");
    // 40 busy request threads, each reading every 2.5 ms: an event every 60 µs or so, few
    // of them after enough quiet to wake the reader.
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for _ in 0..40 {
        let (mut client, mut server) = UnixStream::pair().unwrap();
        let tx = tx.clone();
        threads.push(thread::spawn(move || {
            tx.send(gettid()).unwrap();
            let mut buf = [0u8; 1];
            while server.read(&mut buf).is_ok_and(|n| n > 0) {}
        }));
        threads.push(thread::spawn(move || {
            let end = Instant::now() + Duration::from_millis(1600);
            while Instant::now() < end {
                client.write_all(b"x").unwrap();
                thread::sleep(Duration::from_micros(2500));
            }
        }));
    }
    drop(tx);
    let tids: Vec<u32> = rx.iter().collect();
    thread::sleep(Duration::from_millis(100));
    // One second of waits of up to 250 ms, each followed by 200 µs of other work (the
    // daemon's loop does some): a wait ends by its timeout or by a request that woke the
    // reader, never because deferred events arrive in the ring meanwhile.
    let (mut returns, mut deferred, mut woke) = (0, 0, 0);
    let end = Instant::now() + Duration::from_secs(1);
    while Instant::now() < end {
        probe
            .poll(Duration::from_millis(250), |e| {
                if let Event::Request { tid, woke: w, .. } = e {
                    if tids.contains(&tid) {
                        if w {
                            woke += 1
                        } else {
                            deferred += 1
                        }
                    }
                }
            })
            .unwrap();
        returns += 1;
        let work = Instant::now();
        while work.elapsed() < Duration::from_micros(200) {
            std::hint::spin_loop();
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        deferred >= 1000,
        "the deferred events are all read: {deferred} (woke {woke})"
    );
    assert!(
        returns <= woke + 4 + 3,
        "the reader woke {returns} times in a second for {woke} waking and {deferred} deferred events"
    );
}

#[test]
#[ignore = "needs root (BPF, priorities, cgroups): make test runs it, or as root cargo test -- --include-ignored"]
fn a_request_of_a_thread_held_elevated_is_reported_without_waking_the_reader() {
    let _serial = assert_root();
    let mut storage = ProbeStorage::uninit();
    // A request after 20 ms of quiet wakes the reader, unless its thread is held.
    let cfg = ProbeConfig {
        min_gap: Duration::from_millis(10),
        ignore_pid: None,
        ..ProbeConfig::default()
    };
    let mut probe = Probe::load(&cfg, &mut storage).expect("probe loads as root");
    let (mut client, mut server) = UnixStream::pair().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = thread::spawn(move || {
        tx.send(gettid()).unwrap();
        let mut buf = [0u8; 1];
        while server.read(&mut buf).is_ok_and(|n| n > 0) {}
    });
    let tid = rx.recv().unwrap();
    // Each request after 50 ms of quiet: whether it woke the reader.
    let mut request = |probe: &mut Probe| -> Vec<bool> {
        thread::sleep(Duration::from_millis(50));
        client.write_all(b"x").unwrap();
        collect(probe, Duration::from_millis(30))
            .into_iter()
            .filter_map(|e| match e {
                Event::Request { tid: t, woke, .. } if t == tid => Some(woke),
                _ => None,
            })
            .collect()
    };
    assert_eq!(request(&mut probe), [true], "not held: it wakes");
    let held_before = probe.counters().held;
    probe.set_held(tid, true).unwrap();
    assert_eq!(request(&mut probe), [false], "held: read at the next poll");
    assert_eq!(request(&mut probe), [false]);
    assert_eq!(probe.counters().held, held_before + 2);
    probe.set_held(tid, false).unwrap();
    assert_eq!(request(&mut probe), [true], "let go: it wakes again");
    // Clearing a mark twice, or marking a thread that has ended, is no error.
    probe.set_held(tid, false).unwrap();
    drop(client);
    reader.join().unwrap();
    probe.set_held(tid, true).unwrap();
}

#[test]
#[ignore = "needs root (BPF, priorities, cgroups): make test runs it, or as root cargo test -- --include-ignored"]
fn the_run_queues_count_idle_class_tasks_apart() {
    let _serial = assert_root();
    let mut storage = ProbeStorage::uninit();
    let mut probe = Probe::load(&ProbeConfig::default(), &mut storage).unwrap();
    // The run queues are found by the task iterator (a scan): none known before it,
    // every CPU's after.
    assert_eq!(probe.runnable().map(|r| r.cpus), Some(0));
    probe.take_task_iter().unwrap().read().unwrap();
    let online = std::thread::available_parallelism().unwrap().get() as u32;
    assert!(probe.runnable().unwrap().cpus >= online);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Two spinners of the normal class and two of the idle class.
    let spinners: Vec<_> = (0..4)
        .map(|i| {
            let stop = stop.clone();
            let (tx, rx) = mpsc::channel();
            let h = thread::spawn(move || {
                if i >= 2 {
                    let param = libc::sched_param { sched_priority: 0 };
                    // SAFETY: changes this thread's own policy.
                    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
                    assert_eq!(r, 0, "SCHED_IDLE: {}", std::io::Error::last_os_error());
                }
                tx.send(()).unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
            rx.recv().unwrap();
            h
        })
        .collect();
    thread::sleep(Duration::from_millis(100));
    let readings = |n: usize| -> Vec<appease_probe::Runnable> {
        (0..n)
            .map(|_| {
                thread::sleep(Duration::from_millis(20));
                probe.runnable().expect("the kernel runs the counter")
            })
            .collect()
    };
    let busy = readings(10);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in spinners {
        h.join().unwrap();
    }
    thread::sleep(Duration::from_millis(100));
    let quiet = readings(10);
    // Every reading sees the idle-class spinners waiting or running, and the normal ones
    // and the reader beside them.
    for r in &busy {
        assert!(r.idle_class >= 2, "{busy:?}");
        assert!(r.all - r.idle_class >= 3, "{busy:?}");
    }
    // Once they end, the idle class is empty again (nothing else here is of it) and the
    // reader is counted.
    assert!(
        quiet.iter().all(|r| r.idle_class < 2 && r.all >= 1),
        "{quiet:?}"
    );
}
