//! End to end on the real kernel: the `appease` binary, real BPF, real sockets, real
//! priorities. Root-only tests are ignored with their reason unless run with
//! `--include-ignored` (make test, as root), and fail saying so without root.
//! Tests run one at a time (they share the machine's CPUs and the daemon's lock).
//! They are laid out by topic in the modules below; this file and `support` hold the
//! harness they share.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

mod batch;
mod bench;
mod chaos;
mod containers;
mod elevation;
mod fuzz;
mod in_place;
mod lifecycle;
mod locks;
mod model_sim;
mod nested;
mod operating;
mod pods;
mod responses;
mod services;
mod support;
mod vm;
use support::*;

/// Short fades so the tests run in seconds; otherwise the default's shape. Batch
/// demotion is off: these tests need the soakers competing at nice 0.
const TEST_CONFIG: &str = r#"
[batch]
enabled = false
[elevation]
tick_ms = 10
[elevation.budget]
# Far below what a spinning thread gets beside 2 soakers (~2/3 of a CPU), far above
# what the test servers use (~1/10): robust on a noisy machine.
cpu_share = 0.3
burst_ms = 200
[[elevation.ladder]]
from_runnable_per_cpu = 0.0
unix_nice = 0
inet_nice = 0
decay_ms = 0
[[elevation.ladder]]
from_runnable_per_cpu = 1.0
unix_nice = -8
inet_nice = -4
decay_ms = 50
"#;

/// A daemon with TEST_CONFIG under `soakers` CPU soakers, once it reports the load
/// (servers started after this find the ladder engaged). Bound left to right, dropped
/// right to left: the daemon stops first.
fn loaded(name: &str, soakers: usize) -> (TempDir, PathBuf, Soakers, Daemon) {
    loaded_with(name, soakers, "")
}

/// As `loaded`, with `extra` appended to TEST_CONFIG.
fn loaded_with(name: &str, soakers: usize, extra: &str) -> (TempDir, PathBuf, Soakers, Daemon) {
    let dir = TempDir::new(name);
    let cfg = dir.file("test.toml", &format!("{TEST_CONFIG}{extra}"));
    let soak = Soakers::start(soakers);
    let daemon = Daemon::start(&dir.0, &cfg);
    // About one time constant of the runnable EMA.
    let want = 0.6 * soakers as f64 / host_cpus() as f64;
    let seen = wait_for(Duration::from_secs(5), || {
        daemon.status_json()["load"]["runnable_per_cpu"]
            .as_f64()
            .unwrap_or(0.0)
            >= want
    });
    assert!(
        seen.is_some(),
        "the daemon never reported the load: {}",
        daemon.log_text()
    );
    (dir, cfg, soak, daemon)
}

/// One test at a time, as root. Root-only tests are `#[ignore]`d with the reason, so a
/// plain `cargo test` lists them as ignored; `make test` (root) runs them with
/// `--include-ignored`. Run without root, they fail here saying so: never a silent pass.
fn serial() -> MutexGuard<'static, ()> {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test needs root (BPF, priorities, cgroups); run it as root (make test does)"
    );
    one_at_a_time()
}

/// One test at a time, without root: a test that needs none but keeps the CPUs busy
/// (fuzzing, the simulator) must not run beside one that measures the load or a latency.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn nice_of(tid: u32) -> i32 {
    let stat =
        std::fs::read_to_string(format!("/proc/{}/task/{tid}/stat", std::process::id())).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 1..];
    after.split_whitespace().nth(16).unwrap().parse().unwrap()
}

fn set_nice(tid: u32, nice: i32) {
    // SAFETY: plain syscall on a thread of ours.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) };
    assert_eq!(r, 0, "setpriority");
}

