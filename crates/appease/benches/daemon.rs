//! The daemon's own costs on the real kernel (needs root):
//! 1. time from a request's socket read (in the kernel) to its elevation being applied,
//!    p50/p99, with 2 soakers per CPU, from the daemon's own histogram; then the same on
//!    a host with 10,000 more processes, which the scan reads every second meanwhile, and
//!    what that scan costs;
//! 2. the daemon's CPU use at 10k and 50k requests/s (embedded default config).
//!
//! Run: `cargo bench -p appease --bench daemon` (`APPEASE_BENCH_PROCESSES` changes the
//! 10,000).

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use support::{host_cpus, Daemon, Sleepers, Soakers, TempDir};

/// The default ladder with 10 ms fades, so each server is elevated afresh many times.
const LATENCY_CONFIG: &str = r#"
[[elevation.ladder]]
from_runnable_per_cpu = 0.0
unix_nice = 0
inet_nice = 0
decay_ms = 0
[[elevation.ladder]]
from_runnable_per_cpu = 1.0
unix_nice = -3
inet_nice = -2
decay_ms = 10
[[elevation.ladder]]
from_runnable_per_cpu = 2.0
unix_nice = -8
inet_nice = -5
decay_ms = 10
"#;

trait Conn: Read + Write + Send {}
impl<T: Read + Write + Send> Conn for T {}

