//! What the probe adds to one socket read, measured in one run: rounds alternate
//! between no probe and the probe loaded, each round timing many 1-byte reads from a
//! pre-filled socket (the reads never block). Prints per-round medians and the
//! difference; then, with the kernel's BPF statistics on for a while (put back after),
//! the probe program's own time per run. Last, what the lock-wait hook (attached while
//! an application has sunk threads) adds to a context switch. Needs root. Run:
//! `cargo bench -p appease-probe --bench read_cost`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use appease_probe::{Probe, ProbeConfig, ProbeStorage};

const READS_PER_ROUND: usize = 100_000;
const ROUNDS: usize = 7;
/// Each round's reads come from this many bytes written up front.
const CHUNK: usize = 20_000;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// ns per 1-byte read on `reader`, refilled by `writer` in chunks outside the timing.
fn time_reads(writer: &mut impl Write, reader: &mut impl Read) -> f64 {
    let fill = vec![b'x'; CHUNK];
    let mut b = [0u8; 1];
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < READS_PER_ROUND {
        writer.write_all(&fill).unwrap();
        std::thread::sleep(Duration::from_millis(1)); // let TCP deliver it all
        let start = Instant::now();
        for _ in 0..CHUNK {
            reader.read_exact(&mut b).unwrap();
        }
        total += start.elapsed();
        done += CHUNK;
    }
    total.as_nanos() as f64 / done as f64
}

/// `time_reads` on a thread of its own, which has never received a request, so the
/// probe's per-thread quiet-period filter never spares its reads: for the side that
/// connected, the probe's worst case.
fn time_reads_on_new_thread(mut writer: impl Write + Send, mut reader: impl Read + Send) -> f64 {
    std::thread::scope(|sc| {
        sc.spawn(move || time_reads(&mut writer, &mut reader))
            .join()
            .unwrap()
    })
}

const ROWS: [&str; 5] = [
    "socketpair",
    "unix accepted",
    "unix connected",
    "tcp accepted",
    "tcp connected",
];

/// One pass over every kind of socket, on connections made now (with the probe loaded, it
/// sees them established): ns per read, and the probe program's own ns per run over the
/// row's reads when the kernel keeps its statistics.
fn pass(
    ul: &UnixListener,
    unix_path: &Path,
    tl: &TcpListener,
    probe: Option<&Probe>,
) -> Vec<(f64, Option<f64>)> {
    let (mut pa, mut pb) = UnixStream::pair().unwrap();
    let mut uc = UnixStream::connect(unix_path).unwrap();
    let (mut ua, _) = ul.accept().unwrap();
    let mut tc = TcpStream::connect(tl.local_addr().unwrap()).unwrap();
    let (mut ta, _) = tl.accept().unwrap();
    tc.set_nodelay(true).unwrap();
    ta.set_nodelay(true).unwrap();
    let stats = || probe.and_then(|p| p.read_program_stats());
    let mut out = Vec::new();
    for row in 0..ROWS.len() {
        let before = stats();
        // The accepted sides (and a socketpair's end) are read on this thread, as a busy
        // server reads them; the connected sides on a thread of their own, as a client.
        let ns = match row {
            0 => time_reads(&mut pa, &mut pb),
            1 => time_reads(&mut uc, &mut ua),
            2 => time_reads_on_new_thread(&mut ua, &mut uc),
            3 => time_reads(&mut tc, &mut ta),
            _ => time_reads_on_new_thread(&mut ta, &mut tc),
        };
        let program = match (before, stats()) {
            (Some((t0, n0)), Some((t1, n1))) if n1 > n0 => {
                Some((t1 - t0) as f64 / (n1 - n0) as f64)
            }
            _ => None,
        };
        out.push((ns, program));
    }
    out
}

/// Round trips a switch timing makes: two switches each.
const TRIPS: usize = 50_000;

/// ns per context switch: two threads on CPU 0 pass a byte back and forth through pipes
/// (no socket: the read hook stays out of it).
fn time_switches() -> f64 {
    use std::fs::File;
    use std::os::fd::FromRawFd;
    let pipe = || {
        let mut fds = [0; 2];
        // SAFETY: fds has room for the two descriptors pipe writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
        // SAFETY: both descriptors are new and owned by nobody else.
        unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
    };
    let pin = || {
        // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and sched_setaffinity only read it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
        }
    };
    let ((mut ping_r, mut ping_w), (mut pong_r, mut pong_w)) = (pipe(), pipe());
    let mut b = [0u8; 1];
    std::thread::scope(|sc| {
        sc.spawn(|| {
            pin();
            let mut b = [0u8; 1];
            for _ in 0..TRIPS {
                ping_r.read_exact(&mut b).unwrap();
                pong_w.write_all(&b).unwrap();
            }
        });
        pin();
        let start = Instant::now();
        for _ in 0..TRIPS {
            ping_w.write_all(&b).unwrap();
            pong_r.read_exact(&mut b).unwrap();
        }
        start.elapsed().as_nanos() as f64 / (2 * TRIPS) as f64
    })
}