/// A server thread answering one-byte requests after `cpu` of work, and a client
/// sending one every `period` until stopped.
struct Service {
    server_tid: u32,
    paused: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Service {
    fn tcp(cpu: Duration, period: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = move || {
            let s = TcpStream::connect(addr).unwrap();
            s.set_nodelay(true).unwrap();
            s
        };
        Self::start(move || listener.accept().unwrap().0, client, cpu, period)
    }

    fn unix(cpu: Duration, period: Duration) -> Self {
        let (a, b) = UnixStream::pair().unwrap();
        Self::start(move || b, move || a, cpu, period)
    }

    fn start<S, C>(
        server: impl FnOnce() -> S + Send + 'static,
        client: impl FnOnce() -> C + Send + 'static,
        cpu: Duration,
        period: Duration,
    ) -> Self
    where
        S: Read + Write + 'static,
        C: Read + Write + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let srv = thread::spawn(move || {
            tx.send(gettid()).unwrap();
            let mut s = server();
            let mut b = [0u8; 1];
            while s.read(&mut b).map(|n| n == 1).unwrap_or(false) {
                spin_cpu(cpu);
                if s.write_all(&b).is_err() {
                    break;
                }
            }
        });
        let server_tid = rx.recv().unwrap();
        let paused = Arc::new(AtomicBool::new(false));
        let (st, pa) = (stop.clone(), paused.clone());
        let cli = thread::spawn(move || {
            let mut c = client();
            let mut b = [0u8; 1];
            while !st.load(Ordering::Relaxed) {
                if !pa.load(Ordering::Relaxed)
                    && (c.write_all(b"r").is_err() || c.read_exact(&mut b).is_err())
                {
                    break;
                }
                thread::sleep(period);
            }
            // Dropping the client ends the server's loop.
        });
        Service {
            server_tid,
            paused,
            stop,
            threads: vec![srv, cli],
        }
    }

    /// Stops sending requests; the server thread stays alive but idle.
    fn pause(&self) {
        self.paused.store(true, Ordering::Relaxed);
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Two threads answering one-byte requests, each running `work` per request (false
/// ends it), each with a client thread that sends one every `period` until `stop`.
struct ShortRequests {
    threads: Vec<JoinHandle<()>>,
    latencies: Arc<Mutex<Vec<f64>>>,
}

impl ShortRequests {
    fn start(
        period: Duration,
        stop: Arc<AtomicBool>,
        work: impl Fn() -> bool + Clone + Send + 'static,
    ) -> Self {
        let latencies = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        for _ in 0..2 {
            let (mut client, mut server) = UnixStream::pair().unwrap();
            let (work, stop, lat) = (work.clone(), stop.clone(), latencies.clone());
            threads.push(thread::spawn(move || {
                let mut b = [0u8; 1];
                while server.read_exact(&mut b).is_ok() && work() {
                    if server.write_all(&b).is_err() {
                        break;
                    }
                }
            }));
            threads.push(thread::spawn(move || {
                let mut b = [0u8; 1];
                while !stop.load(Ordering::Relaxed) {
                    let start = Instant::now();
                    let answered =
                        client.write_all(b"r").is_ok() && client.read_exact(&mut b).is_ok();
                    // A request the end of the run cut short (its server gave up when
                    // the lock went away) waited at least this long: it counts.
                    lat.lock()
                        .unwrap()
                        .push(start.elapsed().as_secs_f64() * 1e3);
                    if !answered {
                        break;
                    }
                    thread::sleep(period);
                }
            }));
        }
        ShortRequests { threads, latencies }
    }

    /// Joins the threads (once `stop` is set and nothing blocks them); the latencies, ms,
    /// sorted.
    fn finish(self) -> Vec<f64> {
        for t in self.threads {
            t.join().unwrap();
        }
        let mut v = std::mem::take(&mut *self.latencies.lock().unwrap());
        v.sort_by(f64::total_cmp);
        v
    }
}

/// A per-connection forking TCP server (Perl, from the base system): each connection's
/// child answers one-byte requests, `h` after 400 ms of work, anything else after 2 ms.
/// Prints its port.
const FORKING_SERVER: &str = r#"
use IO::Socket::INET; use Time::HiRes qw(time);
my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 64,
    ReuseAddr => 1) or die "listen: $!";
$| = 1; print $s->sockport, "\n"; $SIG{CHLD} = 'IGNORE';
while (1) {
    my $c = $s->accept or next;
    if (fork == 0) {
        close $s;
        while (sysread($c, my $b, 1)) {
            my $end = time + ($b eq 'h' ? 0.4 : 0.002);
            1 while time < $end;
            syswrite($c, $b);
        }
        exit 0;
    }
    close $c;
}
"#;

/// A perl server that prints its port first; ended on drop, also when an assertion
/// fails (its children end with their connections).
fn perl_server(script: &str) -> (Soakers, String) {
    let mut child = Command::new("perl")
        .args(["-e", script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("perl runs");
    let out = child.stdout.take().unwrap();
    let server = Soakers(vec![child]);
    let mut port = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut port).unwrap();
    (server, port.trim().to_string())
}

// ---------------------------------------------------------------------------------
// Helpers of the batch demotion tests (batch/, in_place/, pods/).

fn batch_config(group: &str) -> String {
    format!(
        r#"
[batch]
group = "{group}"
after_ms = 2000
scan_ms = 200
"#
    )
}

fn cpu_cgroup(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    appease_cgroup::parse_proc_cgroup(&text, appease_cgroup::Version::V1)
        .or_else(|| appease_cgroup::parse_proc_cgroup(&text, appease_cgroup::Version::V2))
}

/// Whether a process is in the idle group `top`: in the group of its job inside it.
fn in_idle_group(pid: u32, top: &str) -> bool {
    cpu_cgroup(pid).is_some_and(|g| g.strip_prefix(top).is_some_and(|r| r.starts_with("/job-")))
}

fn children_of(ppid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|t| {
                    t[t.rfind(')')? + 1..]
                        .split_whitespace()
                        .nth(1)?
                        .parse::<u32>()
                        .ok()
                })
                == Some(ppid)
        })
        .collect()
}

