//! `appease sim run`, `appease sim compare` and `appease sim sweep`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use appease_sim::{Report, Workload, POLICIES};
use clap::Subcommand;

#[derive(Subcommand)]
pub(crate) enum SimCommand {
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

/// Runs one of the simulator's commands.
pub(crate) fn dispatch(command: SimCommand) -> Result<()> {
    match command {
        SimCommand::Run {
            file,
            policy,
            json,
            out,
        } => run(&file, policy.as_deref(), json, out.as_deref()),
        SimCommand::Compare { file, json, out } => compare(&file, json, out.as_deref()),
        SimCommand::Sweep {
            file,
            clients,
            requests,
            policies,
            scale_base,
            json,
        } => sweep(&file, &clients, requests, &policies, scale_base, json),
    }
}

fn write_out(dir: &Path, json_name: &str, json: &str, reports: &[Report]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join(json_name), json)
        .with_context(|| format!("writing {}", dir.join(json_name).display()))?;
    let mut csv = String::new();
    for (i, r) in reports.iter().enumerate() {
        let text = appease_sim::records_csv(r);
        // One header for all policies.
        csv += if i == 0 {
            &text
        } else {
            text.split_once('\n').map_or("", |x| x.1)
        };
    }
    std::fs::write(dir.join("requests.csv"), csv)
        .with_context(|| format!("writing {}", dir.join("requests.csv").display()))?;
    Ok(())
}

pub fn run(file: &Path, policy: Option<&str>, json: bool, out: Option<&Path>) -> Result<()> {
    let w = Workload::load(file)?;
    let r = appease_sim::run(&w, policy).map_err(anyhow::Error::msg)?;
    let text = serde_json::to_string_pretty(&r)?;
    if let Some(dir) = out {
        write_out(dir, "report.json", &text, std::slice::from_ref(&r))?;
    }
    if json {
        println!("{text}");
    } else {
        print!("{}", appease_sim::table(std::slice::from_ref(&r)));
        for (c, u) in &r.unhappiness.per_customer {
            println!("unhappiness of customer {c}: {u:.3} ms");
        }
        for l in &r.locks {
            println!(
                "lock {}: {} contenders, {} acquisitions, held {:.4} of the time, mean wait {:.4} ms \
                 ({:.4} mean holds), effective power {:.3} CPUs",
                l.name,
                l.contenders,
                l.acquisitions,
                l.utilization,
                l.mean_wait_ms,
                l.wait_per_hold,
                l.effective_power
            );
        }
    }
    Ok(())
}

pub fn compare(file: &Path, json: bool, out: Option<&Path>) -> Result<()> {
    let w = Workload::load(file)?;
    let reports = POLICIES
        .iter()
        .map(|p| appease_sim::run(&w, Some(p)).map_err(anyhow::Error::msg))
        .collect::<Result<Vec<_>>>()?;
    let text = serde_json::to_string_pretty(&reports)?;
    if let Some(dir) = out {
        write_out(dir, "compare.json", &text, &reports)?;
    }
    if json {
        println!("{text}");
    } else {
        println!(
            "{}: {} CPUs, {} ms simulated, seed {}",
            file.display(),
            w.sim.cpus,
            w.sim.duration_ms,
            w.sim.seed
        );
        print!("{}", appease_sim::table(&reports));
    }
    Ok(())
}

pub fn sweep(
    file: &Path,
    clients: &[u32],
    requests: u64,
    policies: &[String],
    scale_base: Option<u32>,
    json: bool,
) -> Result<()> {
    let w = Workload::load(file)?;
    let policies: Vec<&str> = if policies.is_empty() {
        POLICIES.to_vec()
    } else {
        policies.iter().map(String::as_str).collect()
    };
    if let Some(bad) = policies.iter().find(|p| !POLICIES.contains(p)) {
        anyhow::bail!("unknown policy {bad:?} (one of {})", POLICIES.join(", "));
    }
    let r = appease_sim::sweep::sweep(&w, clients, requests, &policies, scale_base)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "{}: {} CPUs; {} requests by {:?} to {:?}, split among the clients, each with an \
             instance of the server of its own (no cost per context switch is simulated)",
            file.display(),
            w.sim.cpus,
            r.requests,
            r.customer,
            r.server
        );
        print!("{}", appease_sim::sweep::table(&r));
    }
    Ok(())
}
