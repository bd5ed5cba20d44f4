//! Harness shared by the end-to-end tests and the daemon benchmark: soakers, a
//! daemon under test, timing helpers. Everything started here is ended by its pid.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_appease");

pub fn gettid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// Busy-loops until this thread has used `d` of CPU.
pub fn spin_cpu(d: Duration) {
    let cpu = || {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    };
    let end = cpu() + d;
    while cpu() < end {
        std::hint::spin_loop();
    }
}

/// Polls `f` every 5 ms until it holds; returns how long that took, or None on timeout.
pub fn wait_for(timeout: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return Some(start.elapsed());
        }
        thread::sleep(Duration::from_millis(5));
    }
    None
}

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("appease-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// CPU soakers: plain shell busy loops, ended by pid.
pub struct Soakers(pub Vec<Child>);

impl Soakers {
    pub fn start(n: usize) -> Self {
        Self::spin(n, Path::new("sh"))
    }

    /// As `start`, each a copy of the shell named `name` in `dir`: a `comm` of their own,
    /// for a rule to match.
    pub fn start_named(n: usize, dir: &Path, name: &str) -> Self {
        let sh = dir.join(name);
        std::fs::copy("/bin/sh", &sh).unwrap();
        Self::spin(n, &sh)
    }

    fn spin(n: usize, shell: &Path) -> Self {
        Soakers(
            (0..n)
                .map(|_| {
                    Command::new(shell)
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .unwrap()
                })
                .collect(),
        )
    }
}

impl Drop for Soakers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A child started in a process group of its own (`process_group(0)`), killed as one
/// group when dropped: its forks and threads go with it.
pub struct ProcessGroup(pub Child);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: signalling the process group we made (its id is the leader's pid).
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// Many idle processes, for scans of a crowded host: `sleep`s started by a shell in a
/// process group of their own, ended by that group's id. Not forks of the caller, which
/// would share its address space copy-on-write: a host's processes are their own.
pub struct Sleepers(Option<Child>);

impl Sleepers {
    pub fn start(n: usize) -> Self {
        if n == 0 {
            return Sleepers(None);
        }
        use std::os::unix::process::CommandExt;
        let script = format!(
            "i=0; while [ $i -lt {n} ]; do sleep 3600 & i=$((i+1)); done; echo ready; wait"
        );
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &script]).stdout(Stdio::piped());
        cmd.process_group(0);
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "{n} sleepers started");
        Sleepers(Some(child))
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            // SAFETY: signalling the process group we made (its id is the shell's pid).
            unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
            let _ = c.wait();
        }
    }
}

pub struct Daemon {
    child: Option<Child>,
    run_dir: PathBuf,
    log: PathBuf,
}

impl Daemon {
    pub fn start(run_dir: &Path, config: &Path) -> Self {
        Self::start_with_env(run_dir, config, &[])
    }

    /// With these environment variables too (a test build's FAILPOINTS, for one).
    pub fn start_with_env(run_dir: &Path, config: &Path, env: &[(&str, &str)]) -> Self {
        Self::start_with(run_dir, config, &[], env)
    }

    /// With these arguments to `appease daemon` and environment variables too.
    pub fn start_with(run_dir: &Path, config: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let log = run_dir.join(format!(
            "daemon-{}.log",
            Instant::now().elapsed().as_nanos()
        ));
        let child = Command::new(BIN)
            .args(["daemon", "--log", "debug", "--config"])
            .arg(config)
            .args(args)
            .env("APPEASE_RUN_DIR", run_dir)
            .envs(env.iter().copied())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let d = Daemon {
            child: Some(child),
            run_dir: run_dir.to_path_buf(),
            log,
        };
        let pid = d.child.as_ref().unwrap().id();
        let ready = wait_for(Duration::from_secs(10), || {
            status_of(&d.run_dir).is_some_and(|v| v["pid"] == pid)
        });
        assert!(ready.is_some(), "daemon did not start: {}", d.log_text());
        d
    }

    /// The last lines of the daemon's log, for failure messages.
    pub fn log_text(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.contains("libbpf")).collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// The whole log.
    pub fn full_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&mut self, sig: i32) -> std::process::ExitStatus {
        let mut c = self.child.take().unwrap();
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(c.id() as i32, sig) };
        c.wait().unwrap()
    }

    /// `kill -9`, not waited for: the killed daemon may still be on its way out.
    pub fn kill_now(&mut self) -> Child {
        let c = self.child.take().unwrap();
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
        c
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn status_json(&self) -> serde_json::Value {
        let out = appease(&self.run_dir, &["status", "--json"]);
        assert!(
            out.status.success(),
            "status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Polls the status (rewritten every second) until `holds` is true of it, for up to
    /// `timeout`: whether it came true, and the last status read.
    pub fn status_until(
        &self,
        timeout: Duration,
        holds: impl Fn(&serde_json::Value) -> bool,
    ) -> (bool, serde_json::Value) {
        let mut st = self.status_json();
        let held = wait_for(timeout, || {
            st = self.status_json();
            holds(&st)
        });
        (held.is_some(), st)
    }
}

/// Whether a status lists a changed thread of which `f` holds.
pub fn lists_thread(st: &serde_json::Value, f: impl Fn(&serde_json::Value) -> bool) -> bool {
    st["threads"].as_array().is_some_and(|t| t.iter().any(f))
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal(libc::SIGTERM);
        }
    }
}

