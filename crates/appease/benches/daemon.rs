//! The daemon's own costs on the real kernel (needs root):
//! 1. time from a request's socket read (in the kernel) to its elevation being applied,
//!    p50/p99, with 2 soakers per CPU, from the daemon's own histogram; then the same on
//!    a host with 10,000 more processes, which the scans read meanwhile, and what they
//!    cost (a scan of that many processes comes less often: at most half a percent of a
//!    CPU);
//! 2. the daemon's CPU use (all its threads) and resident memory, idle, at 10k and 50k
//!    requests/s, and idle beside 10,000 more processes (embedded default config).
//!
//! Run: `cargo bench -p appease --bench daemon` (`APPEASE_BENCH_PROCESSES` changes the
//! 10,000).

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use support::{env_or, host_cpus, latency_config, Daemon, Load, Sleepers, Soakers, TempDir};

/// CPU time of all the daemon's threads (event loop, scanner, log writer) in seconds, from
/// each one's schedstat (ns resolution).
fn cpu_seconds(pid: u32) -> f64 {
    let ns: u64 = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|text| text.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
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
    let crowd = env_or("APPEASE_BENCH_PROCESSES", 10_000) as usize;
    let repeat = env_or("APPEASE_BENCH_REPEAT", 1) as usize;
    let cfg = dir.file("latency.toml", &latency_config());
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
        let period_ms = median(&|b| b["scan_period_ms"].as_f64().unwrap_or(1000.0));
        println!(
            "  scan ({}) of {procs:.0} processes, median of {}: scanner thread {scanner_us:.0} us CPU, event loop {loop_us:.0} us; \
             one every {period_ms:.0} ms on average: {:.2} % of one core",
            scans.last().map_or("?".into(), |b| b["scan"]["source"].to_string()),
            scans.len(),
            (scanner_us + loop_us) / 1e3 / period_ms * 100.0
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

    // 2. Daemon CPU use at given request rates, and on a host of many more processes,
    //    embedded default config.
    let cfg = dir.file("default.toml", "");
    for (rate, extra) in [(0.0, 0), (10_000.0, 0), (50_000.0, 0), (0.0, crowd)] {
        let _sleepers = Sleepers::start(extra);
        let daemon = Daemon::start(&dir.0, &cfg);
        let pid = daemon.pid();
        let load = (rate > 0.0).then(|| Load::start(16, 4, rate));
        // Past the first scans, which read every process afresh.
        thread::sleep(Duration::from_millis(if extra > 0 { 12_000 } else { 500 }));
        let (c0, t0) = (cpu_seconds(pid), Instant::now());
        let n0 = load.as_ref().map_or(0, |l| l.done.load(Ordering::Relaxed));
        // Beside the crowd a scan comes every few seconds: several of them in the window.
        thread::sleep(Duration::from_secs_f64(if extra > 0 {
            3.0 * secs
        } else {
            secs
        }));
        let (c1, wall) = (cpu_seconds(pid), t0.elapsed().as_secs_f64());
        let n1 = load.as_ref().map_or(0, |l| l.done.load(Ordering::Relaxed));
        let st = daemon.status_json();
        drop(load);
        println!(
            "daemon CPU at {:>6.0} req/s offered ({:>6.0} achieved, {} request events), {extra} extra processes: \
             {:.3} % of one core, {:.1} MiB resident",
            rate,
            (n1 - n0) as f64 / wall,
            st["probe"]["request_events"],
            100.0 * (c1 - c0) / wall,
            appease_cgroup::resident_kib(pid).expect("the daemon runs") as f64 / 1024.0
        );
    }
}
