//! A local user's flood of socket reads beside a real server (needs root): an
//! unprivileged user's threads (uid 50,000, 10,000 of them by default) each read a byte from
//! a socketpair once a second, while a server answers an open-loop client (1 ms of CPU a
//! request, 100 requests a second) beside 2 soakers per CPU. Two setups, each with and
//! without the flood, interleaved (each round starts one run later than the one before):
//! the daemon with its embedded default config, and the soakers in an idle group made by
//! hand with no daemon, which gives the flood's own cost to the server. For each run, the
//! server's p50 and p99 (from each request's intended send time), the daemon's read ->
//! elevation p99 and its CPU (all its threads), and the probe's events: reported, lost (a
//! full ring buffer) and dropped over the users' bounds. Medians over the rounds.
//!
//! The flood runs in a session of its own, as a user's login would start it.
//!
//! Run: `cargo bench -p appease --bench flood` (`APPEASE_FLOOD_THREADS`,
//! `APPEASE_FLOOD_ROUNDS`, `APPEASE_FLOOD_SECONDS` change 10,000, 3 and 20;
//! `APPEASE_FLOOD_CONFIG` adds config text, e.g. "[users]\nevents_per_s = 50\n";
//! `APPEASE_FLOOD_SAME_SESSION=1` starts the flood in the server's session instead).

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::{env_or, host_cpus, spin_cpu, Daemon, ProcessGroup, Soakers, TempDir};

/// The flooding user: an unprivileged uid (no account needed to run as it).
const FLOOD_UID: u32 = 50_000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--flood") {
        let n = args[i + 1].parse().expect("--flood THREADS SECONDS");
        let secs = args[i + 2].parse().expect("--flood THREADS SECONDS");
        flood(n, Duration::from_secs(secs));
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("flood bench: needs root (BPF, priorities, another user's processes)");
        std::process::exit(1);
    }
    let threads = env_or("APPEASE_FLOOD_THREADS", 10_000);
    let rounds = env_or("APPEASE_FLOOD_ROUNDS", 3);
    let secs = env_or("APPEASE_FLOOD_SECONDS", 20);
    let cpus = host_cpus();
    let dir = TempDir::new("flood-bench");
    // The embedded default, or what APPEASE_FLOOD_CONFIG says on top of it.
    let extra = std::env::var("APPEASE_FLOOD_CONFIG").unwrap_or_default();
    let cfg = dir.file("default.toml", &extra);
    println!(
        "a server (1 ms a request, 100/s, open loop) beside {} soakers on {cpus} CPUs; flood: {threads} threads of uid {FLOOD_UID}, each reading once a second; {rounds} rounds of {secs} s",
        2 * cpus
    );
    // (by hand, flooded) for each run of a round, rotated from round to round.
    let runs = [(false, false), (false, true), (true, false), (true, true)];
    let name = |(by_hand, flooded): (bool, bool)| {
        format!(
            "{} {}",
            if by_hand { "by hand" } else { "appease" },
            if flooded {
                "with flood"
            } else {
                "without flood"
            }
        )
    };
    let mut results: Vec<((bool, bool), Round)> = Vec::new();
    for round in 0..rounds {
        for i in 0..runs.len() {
            let run = runs[(i + round as usize) % runs.len()];
            let r = run_round(
                &dir,
                (!run.0).then_some(&cfg),
                run.1.then_some(threads),
                secs,
                cpus,
            );
            println!(
                "  round {round} {:<26} server p50 {:.2} ms p99 {:.2} ms; read -> elevation p99 {} us of {} elevation(s); daemon {:.2} % of a CPU; events {} reported, {} lost, {} over the users' bounds",
                name(run), r.p50_ms, r.p99_ms, r.elevation_p99_us, r.elevations, r.daemon_cpu_pct, r.events, r.lost, r.throttled
            );
            results.push((run, r));
        }
    }
    let median = |run: (bool, bool), f: &dyn Fn(&Round) -> f64| {
        let mut v: Vec<f64> = results
            .iter()
            .filter(|(r, _)| *r == run)
            .map(|(_, r)| f(r))
            .collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("medians of {rounds} rounds: without flood / with flood (ratio)");
    for by_hand in [false, true] {
        println!(
            "  {}",
            if by_hand {
                "by hand (no daemon)"
            } else {
                "appease"
            }
        );
        for (what, f) in [
            (
                "server p50 ms",
                &(|r: &Round| r.p50_ms) as &dyn Fn(&Round) -> f64,
            ),
            ("server p99 ms", &|r: &Round| r.p99_ms),
            ("read -> elevation p99 us", &|r: &Round| {
                r.elevation_p99_us as f64
            }),
            ("daemon CPU %", &|r: &Round| r.daemon_cpu_pct),
            ("events lost", &|r: &Round| r.lost as f64),
            ("events over the bounds", &|r: &Round| r.throttled as f64),
        ] {
            if by_hand && !what.starts_with("server") {
                continue;
            }
            let (a, b) = (median((by_hand, false), f), median((by_hand, true), f));
            // A ratio to nothing (no event lost, no elevation measured) says nothing.
            let ratio = match a > 0.0 {
                true => format!("{:.2}", b / a),
                false => "–".to_string(),
            };
            println!("    {what:<26} {a:>10.2} / {b:>10.2} ({ratio})");
        }
    }
    let p99 = |run| median(run, &|r: &Round| r.p99_ms);
    println!(
        "server p99 with the flood, appease against by hand: {:.2} / {:.2} ms ({:.2} times)",
        p99((false, true)),
        p99((true, true)),
        p99((false, true)) / p99((true, true))
    );
}

