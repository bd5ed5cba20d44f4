//! The latency scenarios (synthetic, compile, web, db, db-analytic, frames, pipeline): a
//! server under an open-loop client beside batch load, every mode in each round.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::rounds::interleaved;
use crate::{
    client, cpu_jiffies, db, docker, into_idle_group, make_sched_idle, on_path, peer, pipeline,
    process_cpu_ns, report, spawn_server, spawn_worker, start_daemon, utilization, wait_until, web,
    Batch, Mode, ModeResult, Options, Run, ScenarioResult, Synthetic, MIXED_SIZES,
};

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
        // The same with a join of a few hundred ms on a fresh connection (a new backend
        // process) each time.
        "db-analytic-fresh" => (
            "postgresql-analytic-fresh",
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
            let dir = crate::run::tmp_path(crate::run::DOCKER_TMP, std::process::id());
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
        let runs = interleaved(&modes, opts.repeat.max(1), &opts.stop, |slot| {
            let n = slot.mode.batch_jobs(soakers);
            eprintln!(
                "[{}] {} with {}, {} s ...",
                slot.progress(),
                slot.mode.name(),
                params.batch.describe(n, if n == 0 { 0.0 } else { load }),
                params.measure_s
            );
            // Dirty pages left by what ran before (another mode, a test that wrote a
            // disk image) are written back now, not in this mode's measured window.
            // SAFETY: sync(2) takes no arguments and cannot fail.
            unsafe { libc::sync() };
            let r = run_mode(opts, &params, slot.mode, soakers, engine.as_ref())?;
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
            Ok(r)
        })?;
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

fn run_mode(
    opts: &Options,
    p: &Synthetic,
    mode: Mode,
    soakers: usize,
    engine: Option<&docker::Engine>,
) -> Result<ModeResult> {
    let (mut run, tmp) = Run::in_tmp()?;

    start_peer(&mut run, opts, mode, &tmp)?;
    let load = start_server(&mut run, opts, p, &tmp)?;

    // The batch load.
    let n = mode.batch_jobs(soakers);
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
            apply_mode(&mut run, opts, mode, &soak_pids)?;
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
        apply_mode(&mut run, opts, mode, &soak_pids)?;
    }

    warm_up(opts, p, mode, &load, &soak_pids)?;

    let jobs_cpu0: Vec<u64> = soak_pids.iter().map(|&p| process_cpu_ns(p)).collect();
    // The analytic queries that end within the measurement (those of the warm-up dropped).
    drop(run.analytic.as_ref().map(db::FreshAnalytic::take));
    let (busy0, total0) = cpu_jiffies();
    let result = load.run(
        p,
        Duration::from_secs_f64(p.measure_s),
        Duration::from_secs(3),
        &opts.stop,
    )?;
    let (busy1, total1) = cpu_jiffies();
    let analytic = run.analytic.as_ref().map(db::FreshAnalytic::take);
    // Each job's CPU over the measurement, while the server received requests.
    let jobs_cpu: Vec<f64> = soak_pids
        .iter()
        .zip(&jobs_cpu0)
        .map(|(&p, &b)| process_cpu_ns(p).saturating_sub(b) as f64 / 1e9)
        .collect();
    let util = 100.0 * (busy1 - busy0) as f64 / (total1 - total0).max(1) as f64;

    let download_s = download_tree(opts, p, &load, &tmp)?;

    let soak_time = soak_start.elapsed().as_secs_f64();
    let (units, cpu_ns) = stop_batch(&mut run, &soak_pids, engine, &containers)?;
    let mut m = ModeResult::new(mode, &result, units as f64 / soak_time, util);
    m.batch_cpus = cpu_ns as f64 / 1e9 / soak_time;
    if matches!(p.batch, Batch::Soak | Batch::Mixed | Batch::Docker) && jobs_cpu.len() > 1 {
        m.batch_jain = Some(utilization::jain(&jobs_cpu));
    }
    m.download_s = download_s;
    m.analytic = analytic.map(|(times, failed)| report::Analytic::new(times, failed));
    m.peer = run.peer.as_mut().map(peer::PeerRun::report);
    if p.server == "player" {
        m.frames = Some(report::Frames::new(&result, p.rate_per_s));
    }
    Ok(m)
}

/// The 2010 customer-appeasement paper's web test: the whole site with wget -r, under
/// the same batch load; the mean of `DOWNLOADS` in s (None: not nginx, or interrupted).
fn download_tree(opts: &Options, p: &Synthetic, load: &Load, tmp: &Path) -> Result<Option<f64>> {
    let Load::OpenLoop(client::Target::Tcp(addr), _) = load else {
        return Ok(None);
    };
    if p.server != "nginx" || opts.stop.load(Ordering::Relaxed) {
        return Ok(None);
    }
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
    Ok((done > 0).then(|| total.as_secs_f64() / done as f64))
}

