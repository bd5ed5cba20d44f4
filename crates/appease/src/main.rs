//! `appease`: one binary, several commands.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

mod status_cmd;

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
    #[command(subcommand)]
    command: Command,
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
    },
    /// Put back every priority a crashed daemon left changed (from its journal).
    Restore,
    /// Show what the running daemon manages and why.
    Status {
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Check a config file and exit (0: valid).
    CheckConfig { file: PathBuf },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log);
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("appease: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

fn run(cmd: Command) -> Result<()> {
    match cmd {
        Command::Daemon { config, dry_run } => daemon(config, dry_run),
        Command::Restore => restore(),
        Command::Status { json } => status_cmd::show(&appease_daemon::run_dir(), json),
        Command::CheckConfig { file } => {
            appease_config::Config::load(&file)?;
            println!("{}: ok", file.display());
            Ok(())
        }
    }
}

fn daemon(config_path: Option<PathBuf>, dry_run: bool) -> Result<()> {
    let config = match &config_path {
        Some(p) => appease_config::Config::load(p)?,
        None => appease_config::Config::embedded(),
    };
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