struct Round {
    p50_ms: f64,
    p99_ms: f64,
    /// Of the daemon's elevations that it woke for (a served thread's first request
    /// after a quiet spell: few, as a busy server stays elevated).
    elevation_p99_us: u64,
    elevations: u64,
    daemon_cpu_pct: f64,
    events: u64,
    lost: u64,
    throttled: u64,
}

/// All the daemon's threads' CPU time, s (utime + stime of /proc/PID/stat).
fn process_cpu_s(pid: u32) -> f64 {
    let s = appease_cgroup::read_stat(format!("/proc/{pid}/stat")).expect("the daemon runs");
    s.run_ticks as f64 * appease_cgroup::clock_tick_ns() as f64 / 1e9
}

/// One run: the daemon on `cfg`, or without one (`None`) the soakers idle by hand.
fn run_round(
    dir: &TempDir,
    cfg: Option<&std::path::Path>,
    flood: Option<u64>,
    secs: u64,
    cpus: usize,
) -> Round {
    let soak = Soakers::start(2 * cpus);
    let daemon = cfg.map(|cfg| Daemon::start(&dir.0, cfg));
    let _idle = cfg
        .is_none()
        .then(|| IdleByHand::new(soak.0.iter().map(|c| c.id())));
    // The flood, as another user, in a session of its own as a user's login gives it (and
    // so in an autogroup of its own, not the server's; `APPEASE_FLOOD_SAME_SESSION=1`
    // keeps it in the server's session instead), ended by its process group.
    let own_session = std::env::var_os("APPEASE_FLOOD_SAME_SESSION").is_none();
    let flooder = flood.map(|n| {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = Command::new(exe);
        cmd.args(["--flood", &n.to_string(), &(secs + 30).to_string()])
            .uid(FLOOD_UID)
            .gid(FLOOD_UID)
            .stdin(Stdio::null());
        if own_session {
            // SAFETY: setsid is async-signal-safe; the new session's group id is the pid.
            unsafe {
                cmd.pre_exec(|| match libc::setsid() {
                    -1 => Err(std::io::Error::last_os_error()),
                    _ => Ok(()),
                })
            };
        } else {
            cmd.process_group(0);
        }
        ProcessGroup(cmd.spawn().unwrap())
    });
    // The soakers demoted (after 5 s), the flood's threads started.
    thread::sleep(Duration::from_secs(7));
    let status = || {
        daemon
            .as_ref()
            .map_or(serde_json::Value::Null, |d| d.status_json())
    };
    let cpu = || daemon.as_ref().map_or(0.0, |d| process_cpu_s(d.pid()));
    let before = status();
    let (cpu0, t0) = (cpu(), Instant::now());
    let latencies = serve(Duration::from_secs(secs));
    let (cpu1, wall) = (cpu(), t0.elapsed().as_secs_f64());
    thread::sleep(Duration::from_millis(1200)); // the next status
    let after = status();
    drop(flooder);
    let delta = |key: &str| {
        after["probe"][key].as_u64().unwrap_or(0) - before["probe"][key].as_u64().unwrap_or(0)
    };
    let q = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
    Round {
        p50_ms: q(0.5),
        p99_ms: q(0.99),
        elevation_p99_us: after["elevation_latency_us"]["p99"].as_u64().unwrap_or(0),
        elevations: after["elevation_latency_us"]["count"].as_u64().unwrap_or(0),
        daemon_cpu_pct: 100.0 * (cpu1 - cpu0) / wall,
        events: delta("request_events"),
        lost: delta("lost_events"),
        throttled: delta("throttled_events"),
    }
}

