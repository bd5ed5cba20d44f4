//! Closed-loop client sweeps (`appease bench web|db --clients 2,4,…`): the Staircase
//! study's scalability test, with the clients it used. Each point is a fixed amount of
//! work (requests or transactions) done by N clients that each send their next request
//! as soon as the last is answered: `ab` from apache2-utils against nginx (a new
//! connection per request, and keep-alive), `sysbench` OLTP read-only and read-write
//! against PostgreSQL. The figures are the study's: completion time, requests per
//! second, min / p95 / max and the max−min and p95−min spreads, and the scalability
//! formula over the sweep.
//!
//! A closed loop hides a slow server behind a slow client (the client waits, so it sends
//! less), so the client runs at the same place in every mode (nice −10, the latency class
//! the open-loop clients run in) and its CPU time is reported beside each point.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use appease_model::scalability::{self, Scalability, Spread};
use serde::{Deserialize, Serialize};

use crate::report::median_of;
use crate::report::NotRun;
use crate::rounds::interleaved;
use crate::{
    apply_mode, client, scenario_params, spawn_soakers, start_peer, start_server, warm_up, Batch,
    Load, Mode, Options, Run,
};

const AB: &str = "/usr/bin/ab";
const SYSBENCH: &str = "/usr/bin/sysbench";
/// Requests per ab run, transactions per sysbench run (`--quick`: a tenth).
const WEB_REQUESTS: u64 = 50_000;
const DB_TRANSACTIONS: u64 = 5_000;
/// sysbench's tables: small enough to stay in PostgreSQL's buffers (about 100 MB), so the
/// sweep measures CPU and scheduling, not the disk; large enough that 256 clients
/// writing rows drawn uniformly rarely wait on one another's row locks.
const SB_TABLES: u32 = 4;
const SB_TABLE_SIZE: u32 = 100_000;
/// A client run longer than this is stuck: it is stopped and the sweep fails.
const RUN_LIMIT: Duration = Duration::from_secs(600);
/// Past this, ab and PostgreSQL need more than this machine's descriptors and memory.
const MAX_CLIENTS: u32 = 1024;

/// The study's sweep: 2 to 256 clients, doubling.
pub const DEFAULT_CLIENTS: [u32; 8] = [2, 4, 8, 16, 32, 64, 128, 256];

/// One client program and how it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    /// ab, a new connection per request (`keep_alive`: false) or keep-alive (`-k`).
    Ab { keep_alive: bool },
    /// A sysbench OLTP test over PostgreSQL.
    Sysbench(&'static str),
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Ab { keep_alive: false } => "ab",
            Variant::Ab { keep_alive: true } => "ab-k",
            Variant::Sysbench(test) => test,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Variant::Ab { keep_alive: false } => "ab, a new connection per request",
            Variant::Ab { keep_alive: true } => "ab -k, keep-alive connections",
            Variant::Sysbench("oltp_read_only") => {
                "sysbench oltp_read_only (14 queries a transaction)"
            }
            Variant::Sysbench(_) => {
                "sysbench oltp_read_write (18 queries a transaction, 4 of them writes)"
            }
        }
    }
}

/// The medians of one point's runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub clients: u32,
    /// Runs measured (the median is over these).
    pub runs: usize,
    /// The study's completion time: ab's "Time taken for tests", sysbench's "total time".
    pub completion_s: f64,
    /// The fastest and slowest run: the spread of the median.
    pub completion_min_s: f64,
    pub completion_max_s: f64,
    /// Requests (web) or transactions (db) per second.
    pub per_s: f64,
    /// Each figure per run, then the median.
    #[serde(flatten)]
    pub spread: Spread,
    /// CPU time of the client (user + system) in one run.
    pub client_cpu_s: f64,
    /// Times the client was preempted (involuntary context switches) in one run.
    #[serde(default)]
    pub client_preempted: f64,
    /// Failed requests (ab) or errors sysbench ignored and retried, all runs together.
    pub failed: u64,
}