/// `appease bench-worker soak` under the process name `name` (for rules by name).
fn named_soaker(name: &str) -> std::process::Child {
    Command::new(BIN)
        .args(["bench-worker", "soak", "--name", name])
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// A soaker in a new session (no terminal, as under CI even when the tests run from
/// a terminal), which forks a `sleep` child on SIGUSR1.
fn forking_soaker() -> std::process::Child {
    in_new_session("trap 'sleep 60 &' USR1; while :; do :; done")
}

/// `sh -c text` in a session of its own (no terminal, its own process group).
fn in_new_session(text: &str) -> std::process::Child {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", text]).stdout(Stdio::null());
    own_session(&mut cmd).spawn().unwrap()
}

/// `cmd`, to start in a session of its own (setsid), hence its own autogroup.
fn own_session(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        })
    }
}

/// The daemon's thread named `name`.
fn thread_named(pid: u32, name: &str) -> Option<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|tid| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                .is_ok_and(|c| c.trim() == name)
        })
}

/// A shell script in a session of its own (no terminal, its own process group), ended
/// with every process of that group.
struct Script(std::process::Child);

impl Script {
    fn start(text: &str) -> Self {
        Script(in_new_session(text))
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Its processes now: the script and every descendant.
    fn tree(&self) -> Vec<u32> {
        let mut out = vec![self.pid()];
        let mut i = 0;
        while i < out.len() {
            out.extend(children_of(out[i]));
            i += 1;
        }
        out
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        // SAFETY: the process group this script leads (setsid above).
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// The nice of `pid`'s session autogroup.
fn autogroup_nice(pid: u32) -> i32 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/autogroup")).unwrap();
    appease_actuator::sys::parse_autogroup(&text)
        .unwrap_or_else(|| panic!("pid {pid} is in no autogroup: {text:?}"))
        .nice
}

/// The kernel makes autogroups while it lives (`sched_autogroup_enabled = 1`); the
/// setting found goes back on drop.
struct AutogroupsOn(String);

impl AutogroupsOn {
    const KNOB: &str = "/proc/sys/kernel/sched_autogroup_enabled";

    fn new() -> Self {
        let was = std::fs::read_to_string(Self::KNOB)
            .expect("a kernel with autogroups (CONFIG_SCHED_AUTOGROUP): /proc/sys/kernel/sched_autogroup_enabled");
        std::fs::write(Self::KNOB, "1").unwrap();
        AutogroupsOn(was.trim().to_string())
    }
}

impl Drop for AutogroupsOn {
    fn drop(&mut self) {
        let _best_effort = std::fs::write(Self::KNOB, &self.0);
    }
}

/// A request-serving process in a session of its own (`appease bench-worker server` on
/// a UNIX socket, 1 ms of CPU a request) and a thread of this test sending it a request
/// every 20 ms. Its own session, so its own autogroup: the kernel gives none to a process
/// of the first session (under CI the tests may run in it), and /proc/PID/autogroup is
/// then empty.
struct SessionServer {
    server: Soakers,
    stop: Arc<AtomicBool>,
    client: Option<JoinHandle<()>>,
}

impl SessionServer {
    fn start(dir: &std::path::Path) -> Self {
        let socket = dir.join("server.sock");
        let mut cmd = Command::new(BIN);
        cmd.args(["bench-worker", "server", "--cpu-ms", "1", "--unix"])
            .arg(&socket)
            .stdout(Stdio::piped());
        let mut child = own_session(&mut cmd).spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let server = Soakers(vec![child]);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line).unwrap();
        let mut conn = UnixStream::connect(line.trim()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let client = thread::spawn(move || {
            let mut answer = [0u8; appease_bench::worker::ANSWER_LEN];
            while !st.load(Ordering::Relaxed) {
                if conn.write_all(b"r").is_err() || conn.read_exact(&mut answer).is_err() {
                    break;
                }
                thread::sleep(Duration::from_millis(20));
            }
        });
        SessionServer {
            server,
            stop,
            client: Some(client),
        }
    }

    fn pid(&self) -> u32 {
        self.server.0[0].id()
    }
}

impl Drop for SessionServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(c) = self.client.take() {
            let _ = c.join();
        }
    }
}

