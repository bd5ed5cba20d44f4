//! `appease`: one binary, several commands.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

mod bench_cmd;
mod model_cmd;
mod own_group;
mod results_page;
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
    ///
    /// Ctrl-C (or SIGTERM) stops it early: it puts back everything it changed and reports
    /// what it measured.
    Bench(Box<bench_cmd::BenchArgs>),
    /// Redraw the SVG plots of a bench run from the result.json in DIR (no root).
    BenchPlot { dir: PathBuf },
    /// Print bench result files (result.json) as docs/RESULTS.md shows them (no root): the
    /// client sweeps' (`bench web|db --clients`) as Markdown tables over them all, any other
    /// run's as its command, its date and its table; with --summary, the summary table its
    /// rows file lists (docs/results/summary.toml).
    BenchTable {
        /// The rows file of the summary table (each row names its result file).
        #[arg(long, conflicts_with = "files")]
        summary: Option<PathBuf>,
        /// With --summary: README's shorter table of the rows it names.
        #[arg(long, requires = "summary")]
        readme: bool,
        #[arg(required_unless_present = "summary")]
        files: Vec<PathBuf>,
    },
    /// The deterministic scheduler simulator with the 2010 customer-appeasement paper's unhappiness model.
    Sim {
        #[command(subcommand)]
        command: sim_cmd::SimCommand,
    },
    /// Closed-form models.
    Model {
        #[command(subcommand)]
        command: model_cmd::ModelCommand,
    },
    /// Staggered fixed priorities for a multi-process application (the AIX case study).
    Roles {
        #[command(subcommand)]
        command: RolesCommand,
    },
    /// The bench's guardian: ends what a killed bench left running (started by the bench).
    #[command(hide = true)]
    BenchGuard { pid: u32, since: u64 },
    /// Processes the bench starts (server, soakers).
    #[command(hide = true)]
    BenchWorker {
        #[command(subcommand)]
        worker: bench_cmd::Worker,
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
        Command::Bench(args) => bench_cmd::run(*args),
        Command::Sim { command } => sim_cmd::dispatch(command),
        Command::Model { command } => model_cmd::run(command),
        Command::Roles {
            command:
                RolesCommand::Suggest {
                    file,
                    app,
                    top_nice,
                },
        } => roles_cmd::suggest_cmd(&file, &app, top_nice),
        Command::BenchPlot { dir } => bench_cmd::plot(&dir),
        Command::BenchTable {
            summary: Some(spec),
            readme,
            ..
        } => {
            match readme {
                true => print!("{}", results_page::readme(&spec)?),
                false => print!("{}", results_page::summary(&spec)?),
            }
            Ok(())
        }
        Command::BenchTable { files, .. } => bench_cmd::table(&files),
        Command::BenchGuard { pid, since } => appease_bench::guard::watch(pid, since),
        Command::BenchWorker { worker } => bench_cmd::worker(worker),
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
    let _crash_points = appease_daemon::crash_points();
    appease_daemon::preflight()?;
    let dir = appease_daemon::run_dir();
    // A daemon killed a moment ago holds the lock until its exit ends (its probe is
    // detached then): waited for, a few seconds at most.
    let (_lock, waited) =
        appease_daemon::RunLock::acquire_after_exit(&dir, std::time::Duration::from_secs(10))
            .context("a running daemon restores by itself when stopped (SIGTERM); appease restore is for after a crash")?;
    if waited >= std::time::Duration::from_millis(50) {
        println!(
            "waited {:.1} s for the daemon that held {} to finish exiting",
            waited.as_secs_f64(),
            dir.display()
        );
    }
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
