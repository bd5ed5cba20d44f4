//! The `fetch` scenario: batch work that reads its input from a server over a socket (a
//! nightly dump piped into a compressor, a download unpacked, an ETL query loop feeding a
//! script) beside a server with customers: PostgreSQL under pgbench at a fixed rate, or
//! nginx under our open-loop client. Each job is a shell loop in a session of its own (as
//! cron or a CI runner starts it), one iteration after another, so its processes live a
//! second or less each. What it reads are responses to its own requests: the job must be
//! treated as batch, not as a server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::rounds::{interleaved, CaseTable, Cases, Measured};
use crate::{client, db, web, Mode, Options, Run};

/// The server whose customers are measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Server {
    /// PostgreSQL with pgbench's TPC-B-like transactions at 100/s (Poisson).
    Db,
    /// nginx with our client's small GETs at 2,000/s.
    Web,
}

impl Server {
    pub const ALL: [Server; 2] = [Server::Db, Server::Web];

    pub fn name(self) -> &'static str {
        match self {
            Server::Db => "db",
            Server::Web => "web",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Server::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .with_context(|| {
                format!("unknown server {s:?} for the fetch scenario; servers are db, web")
            })
    }

    fn describe(self) -> &'static str {
        match self {
            Server::Db => {
                "PostgreSQL, pgbench TPC-B-like transactions at 100/s (Poisson), 4 clients"
            }
            Server::Web => "nginx (1 worker), small GETs at 2,000/s on one keep-alive connection",
        }
    }
}

/// The batch job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Job {
    /// `pg_dump` of the bench's database piped into `gzip -6`.
    Dump,
    /// A 12 MB archive pulled from nginx with curl and unpacked (`tar -xzO`).
    Pull,
    /// A query over every account, its rows piped into an awk script that sums them.
    Etl,
}

impl Job {
    pub const ALL: [Job; 3] = [Job::Dump, Job::Pull, Job::Etl];

    pub fn name(self) -> &'static str {
        match self {
            Job::Dump => "dump",
            Job::Pull => "pull",
            Job::Etl => "etl",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Job::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .with_context(|| format!("unknown job {s:?}; jobs are dump, pull, etl"))
    }

    fn describe(self) -> &'static str {
        match self {
            Job::Dump => "while :; do pg_dump | gzip -6 > file; done (the database: 400,000 accounts)",
            Job::Pull => "while :; do curl http://…/archive.tar.gz | tar -xzO > /dev/null; done (12 MB archive)",
            Job::Etl => "while :; do psql -c 'SELECT … FROM pgbench_accounts' | awk '{sum by branch}'; done",
        }
    }

    fn needs_postgres(self) -> bool {
        matches!(self, Job::Dump | Job::Etl)
    }

    /// The loop, as `bash -c` runs it: it starts once told to go (a line on its standard
    /// input), then writes a line to `count` after each iteration.
    fn script(self, src: &Sources, count: &Path, tmp: &Path) -> String {
        let body = match self {
            Job::Dump => format!(
                "pg_dump -h {} -p {} -U postgres postgres | gzip -6 > {}",
                src.pg_socket().display(),
                db::PORT,
                tmp.join("dump.sql.gz").display()
            ),
            Job::Pull => format!(
                "curl -sf http://127.0.0.1:{}/{ARCHIVE} | tar -xzOf - > /dev/null",
                src.web_port()
            ),
            Job::Etl => format!(
                "psql -h {} -p {} -U postgres -At -F, -c 'SELECT aid, bid, abalance, filler FROM pgbench_accounts' postgres \
                 | awk -F, '{{ s[$2] += $3; n += length($4) }} END {{ for (b in s) print b, s[b]; print n }}' > /dev/null",
                src.pg_socket().display(),
                db::PORT
            ),
        };
        format!(
            "read go; while :; do {body}; echo >> {}; done",
            count.display()
        )
    }
}

/// The modes the fetch scenario runs unless told otherwise.
pub const MODES: [Mode; 4] = [
    Mode::Unloaded,
    Mode::Unmanaged,
    Mode::BatchCgroupIdle,
    Mode::Appease,
];

