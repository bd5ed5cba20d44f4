//! `appease bench`: real servers under real batch load, every alternative side by side
//! in one run on the same machine.

pub mod client;
pub mod closed_loop;
mod db;
pub mod docker;
pub mod fetch;
pub mod nested;
pub mod peer;
mod pipeline;
pub mod plot;
pub mod report;
pub mod utilization;
mod web;
pub mod worker;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

pub use report::{ModeResult, ScenarioResult};

/// How the batch load is handled in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// No batch load at all: the reference.
    Unloaded,
    /// Batch load at nice 0, nothing managed.
    Unmanaged,
    BatchNice19,
    BatchSchedIdle,
    BatchCgroupIdle,
    /// The daemon with the 2010 paper's Table 1 ladder, nice only, no demotion.
    RbpeClassic,
    /// The daemon with its default config and no rules.
    Appease,
    /// The original Ananicy, installed, with its packaged rules (a peer daemon).
    Ananicy,
    /// system76-scheduler, installed, with its packaged configuration (a peer daemon).
    System76Scheduler,
    /// nested: the batch's own group (its session scope) made idle by hand.
    BatchGroupIdle,
    /// nested: the batch's branch made idle by hand where it meets the server's branch
    /// (a systemd host's `user.slice`).
    BatchBranchIdle,
}

impl Mode {
    pub const ALL: [Mode; 7] = [
        Mode::Unloaded,
        Mode::Unmanaged,
        Mode::BatchNice19,
        Mode::BatchSchedIdle,
        Mode::BatchCgroupIdle,
        Mode::RbpeClassic,
        Mode::Appease,
    ];

    /// What users run instead of appease; not among the default modes (they must be
    /// installed), asked for by name.
    pub const PEERS: [Mode; 2] = [Mode::Ananicy, Mode::System76Scheduler];

    /// Setups made by hand that only the nested scenario's shapes have.
    pub const NESTED: [Mode; 2] = [Mode::BatchGroupIdle, Mode::BatchBranchIdle];

    pub fn peer(self) -> Option<peer::Peer> {
        match self {
            Mode::Ananicy => Some(peer::Peer::Ananicy),
            Mode::System76Scheduler => Some(peer::Peer::System76Scheduler),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Ananicy => "ananicy",
            Mode::System76Scheduler => "system76-scheduler",
            Mode::Unloaded => "unloaded",
            Mode::Unmanaged => "unmanaged",
            Mode::BatchNice19 => "batch-nice19",
            Mode::BatchSchedIdle => "batch-sched-idle",
            Mode::BatchCgroupIdle => "batch-cgroup-idle",
            Mode::RbpeClassic => "rbpe-classic",
            Mode::Appease => "appease",
            Mode::BatchGroupIdle => "batch-group-idle",
            Mode::BatchBranchIdle => "batch-branch-idle",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Mode::ALL
            .into_iter()
            .chain(Mode::PEERS)
            .chain(Mode::NESTED)
            .find(|m| m.name() == s)
            .with_context(|| {
                let names: Vec<_> = Mode::ALL
                    .iter()
                    .chain(&Mode::PEERS)
                    .chain(&Mode::NESTED)
                    .map(|m| m.name())
                    .collect();
                format!("unknown mode {s:?}; modes are {}", names.join(", "))
            })
    }
}

/// What the batch load is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Batch {
    /// CPU soakers counting units of work (1,000 loop iterations each).
    #[default]
    Soak,
    /// `make -jN` with gcc over a generated tree of C files, in a loop.
    Compile,
    /// A shell script with an idle helper (`sleep`) that runs N CPU-heavy children at a
    /// time, round after round.
    Script,
    /// The soakers, each in a Docker container of its own (no quota), from an engine the
    /// bench starts.
    Docker,
    /// Soaker jobs of 1, 2 and 4 threads in turn: batch jobs of different sizes, each of
    /// which should get the same CPU.
    Mixed,
}

impl Batch {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "soak" => Ok(Batch::Soak),
            "compile" => Ok(Batch::Compile),
            "script" => Ok(Batch::Script),
            "docker" => Ok(Batch::Docker),
            "mixed" => Ok(Batch::Mixed),
            _ => bail!("unknown batch load {s:?}; one of soak, compile, script, mixed, docker"),
        }
    }

    /// `n` jobs of it, `load` per CPU, in words.
    pub fn describe(self, n: usize, load: f64) -> String {
        match self {
            Batch::Soak => format!("{n} soakers ({load} per CPU)"),
            Batch::Compile => format!(
                "make -j{n} over {} C files ({load} jobs per CPU)",
                worker::FILES
            ),
            Batch::Script => format!(
                "a shell script with a sleep running {n} CPU-heavy children at a time ({load} per CPU)"
            ),
            Batch::Docker => format!("{n} soakers in Docker containers ({load} per CPU)"),
            Batch::Mixed => format!("{n} soaker jobs of 1, 2 and 4 threads ({load} jobs per CPU)"),
        }
    }

    /// What its throughput counts.
    pub fn unit(self) -> &'static str {
        match self {
            Batch::Soak | Batch::Docker | Batch::Mixed => "work units",
            Batch::Compile => "files compiled",
            Batch::Script => "children finished",
        }
    }
}

