//! `appease bench`, `appease bench-plot` and the processes the bench starts.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use appease_bench::{fetch, nested, Mode, Options, Report};
use clap::Subcommand;

#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// synthetic, web, db, db-analytic, db-analytic-fresh, frames, pipeline, utilization, nested or fetch
    scenario: String,
    /// A short run (5 s per mode) for CI and a first look.
    #[arg(long)]
    quick: bool,
    /// Seconds measured per mode and round (default 30, 20 for utilization, 5 with --quick):
    /// longer runs put more requests under each percentile.
    #[arg(long, value_parser = parse_seconds)]
    seconds: Option<f64>,
    /// Print the result as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Also write result.json, result.csv and SVG plots (response-time CDFs, latency against load) into this directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Comma-separated subset of modes (default: all but the peer daemons; for --clients
    /// unmanaged, batch-cgroup-idle, appease). The peers, ananicy and system76-scheduler,
    /// run when installed; a missing one is named with how to get it, and the rest run.
    /// utilization's cases beside a server run batch-cgroup-idle, appease and the peers named.
    #[arg(long, value_delimiter = ',')]
    modes: Vec<String>,
    /// Batch jobs per CPU; several (e.g. 0,1,2,4,8) sweep.
    #[arg(long, value_delimiter = ',', default_value = "4")]
    load: Vec<f64>,
    /// Daemon config for the appease mode (default: the embedded one).
    #[arg(long)]
    config: Option<PathBuf>,
    /// synthetic: serve over a UNIX socket instead of TCP loopback.
    #[arg(long)]
    unix: bool,
    /// synthetic (TCP) and web: the server's loopback port (default: a free one).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    port: Option<u16>,
    /// How the client spaces requests: fixed (every 1/rate s) or poisson.
    #[arg(long, default_value = "fixed")]
    arrivals: String,
    /// The batch load: soak (CPU spinners counting work), compile (make -jN with gcc
    /// over a generated tree, in a loop; throughput in files compiled per second), script
    /// (a shell script with a `sleep` helper running N CPU-heavy children at a time, in
    /// rounds; throughput in children finished per second), mixed (spinner jobs of 1, 2 and
    /// 4 threads in turn: fairness per job) or docker (the spinners, each in a Docker
    /// container of a private engine the bench starts: needs docker.io).
    #[arg(long, default_value = "soak")]
    batch: String,
    /// Run every mode this many times, interleaved, and report each metric's median
    /// (default 1; 5 for a --clients sweep and fetch, 8 for nested, without --quick).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    repeat: Option<u32>,
    /// web and db: a closed-loop sweep instead of the open-loop run, the Staircase study's
    /// scalability test: a fixed amount of work by each number of clients (e.g.
    /// 2,4,8,16,32,64,128,256), with ab against nginx (new connections and keep-alive) or
    /// sysbench OLTP read-only and read-write against PostgreSQL.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    clients: Vec<u32>,
    /// The sweep's scalability base A in (T_B / T_A) / (B / A) (default: each mode's
    /// client count with the lowest completion time).
    #[arg(long, requires = "clients")]
    scale_base: Option<u32>,
    /// The sweep's work per run: requests (web, default 50,000) or transactions (db,
    /// default 5,000). Each run opens its clients' connections anew, so a larger amount
    /// weighs steady serving over connection set-up.
    #[arg(long, requires = "clients", value_parser = clap::value_parser!(u64).range(1..))]
    work: Option<u64>,
    /// A peer daemon's program, for the modes ananicy and system76-scheduler when it is
    /// not on the PATH: NAME=PATH (repeat or comma-separate).
    #[arg(long, value_delimiter = ',', value_parser = parse_peer_bin)]
    peer_bin: Vec<(String, PathBuf)>,
    /// nested: the host layouts built by hand in the cpu hierarchy, each beside a server in
    /// system.slice/server.service: systemd (soakers and a sleeping shell in a user's
    /// session scope), session (a sleeping shell and make -j in the scope), cron (a cron
    /// daemon and its job script in cron.service); NAME-limited adds a CPU quota of 1.9
    /// CPUs on user.slice (or cron.service), which keeps the batch in its group. Default:
    /// systemd and systemd-limited.
    #[arg(long, value_delimiter = ',')]
    shape: Vec<String>,
    /// nested: the servers measured (synthetic: the bench's own; redis: redis-server with
    /// redis-benchmark; postgresql: PostgreSQL with pgbench). fetch: db (PostgreSQL under pgbench), web (nginx under our
    /// client). Default: all of the scenario's.
    #[arg(long, value_delimiter = ',')]
    server: Vec<String>,
    /// fetch: the batch jobs, each a loop that reads its input from a server: dump
    /// (pg_dump | gzip), pull (curl of an archive | tar -xz), etl (psql query | awk).
    /// Default: all three.
    #[arg(long, value_delimiter = ',')]
    job: Vec<String>,
}