/// One client variant under one mode over the sweep.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Series {
    /// ab, ab-k, oltp_read_only or oltp_read_write.
    pub variant: String,
    pub mode: Mode,
    pub points: Vec<Point>,
    /// From the points' median completion times; None when too little was measured.
    pub scalability: Option<Scalability>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClosedLoopResult {
    pub scenario: String,
    /// Always "closed": tells this result from the open-loop ones.
    pub client_loop: String,
    /// The client programs and the server.
    pub client: String,
    pub cpus: usize,
    pub load_per_cpu: f64,
    pub soakers: usize,
    pub batch: Batch,
    /// Requests or transactions per run, and which.
    pub work_per_run: u64,
    pub unit: String,
    /// Runs per point asked for (interleaved rounds of every mode).
    pub rounds: usize,
    pub clients: Vec<u32>,
    /// The base asked for with --scale-base (None: each series' fastest count).
    pub scale_base: Option<u32>,
    pub series: Vec<Series>,
    /// Modes asked for that could not run (a peer daemon not installed), and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_run: Vec<NotRun>,
}

/// One run's figures.
#[derive(Clone, Debug, PartialEq)]
struct Sample {
    completion_s: f64,
    per_s: f64,
    spread: Spread,
    client_cpu_s: f64,
    client_preempted: u64,
    failed: u64,
}

/// Checks the sweep's options, with one clear error for each mistake.
fn check(opts: &Options) -> Result<()> {
    if !matches!(opts.scenario.as_str(), "web" | "db") {
        bail!(
            "--clients applies to the web and db scenarios (closed-loop ab and sysbench), not {:?}",
            opts.scenario
        );
    }
    if opts.loads.len() != 1 {
        bail!("a client sweep runs at one batch level: give one --load value");
    }
    if !matches!(opts.batch, Batch::Soak | Batch::Mixed) {
        bail!("a client sweep runs beside the soak or mixed batch load");
    }
    if let Some(bad) = opts.clients.iter().find(|&&c| c == 0 || c > MAX_CLIENTS) {
        bail!("--clients {bad}: a client count must be within 1..={MAX_CLIENTS}");
    }
    let mut sorted = opts.clients.clone();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != opts.clients.len() {
        bail!("--clients lists a count twice");
    }
    if let Some(base) = opts.scale_base {
        if !opts.clients.contains(&base) {
            bail!(
                "--scale-base {base} is not among the client counts ({})",
                join(&opts.clients)
            );
        }
    }
    let (program, package) = match opts.scenario.as_str() {
        "web" => (AB, "apache2-utils"),
        _ => (SYSBENCH, "sysbench"),
    };
    if !Path::new(program).exists() {
        bail!(
            "the closed-loop {} sweep needs {program}: apt-get install {package}",
            opts.scenario
        );
    }
    Ok(())
}