/// The running daemon's state (`appease status --json`), if one answers.
pub fn status_of(run_dir: &Path) -> Option<serde_json::Value> {
    let out = appease(run_dir, &["status", "--json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

/// Runs `appease ARGS` against a run directory: a command that ends (a restore, a status,
/// a daemon that must refuse to start). One still running after a minute is stopped
/// (SIGTERM, so a daemon puts back what it changed; SIGKILL 10 s later) and fails the
/// test instead of hanging it.
pub fn appease(run_dir: &Path, args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env("APPEASE_RUN_DIR", run_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let read_all = |mut from: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut bytes = Vec::new();
            drop(from.read_to_end(&mut bytes));
            bytes
        })
    };
    let stdout = read_all(Box::new(child.stdout.take().unwrap()));
    let stderr = read_all(Box::new(child.stderr.take().unwrap()));
    let mut ended = None;
    wait_for(Duration::from_secs(60), || {
        ended = child.try_wait().unwrap();
        ended.is_some()
    });
    let Some(status) = ended else {
        // SIGTERM, then SIGKILL if it has not ended 10 s later; its output is not waited
        // for (whatever it started may still hold the pipes).
        for signal in [libc::SIGTERM, libc::SIGKILL] {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, signal) };
            if wait_for(Duration::from_secs(10), || {
                child.try_wait().unwrap().is_some()
            })
            .is_some()
            {
                break;
            }
        }
        panic!(
            "`appease {}` had not ended after 60 s (stopped)",
            args.join(" ")
        );
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

pub fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A number from the environment (a benchmark's size), or `default`.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `[[elevation.ladder]]` steps, each (from runnable threads per CPU, UNIX nice, IP nice,
/// decay ms).
pub fn ladder(steps: &[(f64, i32, i32, u64)]) -> String {
    steps
        .iter()
        .map(|(from, unix, inet, decay)| {
            format!(
                "[[elevation.ladder]]\nfrom_runnable_per_cpu = {from:.1}\nunix_nice = {unix}\ninet_nice = {inet}\ndecay_ms = {decay}\n"
            )
        })
        .collect()
}

/// The default ladder with 10 ms fades, so each server is elevated afresh many times.
pub fn latency_config() -> String {
    ladder(&[(0.0, 0, 0, 0), (1.0, -3, -2, 10), (2.0, -8, -5, 10)])
}

trait Conn: Read + Write + Send {}
impl<T: Read + Write + Send> Conn for T {}

/// Echo servers (one thread per connection) and paced clients.
pub struct Load {
    stop: Arc<AtomicBool>,
    /// Requests answered so far.
    pub done: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    /// `conns` connections (half UNIX, half TCP), `clients` threads sharing them,
    /// `rate` requests/s in total, sent on a fixed schedule (late sends go at once).
    pub fn start(conns: usize, clients: usize, rate: f64) -> Self {
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

/// The scalability values of one series of a closed-loop result, recomputed from its
/// points' completion times with the study's formula: (T_B / T_A) / (B / A).
pub fn recomputed_scalability(
    series: &serde_json::Value,
    time_key: &str,
) -> (u64, Vec<(u64, f64)>) {
    let points: Vec<(u64, f64)> = series["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["clients"].as_u64().unwrap(),
                p[time_key].as_f64().unwrap(),
            )
        })
        .collect();
    // The default base: the fastest point.
    let &(a, ta) = points.iter().min_by(|x, y| x.1.total_cmp(&y.1)).unwrap();
    let values = points
        .iter()
        .map(|&(b, tb)| (b, (tb / ta) / (b as f64 / a as f64)))
        .collect();
    (a, values)
}

/// Checks a series' `scalability` against the values recomputed from its points.
pub fn assert_scalability_recomputes(series: &serde_json::Value, time_key: &str) {
    let (base, values) = recomputed_scalability(series, time_key);
    let sc = &series["scalability"];
    assert_eq!(sc["base"].as_u64(), Some(base), "{series}");
    for (clients, v) in values {
        let got = sc["values"][clients.to_string()].as_f64().unwrap();
        assert!(
            (got - v).abs() < 1e-9 * v.max(1.0),
            "{clients}: {got} vs {v}: {series}"
        );
    }
}

/// Runs `cmd` and checks that it fails with `expect` in its error output.
pub fn fails_saying(cmd: &mut Command, expect: &str) {
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(expect),
        "{cmd:?}: expected {expect:?} in: {err}"
    );
}

/// `appease ARGS` that must succeed, its stdout as JSON.
pub fn json_of(args: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