/// The archive nginx serves for the pull job.
const ARCHIVE: &str = "archive.tar.gz";
const DB_RATE: f64 = 100.0;
const WEB_RATE: f64 = 2000.0;

/// The servers running for one case: the measured one and the jobs' sources.
struct Sources {
    pg: Option<db::Postgres>,
    web: Option<(client::Target, client::Protocol)>,
}

impl Sources {
    fn pg_socket(&self) -> PathBuf {
        self.pg
            .as_ref()
            .expect("started for the job")
            .socket_dir
            .clone()
    }

    fn web_port(&self) -> u16 {
        match self.web.as_ref().expect("started for the job").0 {
            client::Target::Tcp(a) => a.port(),
            client::Target::Unix(_) => unreachable!("nginx listens on TCP"),
        }
    }
}

/// One mode in one round.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Round {
    #[serde(flatten)]
    pub measured: Measured,
    /// The job's iterations completed per minute of the measurement.
    pub jobs_per_min: f64,
}

/// One mode over every round: medians.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModeSummary {
    pub mode: Mode,
    #[serde(flatten)]
    pub median: Measured,
    pub jobs_per_min: f64,
    /// Iterations against unmanaged's, percent.
    pub batch_pct: Option<f64>,
    /// p99 against the job in an idle group by hand.
    pub p99_vs_by_hand: Option<f64>,
    pub rounds: Vec<Round>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Case {
    pub server: Server,
    pub job: Job,
    pub server_description: String,
    pub job_description: String,
    pub measure_s: f64,
    pub modes: Vec<ModeSummary>,
}

pub type FetchResult = Cases<Case>;

impl Case {
    /// The case's figures in `mode`, if it ran.
    pub fn mode(&self, mode: Mode) -> Option<&ModeSummary> {
        self.modes.iter().find(|m| m.mode == mode)
    }
}

impl CaseTable for Case {
    fn table(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "fetch, {} beside {}\nserver: {}\njob: {}\n{} rounds of {} s, modes interleaved\n",
            self.job.name(),
            self.server.name(),
            self.server_description,
            self.job_description,
            self.modes.first().map_or(0, |m| m.rounds.len()),
            self.measure_s
        ));
        out.push_str(&format!(
            "{:<18}{} {:>13} {:>10} {:>8} {:>12}\n",
            "mode",
            Measured::LATENCY_HEADINGS,
            "jobs/minute",
            "job CPUs",
            "batch %",
            "p99/by hand"
        ));
        for m in &self.modes {
            let opt =
                |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |x| format!("{x:.prec$}"));
            out.push_str(&format!(
                "{:<18}{} {:>13.1} {:>10.2} {:>8} {:>12}\n",
                m.mode.name(),
                m.median.latency_columns(),
                m.jobs_per_min,
                m.median.batch_cpus,
                opt(m.batch_pct, 1),
                opt(m.p99_vs_by_hand, 2)
            ));
        }
        out.push_str("(medians over the rounds; by hand: the job's loop in a top-level idle group, batch-cgroup-idle)\n\n");
        out
    }
}

fn summarise(modes: &[Mode], runs: Vec<Vec<Round>>) -> Vec<ModeSummary> {
    let mut out: Vec<ModeSummary> = modes
        .iter()
        .zip(runs)
        .filter(|(_, r)| !r.is_empty())
        .map(|(&mode, rounds)| ModeSummary {
            mode,
            median: Measured::median(rounds.iter().map(|r| &r.measured)),
            jobs_per_min: crate::report::median_of(rounds.iter().map(|r| r.jobs_per_min).collect()),
            batch_pct: None,
            p99_vs_by_hand: None,
            rounds,
        })
        .collect();
    let of = |m: Mode, out: &[ModeSummary]| out.iter().find(|s| s.mode == m).cloned();
    let unmanaged = of(Mode::Unmanaged, &out).map(|s| s.jobs_per_min);
    let by_hand = of(Mode::BatchCgroupIdle, &out).map(|s| s.median.p99_ms);
    for m in &mut out {
        if m.mode == Mode::Unloaded {
            continue;
        }
        m.batch_pct = unmanaged
            .filter(|&u| u > 0.0)
            .map(|u| 100.0 * m.jobs_per_min / u);
        m.p99_vs_by_hand = by_hand.filter(|&b| b > 0.0).map(|b| m.median.p99_ms / b);
    }
    out
}

