//! `appease bench nested`: the shapes of the hosts most people run (a server in a service
//! unit, batch in a user's session scope), built by hand in the `cpu` hierarchy with real
//! CPUs, and the server measured beside the batch under every way of making it yield.
//!
//! On such a host the kernel chooses between the server and the batch where their
//! branches of the cgroup tree meet (the root, between `system.slice` and `user.slice`),
//! so what is done inside the batch's own group may not reach the server at all.
//! Every shape gets its own top-level groups named after the bench (`appease-bench-PID.
//! system.slice`, …), so the meeting point is the root as on a systemd host, and nothing
//! of the host's is touched; they are removed with the run.

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use appease_cgroup::Cgroups;
use serde::{Deserialize, Serialize};

use crate::rounds::{interleaved, CaseTable, Cases, Measured};
use crate::{Mode, Options, Run};

mod container;
mod servers;
mod units;

pub use servers::Server;
use servers::{measure, start_server, Target};
pub(crate) use units::QuotaReset;

/// A host layout built by hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// systemd's: the server in `system.slice/server.service`, its client in
    /// `system.slice/client.service`, soakers and a sleeping shell in
    /// `user.slice/user-0.slice/session-1.scope`.
    Systemd,
    /// A login session running an interactive shell and a parallel build (`make -j`)
    /// in `user.slice/user-0.slice/session-1.scope`, beside the service.
    Session,
    /// A cron-like service that runs its job in its own unit: `system.slice/cron.service`
    /// holds the sleeping daemon and a job (a shell waiting on CPU-bound workers), beside
    /// the server in `system.slice/server.service`.
    Cron,
    /// A Docker container running a server and a build (`make -j`) together, in the
    /// engine's `/docker/ID`, beside the server on the host.
    Container,
}

/// A layout, and whether a limit keeps the batch in its group (a CPU quota of 1.9 CPUs
/// on `user.slice`, `cron.service` or the container): appease then demotes it in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub layout: Layout,
    pub limited: bool,
}

impl Shape {
    pub const ALL: [Shape; 8] = [
        Shape {
            layout: Layout::Systemd,
            limited: false,
        },
        Shape {
            layout: Layout::Systemd,
            limited: true,
        },
        Shape {
            layout: Layout::Session,
            limited: false,
        },
        Shape {
            layout: Layout::Session,
            limited: true,
        },
        Shape {
            layout: Layout::Cron,
            limited: false,
        },
        Shape {
            layout: Layout::Cron,
            limited: true,
        },
        Shape {
            layout: Layout::Container,
            limited: false,
        },
        Shape {
            layout: Layout::Container,
            limited: true,
        },
    ];

    pub fn name(self) -> String {
        let base = match self.layout {
            Layout::Systemd => "systemd",
            Layout::Session => "session",
            Layout::Cron => "cron",
            Layout::Container => "container",
        };
        if self.limited {
            format!("{base}-limited")
        } else {
            base.to_string()
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Shape::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .with_context(|| {
                let names: Vec<String> = Shape::ALL.iter().map(|x| x.name()).collect();
                format!("unknown shape {s:?}; shapes are {}", names.join(", "))
            })
    }

    fn describe(self) -> String {
        let (what, limit) = match self.layout {
            Layout::Systemd => (
                "server in system.slice/server.service, soakers and a sleeping shell in \
                 user.slice/user-0.slice/session-1.scope",
                "user.slice",
            ),
            Layout::Session => (
                "server in system.slice/server.service, a sleeping shell and make -j with gcc in \
                 user.slice/user-0.slice/session-1.scope",
                "user.slice",
            ),
            Layout::Cron => (
                "server in system.slice/server.service, a sleeping cron daemon and its job (a shell \
                 waiting on CPU-bound workers) in system.slice/cron.service",
                "cron.service",
            ),
            Layout::Container => (
                "server in system.slice/server.service, a Docker container (/docker/ID) running a \
                 server (1 ms of CPU per request, 20 requests/s) and make -j with gcc",
                "the container",
            ),
        };
        if self.limited {
            format!("{what}; {limit} under a CPU quota of 1.9 CPUs")
        } else {
            format!("{what}; no limit")
        }
    }

    /// What its batch is, in words, for `n` jobs.
    fn batch(self, n: usize) -> String {
        match self.layout {
            Layout::Systemd => format!("{n} soakers"),
            Layout::Session => format!(
                "make -j{n} over {} C files, in a loop",
                crate::worker::FILES
            ),
            Layout::Cron => format!("a job shell with {n} CPU-bound workers"),
            Layout::Container => format!(
                "make -j{n} over {} C files in a loop, in the container",
                crate::worker::FILES
            ),
        }
    }
}

/// The quota of a limited shape's `user.slice` or `cron.service` (of a 100 ms period).
const LIMIT_QUOTA_US: u64 = 190_000;

/// The modes the nested scenario runs unless told otherwise.
pub const MODES: [Mode; 6] = [
    Mode::Unloaded,
    Mode::Unmanaged,
    Mode::BatchGroupIdle,
    Mode::BatchBranchIdle,
    Mode::BatchCgroupIdle,
    Mode::Appease,
];

/// One mode in one round.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Round {
    /// The batch's CPUs are its work here.
    #[serde(flatten)]
    pub measured: Measured,
    pub requests_per_s: f64,
    pub slow: bool,
}