/// Threads per job of the mixed load, in turn.
pub const MIXED_SIZES: [usize; 3] = [1, 2, 4];

pub const SCENARIOS: &[&str] = &[
    "synthetic",
    "web",
    "db",
    "db-analytic",
    "frames",
    "pipeline",
    "utilization",
    "nested",
    "fetch",
];

pub struct Options {
    pub scenario: String,
    pub quick: bool,
    /// Seconds measured per mode and round instead of the scenario's default.
    pub seconds: Option<f64>,
    pub modes: Vec<Mode>,
    /// Batch jobs per CPU; several values sweep.
    pub loads: Vec<f64>,
    /// The `appease` binary (workers and daemon modes run it).
    pub appease: PathBuf,
    /// Config for the `appease` mode instead of the embedded default.
    pub config: Option<PathBuf>,
    /// The synthetic server listens on a UNIX socket instead of TCP loopback.
    pub unix: bool,
    /// The loopback port of the synthetic (TCP) or web server; None: a free one.
    pub port: Option<u16>,
    /// How the client spaces its requests.
    pub arrivals: client::Arrivals,
    pub batch: Batch,
    /// Rounds of every mode; the report gives each metric's median over them.
    pub repeat: usize,
    /// Ctrl-C: stop measuring, clean up, report what was measured.
    pub stop: Arc<AtomicBool>,
    /// web and db: a closed-loop sweep over these client counts instead of the
    /// open-loop run (the Staircase study's scalability test).
    pub clients: Vec<u32>,
    /// The sweep's scalability base (None: the count with the lowest completion time).
    pub scale_base: Option<u32>,
    /// Peer daemons' programs by mode name (`--peer-bin NAME=PATH`); others from the PATH.
    pub peer_bins: Vec<(String, PathBuf)>,
    /// nested: the host layouts built.
    pub shapes: Vec<nested::Shape>,
    /// nested: the servers measured in them.
    pub servers: Vec<nested::Server>,
    /// fetch: the servers measured.
    pub fetch_servers: Vec<fetch::Server>,
    /// fetch: the batch jobs beside them.
    pub fetch_jobs: Vec<fetch::Job>,
}

impl Options {
    /// The modes that can run here, and those that cannot (peers not installed) with
    /// the message that says how to get them, printed once.
    pub(crate) fn runnable_modes(&self) -> (Vec<Mode>, Vec<report::NotRun>) {
        let mut run = Vec::new();
        let mut not_run = Vec::new();
        for &m in &self.modes {
            match m.peer().map(|p| peer::locate(p, &self.peer_bins)) {
                Some(Err(why)) => {
                    eprintln!("{}: not run: {why}", m.name());
                    not_run.push(report::NotRun {
                        mode: m.name().into(),
                        why,
                    });
                }
                _ => run.push(m),
            }
        }
        (run, not_run)
    }

    /// The largest client count of a closed-loop sweep.
    pub(crate) fn max_clients(&self) -> Option<u32> {
        self.clients.iter().copied().max()
    }

    /// The idle group the appease mode's daemon uses, as it appears in /proc/PID/cgroup.
    pub(crate) fn batch_group(&self) -> String {
        let name = self
            .config
            .as_ref()
            .and_then(|p| appease_config::Config::load(p).ok())
            .map_or_else(|| "appease.batch".to_string(), |c| c.batch.group);
        format!(":/{name}")
    }
}

/// Parameters of the synthetic scenario (the DESIGN.md experiment by default).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Synthetic {
    /// "synthetic" (a server of ours) or "nginx".
    pub server: String,
    /// "tcp" or "unix".
    pub transport: String,
    pub cpu_ms: f64,
    pub rate_per_s: f64,
    pub arrivals: client::Arrivals,
    /// Absent in results from before the compile load: soakers.
    #[serde(default)]
    pub batch: Batch,
    pub measure_s: f64,
    pub warmup_s: f64,
    /// Each metric is the median over this many interleaved rounds.
    pub rounds: usize,
}

/// What a scenario reports.
pub enum Report {
    /// Latency scenarios: one result per batch level.
    Latency(Vec<ScenarioResult>),
    Utilization(utilization::UtilizationResult),
    /// web and db with `--clients`: the closed-loop sweep.
    ClosedLoop(closed_loop::ClosedLoopResult),
    Nested(nested::NestedResult),
    Fetch(fetch::FetchResult),
}

