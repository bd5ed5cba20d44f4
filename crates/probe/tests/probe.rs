//! Runs the probe on the real kernel. Needs root: ignored with the reason otherwise (make test runs it).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use appease_probe::{Event, Family, Probe, ProbeConfig, ProbeStorage};

/// Root-only tests are `#[ignore]`d with the reason; run without root anyway
/// (`--include-ignored`), they fail here saying so.
fn assert_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "loading BPF programs needs root; run it as root (make test does)"
    );
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// Collects events for `dur` and returns them.
fn collect(probe: &mut Probe, dur: Duration) -> Vec<Event> {
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
fn reports_socket_reads_with_family_filtered_per_thread_and_lifecycle() {
    assert_root();
    let mut storage = ProbeStorage::uninit();
    let cfg = ProbeConfig {
        min_gap: Duration::from_millis(200),
        ignore_pid: None,
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

    // A short-lived child process: fork and exit.
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
        events.iter().any(|e| matches!(e, Event::Fork { pid, ppid, .. } if *pid == child_pid && *ppid == std::process::id())),
        "fork of the child reported"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Exit { pid, .. } if *pid == child_pid)),
        "exit of the child reported"
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