/// One mode over every round.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModeSummary {
    pub mode: Mode,
    #[serde(flatten)]
    pub median: Measured,
    pub requests_per_s: f64,
    pub slow_rounds: usize,
    /// The batch's CPU against unmanaged's, percent (when unmanaged ran).
    pub batch_pct: Option<f64>,
    pub rounds: Vec<Round>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Case {
    pub shape: String,
    pub description: String,
    pub batch: String,
    pub server: Server,
    /// Batch jobs: soakers, make's -j, or the script's children at a time.
    pub jobs: usize,
    pub measure_s: f64,
    pub modes: Vec<ModeSummary>,
}

pub type NestedResult = Cases<Case>;

impl CaseTable for Case {
    fn table(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "nested, shape {}: {}\nserver: {}; batch: {}; {} rounds of {} s, modes interleaved\n",
            self.shape,
            self.description,
            self.server.describe(),
            self.batch,
            self.modes.first().map_or(0, |m| m.rounds.len()),
            self.measure_s
        ));
        out.push_str(&format!(
            "{:<22}{} {:>7} {:>11} {:>12} {:>8}\n",
            "mode",
            Measured::LATENCY_HEADINGS,
            "slow",
            "requests/s",
            "batch CPUs",
            "batch %"
        ));
        for m in &self.modes {
            out.push_str(&format!(
                "{:<22}{} {:>7} {:>11.0} {:>12.2} {:>8}\n",
                m.mode.name(),
                m.median.latency_columns(),
                format!("{}/{}", m.slow_rounds, m.rounds.len()),
                m.requests_per_s,
                m.median.batch_cpus,
                m.batch_pct.map_or("-".to_string(), |p| format!("{p:.1}"))
            ));
        }
        out.push_str(&format!(
            "(medians over the rounds; a round is slow when its p99 is above {:.1} ms)\n\n",
            self.server.slow_above_ms()
        ));
        out
    }
}

fn summarise(mode: Mode, rounds: Vec<Round>) -> ModeSummary {
    ModeSummary {
        mode,
        median: Measured::median(rounds.iter().map(|r| &r.measured)),
        requests_per_s: crate::report::median_of(rounds.iter().map(|r| r.requests_per_s).collect()),
        slow_rounds: rounds.iter().filter(|r| r.slow).count(),
        batch_pct: None,
        rounds,
    }
}

/// The shape's groups for one run, created under the bench's own top-level names.
pub(super) struct Groups {
    pub(super) cg: Cgroups,
    pub(super) server: String,
    pub(super) client: String,
    /// The batch's own group (the session scope, the container's group).
    pub(super) batch: String,
    /// Where the batch's branch meets the server's: the top-level `user.slice`, or
    /// `cron.service` beside `server.service` (none for the container, whose server is
    /// in the batch's own group).
    pub(super) branch: String,
    /// Hierarchies besides `cpu` whose same group a process joins with it: systemd's own
    /// where the groups are its units.
    pub(super) also: Vec<PathBuf>,
}