fn join(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

pub fn run(opts: &Options) -> Result<ClosedLoopResult> {
    check(opts)?;
    let p = scenario_params(opts);
    let variants: Vec<Variant> = match opts.scenario.as_str() {
        "web" => vec![
            Variant::Ab { keep_alive: false },
            Variant::Ab { keep_alive: true },
        ],
        _ => vec![
            Variant::Sysbench("oltp_read_only"),
            Variant::Sysbench("oltp_read_write"),
        ],
    };
    let (work, unit, client) = match opts.scenario.as_str() {
        "web" => (
            WEB_REQUESTS,
            "requests",
            "ab (apache2-utils) against nginx, one 8 KiB page",
        ),
        _ => (
            DB_TRANSACTIONS,
            "transactions",
            "sysbench against PostgreSQL (4 tables of 100,000 rows, rows drawn uniformly)",
        ),
    };
    let work = match opts.work {
        Some(w) => w,
        None if opts.quick => work / 10,
        None => work,
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load = opts.loads[0];
    let soakers = (load * cpus as f64).round() as usize;
    let rounds = opts.repeat.max(1);
    let (modes, not_run) = opts.runnable_modes();
    let started = Instant::now();
    let runs = interleaved(&modes, rounds, &opts.stop, |slot| {
        let n = slot.mode.batch_jobs(soakers);
        eprintln!(
            "[{}, {:.0} s in] {} with {}: {} {unit} per run at {} clients ...",
            slot.progress(),
            started.elapsed().as_secs_f64(),
            slot.mode.name(),
            opts.batch.describe(n, if n == 0 { 0.0 } else { load }),
            work,
            join(&opts.clients),
        );
        run_mode(opts, &p, slot.mode, n, &variants, work)
    })?;
    // samples[variant][mode][clients]
    let mut samples =
        vec![vec![vec![Vec::<Sample>::new(); opts.clients.len()]; modes.len()]; variants.len()];
    for (mi, mode_runs) in runs.into_iter().enumerate() {
        for (vi, ci, s) in mode_runs.into_iter().flatten() {
            samples[vi][mi][ci].push(s);
        }
    }
    let series = series_of(&variants, &modes, &opts.clients, &samples, opts.scale_base);
    Ok(ClosedLoopResult {
        scenario: opts.scenario.clone(),
        client_loop: "closed".into(),
        client: client.into(),
        cpus,
        load_per_cpu: load,
        soakers,
        batch: opts.batch,
        work_per_run: work,
        unit: unit.into(),
        rounds,
        clients: opts.clients.clone(),
        scale_base: opts.scale_base,
        series,
        not_run,
    })
}

/// One series per variant and mode: its points (medians over the rounds) and its
/// scalability. `samples[variant][mode][clients]`.
fn series_of(
    variants: &[Variant],
    modes: &[Mode],
    clients: &[u32],
    samples: &[Vec<Vec<Vec<Sample>>>],
    scale_base: Option<u32>,
) -> Vec<Series> {
    let mut series = Vec::new();
    for (vi, v) in variants.iter().enumerate() {
        for (mi, &mode) in modes.iter().enumerate() {
            let points: Vec<Point> = clients
                .iter()
                .enumerate()
                .filter(|(ci, _)| !samples[vi][mi][*ci].is_empty())
                .map(|(ci, &c)| point(c, &samples[vi][mi][ci]))
                .collect();
            if points.is_empty() {
                continue;
            }
            let times: Vec<(u32, f64)> =
                points.iter().map(|p| (p.clients, p.completion_s)).collect();
            let scalability = match scalability::scalability(&times, scale_base) {
                Ok(s) => Some(s),
                Err(e) => {
                    eprintln!(
                        "    no scalability for {} under {}: {e}",
                        v.name(),
                        mode.name()
                    );
                    None
                }
            };
            series.push(Series {
                variant: v.name().to_string(),
                mode,
                points,
                scalability,
            });
        }
    }
    series
}

/// One mode's round: the server, the batch load and the mode, then every client count
/// with every variant. Returns (variant, client count) indices with their run.
fn run_mode(
    opts: &Options,
    p: &crate::Synthetic,
    mode: Mode,
    soakers: usize,
    variants: &[Variant],
    work: u64,
) -> Result<Vec<(usize, usize, Sample)>> {
    let (mut run, tmp) = Run::in_tmp()?;
    start_peer(&mut run, opts, mode, &tmp)?;
    let load = start_server(&mut run, opts, p, &tmp)?;
    let target = match &load {
        Load::OpenLoop(client::Target::Tcp(addr), client::Protocol::Http { paths, .. }) => {
            // The second file of the site: 8,431 bytes, a typical small page.
            Target::Web(format!("http://{addr}{}", paths[1]))
        }
        Load::Pgbench(pg) => {
            prepare_sysbench(&pg.socket_dir, &tmp)?;
            Target::Db(pg.socket_dir.clone())
        }
        _ => bail!("a client sweep needs nginx or PostgreSQL"),
    };
    let pids = spawn_soakers(&mut run, opts, opts.batch, soakers)?;
    apply_mode(&mut run, opts, mode, &pids)?;
    warm_up(opts, p, mode, &load, &pids)?;
    let mut out = Vec::new();
    for (ci, &clients) in opts.clients.iter().enumerate() {
        for (vi, &v) in variants.iter().enumerate() {
            if opts.stop.load(Ordering::Relaxed) {
                return Ok(out);
            }
            // appease's own cost beside the clients: its live threads' CPU over the run, and
            // the process's own count, which keeps exited threads': a check.
            use crate::procfs::{process_cpu_ns, process_stat_cpu_ns};
            let cost_from = run.daemon.as_ref().map(|d| {
                let pid = d.id();
                let from = (process_cpu_ns(pid), process_stat_cpu_ns(pid));
                (pid, from, Instant::now())
            });
            let Some(s) = run_client(v, &target, clients, work, &tmp, &opts.stop)? else {
                return Ok(out); // Ctrl-C in the middle of a run: not a measurement
            };
            let cost = cost_from.map_or(String::new(), |(pid, (c0, k0), t0)| {
                let pct = |ns: u64| ns as f64 / t0.elapsed().as_nanos() as f64 * 100.0;
                format!(
                    ", appease {:.2} % of a CPU ({:.1} % by its stat), {:.1} MiB resident",
                    pct(process_cpu_ns(pid).saturating_sub(c0)),
                    pct(process_stat_cpu_ns(pid).saturating_sub(k0)),
                    appease_cgroup::resident_kib(pid).unwrap_or(0) as f64 / 1024.0
                )
            });
            eprintln!(
                "    {:<15} {clients:>4} clients: {:.2} s, {:.0}/s, min {:.2} p95 {:.2} max {:.2} ms, client CPU {:.2} s, preempted {}{}{cost}",
                v.name(),
                s.completion_s,
                s.per_s,
                s.spread.min_ms,
                s.spread.p95_ms,
                s.spread.max_ms,
                s.client_cpu_s,
                s.client_preempted,
                if s.failed > 0 { format!(", {} failed", s.failed) } else { String::new() }
            );
            out.push((vi, ci, s));
        }
    }
    Ok(out)
}

/// Where the client sends its work.
enum Target {
    /// An URL of nginx's.
    Web(String),
    /// PostgreSQL's socket directory.
    Db(PathBuf),
}

/// sysbench's connection options for the bench's PostgreSQL (libpq takes a directory
/// as the host for its UNIX socket) and its tables.
fn sysbench_args(socket_dir: &Path) -> Vec<String> {
    vec![
        "--db-driver=pgsql".into(),
        format!("--pgsql-host={}", socket_dir.display()),
        "--pgsql-port=5432".into(),
        "--pgsql-user=postgres".into(),
        "--pgsql-db=postgres".into(),
        format!("--tables={SB_TABLES}"),
        format!("--table-size={SB_TABLE_SIZE}"),
        // sysbench 1.0 draws rows from a "special" distribution with 1 % of them hot by
        // default: hundreds of clients then deadlock on those rows, and PostgreSQL's
        // one-second deadlock timeout, not scheduling, sets the time.
        "--rand-type=uniform".into(),
    ]
}

/// Creates and fills sysbench's tables (oltp_read_write uses the same ones).
fn prepare_sysbench(socket_dir: &Path, tmp: &Path) -> Result<()> {
    let log = tmp.join("sysbench-prepare.log");
    let file = std::fs::File::create(&log)?;
    let status = Command::new(SYSBENCH)
        .arg("oltp_read_only")
        .args(sysbench_args(socket_dir))
        .arg("prepare")
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .context("running sysbench prepare")?;
    if !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        bail!(
            "sysbench prepare failed ({status}): {}",
            text.lines().last().unwrap_or("no message")
        );
    }
    Ok(())
}

/// One closed-loop run of `work` requests by `clients` clients; None when Ctrl-C ended it.
fn run_client(
    v: Variant,
    target: &Target,
    clients: u32,
    work: u64,
    tmp: &Path,
    stop: &AtomicBool,
) -> Result<Option<Sample>> {
    // Every mode's client in the latency class, as the open-loop clients are.
    let mut cmd = Command::new("nice");
    cmd.args(["-n", "-10"]);
    let csv = tmp.join("ab-percentiles.csv");
    match (v, target) {
        (Variant::Ab { keep_alive }, Target::Web(url)) => {
            cmd.arg(AB).arg("-q");
            if keep_alive {
                cmd.arg("-k");
            }
            // -r: a reset connection is a failed request, not the end of the run;
            // -s 30: a request unanswered for 30 s is one too.
            cmd.args([
                "-r",
                "-s",
                "30",
                "-n",
                &work.max(clients as u64).to_string(),
            ])
            .args(["-c", &clients.to_string(), "-e"])
            .arg(&csv)
            .arg(url);
        }
        (Variant::Sysbench(test), Target::Db(dir)) => {
            cmd.arg(SYSBENCH).arg(test).args(sysbench_args(dir)).args([
                format!("--threads={clients}"),
                format!("--events={work}"),
                "--time=0".into(),
                "--percentile=95".into(),
                "run".into(),
            ]);
        }
        _ => bail!("{} cannot drive this server", v.name()),
    }
    let done = run_measured(&mut cmd, stop)?;
    if done.stopped {
        return Ok(None);
    }
    if !done.success {
        let said = done.stderr.trim();
        let said = if said.is_empty() {
            done.stdout.trim()
        } else {
            said
        };
        bail!(
            "{} with {clients} clients failed: {}",
            v.name(),
            said.lines().last().unwrap_or("no message")
        );
    }
    let mut s = match v {
        Variant::Ab { .. } => {
            let percentiles = std::fs::read_to_string(&csv)
                .with_context(|| format!("reading ab's percentiles {}", csv.display()))?;
            parse_ab(&done.stdout, &percentiles)?
        }
        Variant::Sysbench(_) => parse_sysbench(&done.stdout)?,
    };
    s.client_cpu_s = done.cpu_s;
    s.client_preempted = done.preempted;
    Ok(Some(s))
}

/// What a measured program left.
struct Finished {
    stdout: String,
    stderr: String,
    success: bool,
    /// Its user and system CPU time, s.
    cpu_s: f64,
    /// Its involuntary context switches.
    preempted: u64,
    /// Stopped by Ctrl-C before it finished.
    stopped: bool,
}

/// Runs `cmd` to its end and reaps it with wait4, which gives its CPU time; Ctrl-C
/// stops it (SIGINT, then SIGKILL), and so does running past `RUN_LIMIT` (an error).
fn run_measured(cmd: &mut Command, stop: &AtomicBool) -> Result<Finished> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    let pid = child.id() as libc::pid_t;
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _partial_ok = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let err = drain(Box::new(child.stderr.take().expect("piped")));
    let started = Instant::now();
    let (mut signalled, mut over_time) = (None::<Instant>, false);
    let (status, usage) = loop {
        let mut status = 0;
        // SAFETY: rusage is plain data, filled by wait4.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: reaping our own child, once; std's Child is not waited on after.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            break (status, usage);
        }
        if r < 0 {
            bail!("waiting for {pid}: {}", std::io::Error::last_os_error());
        }
        match signalled {
            None if stop.load(Ordering::Relaxed) || started.elapsed() > RUN_LIMIT => {
                over_time = !stop.load(Ordering::Relaxed);
                // SAFETY: our own child, not yet reaped.
                unsafe { libc::kill(pid, libc::SIGINT) };
                signalled = Some(Instant::now());
            }
            Some(at) if at.elapsed() > Duration::from_secs(5) => {
                // SAFETY: our own child, not yet reaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    if over_time {
        bail!(
            "{:?} ran longer than {} s and was stopped",
            cmd.get_program(),
            RUN_LIMIT.as_secs()
        );
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Finished {
        stdout,
        stderr,
        success: libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        cpu_s: secs(usage.ru_utime) + secs(usage.ru_stime),
        preempted: usage.ru_nivcsw as u64,
        stopped: signalled.is_some(),
    })
}

/// The number after `label` on the first line that holds it.
fn number_after(text: &str, label: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.contains(label))?;
    let rest = &line[line.find(label)? + label.len()..];
    let token = rest.split_whitespace().next()?;
    token
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .ok()
}