/// A small tmpfs mounted for a test, unmounted on drop.
struct TinyFs(PathBuf);

impl TinyFs {
    fn mount(at: &std::path::Path, size: &str) -> Self {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount a tmpfs at {}", at.display());
        TinyFs(at.to_path_buf())
    }

    /// Writes zeros until the filesystem is full; returns the file.
    fn fill(&self) -> PathBuf {
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        path
    }
}

impl Drop for TinyFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn fork_spinning_receiver(socket: &UnixStream) -> u32 {
    use std::os::fd::AsRawFd;
    let fd = socket.as_raw_fd();
    // SAFETY: the child only spins and calls recv, forever: async-signal-safe.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let mut buf = [0u8; 64];
        loop {
            spin_cpu(Duration::from_millis(20));
            // SAFETY: valid buffer; non-blocking receive.
            unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        }
    }
    child as u32
}

struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: ending and reaping our own forked child.
        unsafe {
            libc::kill(self.0 as i32, libc::SIGKILL);
            libc::waitpid(self.0 as i32, std::ptr::null_mut(), 0);
        }
    }
}

// ---------------------------------------------------------------------------------
// Helpers of the bench, operating and service tests.

/// Runs `appease bench ARGS --json` (progress on stderr) and returns its one JSON object.
fn bench_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN)
        .arg("bench")
        .args(args)
        .arg("--json")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "bench {args:?} failed");
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

/// The scalability values of one series of a closed-loop result, recomputed from its
/// points' completion times with the study's formula: (T_B / T_A) / (B / A).
fn recomputed_scalability(series: &serde_json::Value, time_key: &str) -> (u64, Vec<(u64, f64)>) {
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
fn assert_scalability_recomputes(series: &serde_json::Value, time_key: &str) {
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

/// PostgreSQL processes started from a bench's private directory, still running.
fn bench_postgres_left() -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("postgres") && c.contains("appease-bench-"))
        .collect()
}

/// Processes working in the bench run `pid`'s private directory (its make and compilers),
/// or naming it on their command line: (comm, command line).
fn bench_processes_left(pid: u32) -> Vec<(String, String)> {
    let mark = format!("appease-bench-{pid}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter_map(|e| {
            let cwd = std::fs::read_link(e.path().join("cwd")).ok()?;
            let cmd = String::from_utf8_lossy(&std::fs::read(e.path().join("cmdline")).ok()?)
                .replace('\0', " ");
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            (cwd.to_string_lossy().contains(&mark) || cmd.contains(&mark))
                .then(|| (comm.trim().to_string(), cmd))
        })
        .collect()
}