impl Groups {
    fn build(run: &mut Run, shape: Shape) -> Result<Self> {
        if units::wanted() {
            return units::build(run, shape);
        }
        let cg = Cgroups::detect()?;
        let p = format!("appease-bench-{}", std::process::id());
        let system = cg.ensure_top_group(&format!("{p}.system.slice"), false, 100)?;
        let server = cg.ensure_child_group(&system, "server.service", 100)?;
        let client = cg.ensure_child_group(&system, "client.service", 100)?;
        // Removed in this order, once the processes are gone: deepest first.
        let mut made = vec![server.clone(), client.clone()];
        let (batch, branch) = match shape.layout {
            Layout::Systemd | Layout::Session => {
                let user = cg.ensure_top_group(&format!("{p}.user.slice"), false, 100)?;
                let user0 = cg.ensure_child_group(&user, "user-0.slice", 100)?;
                let scope = cg.ensure_child_group(&user0, "session-1.scope", 100)?;
                made.extend([scope.clone(), user0, user.clone()]);
                (scope, user)
            }
            Layout::Cron => {
                let cron = cg.ensure_child_group(&system, "cron.service", 100)?;
                made.push(cron.clone());
                (cron.clone(), cron)
            }
            // The engine makes the container's group when it starts it (with its quota).
            Layout::Container => (String::new(), String::new()),
        };
        made.push(system);
        for g in made {
            run.cgroups.push((cg.clone(), g));
        }
        if shape.limited && shape.layout != Layout::Container {
            cg.set_cpu_quota(&branch, Some(LIMIT_QUOTA_US))?;
        }
        Ok(Groups::new(cg, [server, client, batch, branch], Vec::new()))
    }

    /// The groups of the server, its client, the batch and the batch's branch.
    pub(super) fn new(cg: Cgroups, names: [String; 4], also: Vec<PathBuf>) -> Self {
        let [server, client, batch, branch] = names;
        Groups {
            cg,
            server,
            client,
            batch,
            branch,
            also,
        }
    }
}

/// Starts `cmd` inside `group` of `cg`: the child enters it before it runs, so every
/// thread and child it makes is born there.
pub fn spawn_in_group(cg: &Cgroups, group: &str, cmd: &mut Command) -> Result<Child> {
    spawn_in_groups(&[cg.root()], group, cmd)
}

/// Starts `cmd` inside `group` of every hierarchy mounted at `roots`, entered in order
/// before it runs.
fn spawn_in_groups(roots: &[&Path], group: &str, cmd: &mut Command) -> Result<Child> {
    let procs = roots
        .iter()
        .map(|r| {
            let path = r.join(group.trim_start_matches('/')).join("cgroup.procs");
            CString::new(path.into_os_string().into_encoded_bytes())
        })
        .collect::<Result<Vec<_>, _>>()?;
    // SAFETY: between fork and exec the child only makes async-signal-safe syscalls
    // (open, write, close) on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            for p in &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if !ok {
                    return Err(err);
                }
            }
            Ok(())
        });
    }
    cmd.spawn()
        .with_context(|| format!("starting {:?} in {group}", cmd.get_program()))
}

/// Starts `f` on a thread of its own in the shape's `client.service`, where the threads it
/// starts are born too: the bench's own clients then meet the servers where a client unit
/// would, not in the bench's group. The thread enters by its id through v1's `tasks`; cgroup
/// v2 moves a thread alone only within a threaded subtree, so there it stays (said once).
pub(super) fn spawn_client<T: Send + 'static>(
    g: &Groups,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> JoinHandle<Result<T>> {
    let tasks = (g.cg.version() == appease_cgroup::Version::V1).then(|| {
        g.cg.root()
            .join(g.client.trim_start_matches('/'))
            .join("tasks")
    });
    if tasks.is_none() {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            eprintln!("note: on cgroup v2 the bench's own client threads stay in its group")
        });
    }
    std::thread::spawn(move || {
        if let Some(tasks) = tasks {
            // SAFETY: a plain syscall returning the calling thread's id.
            let tid = unsafe { libc::gettid() };
            std::fs::write(&tasks, tid.to_string())
                .with_context(|| format!("moving the client's thread to {}", tasks.display()))?;
        }
        f()
    })
}