pub fn run(opts: &Options) -> Result<Report> {
    if !SCENARIOS.contains(&opts.scenario.as_str()) {
        bail!(
            "unknown scenario {:?}; scenarios are {}",
            opts.scenario,
            SCENARIOS.join(", ")
        );
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("appease bench needs root: its modes change priorities, policies and cgroups");
    }
    if opts.port.is_some()
        && !(opts.scenario == "web" || opts.scenario == "synthetic" && !opts.unix)
    {
        bail!("--port applies to the TCP servers of the synthetic and web scenarios only");
    }
    if opts.scenario == "utilization" {
        return Ok(Report::Utilization(utilization::run(opts)?));
    }
    if opts.scenario == "nested" {
        return Ok(Report::Nested(nested::run(opts)?));
    }
    if opts.scenario == "fetch" {
        return Ok(Report::Fetch(fetch::run(opts)?));
    }
    if let Some(m) = opts.modes.iter().find(|m| Mode::NESTED.contains(m)) {
        bail!("mode {} applies to the nested scenario only", m.name());
    }
    if !opts.clients.is_empty() {
        return Ok(Report::ClosedLoop(closed_loop::run(opts)?));
    }
    Ok(Report::Latency(run_latency(opts)?))
}

/// The order of `n` modes in round `round` (0-based): the list turned by one place
/// per round.
pub(crate) fn rotated(n: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (k + round) % n)
}

/// Whether `program` is on the PATH.
pub(crate) fn on_path(program: &str) -> bool {
    find_on_path(program).is_some()
}

