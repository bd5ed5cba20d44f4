//! `appease`: one binary, several commands.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

mod roles_cmd;
mod sim_cmd;
mod status_cmd;
mod top_cmd;

#[derive(Parser)]
#[command(
    name = "appease",
    version,
    about = "Keeps request-serving processes responsive while batch work soaks up the rest of the CPU"
)]
struct Cli {
    /// Log filter (error, warn, info, debug, trace, or tracing's directive syntax).
    #[arg(long, global = true, env = "APPEASE_LOG", default_value = "info")]
    log: String,
    /// Log lines as text, or as one JSON object each (for log collectors).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon in the foreground (root). SIGTERM/SIGINT restore and exit; SIGHUP reloads the config.
    Daemon {
        /// TOML config file; without it the embedded default config is used.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Watch and decide, but change nothing (decisions are logged and shown in status).
        #[arg(long)]
        dry_run: bool,
        /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9559); overrides [metrics] listen.
        #[arg(long, value_name = "ADDR")]
        metrics: Option<std::net::SocketAddr>,
    },
    /// Put back every priority a crashed daemon left changed (from its journal).
    Restore,
    /// Make the running daemon read its config again and say what changed (as SIGHUP does).
    Reload,
    /// Show what the running daemon manages and why.
    Status {
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A live view of what the running daemon changed and why (q quits, s sorts, f filters).
    Top {
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0, value_parser = parse_interval)]
        interval: f64,
        /// The column rows are ordered by at start.
        #[arg(long, value_enum, default_value_t = top_cmd::SortKey::Cpu)]
        sort: top_cmd::SortKey,
        /// Only rows of this class at start: latency, role, batch, service or all.
        #[arg(long)]
        class: Option<String>,
    },
    /// Check a config file and exit (0: valid).
    CheckConfig { file: PathBuf },
    /// Print a shell's completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// Print the man page (roff), as `make install` installs it.
    Manpage,
    /// Run a real server under real batch load in every mode, side by side (root).
    Bench(Box<BenchArgs>),
    /// Redraw the SVG plots of a bench run from the result.json in DIR (no root).
    BenchPlot { dir: PathBuf },
    /// The deterministic scheduler simulator with the 2010 customer-appeasement paper's unhappiness model.
    Sim {
        #[command(subcommand)]
        command: SimCommand,
    },
    /// Closed-form models.
    Model {
        #[command(subcommand)]
        command: ModelCommand,
    },
    /// Staggered fixed priorities for a multi-process application (the AIX case study).
    Roles {
        #[command(subcommand)]
        command: RolesCommand,
    },
    /// Processes the bench starts (server, soakers).
    #[command(hide = true)]
    BenchWorker {
        #[command(subcommand)]
        worker: Worker,
    },
}