/// ab's report and its `-e` percentiles (0 to 99 %, in µs-resolution ms; its text
/// report rounds to whole ms). The maximum is its longest request, in whole ms.
fn parse_ab(report: &str, percentiles: &str) -> Result<Sample> {
    let need = |label: &str| {
        number_after(report, label).with_context(|| format!("ab's report has no {label:?}"))
    };
    let pct = |p: u32| {
        percentiles
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(',')?;
                (k.trim().parse::<u32>().ok()? == p).then(|| v.trim().parse::<f64>().ok())?
            })
            .with_context(|| format!("ab's percentiles have no {p} %"))
    };
    let longest = report
        .lines()
        .find(|l| l.contains("(longest request)"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .context("ab's report has no longest request")?;
    Ok(Sample {
        completion_s: need("Time taken for tests:")?,
        per_s: need("Requests per second:")?,
        spread: Spread::new(pct(0)?, pct(95)?, longest.max(pct(99)?)),
        client_cpu_s: 0.0,
        client_preempted: 0,
        failed: need("Failed requests:")? as u64,
    })
}

/// sysbench's run report: total time, transactions per second, latency min / 95th / max.
fn parse_sysbench(report: &str) -> Result<Sample> {
    let need = |label: &str| {
        number_after(report, label).with_context(|| format!("sysbench's report has no {label:?}"))
    };
    // "transactions:                        5000   (1234.56 per sec.)"
    let per_s = report
        .lines()
        .find(|l| l.trim_start().starts_with("transactions:"))
        .and_then(|l| l.split('(').nth(1)?.split_whitespace().next()?.parse().ok())
        .context("sysbench's report has no transactions per second")?;
    Ok(Sample {
        completion_s: need("total time:")?,
        per_s,
        spread: Spread::new(need("min:")?, need("95th percentile:")?, need("max:")?),
        client_cpu_s: 0.0,
        client_preempted: 0,
        failed: need("ignored errors:")? as u64,
    })
}

/// The medians of one point's runs.
fn point(clients: u32, runs: &[Sample]) -> Point {
    let m = |f: fn(&Sample) -> f64| median_of(runs.iter().map(f).collect());
    let times = runs.iter().map(|s| s.completion_s);
    Point {
        clients,
        runs: runs.len(),
        completion_s: m(|s| s.completion_s),
        completion_min_s: times.clone().fold(f64::INFINITY, f64::min),
        completion_max_s: times.fold(0.0, f64::max),
        per_s: m(|s| s.per_s),
        spread: Spread::median_of(
            &runs.iter().map(|s| s.spread).collect::<Vec<_>>(),
            median_of,
        ),
        client_cpu_s: m(|s| s.client_cpu_s),
        client_preempted: m(|s| s.client_preempted as f64),
        failed: runs.iter().map(|s| s.failed).sum(),
    }
}

impl ClosedLoopResult {
    /// The study's tables: per variant and mode, one line per client count.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{}: closed loop, {}; {}; {} {} per run, median of {} run(s) per point\n\
             (the Staircase study's closed-loop figures: a slow client hides a slow server, so the \
             client runs at nice -10 in every mode; its CPU time and the times it was preempted are shown)\n",
            self.scenario,
            self.client,
            self.batch.describe(self.soakers, self.load_per_cpu),
            self.work_per_run,
            self.unit,
            self.rounds,
        );
        let mut last_variant = "";
        for series in &self.series {
            if series.variant != last_variant {
                last_variant = &series.variant;
                let title = VARIANTS
                    .iter()
                    .find(|v| v.name() == series.variant)
                    .map_or(series.variant.as_str(), |v| v.describe());
                s += &format!(
                    "\n{title}\n{:<18} {:>7} {:>9} {:>15} {:>9}{} {:>9} {:>9} {:>7}\n",
                    "mode",
                    "clients",
                    "time s",
                    "(min–max)",
                    "per s",
                    Spread::headings(),
                    "client s",
                    "preempted",
                    "scal."
                );
            }
            for p in &series.points {
                let scal = series.scalability.as_ref().and_then(|sc| {
                    let v = sc.values.get(&p.clients)?;
                    Some(if sc.base == p.clients {
                        "base".to_string()
                    } else {
                        format!("{v:.3}")
                    })
                });
                s += &format!(
                    "{:<18} {:>7} {:>9.3} {:>15} {:>9.0}{} {:>9.2} {:>9.0} {:>7}{}\n",
                    series.mode.name(),
                    p.clients,
                    p.completion_s,
                    format!("{:.3}–{:.3}", p.completion_min_s, p.completion_max_s),
                    p.per_s,
                    p.spread.columns(),
                    p.client_cpu_s,
                    p.client_preempted,
                    scal.unwrap_or_else(|| "-".into()),
                    if p.failed > 0 {
                        format!("  {} failed", p.failed)
                    } else {
                        String::new()
                    }
                );
            }
        }
        for n in &self.not_run {
            s += &format!("\nnot run: {}: {}\n", n.mode, n.why);
        }
        s
    }

    /// One line per variant, mode and client count.
    pub fn csv(&self) -> String {
        let mut s = String::from(
            "scenario,variant,mode,clients,runs,completion_s,completion_min_s,completion_max_s,\
             per_s,min_ms,p95_ms,max_ms,max_minus_min_ms,p95_minus_min_ms,client_cpu_s,client_preempted,failed,\
             scalability_base,scalability\n",
        );
        for series in &self.series {
            for p in &series.points {
                let (base, value) = series
                    .scalability
                    .as_ref()
                    .and_then(|sc| {
                        Some((sc.base.to_string(), sc.values.get(&p.clients)?.to_string()))
                    })
                    .unwrap_or_default();
                let spread = p.spread.figures().map(|v| v.to_string()).join(",");
                s += &format!(
                    "{},{},{},{},{},{},{},{},{},{spread},{},{},{},{},{}\n",
                    self.scenario,
                    series.variant,
                    series.mode.name(),
                    p.clients,
                    p.runs,
                    p.completion_s,
                    p.completion_min_s,
                    p.completion_max_s,
                    p.per_s,
                    p.client_cpu_s,
                    p.client_preempted,
                    p.failed,
                    base,
                    value
                );
            }
        }
        s
    }
}