pub(super) fn spawn_in(g: &Groups, group: &str, cmd: &mut Command) -> Result<Child> {
    let mut roots = vec![g.cg.root()];
    roots.extend(g.also.iter().map(PathBuf::as_path));
    spawn_in_groups(&roots, group, cmd)
}

/// What the scenario needs of the host and of its options, each refused with its reason.
fn check(opts: &Options) -> Result<()> {
    if units::wanted() && opts.shapes.iter().any(|s| s.layout == Layout::Container) {
        bail!("under systemd the nested scenario's container shapes are not built (run them on a host without systemd)");
    }
    if units::wanted() && opts.servers.contains(&Server::Postgres) {
        bail!(
            "under systemd the nested scenario measures the synthetic and redis servers (PostgreSQL \
             runs as its own account, which cannot join a unit of the bench's)"
        );
    }
    if appease_cgroup::HostLayout::detect().kind == appease_cgroup::LayoutKind::CgroupV2Systemd {
        bail!(
            "the nested scenario builds its shapes in the cpu hierarchy itself; on this host systemd \
             owns the cgroup tree (cgroup v2 under systemd): run it where the cpu controller is on \
             cgroup v1 or on v2 without a service manager"
        );
    }
    if opts.servers.contains(&Server::Redis) {
        for p in ["redis-server", "redis-benchmark", "redis-cli"] {
            if !crate::on_path(p) {
                bail!("the redis server needs {p}, which is not installed: apt-get install redis-server redis-tools");
            }
        }
    }
    for &m in &opts.modes {
        if !MODES.contains(&m) {
            bail!(
                "mode {} does not apply to the nested scenario; its modes are {}",
                m.name(),
                MODES.map(Mode::name).join(", ")
            );
        }
    }
    if opts
        .shapes
        .iter()
        .any(|s| matches!(s.layout, Layout::Session | Layout::Container))
    {
        if let Some(missing) = ["make", "gcc"].into_iter().find(|p| !crate::on_path(p)) {
            bail!("the session shape's build needs {missing}, which is not installed: apt-get install {missing}");
        }
    }
    Ok(())
}

/// Runs the scenario: every shape with every server, the modes interleaved round by round.
pub fn run(opts: &Options) -> Result<NestedResult> {
    check(opts)?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let jobs = ((opts.loads.first().copied().unwrap_or(4.0)) * cpus as f64).round() as usize;
    let engine = if opts.shapes.iter().any(|s| s.layout == Layout::Container) {
        let dir = crate::run::tmp_path(crate::run::DOCKER_TMP, std::process::id());
        eprintln!(
            "starting a Docker engine of the bench's own in {}",
            dir.display()
        );
        Some(crate::docker::Engine::start(&dir)?)
    } else {
        None
    };
    let measure_s = opts.seconds.unwrap_or(if opts.quick { 5.0 } else { 10.0 });
    let rounds = opts.repeat.max(1);
    let mut cases = Vec::new();
    for &shape in &opts.shapes {
        // Where the job's own unit is what meets the server's, its branch is its group.
        let modes: Vec<Mode> = opts
            .modes
            .iter()
            .copied()
            .filter(|&m| !(shape.layout == Layout::Cron && m == Mode::BatchBranchIdle))
            .collect();
        for &server in &opts.servers {
            let runs = interleaved(&modes, rounds, &opts.stop, |slot| {
                eprintln!(
                    "[{} / {}, {}] {}, {} s ...",
                    shape.name(),
                    server.name(),
                    slot.progress(),
                    slot.mode.name(),
                    measure_s
                );
                // SAFETY: sync(2) takes no arguments and cannot fail.
                unsafe { libc::sync() };
                let r = run_mode(
                    opts,
                    engine.as_ref(),
                    shape,
                    server,
                    slot.mode,
                    jobs,
                    measure_s,
                )?;
                eprintln!(
                    "    p99 {:.3} ms, p50 {:.3} ms, {:.0} requests/s{}; batch on {:.2} CPUs",
                    r.measured.p99_ms,
                    r.measured.p50_ms,
                    r.requests_per_s,
                    if r.slow { " (slow)" } else { "" },
                    r.measured.batch_cpus
                );
                Ok(r)
            })?;
            let mut summaries: Vec<ModeSummary> = modes
                .iter()
                .zip(runs)
                .filter(|(_, r)| !r.is_empty())
                .map(|(&m, r)| summarise(m, r))
                .collect();
            let unmanaged = summaries
                .iter()
                .find(|m| m.mode == Mode::Unmanaged)
                .map(|m| m.median.batch_cpus);
            for m in &mut summaries {
                m.batch_pct = unmanaged
                    .filter(|&u| u > 0.0 && m.mode != Mode::Unloaded)
                    .map(|u| 100.0 * m.median.batch_cpus / u);
            }
            if summaries.is_empty() {
                break;
            }
            cases.push(Case {
                shape: shape.name(),
                description: match units::wanted() {
                    true => format!(
                        "{}; every group a transient scope made by systemd (systemd-run --scope), \
                         the quota set through systemctl",
                        shape.describe()
                    ),
                    false => shape.describe(),
                },
                batch: shape.batch(jobs),
                server,
                jobs,
                measure_s,
                modes: summaries,
            });
        }
    }
    Ok(NestedResult {
        scenario: "nested".into(),
        cases,
    })
}

