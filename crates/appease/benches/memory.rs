//! The daemon's memory over a long run (needs root): its resident set after the first
//! 100,000 requests, and again after 1,000,000 requests and 100,000 short-lived
//! processes that each received one request (so that each was elevated, journaled and
//! forgotten). Under 2 soakers per CPU, with the default config but 10 ms fades, so that
//! the servers (256 UNIX and 256 TCP connections, 20,000 requests/s in all) are elevated
//! afresh again and again.
//!
//! Run: `cargo bench -p appease --bench memory` (`APPEASE_BENCH_REQUESTS` and
//! `APPEASE_BENCH_SHORT_LIVED` change the 1,000,000 and the 100,000).

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use support::{env_or, host_cpus, latency_config, Daemon, Load, Soakers, TempDir};

/// VmRSS of `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    appease_cgroup::resident_kib(pid).expect("VmRSS in /proc/PID/status")
}

/// One short-lived process: `head -c1` reading one byte from a UNIX socket (a request).
fn short_lived() {
    let (mut ours, theirs) = UnixStream::pair().unwrap();
    let mut child = Command::new("head")
        .args(["-c1"])
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stdout(Stdio::null())
        .spawn()
        .expect("head (coreutils) runs");
    ours.write_all(b"q").unwrap();
    child.wait().unwrap();
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("memory bench: needs root (BPF, priorities)");
        std::process::exit(1);
    }
    let total = env_or("APPEASE_BENCH_REQUESTS", 1_000_000);
    let processes = env_or("APPEASE_BENCH_SHORT_LIVED", 100_000);
    let dir = TempDir::new("memory");
    let cfg = dir.file("memory.toml", &latency_config());
    let _soak = Soakers::start(2 * host_cpus());
    let daemon = Daemon::start(&dir.0, &cfg);
    let pid = daemon.pid();
    thread::sleep(Duration::from_millis(1500));
    let load = Load::start(512, 16, 20_000.0);
    let done = load.done.clone();
    let started = Instant::now();
    while done.load(Ordering::Relaxed) < total / 10 {
        thread::sleep(Duration::from_millis(100));
    }
    let first = rss_kib(pid);
    let events0 = daemon.status_json()["probe"]["request_events"]
        .as_u64()
        .unwrap_or(0);
    println!(
        "after {} requests ({:.0} s): daemon RSS {first} KiB",
        done.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    let spawners: Vec<_> = (0..2)
        .map(|_| {
            let n = processes / 2;
            thread::spawn(move || (0..n).for_each(|_| short_lived()))
        })
        .collect();
    let mut last = Instant::now();
    for s in spawners {
        s.join().unwrap();
    }
    while done.load(Ordering::Relaxed) < total {
        thread::sleep(Duration::from_millis(100));
        if last.elapsed() > Duration::from_secs(30) {
            eprintln!("  {} requests so far", done.load(Ordering::Relaxed));
            last = Instant::now();
        }
    }
    let st = daemon.status_json();
    let end = rss_kib(pid);
    drop(load);
    let events = st["probe"]["request_events"].as_u64().unwrap_or(0);
    println!(
        "after {} requests and {processes} short-lived processes ({:.0} s, {} request events, {} changes): \
         daemon RSS {end} KiB, {:+.1} % of the first figure",
        done.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64(),
        events.saturating_sub(events0),
        st["actuator"]["changes"],
        (end as f64 / first as f64 - 1.0) * 100.0
    );
}