/// Stops the batch jobs and sums what they report on SIGTERM ("UNITS CPU_NS" each):
/// work units and CPU ns.
fn stop_batch(
    run: &mut Run,
    soak_pids: &[u32],
    engine: Option<&docker::Engine>,
    containers: &[docker::Container],
) -> Result<(u64, u64)> {
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
        for c in containers {
            // SAFETY: the first process of a container this run started.
            unsafe { libc::kill(c.pid as i32, libc::SIGTERM) };
        }
        for c in containers {
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
    Ok((units, cpu_ns))
}

/// The scenario's server, started for `run`, and what sends it requests.
pub(crate) fn start_server(
    run: &mut Run,
    opts: &Options,
    p: &Synthetic,
    tmp: &Path,
) -> Result<Load> {
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
        "postgresql-analytic-fresh" => {
            let pg = db::start(run, tmp, opts.max_clients())?;
            run.analytic = Some(pg.start_fresh_analytic()?);
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
pub(crate) fn start_peer(run: &mut Run, opts: &Options, mode: Mode, tmp: &Path) -> Result<()> {
    if let Some(p) = mode.peer() {
        let located = peer::locate(p, &opts.peer_bins).map_err(anyhow::Error::msg)?;
        run.peer = Some(peer::start(&located, tmp)?);
    }
    Ok(())
}

/// `n` soaker jobs (one thread each, or 1, 2 and 4 in turn for the mixed load), ended
/// with `run`; their pids.
pub(crate) fn spawn_soakers(
    run: &mut Run,
    opts: &Options,
    batch: Batch,
    n: usize,
) -> Result<Vec<u32>> {
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
pub(crate) fn warm_up(
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
    let waited = match mode == Mode::Appease && !soak_pids.is_empty() {
        true => await_demotion(opts, soak_pids, "the soakers", settle),
        false => Ok(()),
    };
    warm_stop.store(true, Ordering::Relaxed);
    let _warmup_latencies_unused = warm.join();
    waited
}

/// For appease: waits up to 30 s for the daemon to demote every process of `pids` (`what`
/// names them) and says how long after `since` it did.
pub(crate) fn await_demotion(
    opts: &Options,
    pids: &[u32],
    what: &str,
    since: Instant,
) -> Result<()> {
    let group = opts.batch_group();
    wait_until(Duration::from_secs(30), || {
        opts.stop.load(Ordering::Relaxed) || pids.iter().all(|&p| demoted(&group, p))
    })
    .with_context(|| format!("the daemon did not demote {what} within 30 s"))?;
    eprintln!(
        "    {what} demoted by the daemon {:.1} s after the start",
        since.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Whether the daemon has put `pid` in the idle class: moved into its group (`group`, as
/// /proc/PID/cgroup names it), a group of its made idle in place (a container, a branch),
/// or the process itself SCHED_IDLE.
pub(crate) fn demoted(group: &str, pid: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return false;
    };
    if text.contains(group) {
        return true;
    }
    // Its group or one above it (a branch made idle carries the class for the threads
    // below it, which go back to the normal policy).
    let in_idle_group = appease_cgroup::Cgroups::detect().is_ok_and(|cg| {
        appease_cgroup::parse_proc_cgroup(&text, cg.version()).is_some_and(|g| {
            std::iter::successors(Some(g.as_str()), |g| g.rsplit_once('/').map(|(up, _)| up))
                .filter(|g| !g.is_empty())
                .any(|g| cg.idle(g).unwrap_or(false))
        })
    });
    // SAFETY: sched_getscheduler only reads.
    in_idle_group || unsafe { libc::sched_getscheduler(pid as i32) } == libc::SCHED_IDLE
}

/// Whole-tree downloads per mode (the 2010 customer-appeasement paper averaged three).
const DOWNLOADS: u32 = 3;

/// What sends the server its requests.
#[derive(Clone)]
pub(crate) enum Load {
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

pub(crate) fn apply_mode(run: &mut Run, opts: &Options, mode: Mode, soakers: &[u32]) -> Result<()> {
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
        Mode::BatchCgroupLow => crate::into_low_group(run, soakers)?,
        // Started before the batch load (start_peer).
        Mode::Ananicy | Mode::System76Scheduler => {}
        Mode::BatchGroupIdle | Mode::BatchBranchIdle => {
            bail!("mode {} applies to the nested scenario only", mode.name())
        }
        Mode::RbpeClassic => start_daemon(run, opts, Some(appease_config_rbpe()))?,
        Mode::Appease => start_daemon(run, opts, None)?,
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

fn appease_config_rbpe() -> String {
    include_str!("../../../config/rbpe-classic.toml").to_string()
}