/// `--peer-bin NAME=PATH` with NAME a peer mode.
fn parse_peer_bin(s: &str) -> std::result::Result<(String, PathBuf), String> {
    let (name, path) = s.split_once('=').ok_or_else(|| {
        format!("{s:?}: expected NAME=PATH, e.g. ananicy=/opt/ananicy/usr/bin/ananicy")
    })?;
    let peers: Vec<&str> = appease_bench::Mode::PEERS
        .iter()
        .map(|m| m.name())
        .collect();
    if !peers.contains(&name) {
        return Err(format!(
            "{name:?} is not a peer daemon; peers are {}",
            peers.join(", ")
        ));
    }
    Ok((name.to_string(), PathBuf::from(path)))
}

#[derive(Subcommand)]
pub(crate) enum Worker {
    Server {
        #[arg(long)]
        cpu_ms: f64,
        /// Listen on this UNIX socket instead of TCP loopback.
        #[arg(long)]
        unix: Option<PathBuf>,
        /// TCP loopback port (0: a free one).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Process name (comm) to run under.
        #[arg(long, default_value = "bench-server")]
        name: String,
        /// Call another server per request: SOCKET=TIMES (repeatable).
        #[arg(long)]
        call: Vec<appease_bench::worker::Call>,
    },
    Soak {
        /// Process name (comm) to run under.
        #[arg(long, default_value = "bench-soaker")]
        name: String,
        /// Spinning threads (a job of this size).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
        threads: u32,
    },
    /// A parallel C compile in a loop (starts after a line on stdin).
    Compile {
        /// Where to generate the sources.
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        jobs: usize,
    },
    /// A shell script with an idle helper running CPU-heavy children, `jobs` at a time,
    /// in rounds (starts after a line on stdin).
    Script {
        #[arg(long)]
        jobs: usize,
    },
    /// One CPU-heavy child of the script load: a fixed amount of work, then exit.
    Burn {
        #[arg(long)]
        units: u64,
    },
}

pub(crate) fn plot(dir: &Path) -> Result<()> {
    let (report, _) = read_result(&dir.join("result.json"))?;
    for (name, svg) in plots_of(&report)? {
        std::fs::write(dir.join(&name), svg)?;
        println!("wrote {}", dir.join(name).display());
    }
    Ok(())
}

/// A result file's report, as the run that wrote it had it, and when and how it was
/// measured (None in a file written before appease kept that).
pub(crate) fn read_result(path: &Path) -> Result<(Report, Option<Measured>)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let measured = Measured::of(&value);
    let what = value.get("scenario").and_then(|s| s.as_str()).unwrap_or("");
    fn parse<T: serde::de::DeserializeOwned>(v: serde_json::Value, path: &Path) -> Result<T> {
        serde_json::from_value(v)
            .with_context(|| format!("{} is no bench result.json", path.display()))
    }
    let report = match what {
        _ if value.get("client_loop").is_some() => Report::ClosedLoop(parse(value, path)?),
        "utilization" => Report::Utilization(parse(value, path)?),
        "nested" => Report::Nested(parse(value, path)?),
        "fetch" => Report::Fetch(parse(value, path)?),
        // One batch level is one object; a --load sweep keeps every level under "sweep".
        _ => Report::Latency(match value.get("sweep") {
            Some(sweep) => parse(sweep.clone(), path)?,
            None => vec![parse(value, path)?],
        }),
    };
    Ok((report, measured))
}