/// Echo servers (one thread per connection) and paced clients.
struct Load {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    /// `conns` connections (half UNIX, half TCP), `clients` threads sharing them,
    /// `rate` requests/s in total, sent on a fixed schedule (late sends go at once).
    fn start(conns: usize, clients: usize, rate: f64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut threads = Vec::new();
        let mut client_ends: Vec<Box<dyn Conn>> = Vec::new();
        for i in 0..conns {
            let (c, mut s): (Box<dyn Conn>, Box<dyn Conn>) = if i % 2 == 0 {
                let (a, b) = UnixStream::pair().unwrap();
                (Box::new(a), Box::new(b))
            } else {
                let a = TcpStream::connect(addr).unwrap();
                a.set_nodelay(true).unwrap();
                let (b, _) = listener.accept().unwrap();
                b.set_nodelay(true).unwrap();
                (Box::new(a), Box::new(b))
            };
            client_ends.push(c);
            threads.push(thread::spawn(move || {
                let mut b = [0u8; 1];
                while s.read(&mut b).map(|n| n == 1).unwrap_or(false) {
                    if s.write_all(&b).is_err() {
                        break;
                    }
                }
            }));
        }
        let per_client = conns / clients;
        for _ in 0..clients {
            let mut mine: Vec<Box<dyn Conn>> = client_ends.drain(..per_client).collect();
            let (stop, done) = (stop.clone(), done.clone());
            let period = Duration::from_secs_f64(clients as f64 / rate);
            threads.push(thread::spawn(move || {
                let mut b = [0u8; 1];
                let mut due = Instant::now();
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if now < due {
                        thread::sleep(due - now);
                    }
                    due += period;
                    let n = mine.len();
                    let c = &mut mine[i % n];
                    i += 1;
                    if c.write_all(b"q").is_err() || c.read_exact(&mut b).is_err() {
                        break;
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                // Dropping the client ends closes the servers' loops.
            }));
        }
        Load {
            stop,
            done,
            threads,
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// CPU time of the daemon's (only) thread in seconds, from schedstat (ns resolution).
fn cpu_seconds(pid: u32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).unwrap();
    text.split_whitespace()
        .next()
        .unwrap()
        .parse::<f64>()
        .unwrap()
        / 1e9
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("daemon bench: needs root (BPF, priorities)");
        std::process::exit(1);
    }
    let cpus = host_cpus();
    let dir = TempDir::new("bench");
    let secs = 10.0;

    // 1. Latency from read to elevation, under 2 soakers per CPU: on this host as it is,
    //    then with many more processes, all read by the scan every second.
    let crowd: usize = std::env::var("APPEASE_BENCH_PROCESSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let repeat: usize = std::env::var("APPEASE_BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let cfg = dir.file("latency.toml", LATENCY_CONFIG);
    let mut p99s: Vec<(usize, u64)> = Vec::new();
    for extra in std::iter::repeat_n([0, crowd], repeat).flatten() {
        let _sleepers = Sleepers::start(extra);
        let _soak = Soakers::start(2 * cpus);
        let daemon = Daemon::start(&dir.0, &cfg);
        thread::sleep(Duration::from_millis(1500));
        // 64 connections, each getting a request every ~200 ms: a fresh elevation each time.
        println!(
            "{} soakers on {cpus} CPUs, {extra} extra processes, 64 servers each getting a request every 200 ms:",
            2 * cpus
        );
        let load = Load::start(64, 8, 64.0 / 0.2);
        let mut scans = Vec::new();
        let end = Instant::now() + Duration::from_secs_f64(secs);
        while Instant::now() < end {
            thread::sleep(Duration::from_millis(1000));
            scans.push(daemon.status_json()["batch"].clone());
        }
        drop(load);
        thread::sleep(Duration::from_millis(1200)); // one more status write
        let st = daemon.status_json();
        for (key, what) in [
            (
                "elevation_latency_us",
                "first request after a quiet spell (wakes the daemon)",
            ),
            (
                "deferred_elevation_latency_us",
                "request of an already busy thread (read at the next tick)",
            ),
        ] {
            let l = &st[key];
            if key == "elevation_latency_us" {
                p99s.push((extra, l["p99"].as_u64().unwrap_or(0)));
            }
            println!(
                "  read -> elevation applied, {what}: n = {}, p50 = {} us, p99 = {} us, max = {} us",
                l["count"], l["p50"], l["p99"], l["max"]
            );
        }
        let median = |f: &dyn Fn(&serde_json::Value) -> f64| {
            let mut v: Vec<f64> = scans.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        let scanner_us = median(&|b| b["scan"]["cpu_us"].as_f64().unwrap_or(0.0));
        let loop_us = median(&|b| b["scan_loop_us"].as_f64().unwrap_or(0.0));
        let procs = median(&|b| b["scan"]["processes"].as_f64().unwrap_or(0.0));
        println!(
            "  scan ({}) of {procs:.0} processes, median of {}: scanner thread {scanner_us:.0} us CPU, event loop {loop_us:.0} us; \
             at the default 1 s interval {:.2} % of one core",
            scans.last().map_or("?".into(), |b| b["scan"]["source"].to_string()),
            scans.len(),
            (scanner_us + loop_us) / 1e6 * 100.0
        );
    }

    if repeat > 1 {
        for extra in [0, crowd] {
            let mut v: Vec<u64> = p99s
                .iter()
                .filter(|(e, _)| *e == extra)
                .map(|(_, p)| *p)
                .collect();
            v.sort_unstable();
            println!(
                "read -> elevation p99 with {extra} extra processes over {repeat} runs: {v:?} us, median {} us",
                v[v.len() / 2]
            );
        }
    }

    // 2. Daemon CPU use at given request rates, embedded default config.
    let cfg = dir.file("default.toml", "");
    for rate in [0.0, 10_000.0, 50_000.0] {
        let daemon = Daemon::start(&dir.0, &cfg);
        let pid = daemon.pid();
        let load = (rate > 0.0).then(|| Load::start(16, 4, rate));
        thread::sleep(Duration::from_millis(500));
        let (c0, t0) = (cpu_seconds(pid), Instant::now());
        let n0 = load.as_ref().map_or(0, |l| l.done.load(Ordering::Relaxed));
        thread::sleep(Duration::from_secs_f64(secs));
        let (c1, wall) = (cpu_seconds(pid), t0.elapsed().as_secs_f64());
        let n1 = load.as_ref().map_or(0, |l| l.done.load(Ordering::Relaxed));
        let st = daemon.status_json();
        drop(load);
        println!(
            "daemon CPU at {:>6.0} req/s offered ({:>6.0} achieved, {} request events): {:.3} % of one core",
            rate,
            (n1 - n0) as f64 / wall,
            st["probe"]["request_events"],
            100.0 * (c1 - c0) / wall
        );
    }
}