/// Where `program` is on the PATH.
pub(crate) fn find_on_path(program: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// The server, its request rate and the run's timing for the chosen scenario.
pub(crate) fn scenario_params(opts: &Options) -> Synthetic {
    let (server, transport, cpu_ms, rate_per_s, arrivals) = match opts.scenario.as_str() {
        // nginx's work per request is its own; 2,000 small requests/s.
        "web" => ("nginx", "tcp", 0.0, 2000.0, opts.arrivals),
        // pgbench's TPC-B-like transactions; its rate schedule is always Poisson.
        "db" => ("postgresql", "unix", 0.0, 100.0, client::Arrivals::Poisson),
        // The same, while another connection runs analytic queries of about a second each,
        // back to back, all the time (the unloaded mode included).
        "db-analytic" => (
            "postgresql-analytic",
            "unix",
            0.0,
            100.0,
            client::Arrivals::Poisson,
        ),
        // A 25 fps player: each frame arrives from its demuxer over a UNIX socket and is
        // decoded on 8 ms of CPU; it must be done before the next one is due.
        "frames" => ("player", "unix", 8.0, 25.0, client::Arrivals::Fixed),
        // the AIX case study: searches through six cooperating processes, 5 ms of CPU each.
        "pipeline" => ("pipeline", "unix", 5.0, 100.0, opts.arrivals),
        // The DESIGN.md experiment.
        _ => (
            "synthetic",
            if opts.unix { "unix" } else { "tcp" },
            5.0,
            40.0,
            opts.arrivals,
        ),
    };
    Synthetic {
        server: server.into(),
        transport: transport.into(),
        cpu_ms,
        rate_per_s,
        arrivals,
        batch: opts.batch,
        measure_s: opts.seconds.unwrap_or(if opts.quick { 5.0 } else { 30.0 }),
        warmup_s: 1.0,
        rounds: opts.repeat.max(1),
    }
}

pub(crate) fn run_latency(opts: &Options) -> Result<Vec<ScenarioResult>> {
    if opts.batch == Batch::Compile {
        if let Some(missing) = ["make", "gcc"].into_iter().find(|p| !on_path(p)) {
            bail!("the compile load needs {missing}, which is not installed: apt-get install {missing}");
        }
    }
    let params = scenario_params(opts);
    let engine = match opts.batch {
        Batch::Docker => {
            let dir =
                std::env::temp_dir().join(format!("appease-bench-docker-{}", std::process::id()));
            eprintln!(
                "starting a Docker engine of the bench's own in {}",
                dir.display()
            );
            Some(docker::Engine::start(&dir)?)
        }
        _ => None,
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (modes, not_run) = opts.runnable_modes();
    let mut out = Vec::new();
    for &load in &opts.loads {
        let soakers = (load * cpus as f64).round() as usize;
        // Rounds interleave the modes, so slow drifts of a shared machine hit all alike,
        // and each round starts one mode later, so no mode always runs in the same place
        // (a compile's late requests were about 10 % more frequent in the second of two
        // places whichever mode ran there, over ten alternated invocations).
        let rounds = opts.repeat.max(1);
        let mut runs: Vec<Vec<ModeResult>> = vec![Vec::new(); modes.len()];
        'rounds: for round in 0..rounds {
            for (place, i) in rotated(modes.len(), round).enumerate() {
                let mode = modes[i];
                if opts.stop.load(Ordering::Relaxed) {
                    break 'rounds;
                }
                let n = if mode == Mode::Unloaded { 0 } else { soakers };
                eprintln!(
                    "[round {}/{rounds}, {}/{}] {} with {}, {} s ...",
                    round + 1,
                    place + 1,
                    modes.len(),
                    mode.name(),
                    params.batch.describe(n, if n == 0 { 0.0 } else { load }),
                    params.measure_s
                );
                // Dirty pages left by what ran before (another mode, a test that wrote a
                // disk image) are written back now, not in this mode's measured window.
                // SAFETY: sync(2) takes no arguments and cannot fail.
                unsafe { libc::sync() };
                let r = run_mode(opts, &params, mode, soakers, engine.as_ref())?;
                eprintln!(
                    "    mean {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms{}; batch {:.1} {}/s on {:.2} CPUs{}",
                    r.latency_ms.mean,
                    r.latency_ms.p95,
                    r.latency_ms.p99,
                    r.latency_ms.max,
                    r.late.map_or(String::new(), |n| match r.late_for_cpu_loss {
                        Some(l) if l > 0 => {
                            format!(", {n} waited ≥ 1 ms ({l} of them for time lost on CPU)")
                        }
                        _ => format!(", {n} waited ≥ 1 ms"),
                    }),
                    r.batch_throughput,
                    params.batch.unit(),
                    r.batch_cpus,
                    r.batch_jain
                        .map_or(String::new(), |j| format!(", Jain {j:.4} over the jobs"))
                );
                runs[i].push(r);
            }
        }
        let results: Vec<ModeResult> = runs
            .iter()
            .filter(|r| !r.is_empty())
            .map(|r| report::median(r))
            .collect();
        if results.is_empty() && !modes.is_empty() {
            break; // Ctrl-C before this level measured anything: report the levels done
        }
        out.push(ScenarioResult {
            scenario: opts.scenario.clone(),
            cpus,
            load_per_cpu: load,
            soakers,
            params: params.clone(),
            modes: results,
            not_run: not_run.clone(),
        });
    }
    Ok(out)
}

/// Everything one run started; ended (by pid) and undone when dropped, on every path.
#[derive(Default)]
pub(crate) struct Run {
    pub(crate) children: Vec<Child>,
    /// Servers that must stop on their own terms (nginx stops its workers on SIGTERM).
    graceful: Vec<Child>,
    daemon: Option<Child>,
    /// A peer daemon's mode: stopped, and what it changed put back, last.
    pub(crate) peer: Option<peer::PeerRun>,
    /// Removed in this order once the processes are gone.
    pub(crate) cgroups: Vec<(appease_cgroup::Cgroups, String)>,
    tmp: Option<PathBuf>,
}

impl Drop for Run {
    fn drop(&mut self) {
        let peer = self.peer.take();
        if let Some(mut d) = self.daemon.take() {
            // SAFETY: signalling our own child; it restores everything it changed.
            unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
            let _exit_status_logged_by_daemon = d.wait();
        }
        // Only those still running: a reaped child's pid may belong to someone else now.
        for c in &mut self.graceful {
            if matches!(c.try_wait(), Ok(None)) {
                // SAFETY: signalling our own running child.
                unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            }
        }
        for c in &mut self.graceful {
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(5) && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _already_gone = c.kill();
            let _reaped = c.wait();
        }
        // A compile load's make and gcc first: orphaned, they would keep running and
        // keep the bench's cgroup busy. One walk of /proc for all children.
        let roots: Vec<u32> = self.children.iter().map(|c| c.id()).collect();
        for pid in descendants(&roots) {
            // SAFETY: processes our own children started, ended with the run.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        for c in &mut self.children {
            let _already_gone = c.kill();
            let _reaped = c.wait();
        }
        for (cg, group) in self.cgroups.drain(..) {
            // Killed compilers leave the group only once they are reaped (by init,
            // their parent gone): until then removal fails as busy.
            let mut result = cg.remove(&group);
            let t = Instant::now();
            while result.is_err() && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(20));
                result = cg.remove(&group);
            }
            if let Err(e) = result {
                tracing::warn!(error = %e, "could not remove the bench's cgroup {group}");
            }
        }
        // After the run's processes are gone: the peer's cgroups are empty by then.
        if let Some(p) = peer {
            let name = p.peer.name();
            for failed in p.stop_and_restore() {
                tracing::warn!("could not put back what {name} changed: {failed}");
            }
        }
        if let Some(dir) = self.tmp.take() {
            // APPEASE_BENCH_KEEP=1 keeps the daemon's log and config for a look.
            if std::env::var_os("APPEASE_BENCH_KEEP").is_none() {
                let _best_effort = std::fs::remove_dir_all(dir);
            } else {
                eprintln!("    kept {}", dir.display());
            }
        }
    }
}

/// CPU time of the processes `roots` and everything below them, with what their reaped
/// children used (a build's compilers come and go), ns.
pub(crate) fn tree_cpu_ns(roots: &[u32]) -> u64 {
    let mut pids = roots.to_vec();
    pids.extend(crate::descendants(roots));
    let ticks: u64 = pids
        .iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .filter_map(|t| appease_cgroup::ProcStat::parse(&t))
        .map(|s| s.cpu_ticks)
        .sum();
    ticks * appease_cgroup::clock_tick_ns()
}