/// A file of varied text lines, `bytes` long: compresses about as well as logs or SQL.
fn varied_text(bytes: usize) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "account",
        "balance",
        "branch",
        "teller",
        "history",
        "update",
        "select",
        "insert",
        "commit",
        "delta",
        "filler",
        "row",
        "index",
        "value",
        "total",
        "2026-11-28",
    ];
    let mut out = Vec::with_capacity(bytes + 64);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut line = 0u64;
    while out.len() < bytes {
        line += 1;
        out.extend_from_slice(format!("{line} ").as_bytes());
        for _ in 0..8 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.extend_from_slice(WORDS[(x % 16) as usize].as_bytes());
            out.extend_from_slice(format!(" {} ", x % 100_000).as_bytes());
        }
        out.push(b'\n');
    }
    out
}

/// Writes the pull job's archive into nginx's root: 8 files of 5 MB of varied text.
fn make_archive(tmp: &Path) -> Result<()> {
    let src = tmp.join("archive-src");
    std::fs::create_dir_all(&src)?;
    for i in 0..8 {
        std::fs::write(src.join(format!("part-{i}.log")), varied_text(5 << 20))?;
    }
    let status = Command::new("tar")
        .arg("-czf")
        .arg(tmp.join("www").join(ARCHIVE))
        .arg("-C")
        .arg(&src)
        .arg(".")
        .status()
        .context("running tar")?;
    if !status.success() {
        bail!("tar could not make the pull job's archive ({status})");
    }
    std::fs::remove_dir_all(&src)?;
    Ok(())
}