fn run_mode(
    opts: &Options,
    engine: Option<&crate::docker::Engine>,
    shape: Shape,
    server: Server,
    mode: Mode,
    jobs: usize,
    measure_s: f64,
) -> Result<Round> {
    let (mut run, tmp) = Run::in_tmp()?;
    let mut g = Groups::build(&mut run, shape)?;
    let target = start_server(&mut run, opts, &g, server, &tmp)?;
    let n = mode.batch_jobs(jobs);
    let mut roots = Vec::new();

    // The container: its server serving and its build waiting; removed with the round.
    let docker = match shape.layout {
        Layout::Container => {
            let engine = engine.context("the container shape needs the bench's Docker engine")?;
            let c = container::start(engine, &opts.appease, &tmp, n, shape.limited)?;
            g.batch = c.container.group();
            g.branch = format!("/{}", crate::docker::PARENT);
            if n > 0 {
                roots.push(c.build);
            }
            Some(c)
        }
        _ => {
            // Someone logged in (a shell asleep), or the cron daemon waiting.
            let mut sleeper = Command::new("sh");
            sleeper
                .args(["-c", "sleep 100000; :"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                // Ended with its sleep at the round's end, it would say "Killed".
                .stderr(Stdio::null());
            run.children.push(spawn_in(&g, &g.batch, &mut sleeper)?);
            None
        }
    };
    let side_load = docker.as_ref().map(|d| d.serve(&g));
    let go = start_host_batch(&mut run, opts, &g, shape, n, &tmp, &mut roots)?;
    apply_mode(&mut run, opts, &g, mode, &roots)?;
    if let Some(mut go) = go {
        // Every make, gcc and child the job starts from now on inherits the mode.
        std::io::Write::write_all(&mut go, b"go\n").context("starting the batch job")?;
    }
    if let Some(c) = docker.as_ref().filter(|_| n > 0) {
        c.go()?;
    }
    warm_up(opts, &g, &target, mode, &roots)?;

    let (t0, cpu0) = (Instant::now(), crate::tree_cpu_ns(&roots));
    let (rps, p50, p99) = measure(
        &g,
        &target,
        Duration::from_secs_f64(measure_s),
        Duration::from_secs(3),
        &opts.stop,
    )?;
    let batch_cpus =
        crate::tree_cpu_ns(&roots).saturating_sub(cpu0) as f64 / 1e9 / t0.elapsed().as_secs_f64();
    if let Some(load) = side_load {
        load.finish()?;
    }
    Ok(Round {
        measured: Measured {
            p99_ms: p99,
            p50_ms: p50,
            batch_cpus,
        },
        requests_per_s: rps,
        slow: p99 > server.slow_above_ms(),
    })
}

/// The batch of a shape built on the host (not the container's): the soakers, or the job
/// waiting for its go, whose stdin is returned. Their pids go to `roots`.
fn start_host_batch(
    run: &mut Run,
    opts: &Options,
    g: &Groups,
    shape: Shape,
    n: usize,
    tmp: &Path,
    roots: &mut Vec<u32>,
) -> Result<Option<std::process::ChildStdin>> {
    match shape.layout {
        Layout::Systemd => {
            for _ in 0..n {
                let mut cmd = Command::new(&opts.appease);
                cmd.args(["bench-worker", "soak"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit());
                let c = spawn_in(g, &g.batch, &mut cmd)?;
                roots.push(c.id());
                run.children.push(c);
            }
        }
        Layout::Session | Layout::Cron if n > 0 => {
            let mut cmd = match shape.layout {
                Layout::Session => {
                    let src = tmp.join("src").display().to_string();
                    let mut c = Command::new(&opts.appease);
                    c.args([
                        "bench-worker",
                        "compile",
                        "--dir",
                        &src,
                        "--jobs",
                        &n.to_string(),
                    ]);
                    c
                }
                _ => {
                    // The job: a shell that starts its workers once told to go, and waits.
                    let mut c = Command::new("sh");
                    c.args([
                        "-c",
                        "read go; i=0; while [ $i -lt \"$1\" ]; do \"$0\" bench-worker soak & i=$((i+1)); done; wait",
                    ])
                    .arg(&opts.appease)
                    .arg(n.to_string());
                    c
                }
            };
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
            let mut c = spawn_in(g, &g.batch, &mut cmd)?;
            roots.push(c.id());
            let go = c.stdin.take();
            run.children.push(c);
            return Ok(go);
        }
        Layout::Session | Layout::Cron | Layout::Container => {}
    }
    Ok(None)
}

fn apply_mode(run: &mut Run, opts: &Options, g: &Groups, mode: Mode, roots: &[u32]) -> Result<()> {
    match mode {
        Mode::Unloaded | Mode::Unmanaged => {}
        Mode::BatchGroupIdle => g.cg.set_idle(&g.batch, true)?,
        Mode::BatchBranchIdle => {
            g.cg.set_idle(&g.branch, true)?;
            // The engine's `/docker` outlives the round: not idle after it.
            run.reset_idle.push((g.cg.clone(), g.branch.clone()));
        }
        Mode::BatchCgroupIdle => crate::into_idle_group(run, roots)?,
        Mode::Appease => crate::start_daemon(run, opts, None)?,
        other => bail!(
            "mode {} does not apply to the nested scenario",
            other.name()
        ),
    }
    Ok(())
}

/// Load flows while the host settles; for appease, until the daemon has demoted every
/// batch job and then two scans more (what it does beyond the soakers themselves, such as
/// their branch, follows from a scan that sees the server serving beside them).
fn warm_up(
    opts: &Options,
    g: &Groups,
    target: &Target,
    mode: Mode,
    soak_pids: &[u32],
) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let settled = std::thread::scope(|s| -> Result<()> {
        let load = s.spawn(|| measure(g, target, Duration::from_secs(3600), Duration::ZERO, &stop));
        let t = Instant::now();
        let mut result = Ok(());
        std::thread::sleep(Duration::from_secs(1));
        if mode == Mode::Appease && !soak_pids.is_empty() {
            result = crate::synthetic::await_demotion(opts, soak_pids, "the batch", t);
            if result.is_ok() {
                std::thread::sleep(Duration::from_secs(2));
            }
        }
        stop.store(true, Ordering::Relaxed);
        let _warmup_figures_unused = load.join();
        result
    });
    settled
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_are_medians_and_count_slow_rounds() {
        let r = |p99: f64, slow: bool| Round {
            measured: Measured {
                p99_ms: p99,
                p50_ms: 0.05,
                batch_cpus: 1.0,
            },
            requests_per_s: 1000.0,
            slow,
        };
        let s = summarise(
            Mode::Appease,
            vec![r(0.1, false), r(3.3, true), r(0.2, false)],
        );
        assert_eq!(s.median.p99_ms, 0.2);
        assert_eq!(s.slow_rounds, 1);
        assert_eq!(s.rounds.len(), 3);
    }

    #[test]
    fn shapes_servers_and_their_names_round_trip() {
        for s in Shape::ALL {
            assert_eq!(Shape::parse(&s.name()).unwrap(), s);
        }
        assert_eq!(Shape::ALL[1].name(), "systemd-limited");
        for s in Server::ALL {
            assert_eq!(Server::parse(s.name()).unwrap(), s);
        }
        assert!(Shape::parse("flat").is_err());
    }
}