/// Runs `cmd` and checks that it fails with `expect` in its error output.
fn fails_saying(cmd: &mut Command, expect: &str) {
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(expect),
        "{cmd:?}: expected {expect:?} in: {err}"
    );
}

/// The host's processes running or waiting for a CPU now, (pid, name): what else
/// competed with a test's soaker when it was not found soaking.
fn running_processes() -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let (name, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
            rest.starts_with('R').then(|| (pid, name.to_string()))
        })
        .collect()
}

/// A daemon with the batch config plus `extra` ([batch] keys), and one soaker it has
/// demoted: (run dir, the group's path, the soaker, the daemon).
fn demoted_soaker(name: &str, extra: &str) -> (TempDir, String, Soakers, Daemon) {
    let dir = TempDir::new(name);
    let group = format!("appease-e2e-{name}{}", std::process::id());
    let cfg = dir.file(
        &format!("{name}.toml"),
        &format!("{}{extra}", batch_config(&group)),
    );
    let soakers = Soakers(vec![forking_soaker()]);
    let pid = soakers.0[0].id();
    let home = cpu_cgroup(std::process::id());
    let daemon = Daemon::start(&dir.0, &cfg);
    let gpath = format!("/{group}");
    assert!(
        wait_for(Duration::from_secs(8), || in_idle_group(pid, &gpath)).is_some(),
        "demoted (running now: {:?}; status: {}): {}",
        running_processes(),
        daemon.status_json()["batch"],
        daemon.log_text()
    );
    // The soaker alone: this process started the daemon, so it (and whatever runs it)
    // supervises the daemon and is never part of a batch tree.
    assert_eq!(
        cpu_cgroup(std::process::id()),
        home,
        "{}",
        daemon.log_text()
    );
    // The daemon logs the move after it is made: wait for the line.
    let moved = format!("root={pid} moved=1");
    assert!(
        wait_for(Duration::from_secs(3), || daemon
            .log_text()
            .contains(&moved))
        .is_some(),
        "{}",
        daemon.log_text()
    );
    (dir, gpath, soakers, daemon)
}

/// The CPUs a thread may run on (none once it is gone).
fn cpus_of(tid: u32) -> Vec<usize> {
    appease_actuator::sys::affinity(tid).unwrap_or_default()
}

fn nice_of_process(pid: u32) -> i32 {
    let t = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    t[t.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(16)
        .unwrap()
        .parse()
        .unwrap()
}

/// GET http://ADDR/metrics: the body.
fn scrape(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body.to_string()
}

/// A sample's value in a scrape.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
}

/// The daemon's audit lines (JSON logs): the `fields` of each.
fn audit_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| v["fields"].clone())
        .filter(|f| f["change"].is_string())
        .collect()
}

/// A private tmux server for one test, ended (with what runs in it) on drop.
struct Tmux(String);

impl Tmux {
    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.0])
            .args(args)
            .output()
            .expect("tmux (Debian package tmux; make test-deps installs it)")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p"]).stdout).into_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _already_gone = self.run(&["kill-server"]);
    }
}