/// Every variant, for names and descriptions.
const VARIANTS: [Variant; 4] = [
    Variant::Ab { keep_alive: false },
    Variant::Ab { keep_alive: true },
    Variant::Sysbench("oltp_read_only"),
    Variant::Sysbench("oltp_read_write"),
];

#[cfg(test)]
mod tests {
    use super::*;

    const AB_REPORT: &str = "\
Concurrency Level:      64
Time taken for tests:   0.134 seconds
Complete requests:      5000
Failed requests:        2
Requests per second:    37254.49 [#/sec] (mean)
Percentage of the requests served within a certain time (ms)
  50%      2
  95%      2
 100%      3 (longest request)
";

    #[test]
    fn ab_report_and_percentiles() {
        let csv = "Percentage served,Time in ms\n0,0.961\n1,1.271\n95,2.126\n99,3.066\n";
        let s = parse_ab(AB_REPORT, csv).unwrap();
        assert_eq!(
            s,
            Sample {
                completion_s: 0.134,
                per_s: 37254.49,
                // The longest request is in whole ms: never below the 99th percentile.
                spread: Spread::new(0.961, 2.126, 3.066),
                client_cpu_s: 0.0,
                client_preempted: 0,
                failed: 2,
            }
        );
        assert!(parse_ab("nothing", csv).is_err());
        assert!(parse_ab(AB_REPORT, "Percentage served,Time in ms\n").is_err());
    }

    #[test]
    fn sysbench_report() {
        let report = "\
SQL statistics:
    transactions:                        5000   (1234.56 per sec.)
    queries:                             70000  (17283.84 per sec.)
    ignored errors:                      3      (0.74 per sec.)
General statistics:
    total time:                          4.0487s
    total number of events:              5000
Latency (ms):
         min:                                    1.23
         avg:                                    3.21
         max:                                   45.67
         95th percentile:                        7.98
         sum:                                16050.00
";
        let s = parse_sysbench(report).unwrap();
        assert_eq!(s.completion_s, 4.0487);
        assert_eq!(s.per_s, 1234.56);
        assert_eq!(s.spread, Spread::new(1.23, 7.98, 45.67));
        assert_eq!(s.failed, 3);
        assert!(parse_sysbench("FATAL: connection refused").is_err());
    }

    #[test]
    fn a_point_is_the_median_of_its_runs_with_spreads_per_run() {
        let run = |t: f64, min: f64, max: f64| Sample {
            completion_s: t,
            per_s: 100.0 / t,
            spread: Spread::new(min, min + 1.0, max),
            client_cpu_s: 0.5,
            client_preempted: 7,
            failed: 1,
        };
        let p = point(
            8,
            &[run(2.0, 1.0, 10.0), run(1.0, 2.0, 4.0), run(3.0, 1.0, 30.0)],
        );
        assert_eq!(p.completion_s, 2.0);
        assert_eq!((p.completion_min_s, p.completion_max_s), (1.0, 3.0));
        assert_eq!(p.spread.max_ms, 10.0);
        // Spreads per run (9, 2, 29), then their median.
        assert_eq!(p.spread.max_minus_min_ms, 9.0);
        assert_eq!(p.spread.p95_minus_min_ms, 1.0);
        assert_eq!(p.failed, 3);
        assert_eq!(p.client_preempted, 7.0);
        assert_eq!(p.runs, 3);
    }
}