fn check_tools(opts: &Options) -> Result<()> {
    let mut need: Vec<(&str, &str)> = vec![("bash", "bash"), ("gzip", "gzip"), ("tar", "tar")];
    if opts.fetch_jobs.iter().any(|j| j.needs_postgres())
        || opts.fetch_servers.contains(&Server::Db)
    {
        need.extend([
            ("pg_dump", "postgresql-client"),
            ("psql", "postgresql-client"),
            ("awk", "mawk"),
        ]);
    }
    if opts.fetch_jobs.contains(&Job::Pull) || opts.fetch_servers.contains(&Server::Web) {
        need.push(("curl", "curl"));
    }
    for (program, package) in need {
        if !crate::on_path(program) {
            bail!("the fetch scenario needs {program}, which is not installed: apt-get install {package}");
        }
    }
    for &m in &opts.modes {
        if !MODES.contains(&m) && !Mode::TRIED.contains(&m) {
            bail!(
                "mode {} does not apply to the fetch scenario; its modes are {}",
                m.name(),
                MODES
                    .iter()
                    .chain(&Mode::TRIED)
                    .map(|m| m.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    Ok(())
}

/// Runs the scenario: every job beside every server, the modes interleaved round by round.
pub fn run(opts: &Options) -> Result<FetchResult> {
    check_tools(opts)?;
    let measure_s = opts.seconds.unwrap_or(if opts.quick { 5.0 } else { 20.0 });
    let rounds = opts.repeat.max(1);
    let modes = opts.modes.clone();
    let mut cases = Vec::new();
    for &server in &opts.fetch_servers {
        for &job in &opts.fetch_jobs {
            // The servers live for the whole case, in a directory of their own (each mode's
            // run has the bench's usual one, removed after it).
            let mut case_run = Run::default();
            // Checked as the bench's own before anything in it is removed.
            let stale = crate::run::private_tmp(crate::run::FETCH_TMP)?;
            let _stale = std::fs::remove_dir_all(stale);
            let tmp = crate::run::private_tmp(crate::run::FETCH_TMP)?;
            case_run.tmp = Some(tmp.clone());
            eprintln!(
                "[{} beside {}] starting the servers ...",
                job.name(),
                server.name()
            );
            let pg = (server == Server::Db || job.needs_postgres())
                .then(|| db::start(&mut case_run, &tmp, None))
                .transpose()?;
            let web = (server == Server::Web || job == Job::Pull)
                .then(|| web::start(&mut case_run, &tmp, None))
                .transpose()?;
            if job == Job::Pull {
                make_archive(&tmp)?;
            }
            let src = Sources { pg, web };
            let runs = interleaved(&modes, rounds, &opts.stop, |slot| {
                eprintln!(
                    "[{} beside {}, {}] {}, {measure_s} s ...",
                    job.name(),
                    server.name(),
                    slot.progress(),
                    slot.mode.name(),
                );
                let r = run_mode(opts, server, job, &src, slot.mode, &tmp, measure_s)?;
                eprintln!(
                    "    p99 {:.3} ms, p50 {:.3} ms; {:.1} jobs/minute on {:.2} CPUs",
                    r.measured.p99_ms, r.measured.p50_ms, r.jobs_per_min, r.measured.batch_cpus
                );
                Ok(r)
            })?;
            let summaries = summarise(&modes, runs);
            drop(case_run);
            if summaries.is_empty() {
                break;
            }
            cases.push(Case {
                server,
                job,
                server_description: server.describe().into(),
                job_description: job.describe().into(),
                measure_s,
                modes: summaries,
            });
        }
    }
    Ok(FetchResult {
        scenario: "fetch".into(),
        cases,
    })
}

/// Requests to the measured server for `duration`: (p50, p99) in ms.
fn measure(
    server: Server,
    src: &Sources,
    duration: Duration,
    stop: &Arc<AtomicBool>,
) -> Result<(f64, f64)> {
    let r = match server {
        Server::Db => src
            .pg
            .as_ref()
            .expect("started")
            .run(DB_RATE, duration, stop)?,
        Server::Web => {
            let (target, protocol) = src.web.as_ref().expect("started");
            client::open_loop(
                target,
                protocol,
                client::Arrivals::Fixed,
                WEB_RATE,
                duration,
                Duration::from_secs(2),
                stop,
            )?
        }
    };
    let ms = |q: f64| r.latency_us.value_at_quantile(q) as f64 / 1000.0;
    Ok((ms(0.5), ms(0.99)))
}

fn lines(path: &Path) -> usize {
    std::fs::read(path).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count())
}

/// The job's loop, in a session of its own (no terminal), waiting for its go.
fn spawn_job(job: Job, src: &Sources, count: &Path, tmp: &Path) -> Result<Child> {
    let mut cmd = Command::new("bash");
    cmd.args(["-c", &job.script(src, count, tmp)])
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe and touches only the child.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::setsid();
            Ok(())
        });
    }
    cmd.spawn().context("starting the job's loop (bash)")
}

fn run_mode(
    opts: &Options,
    server: Server,
    job: Job,
    src: &Sources,
    mode: Mode,
    tmp: &Path,
    measure_s: f64,
) -> Result<Round> {
    let mut run = Run::default();
    let count = tmp.join("count");
    let _fresh = std::fs::remove_file(&count);
    let mut go = None;
    let mut root = None;
    if mode != Mode::Unloaded {
        let mut c = spawn_job(job, src, &count, tmp)?;
        root = Some(c.id());
        go = c.stdin.take();
        run.children.push(c);
    }
    let roots: Vec<u32> = root.into_iter().collect();
    match mode {
        Mode::Unloaded | Mode::Unmanaged => {}
        Mode::BatchCgroupIdle => crate::into_idle_group(&mut run, &roots)?,
        Mode::BatchCgroupLow => crate::into_low_group(&mut run, &roots)?,
        Mode::Appease => crate::start_daemon(&mut run, opts, None)?,
        other => bail!("mode {} does not apply to the fetch scenario", other.name()),
    }
    if let Some(mut go) = go {
        // Every child the loop starts from now on inherits the mode's placement.
        std::io::Write::write_all(&mut go, b"go\n").context("starting the job")?;
    }
    warm_up(opts, server, src, mode, &roots)?;
    let (t0, cpu0, n0) = (Instant::now(), crate::tree_cpu_ns(&roots), lines(&count));
    let (p50, p99) = measure(server, src, Duration::from_secs_f64(measure_s), &opts.stop)?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = crate::tree_cpu_ns(&roots).saturating_sub(cpu0);
    let done = lines(&count).saturating_sub(n0);
    if mode != Mode::Unloaded && lines(&count) == 0 {
        bail!(
            "the {} job completed no iteration: run its loop by hand to see why: {}",
            job.name(),
            job.script(src, &count, tmp)
        );
    }
    Ok(Round {
        measured: Measured {
            p99_ms: p99,
            p50_ms: p50,
            batch_cpus: cpu as f64 / 1e9 / secs,
        },
        jobs_per_min: done as f64 * 60.0 / secs,
    })
}