#[derive(clap::Args)]
struct BenchArgs {
    /// synthetic, web, db, db-analytic, frames, pipeline, utilization, nested or fetch
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
    /// redis-benchmark). fetch: db (PostgreSQL under pgbench), web (nginx under our
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
enum SimCommand {
    /// Simulate a workload file under one policy.
    Run {
        file: PathBuf,
        /// rr, mlfq, o1, staircase, cfs, eevdf, cfs-rbpe or unhappiness (default: the file's).
        #[arg(long)]
        policy: Option<String>,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
        /// Also write report.json and requests.csv (one line per answered request) here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Simulate a workload file under every policy and print one table.
    Compare {
        file: PathBuf,
        #[arg(long)]
        json: bool,
        /// Also write compare.json and requests.csv here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The Staircase study's scalability test, simulated: the file's one closed-loop
    /// customer becomes N clients, each with an instance of its server, sharing a fixed
    /// number of requests; completion time, spreads and scalability per policy.
    Sweep {
        file: PathBuf,
        /// Client counts.
        #[arg(long, value_delimiter = ',', num_args = 1.., default_value = "2,4,8,16,32,64,128,256")]
        clients: Vec<u32>,
        /// Requests per run, shared by the clients.
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        requests: u64,
        /// Comma-separated policies (default: every policy).
        #[arg(long, value_delimiter = ',')]
        policies: Vec<String>,
        /// The scalability base A (default: each policy's fastest client count).
        #[arg(long)]
        scale_base: Option<u32>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ModelCommand {
    /// N processors contending for one lock (machine-repairman queue, exact MVA). Give
    /// --demand, or measurements (--rate, --hold-us, --wait-us) to compare with the model.
    Contention {
        #[arg(long)]
        cpus: u64,
        /// Share of time a processor would hold the lock if it were alone, percent.
        #[arg(long, conflicts_with_all = ["rate", "hold_us", "wait_us"], required_unless_present = "rate")]
        demand: Option<f64>,
        /// Measured lock acquisitions per second, all processors together.
        #[arg(long, requires_all = ["hold_us", "wait_us"])]
        rate: Option<f64>,
        /// Measured mean hold time, µs.
        #[arg(long)]
        hold_us: Option<f64>,
        /// Measured mean wait (queueing only), µs.
        #[arg(long)]
        wait_us: Option<f64>,
        #[arg(long)]
        json: bool,
    },
    /// the 2010 customer-appeasement paper's closed forms (eqs. 6–27): the unhappiness one request causes under
    /// round robin, feedback queues, CFS and CFS with request-based elevation.
    Unhappiness {
        /// N: runnable processes, the server included.
        #[arg(long, default_value_t = 5)]
        processes: u32,
        /// q: round-robin quantum, base quantum of the feedback queues.
        #[arg(long, default_value_t = 10.0)]
        quantum_ms: f64,
        /// CFS's sched_latency.
        #[arg(long, default_value_t = 20.0)]
        sched_latency_ms: f64,
        /// τ of the one-request scenario.
        #[arg(long, default_value_t = 30.0)]
        request_ms: f64,
        /// τ1,τ2,τ3 of the service-call scenario.
        #[arg(long, value_delimiter = ',', default_value = "20,20,10")]
        tau_ms: Vec<f64>,
        /// RBPE's elevation level (1..=15).
        #[arg(long, default_value_t = 5)]
        nice: u32,
        /// a_0,a_1,…: processes in each feedback queue when the request arrives, the
        /// server included (default: the server alone).
        #[arg(long, value_delimiter = ',')]
        queues: Vec<u32>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum RolesCommand {
    /// Propose ranks from observed per-call CPU shares and invocation counts (TOML).
    Suggest {
        /// Observations: `critical = NAME` and [[process]] name, share_pct, invocations.
        file: PathBuf,
        /// Application name for the generated [[role]] entries.
        #[arg(long, default_value = "app")]
        app: String,
        /// Nice of rank 0 (each rank below is one more).
        #[arg(long, default_value_t = -5, allow_hyphen_values = true)]
        top_nice: i32,
    },
}

#[derive(Subcommand)]
enum Worker {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log_writer = init_logging(&cli.log, cli.log_format);
    let result = run(cli.command);
    // What is still queued is written before the error, if any.
    drop(log_writer);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that went away (`appease manpage | head`): nothing left to say.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // Not eprintln!: it panics when stderr cannot be written (a full disk).
            let _unwritable = writeln!(std::io::stderr(), "appease: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A refresh interval: a positive number of seconds, at least a tenth of one.
fn parse_interval(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && (0.1..=3600.0).contains(&s) => Ok(s),
        _ => Err(format!("{text:?}: seconds between 0.1 and 3600")),
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Logs go to stderr through a background writer: a slow reader (journald under load, a
/// terminal scrolled back) never blocks the event loop; lines are dropped instead, when
/// more than its queue holds wait.
/// Writes what the log queued when dropped.
struct LogFlush;

impl Drop for LogFlush {
    fn drop(&mut self) {
        appease_daemon::log_writer::flush();
    }
}

fn init_logging(filter: &str, format: LogFormat) -> LogFlush {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(appease_daemon::log_writer::LogWriter)
        // Colour only on a terminal: journald and log files get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        // A log that cannot be written (stderr to a file on a full disk) must not end the
        // daemon: tracing-subscriber would report it with eprintln!, which panics then.
        .log_internal_errors(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
    LogFlush
}

fn run(cmd: Command) -> Result<()> {
    match cmd {
        Command::Daemon {
            config,
            dry_run,
            metrics,
        } => daemon(config, dry_run, metrics),
        Command::Reload => status_cmd::reload(&appease_daemon::run_dir()),
        Command::Restore => restore(),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "appease",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Manpage => {
            use clap::CommandFactory;
            clap_mangen::Man::new(Cli::command())
                .section("8")
                .render(&mut std::io::stdout())
                .context("writing the man page")
        }
        Command::Status { json } => status_cmd::show(&appease_daemon::run_dir(), json),
        Command::Top {
            interval,
            sort,
            class,
        } => top_cmd::run(
            &appease_daemon::run_dir(),
            Duration::from_secs_f64(interval),
            sort,
            class,
        ),
        Command::Bench(args) => bench(*args),
        Command::Sim {
            command:
                SimCommand::Run {
                    file,
                    policy,
                    json,
                    out,
                },
        } => sim_cmd::run(&file, policy.as_deref(), json, out.as_deref()),
        Command::Sim {
            command: SimCommand::Compare { file, json, out },
        } => sim_cmd::compare(&file, json, out.as_deref()),
        Command::Sim {
            command:
                SimCommand::Sweep {
                    file,
                    clients,
                    requests,
                    policies,
                    scale_base,
                    json,
                },
        } => sim_cmd::sweep(&file, &clients, requests, &policies, scale_base, json),
        Command::Model {
            command:
                ModelCommand::Contention {
                    cpus,
                    demand,
                    rate,
                    hold_us,
                    wait_us,
                    json,
                },
        } => contention(
            cpus,
            demand,
            rate.zip(hold_us).zip(wait_us).map(|((r, h), w)| (r, h, w)),
            json,
        ),
        Command::Model {
            command:
                ModelCommand::Unhappiness {
                    processes,
                    quantum_ms,
                    sched_latency_ms,
                    request_ms,
                    tau_ms,
                    nice,
                    queues,
                    json,
                },
        } => {
            let tau: [f64; 3] = tau_ms
                .as_slice()
                .try_into()
                .map_err(|_| appease_model::unhappiness::ParamError::Tau(tau_ms.len()))?;
            unhappiness(
                &appease_model::unhappiness::Params {
                    processes,
                    quantum_ms,
                    sched_latency_ms,
                    request_ms,
                    tau_ms: tau,
                    nice,
                    queues,
                },
                json,
            )
        }
        Command::Roles {
            command:
                RolesCommand::Suggest {
                    file,
                    app,
                    top_nice,
                },
        } => roles_cmd::suggest_cmd(&file, &app, top_nice),
        Command::BenchPlot { dir } => bench_plot(&dir),
        Command::BenchWorker { worker } => match worker {
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
            Worker::Soak { name, threads } => {
                Ok(appease_bench::worker::soak(&name, threads as usize)?)
            }
            Worker::Compile { dir, jobs } => Ok(appease_bench::worker::compile(&dir, jobs)?),
            Worker::Script { jobs } => {
                let me = std::env::current_exe().context("finding appease's own binary")?;
                Ok(appease_bench::worker::script(&me, jobs)?)
            }
            Worker::Burn { units } => {
                appease_bench::worker::burn(units);
                Ok(())
            }
        },
        Command::CheckConfig { file } => {
            appease_config::Config::load(&file)?;
            println!("{}: ok", file.display());
            Ok(())
        }
    }
}

fn daemon(
    config_path: Option<PathBuf>,
    dry_run: bool,
    metrics: Option<std::net::SocketAddr>,
) -> Result<()> {
    let mut config = match &config_path {
        Some(p) => appease_config::Config::load(p)?,
        None => appease_config::Config::embedded(),
    };
    if metrics.is_some() {
        config.metrics.listen = metrics;
    }
    let controls = appease_daemon::Controls::default();
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, controls.shutdown.clone())
            .context("installing signal handlers")?;
    }
    signal_hook::flag::register(signal_hook::consts::SIGHUP, controls.reload.clone())
        .context("installing signal handlers")?;
    appease_daemon::run(
        appease_daemon::DaemonOptions {
            config,
            config_path,
            dry_run,
            run_dir: appease_daemon::run_dir(),
        },
        controls,
    )
}

fn restore() -> Result<()> {
    appease_daemon::preflight()?;
    let dir = appease_daemon::run_dir();
    let _lock = appease_daemon::RunLock::acquire(&dir)
        .context("a running daemon restores by itself when stopped (SIGTERM); appease restore is for after a crash")?;
    let r = appease_daemon::restore_leftovers(&dir)?;
    println!(
        "restored {} thread(s); {} gone, {} changed by someone else since (left alone), {} failed",
        r.restored, r.gone, r.left_alone, r.failed
    );
    if r.failed > 0 {
        anyhow::bail!(
            "{} thread(s) could not be restored; the journal in {} keeps them",
            r.failed,
            dir.display()
        );
    }
    Ok(())
}

fn bench_plot(dir: &std::path::Path) -> Result<()> {
    let path = dir.join("result.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    if value.get("scenario").and_then(|s| s.as_str()) == Some("utilization") {
        let u: appease_bench::utilization::UtilizationResult =
            serde_json::from_value(value).with_context(|| format!("parsing {}", path.display()))?;
        let file = dir.join("fairness.svg");
        std::fs::write(&file, appease_bench::plot::fairness(&u)?)?;
        println!("wrote {}", file.display());
        return Ok(());
    }
    if value.get("client_loop").is_some() {
        let r: appease_bench::closed_loop::ClosedLoopResult =
            serde_json::from_value(value).with_context(|| format!("parsing {}", path.display()))?;
        for (name, svg) in appease_bench::plot::completion_vs_clients(&r)? {
            std::fs::write(dir.join(&name), svg)?;
            println!("wrote {}", dir.join(name).display());
        }
        return Ok(());
    }
    // One batch level is one object; a --load sweep keeps every level under "sweep".
    let results: Vec<appease_bench::report::ScenarioResult> = match value.get("sweep") {
        Some(sweep) => serde_json::from_value(sweep.clone()),
        None => serde_json::from_value(value).map(|r| vec![r]),
    }
    .with_context(|| format!("{} holds no latency results to plot", path.display()))?;
    for (name, svg) in appease_bench::plot::all(&results)? {
        std::fs::write(dir.join(&name), svg)?;
        println!("wrote {}", dir.join(name).display());
    }
    Ok(())
}

/// `--seconds`: a positive duration of at most an hour.
fn parse_seconds(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 3600.0 => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds within (0, 3600]")),
    }
}

fn bench(args: BenchArgs) -> Result<()> {
    let BenchArgs {
        scenario,
        quick,
        seconds,
        json,
        out,
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
        peer_bin,
        shape,
        server,
        job,
    } = args;
    if scenario != "nested" && !shape.is_empty() {
        anyhow::bail!("--shape applies to the nested scenario only");
    }
    if !matches!(scenario.as_str(), "nested" | "fetch") && !server.is_empty() {
        anyhow::bail!("--server applies to the nested and fetch scenarios only");
    }
    if scenario != "fetch" && !job.is_empty() {
        anyhow::bail!("--job applies to the fetch scenario only");
    }
    let (fetch_servers, fetch_jobs) = if scenario == "fetch" {
        let servers = if server.is_empty() {
            appease_bench::fetch::Server::ALL.to_vec()
        } else {
            server
                .iter()
                .map(|s| appease_bench::fetch::Server::parse(s))
                .collect::<Result<_>>()?
        };
        let jobs = if job.is_empty() {
            appease_bench::fetch::Job::ALL.to_vec()
        } else {
            job.iter()
                .map(|s| appease_bench::fetch::Job::parse(s))
                .collect::<Result<_>>()?
        };
        (servers, jobs)
    } else {
        (Vec::new(), Vec::new())
    };
    let shapes = if shape.is_empty() {
        appease_bench::nested::Shape::ALL[..2].to_vec()
    } else {
        shape
            .iter()
            .map(|s| appease_bench::nested::Shape::parse(s))
            .collect::<Result<_>>()?
    };
    let servers = if server.is_empty() || scenario != "nested" {
        appease_bench::nested::Server::ALL.to_vec()
    } else {
        server
            .iter()
            .map(|s| appease_bench::nested::Server::parse(s))
            .collect::<Result<_>>()?
    };
    let repeat = repeat.unwrap_or(match () {
        // The nested shapes' rounds are slow or not as a whole: count them over eight.
        _ if scenario == "nested" && !quick => 8,
        _ if scenario == "fetch" && !quick => 5,
        _ if clients.is_empty() || quick => 1,
        _ => 5,
    });
    let arrivals = appease_bench::client::Arrivals::parse(&arrivals)?;
    let batch = appease_bench::Batch::parse(&batch)?;
    if let Some(c) = &config {
        appease_config::Config::load(c)?;
    }
    let modes = if modes.is_empty() && !clients.is_empty() {
        // The sweep's question: appease against doing nothing and the best manual setup.
        use appease_bench::Mode::{Appease, BatchCgroupIdle, Unmanaged};
        vec![Unmanaged, BatchCgroupIdle, Appease]
    } else if modes.is_empty() && scenario == "nested" {
        appease_bench::nested::MODES.to_vec()
    } else if modes.is_empty() && scenario == "fetch" {
        appease_bench::fetch::MODES.to_vec()
    } else if modes.is_empty() {
        appease_bench::Mode::ALL.to_vec()
    } else {
        modes
            .iter()
            .map(|m| appease_bench::Mode::parse(m))
            .collect::<Result<_>>()?
    };
    if let Some(bad) = load.iter().find(|l| !(**l >= 0.0 && **l <= 64.0)) {
        anyhow::bail!("--load {bad}: batch jobs per CPU must be within 0..=64");
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let opts = appease_bench::Options {
        scenario,
        quick,
        seconds,
        modes,
        loads: load,
        appease: std::env::current_exe().context("finding the appease binary")?,
        config,
        unix,
        port,
        arrivals,
        batch,
        repeat: repeat as usize,
        stop,
        clients,
        scale_base,
        peer_bins: peer_bin,
        shapes,
        servers,
        fetch_servers,
        fetch_jobs,
    };
    let (value, table, csv, plots) = match appease_bench::run(&opts)? {
        appease_bench::Report::Latency(results) => {
            let value = match results.as_slice() {
                [one] => serde_json::to_value(one)?,
                many => serde_json::json!({
                    "scenario": many.first().map(|r| r.scenario.clone()),
                    "modes": many.first().map(|r| r.modes.clone()),
                    "sweep": many,
                }),
            };
            let table: Vec<String> = results.iter().map(|r| r.table()).collect();
            let plots = match &out {
                Some(_) => appease_bench::plot::all(&results)?,
                None => Vec::new(),
            };
            (
                value,
                table.join("\n"),
                Some(appease_bench::report::csv(&results)),
                plots,
            )
        }
        appease_bench::Report::Utilization(u) => {
            let plots = match &out {
                Some(_) => vec![(
                    "fairness.svg".to_string(),
                    appease_bench::plot::fairness(&u)?,
                )],
                None => Vec::new(),
            };
            (serde_json::to_value(&u)?, u.table(), None, plots)
        }
        appease_bench::Report::ClosedLoop(r) => {
            let plots = match &out {
                Some(_) => appease_bench::plot::completion_vs_clients(&r)?,
                None => Vec::new(),
            };
            (serde_json::to_value(&r)?, r.table(), Some(r.csv()), plots)
        }
        appease_bench::Report::Nested(r) => {
            (serde_json::to_value(&r)?, r.table(), None, Vec::new())
        }
        appease_bench::Report::Fetch(r) => (serde_json::to_value(&r)?, r.table(), None, Vec::new()),
    };
    if let Some(dir) = &out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(
            dir.join("result.json"),
            serde_json::to_string_pretty(&value)?,
        )?;
        if let Some(csv) = csv {
            std::fs::write(dir.join("result.csv"), csv)?;
        }
        for (name, svg) in plots {
            std::fs::write(dir.join(&name), svg)?;
            eprintln!("wrote {}", dir.join(name).display());
        }
    }
    if json {
        println!("{}", serde_json::to_string(&value)?);
    } else {
        println!("{table}");
    }
    Ok(())
}

fn unhappiness(p: &appease_model::unhappiness::Params, json: bool) -> Result<()> {
    let u = appease_model::unhappiness::evaluate(p)?;
    if json {
        println!("{}", serde_json::to_string(&u)?);
        return Ok(());
    }
    println!(
        "Closed forms of the 2010 customer-appeasement paper: N = {} processes, q = {} ms, sched_latency = {} ms, \
         τ = {} ms, τ1,τ2,τ3 = {},{},{} ms, elevation nice −{}",
        p.processes,
        p.quantum_ms,
        p.sched_latency_ms,
        p.request_ms,
        p.tau_ms[0],
        p.tau_ms[1],
        p.tau_ms[2],
        p.nice
    );
    println!(
        "{:<9} {:<13} {:<11} {:>12}  note",
        "policy", "scenario", "eqs.", "unhappy ms"
    );
    for r in &u.rows {
        let v = r
            .unhappiness_ms
            .map_or_else(|| "-".to_string(), |v| format!("{v:.3}"));
        println!(
            "{:<9} {:<13} {:<11} {:>12}  {}",
            r.policy, r.scenario, r.equations, v, r.note
        );
    }
    println!("(`appease sim` gives the exact values; docs/sim.md compares them)");
    Ok(())
}

fn contention(
    cpus: u64,
    demand: Option<f64>,
    measured: Option<(f64, f64, f64)>,
    json: bool,
) -> Result<()> {
    use appease_model::contention::{from_measurements, solve};
    match (demand, measured) {
        (Some(d), _) => {
            let c = solve(cpus, d)?;
            if json {
                println!("{}", serde_json::to_string(&c)?);
            } else {
                println!(
                    "{} CPUs at {:.2} % demand: lock utilization {:.4}, {:.4} acquisitions per hold time, \
                     mean wait {:.4} hold times, effective power {:.3} CPUs",
                    c.cpus, c.demand_pct, c.utilization, c.throughput_per_hold, c.wait_per_hold, c.effective_power
                );
            }
        }
        (None, Some((rate, hold, wait))) => {
            let m = from_measurements(cpus, rate, hold, wait)?;
            if json {
                println!("{}", serde_json::to_string(&m)?);
            } else {
                println!(
                    "{} CPUs: derived demand {:.3} %; effective power measured {:.3} CPUs, model {:.3} CPUs \
                     (lock utilization {:.4}, mean wait {:.4} hold times)",
                    m.cpus,
                    m.demand_pct,
                    m.measured_effective_power,
                    m.predicted_effective_power,
                    m.model.utilization,
                    m.model.wait_per_hold
                );
            }
        }
        (None, None) => anyhow::bail!("give --demand, or --rate, --hold-us and --wait-us"),
    }
    Ok(())
}