/// `appease ARGS` that must succeed, its stdout as JSON.
fn json_of(args: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

// ---------------------------------------------------------------------------------
// Helpers of the in-place demotion tests (in_place/).

/// A top-level cgroup of the test's with half a CPU of quota (`cpu.cfs_quota_us` on
/// v1, `cpu.max` on v2; on v2 also `pids.max`), removed on drop once its processes are.
struct LimitedGroup {
    cg: appease_cgroup::Cgroups,
    path: String,
    procs: Vec<u32>,
}

impl LimitedGroup {
    fn new(tag: &str, pids_max: Option<u32>) -> Self {
        let cg = appease_cgroup::Cgroups::detect().expect("a CPU cgroup hierarchy");
        let path = format!("/appease-e2e-{tag}{}", std::process::id());
        let dir = cg.root().join(&path[1..]);
        std::fs::create_dir(&dir).unwrap();
        let write = |f: &str, v: &str| std::fs::write(dir.join(f), v).unwrap();
        match cg.version() {
            appease_cgroup::Version::V1 => {
                write("cpu.cfs_period_us", "100000");
                write("cpu.cfs_quota_us", "50000");
            }
            appease_cgroup::Version::V2 => {
                write("cpu.max", "50000 100000");
                if let Some(n) = pids_max {
                    write("pids.max", &n.to_string());
                }
            }
        }
        LimitedGroup {
            cg,
            path,
            procs: vec![],
        }
    }

    fn adopt(&mut self, pid: u32) {
        self.cg.move_process(pid, &self.path).unwrap();
        self.procs.push(pid);
    }
}

impl Drop for LimitedGroup {
    fn drop(&mut self) {
        for p in self.cg.processes(&self.path).unwrap_or_default() {
            // SAFETY: ending processes this test started in its own group.
            unsafe { libc::kill(p as i32, libc::SIGKILL) };
        }
        let gone = wait_for(Duration::from_secs(5), || {
            self.cg.processes(&self.path).is_ok_and(|p| p.is_empty())
        });
        assert!(gone.is_some(), "processes left in {}", self.path);
        // An emptied cgroup can still be busy for a moment.
        wait_for(Duration::from_secs(2), || {
            self.cg.remove(&self.path).is_ok()
        });
        assert!(!self.cg.exists(&self.path), "{} removed", self.path);
    }
}

/// A thread's scheduling policy (0 normal, 5 SCHED_IDLE), field 41 of its stat.
fn policy_of(pid: u32, tid: u32) -> u32 {
    let t = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap();
    let (_, f) = appease_cgroup::stat_fields(&t).unwrap();
    f[41 - 3].parse().unwrap()
}

/// CPU time of all of a process's threads, ns (schedstat).
fn cpu_ns_of(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let t = std::fs::read_to_string(e.path().join("schedstat")).ok()?;
                    t.split_whitespace().next()?.parse::<u64>().ok()
                })
                .sum()
        })
        .unwrap_or(0)
}

/// A forked copy of this process that spins and takes what waits on its socket every
/// 20 ms, fed a request every 50 ms: busy, and receiving requests (never batch).
struct BusyServer {
    pid: u32,
    stop: Arc<AtomicBool>,
    feeder: Option<JoinHandle<()>>,
}

impl BusyServer {
    fn start() -> Self {
        let (mut a, b) = UnixStream::pair().unwrap();
        let child = fork_spinning_receiver(&b);
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let feeder = thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let _ = a.write_all(b"q");
                thread::sleep(Duration::from_millis(50));
            }
        });
        BusyServer {
            pid: child,
            stop,
            feeder: Some(feeder),
        }
    }
}

impl Drop for BusyServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(f) = self.feeder.take() {
            let _ = f.join();
        }
        drop(KillOnDrop(self.pid));
    }
}

/// The soaker and the server under one half-CPU limit, a daemon, and the soaker
/// demoted in place. Bound left to right, dropped right to left: the daemon stops first.
fn demoted_under_a_limit(
    tag: &str,
    pids_max: Option<u32>,
) -> (LimitedGroup, TempDir, Soakers, BusyServer, Daemon, String) {
    let mut limited = LimitedGroup::new(tag, pids_max);
    let dir = TempDir::new(tag);
    let batch_group = format!("appease-e2e-{tag}b{}", std::process::id());
    // Under half a CPU shared with the server, the soaker can want only about a quarter
    // of one (a throttled task is not even waiting): the threshold is lowered to match.
    let cfg = dir.file(
        "batch.toml",
        &format!("{}min_cpus = 0.15\n", batch_config(&batch_group)),
    );
    let soakers = Soakers(vec![forking_soaker()]);
    let soaker = soakers.0[0].id();
    let server = BusyServer::start();
    limited.adopt(soaker);
    limited.adopt(server.pid);
    let daemon = Daemon::start(&dir.0, &cfg);
    let idle = wait_for(Duration::from_secs(8), || policy_of(soaker, soaker) == 5);
    assert!(
        idle.is_some(),
        "soaker demoted in place: {}",
        daemon.log_text()
    );
    (limited, dir, soakers, server, daemon, batch_group)
}

// ---------------------------------------------------------------------------------
// Helpers of the VM tests (vm/).

fn in_vm(mode: &str, script: &str) {
    in_vm_with(mode, script, &[]);
}