/// Prints result files as docs/RESULTS.md shows them: the client sweeps' files as one set
/// of Markdown tables over them all; any other run's file as the command and the date that
/// made it, then the table the bench printed at its end.
pub(crate) fn table(files: &[PathBuf]) -> Result<()> {
    let reports = files
        .iter()
        .map(|path| Ok((path, read_result(path)?)))
        .collect::<Result<Vec<_>>>()?;
    let sweeps: Vec<_> = reports
        .iter()
        .filter_map(|(_, (r, _))| match r {
            Report::ClosedLoop(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    if sweeps.len() == reports.len() {
        print!("{}", appease_bench::markdown::closed_loop(&sweeps));
        return Ok(());
    }
    if !sweeps.is_empty() {
        bail!("a client sweep's result file is shown only with other client sweeps' files");
    }
    for (i, (path, (report, measured))) in reports.into_iter().enumerate() {
        let measured = Measured::required(measured, path)?;
        if i > 0 {
            println!();
        }
        // Wrapped as the page's prose is (a code span may go on over a line's end).
        let made_by = format!("`{}` ({}):", measured.command, measured.date);
        println!("{}\n", appease_bench::markdown::wrap(&made_by));
        match report {
            Report::Latency(results) if results.len() > 1 => {
                print!("{}", appease_bench::markdown::load_sweep(&results))
            }
            Report::Latency(results) => {
                let tables: Vec<String> = results
                    .iter()
                    .map(appease_bench::markdown::scenario)
                    .collect();
                print!("{}", tables.join("\n"));
            }
            Report::Fetch(r) => print!("{}", appease_bench::markdown::fetch(&r)),
            Report::Utilization(r) => print!("{}", appease_bench::markdown::utilization(&r)),
            // The bench's own text table, as it printed it.
            other => println!("```\n{}\n```", Output::of(other, false)?.table.trim_end()),
        }
    }
    Ok(())
}

/// When a run was made and by what command, as its result.json keeps them.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Measured {
    /// The day (UTC), YYYY-MM-DD.
    pub date: String,
    /// `appease bench ...` as given, without where its files went.
    pub command: String,
}

impl Measured {
    /// This run's.
    fn now() -> Self {
        let mut args = std::env::args().skip(1);
        let mut words = vec!["appease".to_string()];
        while let Some(a) = args.next() {
            match a.as_str() {
                "--out" => {
                    args.next();
                }
                "--json" => {}
                _ if a.starts_with("--out=") => {}
                _ => words.push(a),
            }
        }
        Measured {
            date: time::OffsetDateTime::now_utc().date().to_string(),
            command: words.join(" "),
        }
    }

    fn of(value: &serde_json::Value) -> Option<Self> {
        serde_json::from_value(value.get("measured")?.clone()).ok()
    }

    /// `measured` of the file at `path`, or the error that names it.
    pub fn required(measured: Option<Self>, path: &Path) -> Result<Self> {
        measured.with_context(|| {
            format!(
                "{} does not say when and how it was measured (written by an older appease): run its command again with --out",
                path.display()
            )
        })
    }
}

/// `--seconds`: a positive duration of at most an hour.
fn parse_seconds(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 3600.0 => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds within (0, 3600]")),
    }
}

/// Runs a bench scenario and prints (and with `--out`, writes) its results.
pub(crate) fn run(args: BenchArgs) -> Result<()> {
    if let Some(code) = crate::own_group::rerun_in_own_group()? {
        // The child said what there was to say.
        std::process::exit(code);
    }
    let (json, out) = (args.json, args.out.clone());
    let opts = options(args)?;
    refuse_beside_a_daemon()?;
    let exe = std::env::current_exe().context("finding the appease binary")?;
    // Kept to the end: its pipe's closing tells the guardian the bench has gone.
    let _guardian = appease_bench::guard::start(&exe)?;
    let mut output = Output::of(appease_bench::run(&opts)?, out.is_some())?;
    if let Some(fields) = output.value.as_object_mut() {
        fields.insert("measured".into(), serde_json::to_value(Measured::now())?);
    }
    if let Some(dir) = &out {
        output.write(dir)?;
    }
    if json {
        println!("{}", serde_json::to_string(&output.value)?);
    } else {
        println!("{}", output.table);
    }
    Ok(())
}

/// A daemon acting on the host would manage the bench's servers and batch in every mode,
/// unmanaged and by hand included: no figure would be what it says. One in its last
/// moments (exiting) is waited for.
fn refuse_beside_a_daemon() -> Result<()> {
    let acting = appease_daemon::RunLock::acting_daemons(std::time::Duration::from_secs(10));
    let Some((group, pid)) = acting.first() else {
        return Ok(());
    };
    let (whose, stop) = match pid.and_then(appease_bench::guard::bench_of) {
        Some(bench) => (
            format!("the daemon of another appease bench (pid {bench})"),
            "let that bench end, or stop it",
        ),
        None => (
            "an appease daemon".to_string(),
            "stop it first (systemctl stop appease)",
        ),
    };
    let pid = pid.map_or("unknown".to_string(), |p| p.to_string());
    bail!(
        "{whose} is running (pid {pid}, idle group /{group}): it would manage this bench's \
         servers and batch in every mode, unmanaged and by hand included; {stop}"
    )
}

/// The bench's options from the command line, each checked.
fn options(args: BenchArgs) -> Result<Options> {
    let BenchArgs {
        scenario,
        quick,
        seconds,
        json: _,
        out: _,
        modes,
        load,
        config,
        unix,
        port,
        arrivals,
        batch,
        repeat,
        clients,
        scale_base,
        work,
        peer_bin,
        shape,
        server,
        job,
    } = args;
    check_scenario_options(&scenario, &shape, &server, &job)?;
    let fetch = scenario == "fetch";
    let (fetch_servers, fetch_jobs) = match fetch {
        true => (
            parsed(&server, &fetch::Server::ALL, fetch::Server::parse)?,
            parsed(&job, &fetch::Job::ALL, fetch::Job::parse)?,
        ),
        false => (Vec::new(), Vec::new()),
    };
    let shapes = parsed(&shape, &nested::Shape::ALL[..2], nested::Shape::parse)?;
    let nested_servers: &[String] = if scenario == "nested" { &server } else { &[] };
    let servers = parsed(nested_servers, &nested::Server::ALL, nested::Server::parse)?;
    let repeat = repeat.unwrap_or(match () {
        // The nested shapes' rounds are slow or not as a whole: count them over eight.
        _ if scenario == "nested" && !quick => 8,
        _ if fetch && !quick => 5,
        _ if clients.is_empty() || quick => 1,
        _ => 5,
    });
    if let Some(c) = &config {
        appease_config::Config::load(c)?;
    }
    let modes = modes_of(&scenario, &modes, !clients.is_empty())?;
    if let Some(bad) = load.iter().find(|l| !(**l >= 0.0 && **l <= 64.0)) {
        bail!("--load {bad}: batch jobs per CPU must be within 0..=64");
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    Ok(Options {
        scenario,
        quick,
        seconds,
        modes,
        loads: load,
        appease: std::env::current_exe().context("finding the appease binary")?,
        config,
        unix,
        port,
        arrivals: appease_bench::client::Arrivals::parse(&arrivals)?,
        batch: appease_bench::Batch::parse(&batch)?,
        repeat: repeat as usize,
        stop,
        clients,
        scale_base,
        work,
        peer_bins: peer_bin,
        shapes,
        servers,
        fetch_servers,
        fetch_jobs,
    })
}

/// `--shape`, `--server` and `--job` only where the scenario takes them.
fn check_scenario_options(
    scenario: &str,
    shape: &[String],
    server: &[String],
    job: &[String],
) -> Result<()> {
    if scenario != "nested" && !shape.is_empty() {
        bail!("--shape applies to the nested scenario only");
    }
    if !matches!(scenario, "nested" | "fetch") && !server.is_empty() {
        bail!("--server applies to the nested and fetch scenarios only");
    }
    if scenario != "fetch" && !job.is_empty() {
        bail!("--job applies to the fetch scenario only");
    }
    Ok(())
}

/// `given` parsed one by one, or `default` when none is given.
fn parsed<T: Clone>(
    given: &[String],
    default: &[T],
    parse: impl Fn(&str) -> Result<T>,
) -> Result<Vec<T>> {
    match given.is_empty() {
        true => Ok(default.to_vec()),
        false => given.iter().map(|s| parse(s)).collect(),
    }
}

/// The modes asked for, or the scenario's own.
fn modes_of(scenario: &str, given: &[String], sweep: bool) -> Result<Vec<Mode>> {
    if !given.is_empty() {
        return given.iter().map(|m| Mode::parse(m)).collect();
    }
    Ok(match scenario {
        // The sweep's question: appease against doing nothing and the best manual setup.
        _ if sweep => vec![Mode::Unmanaged, Mode::BatchCgroupIdle, Mode::Appease],
        "nested" => nested::MODES.to_vec(),
        "fetch" => fetch::MODES.to_vec(),
        _ => Mode::ALL.to_vec(),
    })
}

/// What a run prints and writes: its JSON, its table, its CSV and its plots.
struct Output {
    value: serde_json::Value,
    table: String,
    csv: Option<String>,
    plots: Vec<(String, String)>,
}

impl Output {
    /// `plots`: draw the plots (they are only written, with `--out`).
    fn of(report: Report, plots: bool) -> Result<Self> {
        let plots = match plots {
            true => plots_of(&report)?,
            false => Vec::new(),
        };
        let (value, table, csv) = match report {
            Report::Latency(results) => (
                match results.as_slice() {
                    [one] => serde_json::to_value(one)?,
                    many => serde_json::json!({
                        "scenario": many.first().map(|r| r.scenario.clone()),
                        "modes": many.first().map(|r| r.modes.clone()),
                        "sweep": many,
                    }),
                },
                results
                    .iter()
                    .map(|r| r.table())
                    .collect::<Vec<_>>()
                    .join("\n"),
                Some(appease_bench::report::csv(&results)),
            ),
            Report::Utilization(u) => (serde_json::to_value(&u)?, u.table(), None),
            Report::ClosedLoop(r) => (serde_json::to_value(&r)?, r.table(), Some(r.csv())),
            Report::Nested(r) => (serde_json::to_value(&r)?, r.table(), None),
            Report::Fetch(r) => (serde_json::to_value(&r)?, r.table(), None),
        };
        Ok(Output {
            value,
            table,
            csv,
            plots,
        })
    }

    /// result.json, result.csv and the plots into `dir`.
    fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(
            dir.join("result.json"),
            serde_json::to_string_pretty(&self.value)?,
        )?;
        if let Some(csv) = &self.csv {
            std::fs::write(dir.join("result.csv"), csv)?;
        }
        for (name, svg) in &self.plots {
            std::fs::write(dir.join(name), svg)?;
            eprintln!("wrote {}", dir.join(name).display());
        }
        Ok(())
    }
}

/// The SVG plots of a report: (file name, SVG).
fn plots_of(report: &Report) -> Result<Vec<(String, String)>> {
    Ok(match report {
        Report::Latency(results) => appease_bench::plot::all(results)?,
        Report::Utilization(u) => vec![(
            "fairness.svg".to_string(),
            appease_bench::plot::fairness(u)?,
        )],
        Report::ClosedLoop(r) => appease_bench::plot::completion_vs_clients(r)?,
        Report::Nested(_) | Report::Fetch(_) => Vec::new(),
    })
}

/// Runs one of the processes the bench starts.
pub(crate) fn worker(worker: Worker) -> Result<()> {
    match worker {
        Worker::Server {
            cpu_ms,
            unix,
            port,
            name,
            call,
        } => {
            let cpu = std::time::Duration::from_secs_f64(cpu_ms / 1000.0);
            Ok(appease_bench::worker::serve(
                cpu,
                unix.as_deref(),
                port,
                &name,
                &call,
            )?)
        }
        Worker::Soak { name, threads } => Ok(appease_bench::worker::soak(&name, threads as usize)?),
        Worker::Compile { dir, jobs } => Ok(appease_bench::worker::compile(&dir, jobs)?),
        Worker::Script { jobs } => {
            let me = std::env::current_exe().context("finding appease's own binary")?;
            Ok(appease_bench::worker::script(&me, jobs)?)
        }
        Worker::Burn { units } => {
            appease_bench::worker::burn(units);
            Ok(())
        }
    }
}