/// Every process below `roots`, parents before children (so none can fork anew once
/// its parent is gone).
pub(crate) fn descendants(roots: &[u32]) -> Vec<u32> {
    let mut pairs = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        if let Some(ppid) = appease_cgroup::stat_ppid(&stat) {
            pairs.push((pid, ppid));
        }
    }
    appease_policy::tree::Children::new(pairs).below(roots)
}

pub(crate) fn spawn_worker(appease: &Path, args: &[&str]) -> Result<Child> {
    worker_command(appease, args, Stdio::inherit())
}

fn worker_command(appease: &Path, args: &[&str], stderr: Stdio) -> Result<Child> {
    Command::new(appease)
        .arg("bench-worker")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("starting {} bench-worker", appease.display()))
}

/// CPU time of a process's live threads, ns (0 once it is gone).
pub(crate) fn process_cpu_ns(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.filter_map(|e| {
        let text = std::fs::read_to_string(e.ok()?.path().join("schedstat")).ok()?;
        text.split_whitespace().next()?.parse::<u64>().ok()
    })
    .sum()
}

/// Busy and total jiffies from the first line of /proc/stat.
pub(crate) fn cpu_jiffies() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = text
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

fn run_mode(
    opts: &Options,
    p: &Synthetic,
    mode: Mode,
    soakers: usize,
    engine: Option<&docker::Engine>,
) -> Result<ModeResult> {
    let mut run = Run::default();
    let tmp = std::env::temp_dir().join(format!("appease-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    run.tmp = Some(tmp.clone());

    start_peer(&mut run, opts, mode, &tmp)?;
    let load = start_server(&mut run, opts, p, &tmp)?;

    // The batch load.
    let n = if mode == Mode::Unloaded { 0 } else { soakers };
    let mut soak_pids = Vec::new();
    let mut containers = Vec::new();
    match p.batch {
        Batch::Soak | Batch::Mixed => soak_pids = spawn_soakers(&mut run, opts, p.batch, n)?,
        Batch::Compile | Batch::Script if n > 0 => {
            let src = tmp.join("src").display().to_string();
            let jobs = n.to_string();
            let args = match p.batch {
                Batch::Compile => vec!["bench-worker", "compile", "--dir", &src, "--jobs", &jobs],
                _ => vec!["bench-worker", "script", "--jobs", &jobs],
            };
            let mut c = Command::new(&opts.appease)
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .context("starting the compile load")?;
            soak_pids.push(c.id());
            let go = c.stdin.take().expect("piped");
            run.children.push(c);
            apply_mode(&mut run, opts, mode, &soak_pids, &tmp)?;
            // Now every make and gcc it forks inherits the mode.
            std::io::Write::write_all(&mut &go, b"go\n").context("starting the compile")?;
        }
        Batch::Compile | Batch::Script => {}
        Batch::Docker => {
            let engine = engine.context("the docker load needs the bench's engine")?;
            let bin = opts.appease.canonicalize()?;
            let mount = format!("{}:/appease:ro", bin.display());
            for _ in 0..n {
                let c = engine.run(&["-v", &mount], &["/appease", "bench-worker", "soak"])?;
                soak_pids.push(c.pid);
                containers.push(c);
            }
        }
    }
    let soak_start = Instant::now();
    if !matches!(p.batch, Batch::Compile | Batch::Script) || n == 0 {
        apply_mode(&mut run, opts, mode, &soak_pids, &tmp)?;
    }

    warm_up(opts, p, mode, &load, &soak_pids)?;

    let jobs_cpu0: Vec<u64> = soak_pids.iter().map(|&p| process_cpu_ns(p)).collect();
    let (busy0, total0) = cpu_jiffies();
    let result = load.run(
        p,
        Duration::from_secs_f64(p.measure_s),
        Duration::from_secs(3),
        &opts.stop,
    )?;
    let (busy1, total1) = cpu_jiffies();
    // Each job's CPU over the measurement, while the server received requests.
    let jobs_cpu: Vec<f64> = soak_pids
        .iter()
        .zip(&jobs_cpu0)
        .map(|(&p, &b)| process_cpu_ns(p).saturating_sub(b) as f64 / 1e9)
        .collect();
    let util = 100.0 * (busy1 - busy0) as f64 / (total1 - total0).max(1) as f64;

    // the 2010 customer-appeasement paper's web test: the whole site with wget -r, under the same batch load.
    let download_s = match &load {
        Load::OpenLoop(client::Target::Tcp(addr), _)
            if p.server == "nginx" && !opts.stop.load(Ordering::Relaxed) =>
        {
            let into = tmp.join("download");
            let mut total = Duration::ZERO;
            let mut done = 0;
            while done < DOWNLOADS {
                let Some(took) = web::download_tree(*addr, &into, &opts.stop)? else {
                    break; // Ctrl-C
                };
                total += took;
                done += 1;
            }
            (done > 0).then(|| total.as_secs_f64() / done as f64)
        }
        _ => None,
    };

    // Soakers report their work on SIGTERM: "UNITS CPU_NS".
    let soak_time = soak_start.elapsed().as_secs_f64();
    let mut reports = Vec::new();
    for c in run
        .children
        .iter_mut()
        .filter(|c| soak_pids.contains(&c.id()))
    {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let mut s = String::new();
        if let Some(out) = c.stdout.as_mut() {
            let _partial_ok = out.read_to_string(&mut s);
        }
        reports.push(s);
        let _reaped = c.wait();
    }
    if let Some(engine) = engine {
        for c in &containers {
            // SAFETY: the first process of a container this run started.
            unsafe { libc::kill(c.pid as i32, libc::SIGTERM) };
        }
        for c in &containers {
            reports.push(engine.output(c)?);
            engine.remove(c)?;
        }
    }
    let (mut units, mut cpu_ns) = (0u64, 0u64);
    for s in reports {
        let mut fields = s.split_whitespace().map(|f| f.parse::<u64>().unwrap_or(0));
        units += fields.next().unwrap_or(0);
        cpu_ns += fields.next().unwrap_or(0);
    }
    let mut m = ModeResult::new(mode, &result, units as f64 / soak_time, util);
    m.batch_cpus = cpu_ns as f64 / 1e9 / soak_time;
    if matches!(p.batch, Batch::Soak | Batch::Mixed | Batch::Docker) && jobs_cpu.len() > 1 {
        m.batch_jain = Some(utilization::jain(&jobs_cpu));
    }
    m.download_s = download_s;
    m.peer = run.peer.as_mut().map(peer::PeerRun::report);
    if p.server == "player" {
        m.frames = Some(report::Frames::new(&result, p.rate_per_s));
    }
    Ok(m)
}

/// The scenario's server, started for `run`, and what sends it requests.
fn start_server(run: &mut Run, opts: &Options, p: &Synthetic, tmp: &Path) -> Result<Load> {
    Ok(match p.server.as_str() {
        "nginx" => {
            let (target, protocol) = web::start(run, tmp, opts.port)?;
            Load::OpenLoop(target, protocol)
        }
        "postgresql" => Load::Pgbench(db::start(run, tmp, opts.max_clients())?),
        "postgresql-analytic" => {
            let pg = db::start(run, tmp, opts.max_clients())?;
            pg.start_analytic(run, tmp)?;
            Load::Pgbench(pg)
        }
        "pipeline" => Load::OpenLoop(
            pipeline::start(run, opts, p.cpu_ms, tmp)?,
            client::Protocol::Synthetic,
        ),
        _ => Load::OpenLoop(
            start_synthetic(run, opts, p, tmp)?,
            client::Protocol::Synthetic,
        ),
    })
}

/// A peer daemon's mode: the peer, started before the server and the batch load, as on a
/// host where it is always running.
fn start_peer(run: &mut Run, opts: &Options, mode: Mode, tmp: &Path) -> Result<()> {
    if let Some(p) = mode.peer() {
        let located = peer::locate(p, &opts.peer_bins).map_err(anyhow::Error::msg)?;
        run.peer = Some(peer::start(&located, tmp)?);
    }
    Ok(())
}

/// `n` soaker jobs (one thread each, or 1, 2 and 4 in turn for the mixed load), ended
/// with `run`; their pids.
fn spawn_soakers(run: &mut Run, opts: &Options, batch: Batch, n: usize) -> Result<Vec<u32>> {
    let mut pids = Vec::new();
    for i in 0..n {
        let threads = match batch {
            Batch::Mixed => MIXED_SIZES[i % MIXED_SIZES.len()],
            _ => 1,
        }
        .to_string();
        let c = spawn_worker(&opts.appease, &["soak", "--threads", &threads])?;
        pids.push(c.id());
        run.children.push(c);
    }
    Ok(pids)
}

/// Warm-up with traffic flowing, as on a real host: the daemon sees a server that
/// answers requests. For `appease`, until it has demoted the soakers.
fn warm_up(
    opts: &Options,
    p: &Synthetic,
    mode: Mode,
    load: &Load,
    soak_pids: &[u32],
) -> Result<()> {
    let warm_stop = Arc::new(AtomicBool::new(false));
    let warm = {
        let (stop, load, p) = (warm_stop.clone(), load.clone(), p.clone());
        std::thread::spawn(move || load.run(&p, Duration::from_secs(3600), Duration::ZERO, &stop))
    };
    let settle = Instant::now();
    // A peer acts on what its scan finds: long enough for it to have seen the batch.
    let wait = mode.peer().map_or(p.warmup_s, |peer| {
        peer.settle().as_secs_f64().max(p.warmup_s)
    });
    if mode.peer().is_some() {
        eprintln!("    {wait:.0} s for {} to see the batch load", mode.name());
    }
    std::thread::sleep(Duration::from_secs_f64(wait));
    if mode == Mode::Appease && !soak_pids.is_empty() {
        let group = opts.batch_group();
        let waited = wait_until(Duration::from_secs(30), || {
            opts.stop.load(Ordering::Relaxed) || soak_pids.iter().all(|&p| demoted(&group, p))
        });
        warm_stop.store(true, Ordering::Relaxed);
        let _warmup_latencies_unused = warm.join();
        waited.context("the daemon did not demote the soakers within 30 s")?;
        eprintln!(
            "    soakers demoted by the daemon {:.1} s after they started",
            settle.elapsed().as_secs_f64()
        );
    } else {
        warm_stop.store(true, Ordering::Relaxed);
        let _warmup_latencies_unused = warm.join();
    }
    Ok(())
}

/// Whether the daemon has put `pid` in the idle class: moved into its group (`group`, as
/// /proc/PID/cgroup names it), its own group made idle in place (a container), or the
/// process itself SCHED_IDLE.
fn demoted(group: &str, pid: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return false;
    };
    if text.contains(group) {
        return true;
    }
    let in_idle_group = appease_cgroup::Cgroups::detect().is_ok_and(|cg| {
        appease_cgroup::parse_proc_cgroup(&text, cg.version())
            .is_some_and(|g| cg.idle(&g).unwrap_or(false))
    });
    // SAFETY: sched_getscheduler only reads.
    in_idle_group || unsafe { libc::sched_getscheduler(pid as i32) } == libc::SCHED_IDLE
}

/// Whole-tree downloads per mode (the 2010 customer-appeasement paper averaged three).
const DOWNLOADS: u32 = 3;

/// What sends the server its requests.
#[derive(Clone)]
enum Load {
    /// Our open-loop client, to the synthetic server or nginx.
    OpenLoop(client::Target, client::Protocol),
    /// pgbench, to PostgreSQL.
    Pgbench(db::Postgres),
}

impl Load {
    /// Sends requests for `duration` (or until `stop`); waits up to `drain` for answers.
    fn run(
        &self,
        p: &Synthetic,
        duration: Duration,
        drain: Duration,
        stop: &Arc<AtomicBool>,
    ) -> Result<client::ClientResult> {
        match self {
            Load::OpenLoop(target, protocol) => client::open_loop(
                target,
                protocol,
                p.arrivals,
                p.rate_per_s,
                duration,
                drain,
                stop,
            ),
            Load::Pgbench(pg) => pg.run(p.rate_per_s, duration, stop),
        }
    }
}

fn apply_mode(
    run: &mut Run,
    opts: &Options,
    mode: Mode,
    soakers: &[u32],
    tmp: &Path,
) -> Result<()> {
    match mode {
        Mode::Unloaded | Mode::Unmanaged => {}
        Mode::BatchNice19 => {
            for &pid in soakers {
                // SAFETY: changing our own children's priority; they end with the run.
                if unsafe { libc::setpriority(libc::PRIO_PROCESS, pid, 19) } != 0 {
                    bail!(
                        "setpriority({pid}, 19): {}",
                        std::io::Error::last_os_error()
                    );
                }
            }
        }
        Mode::BatchSchedIdle => make_sched_idle(soakers)?,
        Mode::BatchCgroupIdle => into_idle_group(run, soakers)?,
        // Started before the batch load (start_peer).
        Mode::Ananicy | Mode::System76Scheduler => {}
        Mode::BatchGroupIdle | Mode::BatchBranchIdle => {
            bail!("mode {} applies to the nested scenario only", mode.name())
        }
        Mode::RbpeClassic | Mode::Appease => {
            let cfg = tmp.join("daemon.toml");
            let text = match (&opts.config, mode) {
                (_, Mode::RbpeClassic) => appease_config_rbpe(),
                (Some(path), _) => std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?,
                (None, _) => String::new(),
            };
            std::fs::write(&cfg, text)?;
            start_daemon(run, opts, &cfg)?;
        }
    }
    Ok(())
}

/// The synthetic server (`appease bench-worker server`), on TCP loopback or a UNIX socket.
fn start_synthetic(
    run: &mut Run,
    opts: &Options,
    p: &Synthetic,
    tmp: &Path,
) -> Result<client::Target> {
    let cpu_arg = p.cpu_ms.to_string();
    let sock = tmp.join("server.sock");
    let _stale = std::fs::remove_file(&sock);
    let sock_arg = sock.display().to_string();
    let unix = p.transport == "unix";
    let port_arg = opts.port.unwrap_or(0).to_string();
    let mut args = vec!["server", "--cpu-ms", &cpu_arg];
    if unix {
        args.extend(["--unix", &sock_arg]);
    } else {
        args.extend(["--port", &port_arg]);
    }
    let line = spawn_server(run, opts, &args)?;
    if unix {
        return Ok(client::Target::Unix(sock));
    }
    let port: u16 = line
        .trim()
        .parse()
        .context("the server did not report its port")?;
    Ok(client::Target::Tcp(([127, 0, 0, 1], port).into()))
}

/// Starts `appease bench-worker ARGS` (a server) and returns the line where it says it
/// listens, which it prints once it accepts connections.
pub(crate) fn spawn_server(run: &mut Run, opts: &Options, args: &[&str]) -> Result<String> {
    let mut server = worker_command(&opts.appease, args, Stdio::piped())?;
    let mut line = String::new();
    let read = BufReader::new(server.stdout.as_mut().expect("piped")).read_line(&mut line);
    let mut stderr = server.stderr.take().expect("piped");
    run.children.push(server);
    if read.is_err() || line.is_empty() {
        // It closed its stdout by exiting: its own last words say why.
        let mut said = String::new();
        drop(stderr.read_to_string(&mut said));
        let why = said.lines().last().unwrap_or("it exited without a message");
        bail!(
            "the server `{}` did not start: {}",
            args.join(" "),
            why.trim_start_matches("appease: error: ")
        );
    }
    // Anything it says later goes where ours goes.
    std::thread::spawn(move || drop(std::io::copy(&mut stderr, &mut std::io::stderr())));
    Ok(line.trim().to_string())
}

/// Starts `appease daemon --config CFG` for a run (ended with the run) and waits until
/// it reports itself running.
pub(crate) fn start_daemon(run: &mut Run, opts: &Options, cfg: &Path) -> Result<()> {
    let tmp = std::env::temp_dir().join(format!("appease-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    if run.tmp.is_none() {
        run.tmp = Some(tmp.clone());
    }
    let run_dir = tmp.join("run");
    let log = std::fs::File::create(tmp.join("daemon.log"))?;
    let child = Command::new(&opts.appease)
        .args(["daemon", "--log", "debug", "--config"])
        .arg(cfg)
        .env("APPEASE_RUN_DIR", &run_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting appease daemon")?;
    let pid = child.id();
    run.daemon = Some(child);
    // Up once its control socket answers with its state.
    wait_until(Duration::from_secs(10), || {
        Command::new(&opts.appease)
            .args(["status", "--json"])
            .env("APPEASE_RUN_DIR", &run_dir)
            .stderr(Stdio::null())
            .output()
            .is_ok_and(|o| {
                o.status.success()
                    && String::from_utf8_lossy(&o.stdout).contains(&format!("\"pid\": {pid},"))
            })
    })
    .with_context(|| {
        format!(
            "the daemon did not start; see {}",
            tmp.join("daemon.log").display()
        )
    })
}

/// Our own children (the soakers) to SCHED_IDLE; they end with the run.
pub(crate) fn make_sched_idle(pids: &[u32]) -> Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    for &pid in pids {
        // SAFETY: our own children, ended with the run.
        if unsafe { libc::sched_setscheduler(pid as i32, libc::SCHED_IDLE, &param) } != 0 {
            bail!("SCHED_IDLE for {pid}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A top-level group of the bench's, `appease-bench-PID.SUFFIX`, removed with the run.
pub(crate) fn bench_top_group(
    run: &mut Run,
    suffix: &str,
    idle: bool,
) -> Result<(appease_cgroup::Cgroups, String)> {
    let cg = appease_cgroup::Cgroups::detect()?;
    let name = format!("appease-bench-{}.{suffix}", std::process::id());
    let group = cg.ensure_top_group(&name, idle, 100)?;
    run.cgroups.push((cg.clone(), group.clone()));
    Ok((cg, group))
}

/// Our own children into a top-level idle group of the bench's, removed with the run.
pub(crate) fn into_idle_group(run: &mut Run, pids: &[u32]) -> Result<()> {
    let (cg, group) = bench_top_group(run, "idle", true)?;
    for &pid in pids {
        cg.move_process(pid, &group)?;
    }
    Ok(())
}

fn appease_config_rbpe() -> String {
    include_str!("../../../config/rbpe-classic.toml").to_string()
}

pub(crate) fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    let t = Instant::now();
    while t.elapsed() < timeout {
        if f() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("timed out after {timeout:?}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_round_runs_every_mode_once_and_each_mode_takes_every_place() {
        let rounds: Vec<Vec<usize>> = (0..4).map(|r| super::rotated(4, r).collect()).collect();
        assert_eq!(rounds[0], [0, 1, 2, 3]);
        assert_eq!(rounds[1], [1, 2, 3, 0]);
        for round in &rounds {
            let mut sorted = round.clone();
            sorted.sort();
            assert_eq!(sorted, [0, 1, 2, 3]);
        }
        for place in 0..4 {
            let mut at: Vec<usize> = rounds.iter().map(|r| r[place]).collect();
            at.sort();
            assert_eq!(at, [0, 1, 2, 3], "place {place}");
        }
    }
}