/// The switch timing with the lock-wait hook detached and attached, alternating.
fn switch_cost() -> (f64, f64) {
    let cfg = ProbeConfig {
        serving_window: Some(Duration::from_millis(500)),
        ..ProbeConfig::default()
    };
    let mut storage = ProbeStorage::uninit();
    let mut probe = Probe::load(&cfg, &mut storage).expect("probe loads");
    // No process has this number: a mark that attaches the hook and matches no thread.
    let nobody = u32::MAX - 1;
    let (mut off, mut on) = (vec![], vec![]);
    for _ in 0..ROUNDS {
        probe.set_sunk_app(nobody, false).unwrap();
        probe.detach_lock_waits();
        off.push(time_switches());
        probe.set_sunk_app(nobody, true).unwrap();
        on.push(time_switches());
    }
    (median(&mut off), median(&mut on))
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Turns the kernel's BPF run-time statistics on, and back to what they were on drop.
struct StatsOn(String);

impl StatsOn {
    fn new() -> Self {
        let was = std::fs::read_to_string(BPF_STATS).unwrap_or_else(|_| "0".into());
        std::fs::write(BPF_STATS, "1").expect("turning on kernel.bpf_stats_enabled");
        StatsOn(was.trim().to_string())
    }
}

impl Drop for StatsOn {
    fn drop(&mut self) {
        let _ = std::fs::write(BPF_STATS, &self.0);
    }
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("read_cost: needs root to load the BPF probe");
        std::process::exit(1);
    }
    let dir = std::env::temp_dir().join(format!("appease-read-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let unix_path = dir.join("sock");
    let ul = UnixListener::bind(&unix_path).unwrap();
    let tl = TcpListener::bind("127.0.0.1:0").unwrap();

    // The default quiet period: after the first read of a burst, reads only pay the
    // tracepoint and the per-thread filter, which is the common case on a busy server.
    let cfg = ProbeConfig {
        ignore_pid: None,
        ..ProbeConfig::default()
    };
    let mut off: Vec<Vec<f64>> = vec![vec![]; ROWS.len()];
    let mut on: Vec<Vec<f64>> = vec![vec![]; ROWS.len()];
    let mut program: Vec<Vec<f64>> = vec![vec![]; ROWS.len()];
    // Reads with and without the probe, alternating; the statistics are off (they cost
    // every BPF program two clock reads).
    for round in 0..ROUNDS {
        for with_probe in [false, true] {
            let mut storage = ProbeStorage::uninit();
            let probe = with_probe.then(|| Probe::load(&cfg, &mut storage).expect("probe loads"));
            let dst = if with_probe { &mut on } else { &mut off };
            for (v, (ns, _)) in dst
                .iter_mut()
                .zip(pass(&ul, &unix_path, &tl, probe.as_ref()))
            {
                v.push(ns);
            }
            if let Some(p) = &probe {
                let c = p.counters();
                eprintln!(
                    "round {round}: probe saw {} socket reads, reported {} request events, {} responses",
                    c.socket_reads, c.requests, c.responses
                );
            }
        }
    }
    // The program's own time per run, as the kernel measures it: far steadier than the
    // difference of two read timings on a shared host.
    {
        let _stats = StatsOn::new();
        for _ in 0..ROUNDS {
            let mut storage = ProbeStorage::uninit();
            let probe = Probe::load(&cfg, &mut storage).expect("probe loads");
            for (v, (_, prog)) in program
                .iter_mut()
                .zip(pass(&ul, &unix_path, &tl, Some(&probe)))
            {
                v.extend(prog);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "cost of one 1-byte socket read, median of {ROUNDS} rounds x {READS_PER_ROUND} reads (ns)"
    );
    println!(
        "{:<15} {:>10} {:>10} {:>10} {:>10}",
        "socket", "no probe", "probe", "added", "program"
    );
    for (i, name) in ROWS.iter().enumerate() {
        let (a, b) = (median(&mut off[i]), median(&mut on[i]));
        let prog = if program[i].is_empty() {
            f64::NAN
        } else {
            median(&mut program[i])
        };
        println!(
            "{name:<15} {a:>10.0} {b:>10.0} {:>10.0} {prog:>10.1}",
            b - a
        );
    }
    let (off, on) = switch_cost();
    println!(
        "context switch (two threads on one CPU, {ROUNDS} rounds x {} switches): {off:.0} ns \
         without the lock-wait hook, {on:.0} with it attached, {:.0} added",
        2 * TRIPS,
        on - off
    );
}