/// The soakers in an idle top-level group made by hand (no daemon), put back and the
/// group removed when dropped.
struct IdleByHand {
    cg: appease_cgroup::Cgroups,
    group: String,
    pids: Vec<u32>,
}

impl IdleByHand {
    fn new(pids: impl Iterator<Item = u32>) -> Self {
        let cg = appease_cgroup::Cgroups::detect().expect("a CPU cgroup hierarchy");
        let group = cg
            .ensure_top_group("appease-flood-by-hand", true, 100)
            .expect("an idle group");
        let pids: Vec<u32> = pids.collect();
        for &pid in &pids {
            cg.move_process(pid, &group).expect("a soaker moved");
        }
        IdleByHand { cg, group, pids }
    }
}

impl Drop for IdleByHand {
    fn drop(&mut self) {
        for &pid in &self.pids {
            let _gone_already = self.cg.move_process(pid, "/");
        }
        let _ = self.cg.remove(&self.group);
    }
}

/// A server thread (1 ms of CPU a request) and its open-loop client (100 requests a
/// second) for `d`; the latencies in ms, sorted, from each request's intended send time.
fn serve(d: Duration) -> Vec<f64> {
    let (mut client, mut server) = UnixStream::pair().unwrap();
    let srv = thread::spawn(move || {
        let mut b = [0u8; 1];
        while server.read_exact(&mut b).is_ok() {
            spin_cpu(Duration::from_millis(1));
            if server.write_all(&b).is_err() {
                break;
            }
        }
    });
    let period = Duration::from_millis(10);
    let start = Instant::now();
    let mut due = start;
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    while start.elapsed() < d {
        let now = Instant::now();
        if now < due {
            thread::sleep(due - now);
        }
        client.write_all(b"q").unwrap();
        client.read_exact(&mut b).unwrap();
        out.push(due.elapsed().as_secs_f64() * 1e3);
        due += period;
    }
    drop(client);
    srv.join().unwrap();
    out.sort_by(f64::total_cmp);
    out
}

/// As the flooding user: `n` threads, each reading a byte from its own socketpair once a
/// second (spread over the second), for `d`.
fn flood(n: u64, d: Duration) {
    // Two descriptors a thread: the soft limit raised to the hard one (any user may).
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid rlimit pointers.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut handles = Vec::new();
    for i in 0..n {
        let stop = stop.clone();
        let offset = Duration::from_secs_f64(i as f64 / n as f64);
        let spawned = thread::Builder::new().stack_size(64 << 10).spawn(move || {
            let Ok((mut a, mut b)) = UnixStream::pair() else {
                return;
            };
            thread::sleep(offset);
            let mut buf = [0u8; 1];
            while !stop.load(Ordering::Relaxed) {
                if a.write_all(b"x").is_err() || b.read_exact(&mut buf).is_err() {
                    return;
                }
                thread::sleep(Duration::from_secs(1));
            }
        });
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                eprintln!("flood: {i} threads started, then {e}");
                break;
            }
        }
    }
    let left = d.saturating_sub(start.elapsed());
    thread::sleep(left);
    stop.store(true, Ordering::Relaxed);
    std::process::exit(0);
}