/// With these files of the repository beside the script in the VM's /opt/appease.
fn in_vm_with(mode: &str, script: &str, files: &[&str]) {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let vm = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm");
    let out = Command::new(repo.join("scripts/vm/run.sh"))
        .arg(mode)
        .arg(vm.join(script))
        .arg(vm.join("lib.sh"))
        .args(files.iter().map(|f| repo.join(f)))
        .env("APPEASE_BIN", BIN)
        .output()
        .expect("scripts/vm/run.sh runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    // The whole output is above; the failed checks are repeated here, where a clipped
    // log still shows them.
    let mut failed: Vec<&str> = text.lines().filter(|l| l.starts_with("not ok")).collect();
    if failed.is_empty() {
        // The VM stopped before its checks said anything: its last words instead.
        let lines: Vec<&str> = text.lines().collect();
        failed = lines[lines.len().saturating_sub(20)..].to_vec();
    }
    assert!(
        out.status.success(),
        "the VM's checks failed:\n{}",
        failed.join("\n")
    );
    assert!(
        text.lines().any(|l| l.ends_with(" passed, 0 failed")),
        "no closing count from the VM:\n{text}"
    );
}

// ---------------------------------------------------------------------------------
// Helpers of the container and pod tests (pods/, containers/).

/// Cgroups the test made (deepest last), emptied and removed on drop.
struct MadeGroups {
    cg: appease_cgroup::Cgroups,
    paths: Vec<String>,
}

impl MadeGroups {
    fn new(paths: &[&str]) -> Self {
        let cg = appease_cgroup::Cgroups::detect().expect("a CPU cgroup hierarchy");
        for p in paths {
            std::fs::create_dir_all(cg.root().join(&p[1..])).unwrap();
        }
        MadeGroups {
            cg,
            paths: paths.iter().map(|p| p.to_string()).collect(),
        }
    }
}

impl Drop for MadeGroups {
    fn drop(&mut self) {
        for p in &self.paths {
            for pid in self.cg.processes_below(p).unwrap_or_default() {
                // SAFETY: ending processes this test started in its own groups.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
        let mut all: Vec<String> = Vec::new();
        for p in &self.paths {
            let mut cur = p.clone();
            while cur.len() > 1 {
                if !all.contains(&cur) {
                    all.push(cur.clone());
                }
                cur = cur[..cur.rfind('/').unwrap()].to_string();
            }
        }
        all.sort_by_key(|p| std::cmp::Reverse(p.matches('/').count()));
        for p in all {
            wait_for(Duration::from_secs(3), || self.cg.remove(&p).is_ok());
        }
    }
}

/// Has a `forking_soaker` fork a `sleep` and returns its pid. An idle-class shell beside
/// a spinning server runs rarely: it is given time.
fn fork_a_sleep(soaker: u32) -> u32 {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(soaker as i32, libc::SIGUSR1) };
    let mut kids = vec![];
    assert!(wait_for(Duration::from_secs(15), || {
        kids = children_of(soaker);
        !kids.is_empty()
    })
    .is_some());
    kids[0]
}

/// A soaker alone in the container cgroup `ctr` (made by the test, its weight as first
/// read returned) and a daemon that has made the container idle. Bound left to right,
/// dropped right to left.
fn container_made_idle(ctr: &str, tag: &str) -> (MadeGroups, String, Soakers, TempDir, Daemon) {
    let made = MadeGroups::new(&[ctr]);
    let weight = made.cg.weight_raw(ctr).unwrap();
    let soakers = Soakers(vec![soaker_in(&made.cg, ctr)]);
    let dir = TempDir::new(tag);
    let cfg = dir.file(
        "batch.toml",
        &batch_config(&format!("appease-e2e-{tag}{}", std::process::id())),
    );
    let daemon = Daemon::start(&dir.0, &cfg);
    assert!(
        wait_for(Duration::from_secs(8), || made
            .cg
            .idle(ctr)
            .unwrap_or(false))
        .is_some(),
        "the container made idle: {}",
        daemon.log_text()
    );
    (made, weight, soakers, dir, daemon)
}

/// A soaker started straight into `group`.
fn soaker_in(cg: &appease_cgroup::Cgroups, group: &str) -> std::process::Child {
    let child = forking_soaker();
    cg.move_process(child.id(), group).unwrap();
    child
}