/// The job runs while the host settles; for appease, until the daemon has demoted the
/// job's loop, and a scan more.
fn warm_up(opts: &Options, server: Server, src: &Sources, mode: Mode, roots: &[u32]) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| -> Result<()> {
        let load = s.spawn(|| measure(server, src, Duration::from_secs(3600), &stop));
        let t = Instant::now();
        std::thread::sleep(Duration::from_secs(2));
        let mut result = Ok(());
        if mode == Mode::Appease && !roots.is_empty() {
            result = crate::synthetic::await_demotion(opts, roots, "the job's loop", t);
            if result.is_ok() {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        stop.store(true, Ordering::Relaxed);
        let _warmup_figures_unused = load.join();
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(p99: f64, jobs: f64) -> Round {
        Round {
            measured: Measured {
                p99_ms: p99,
                p50_ms: p99 / 4.0,
                batch_cpus: 1.0,
            },
            jobs_per_min: jobs,
        }
    }

    #[test]
    fn summaries_are_medians_against_unmanaged_and_by_hand() {
        let modes = [
            Mode::Unloaded,
            Mode::Unmanaged,
            Mode::BatchCgroupIdle,
            Mode::Appease,
        ];
        let runs = vec![
            vec![round(0.6, 0.0), round(0.7, 0.0), round(0.5, 0.0)],
            vec![round(9.0, 40.0), round(3.0, 44.0), round(5.0, 42.0)],
            vec![round(1.0, 38.0), round(1.2, 40.0), round(0.8, 39.0)],
            vec![round(1.1, 41.0), round(1.3, 39.0), round(1.2, 40.0)],
        ];
        let s = summarise(&modes, runs);
        assert_eq!(s[1].median.p99_ms, 5.0);
        assert_eq!(s[1].jobs_per_min, 42.0);
        assert_eq!(s[0].batch_pct, None, "unloaded has no batch");
        let appease = &s[3];
        assert_eq!(appease.median.p99_ms, 1.2);
        assert!((appease.p99_vs_by_hand.unwrap() - 1.2).abs() < 1e-9);
        assert!((appease.batch_pct.unwrap() - 100.0 * 40.0 / 42.0).abs() < 1e-9);
    }

    #[test]
    fn servers_and_jobs_round_trip_and_the_unknown_are_named() {
        for s in Server::ALL {
            assert_eq!(Server::parse(s.name()).unwrap(), s);
        }
        for j in Job::ALL {
            assert_eq!(Job::parse(j.name()).unwrap(), j);
        }
        assert!(Job::parse("backup")
            .unwrap_err()
            .to_string()
            .contains("dump, pull, etl"));
        assert!(Server::parse("redis")
            .unwrap_err()
            .to_string()
            .contains("db, web"));
    }

    #[test]
    fn the_archive_text_compresses_like_logs_not_like_noise_or_zeros() {
        use std::io::Write;
        let text = varied_text(1 << 20);
        let mut gzip = Command::new("gzip")
            .arg("-6")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // Fed from a thread: gzip's output fills its pipe long before its input ends.
        let mut input = gzip.stdin.take().unwrap();
        let feeder = std::thread::spawn(move || input.write_all(&text).unwrap());
        let packed = gzip.wait_with_output().unwrap().stdout;
        feeder.join().unwrap();
        let text_len = 1 << 20;
        let ratio = text_len as f64 / packed.len() as f64;
        assert!((2.0..20.0).contains(&ratio), "compression ratio {ratio:.1}");
    }
}
